"""The lean forward against transformers' own, for every architecture it claims (Llama,
Qwen2 with its q/k/v bias, Mistral without a sliding window), fused and unfused."""

import pytest
import torch

from node.engine.base import GenRequest, SamplingParams
from node.engine.fastpath import supports
from node.engine.torch_engine import TorchEngine, recompute

VOCAB = 256


def build(arch):
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=1,
        pad_token_id=0,
        bos_token_id=2,
    )
    torch.manual_seed(3)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common, use_sliding_window=False))
    else:
        model = MistralForCausalLM(MistralConfig(**common, sliding_window=None))
    with torch.no_grad():  # random biases are zero-initialized: make them matter
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
    return model.eval()


def requests(n=6):
    g = torch.Generator().manual_seed(11)
    return [
        GenRequest([2] + torch.randint(3, VOCAB, (4 + 3 * i,), generator=g).tolist(), 500 + i)
        for i in range(n)
    ]


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_fast_path_tokens_and_logprobs_match_transformers(arch, fused):
    model = build(arch)
    assert supports(model)
    if arch == "qwen2":  # the q/k/v bias is there, and nonzero
        assert model.model.layers[0].self_attn.q_proj.bias.abs().sum() > 0
    if not fused:
        model._intellect_fused = False  # the unfused branch: each projection on its own
    engine = TorchEngine(model, eos_token_ids=frozenset({1}), max_batch=3)
    assert engine.fast
    params = SamplingParams(max_new_tokens=24, temperature=1.0)
    reqs = requests()
    results = engine.generate(reqs, params)
    if fused:
        assert model._intellect_fused  # the fused branch really ran
    for r in results:
        _, logits = recompute(model, r.prompt, r.tokens)  # transformers' own forward
        want = torch.log_softmax(logits.double(), dim=-1).gather(
            1, torch.tensor(r.tokens)[:, None]
        )[:, 0]
        assert torch.allclose(torch.tensor(r.logprobs, dtype=torch.float64), want, atol=1e-4), (
            arch,
            fused,
        )
    # the generic path (transformers' forward with a cache) draws the same tokens
    generic = TorchEngine(model, eos_token_ids=frozenset({1}), max_batch=3, fast=False)
    assert [g.tokens for g in generic.generate(reqs, params)] == [r.tokens for r in results]


def test_a_sliding_window_model_is_not_claimed():
    from transformers import MistralConfig, MistralForCausalLM

    model = MistralForCausalLM(
        MistralConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            sliding_window=16,
        )
    )
    assert not supports(model)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_batched_recomputation_equals_one_by_one(arch):
    from node.engine.torch_engine import recompute_batch

    model = build(arch)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, VOCAB, (int(n),), generator=g).tolist() for n in (3, 17, 8, 30)]
    outputs = [torch.randint(3, VOCAB, (int(n),), generator=g).tolist() for n in (1, 25, 9, 4)]
    batched = recompute_batch(model, prompts, outputs, max_tokens=64)  # several forwards
    for (acts, logits), p, t in zip(batched, prompts, outputs, strict=True):
        want_acts, want_logits = recompute(model, p, t)
        assert logits.shape == want_logits.shape == (len(t), VOCAB)
        assert torch.allclose(logits, want_logits, atol=1e-5)
        assert [a.shape for a in acts] == [a.shape for a in want_acts]
        for a, b in zip(acts, want_acts, strict=True):
            assert torch.allclose(a, b, atol=1e-5)


def test_batched_recomputation_falls_back_for_other_architectures():
    from transformers import GPT2Config, GPT2LMHeadModel

    from node.engine.torch_engine import recompute_batch

    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2)).eval()
    ((acts, logits),) = recompute_batch(gpt2, [[5, 6, 7]], [[8, 9]])
    want_acts, want_logits = recompute(gpt2, [5, 6, 7], [8, 9])
    assert torch.equal(logits, want_logits) and torch.equal(acts[0], want_acts[0])
