"""A tiny real transformer (HF Llama, random init) with batched, seeded generation that
captures the post-final-norm hidden states, and the validator's one-pass recomputation.

Used by the TOPLOC tests and bench. The rollout engine proper is issue #4; this is the
smallest honest generation loop: left-padded batches, a KV cache, Gumbel-max sampling
with per-sequence seeds, and the hidden states TOPLOC commits to.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from crypto.sampling import gumbel_noise_rows, sample_tokens
from node.engine.torch_engine import recompute as engine_recompute

VOCAB = 256
EOS = 1
PAD = 0


def tiny_llama(
    seed: int, *, layers: int = 2, hidden: int = 64, vocab: int = VOCAB, dtype=torch.float32
) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 2 if hidden <= 256 else hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 16),
        num_key_value_heads=max(1, hidden // 32),
        max_position_embeddings=2048,
        eos_token_id=EOS,
        pad_token_id=PAD,
        bos_token_id=2,
    )
    model = LlamaForCausalLM(cfg).eval()
    return model.to(dtype)


@dataclass
class Generation:
    prompt: list[int]
    tokens: list[int]
    seed: int
    finish_reason: str
    activations: list[torch.Tensor]  # [prefill [L, H]] + one [H] per decode step


@torch.no_grad()
def generate(
    model: LlamaForCausalLM,
    prompts: list[list[int]],
    seeds: list[int],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    stop_at_eos: bool = True,
    tamper: dict[int, int] | None = None,
) -> list[Generation]:
    """Generate for a left-padded batch. ``tamper`` {position: token} overrides the
    sampled token of every sequence at that position (a cheating worker)."""
    b = len(prompts)
    width = max(len(p) for p in prompts)
    ids = torch.full((b, width), PAD, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        cache=cache,
        use_cache=True,
        output_hidden_states=True,
    )
    hidden = out.hidden_states[-1]  # [B, W, H], after the final norm
    acts: list[list[torch.Tensor]] = [
        [hidden[i, width - len(p) :].float().clone()] for i, p in enumerate(prompts)
    ]
    tokens: list[list[int]] = [[] for _ in range(b)]
    done = [False] * b
    finish = ["length"] * b
    logits = out.logits[:, -1]
    vocab = logits.shape[-1]
    for step in range(max_new_tokens):
        noise = gumbel_noise_rows(seeds, [step] * len(seeds), vocab)
        nxt = sample_tokens(logits.float(), noise, temperature, top_p)
        if tamper and step in tamper:
            nxt = torch.full_like(nxt, tamper[step])
        for i in range(b):
            if not done[i]:
                tokens[i].append(int(nxt[i]))
                if stop_at_eos and int(nxt[i]) == EOS:
                    done[i] = True
                    finish[i] = "stop"
        if all(done) or step == max_new_tokens - 1:
            break
        mask = torch.cat([mask, torch.ones((b, 1), dtype=torch.long)], dim=1)
        positions = positions[:, -1:] + 1
        out = model(
            input_ids=nxt[:, None],
            attention_mask=mask,
            position_ids=positions,
            cache=cache,
            use_cache=True,
            output_hidden_states=True,
        )
        h = out.hidden_states[-1][:, -1]
        for i in range(b):
            if not done[i]:  # this state will choose sequence i's next token
                acts[i].append(h[i].float().clone())
        logits = out.logits[:, -1]
    return [Generation(prompts[i], tokens[i], seeds[i], finish[i], acts[i]) for i in range(b)]


def recompute(
    model: LlamaForCausalLM, prompt: list[int], tokens: list[int]
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The validator's one prefill pass (the engine's own ``recompute``)."""
    return engine_recompute(model, prompt, tokens)


ATTACKS = (
    "other_seed",
    "optimizer_step",
    "bf16_as_fp32",
    "other_prompt",
    "token_changed",
    "tampered_sampling",
)


def attack(
    model: LlamaForCausalLM,
    name: str,
    prompt: list[int],
    other_prompt: list[int],
    seed: int,
    *,
    max_new_tokens: int,
) -> tuple[LlamaForCausalLM, Generation, list[int]]:
    """A cheating worker's rollout: (the honest validator's model, the worker's
    generation with its activations, the prompt the validator checks against)."""
    gen_honest = generate(model, [prompt], [seed], max_new_tokens=max_new_tokens)[0]
    if name == "other_seed":  # same architecture initialized from another seed
        torch.manual_seed(seed % 2**31 + 1)
        other = LlamaForCausalLM(model.config).eval().to(model.dtype)
        return model, generate(other, [prompt], [seed], max_new_tokens=max_new_tokens)[0], prompt
    if name == "optimizer_step":  # the worker is one small AdamW step away from the run's weights
        stepped = copy.deepcopy(model)
        opt = torch.optim.AdamW(stepped.parameters(), lr=1e-4)
        x = torch.randint(
            3, model.config.vocab_size, (4, 32), generator=torch.Generator().manual_seed(0)
        )
        stepped(input_ids=x, labels=x).loss.backward()
        opt.step()
        return model, generate(stepped, [prompt], [seed], max_new_tokens=max_new_tokens)[0], prompt
    if name == "bf16_as_fp32":  # cheaper bf16 compute, claimed as the run's fp32
        cheap = copy.deepcopy(model).to(torch.bfloat16)
        return model, generate(cheap, [prompt], [seed], max_new_tokens=max_new_tokens)[0], prompt
    if name == "other_prompt":  # generated for another prompt than the assigned one
        return (
            model,
            generate(model, [other_prompt], [seed], max_new_tokens=max_new_tokens)[0],
            prompt,
        )
    if name == "token_changed":  # one output token edited after proving
        edited = copy.copy(gen_honest)
        edited.tokens = list(gen_honest.tokens)
        j = len(edited.tokens) // 2
        edited.tokens[j] = (edited.tokens[j] + 1 - 3) % (model.config.vocab_size - 3) + 3
        return model, edited, prompt
    if name == "tampered_sampling":  # forces a token the noise did not pick; proves honestly
        j = min(20, max_new_tokens - 2)
        forced = (gen_honest.tokens[j] + 7 - 3) % (model.config.vocab_size - 3) + 3
        return (
            model,
            generate(model, [prompt], [seed], max_new_tokens=max_new_tokens, tamper={j: forced})[0],
            prompt,
        )
    raise ValueError(f"unknown attack {name!r}")
