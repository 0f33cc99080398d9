"""The torch engine and model loading, with the real tiny base model and random Llamas."""

import dataclasses
import json
import shutil

import pytest
import torch

from crypto.verdict import RolloutClaim, check_rollout
from node.engine import open_engine
from node.engine.base import GenRequest, SamplingParams
from node.engine.models import ModelError, load_model, pick_dtype
from node.engine.torch_engine import TorchEngine, recompute
from node.engine.vllm_engine import _Picker, vllm_available
from tests.helpers.tiny_lm import EOS, tiny_llama


def requests(lengths, seed=0, vocab=256):
    g = torch.Generator().manual_seed(seed)
    return [
        GenRequest([2] + torch.randint(3, vocab, (n - 1,), generator=g).tolist(), 1000 + i)
        for i, n in enumerate(lengths)
    ]


@pytest.fixture(scope="module")
def llama():
    return tiny_llama(0, layers=2, hidden=64)


def verify_all(model, results, params, eos=EOS):
    for r in results:
        acts, logits = recompute(model, r.prompt, r.tokens)
        claim = RolloutClaim(
            r.tokens,
            r.proofs,
            r.seed,
            r.finish_reason,
            params.max_new_tokens,
            params.temperature,
            params.top_p,
        )
        verdict = check_rollout(claim, acts, logits, eos_token_id=eos)
        assert verdict.passed, verdict.reason
        # the log-probs are those of a fresh forward pass over the output
        t = params.temperature if params.temperature > 0 else 1.0
        fresh = torch.log_softmax(logits / t, -1).gather(1, torch.tensor(r.tokens)[:, None])[:, 0]
        assert torch.allclose(fresh, torch.tensor(r.logprobs), atol=1e-4)


def test_shapes_lengths_and_order(llama):
    engine = TorchEngine(llama, eos_token_ids=frozenset({EOS}), max_batch=3)
    reqs = requests([7, 3, 12, 5, 9, 4, 3])  # several length buckets of at most 3
    params = SamplingParams(max_new_tokens=20, stop_at_eos=False)
    results = engine.generate(reqs, params)
    assert [r.prompt for r in results] == [q.prompt for q in reqs]  # request order kept
    for r in results:
        assert len(r.tokens) == len(r.logprobs) == 20
        assert r.finish_reason == "length"
        assert len(r.proofs) == 1 + 1  # prefill, 19 decode states in one chunk of 32
        assert all(len(p) == 258 for p in r.proofs)
        assert all(lp <= 0 for lp in r.logprobs)
    verify_all(llama, results, params)


def test_deterministic_under_fixed_seeds(llama):
    engine = TorchEngine(llama, eos_token_ids=frozenset({EOS}))
    reqs = requests([6, 10, 4])
    params = SamplingParams(max_new_tokens=40, temperature=0.8, top_p=0.9)
    a, b = engine.generate(reqs, params), engine.generate(reqs, params)
    assert [(r.tokens, r.logprobs, r.proofs) for r in a] == [
        (r.tokens, r.logprobs, r.proofs) for r in b
    ]
    other = engine.generate([GenRequest(q.prompt, q.seed + 1) for q in reqs], params)
    assert [r.tokens for r in other] != [r.tokens for r in a]
    verify_all(llama, a, params)


def midway_token(model, reqs, params, lo, hi):
    """A token that between ``lo`` and ``hi`` of the sequences emit midway (and the others
    never): made the EOS, it ends some sequences early and not others."""
    free = TorchEngine(model, eos_token_ids=frozenset({EOS})).generate(
        reqs, dataclasses.replace(params, stop_at_eos=False)
    )
    seen = [set(r.tokens[1 : params.max_new_tokens - 8]) for r in free]
    return next(t for t in sorted(set().union(*seen)) if lo <= sum(t in s for s in seen) <= hi)


def test_eos_ends_a_sequence_and_the_rest_go_on(llama):
    reqs = requests([5] * 8, seed=3)
    params = SamplingParams(max_new_tokens=48, temperature=1.5)
    eos = midway_token(llama, reqs, params, 2, 6)
    engine = TorchEngine(llama, eos_token_ids=frozenset({eos}), max_batch=8)
    results = engine.generate(reqs, params)
    stopped = [r for r in results if r.finish_reason == "stop"]
    running = [r for r in results if r.finish_reason == "length"]
    assert stopped and running
    for r in stopped:
        assert r.tokens[-1] == eos and eos not in r.tokens[:-1] and len(r.tokens) < 48
    for r in running:
        assert len(r.tokens) == 48 and eos not in r.tokens
    verify_all(llama, results, params, eos=eos)  # rows dropped mid-batch still prove right


def test_greedy_and_single_token_outputs(llama):
    engine = TorchEngine(llama, eos_token_ids=frozenset({EOS}))
    params = SamplingParams(max_new_tokens=1, temperature=0.0)
    results = engine.generate(requests([4, 8]), params)
    for r in results:
        assert len(r.tokens) == 1 and len(r.proofs) == 1  # prefill proof only
    verify_all(llama, results, params)


def test_batch_composition_does_not_break_proofs(llama):
    engine = TorchEngine(llama, eos_token_ids=frozenset({EOS}), max_batch=32)
    reqs = requests([3, 30, 9, 17])
    params = SamplingParams(max_new_tokens=33)
    together = engine.generate(reqs, params)
    alone = [engine.generate([q], params)[0] for q in reqs]
    verify_all(llama, together + alone, params)


def test_bad_requests(llama):
    engine = TorchEngine(llama, eos_token_ids=frozenset({EOS}))
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([GenRequest([], 1)], SamplingParams())
    with pytest.raises(ValueError, match="out of range"):
        engine.generate([GenRequest([2, 999], 1)], SamplingParams())
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=0)
    for bad in ({"proof_chunk": 0}, {"proof_topk": 0}, {"proof_topk": 5000}):
        with pytest.raises(ValueError, match="proof_"):
            SamplingParams(**bad)


def test_tiny_model_loads_offline_and_generates(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    engine, tokenizer = open_engine(str(tiny_model_dir))  # auto: torch without vLLM/GPU
    assert engine.name == "torch" and engine.device.type == "cpu"
    prompt = tokenizer("3+4=?\nAnswer:")["input_ids"]
    assert prompt[0] == tokenizer.bos_token_id
    assert tokenizer.decode(prompt, skip_special_tokens=True) == "3+4=?\nAnswer:"
    params = SamplingParams(max_new_tokens=16)
    results = engine.generate([GenRequest(prompt, s) for s in range(8)], params)
    assert any(r.finish_reason == "stop" for r in results)  # the SFT model learned to stop
    verify_all(engine.model, results, params, eos=tokenizer.eos_token_id)


def test_dtype_and_device_choice(tiny_model_dir):
    assert pick_dtype("auto", torch.device("cpu")) == torch.float32
    loaded = load_model(tiny_model_dir, dtype="bfloat16")
    assert loaded.dtype == torch.bfloat16
    assert next(loaded.model.parameters()).dtype == torch.bfloat16
    with pytest.raises(ModelError, match="unknown dtype"):
        load_model(tiny_model_dir, dtype="float8")
    if not torch.cuda.is_available():
        with pytest.raises(ModelError, match="no CUDA"):
            load_model(tiny_model_dir, device="cuda")


def test_bad_model_dirs(tiny_model_dir, tmp_path):
    with pytest.raises(ModelError, match="not a directory"):
        load_model(tmp_path / "missing")
    with pytest.raises(ModelError, match="config.json"):
        load_model(tmp_path)
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    for f in broken.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(ModelError, match="safetensors"):
        load_model(broken)
    garbage = tmp_path / "garbage"
    shutil.copytree(tiny_model_dir, garbage)
    for f in garbage.glob("*.safetensors"):
        f.write_bytes(b"\x00" * 64)
    with pytest.raises(ModelError, match="cannot load"):
        load_model(garbage)
    other = tmp_path / "badconfig"
    shutil.copytree(tiny_model_dir, other)
    (other / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    with pytest.raises(ModelError, match="cannot load"):
        load_model(other)


def test_backend_selection(monkeypatch, tiny_model_dir):
    """vLLM is chosen automatically only when it is installed AND a GPU is present."""
    import importlib.util

    from node.engine import vllm_engine

    real_find_spec = importlib.util.find_spec
    for cuda, installed, want in [(False, True, False), (True, False, False), (True, True, True)]:
        monkeypatch.setattr(vllm_engine.torch.cuda, "is_available", lambda c=cuda: c)
        monkeypatch.setattr(
            importlib.util,
            "find_spec",
            lambda name, *a, i=installed: (
                (object() if i else None) if name == "vllm" else real_find_spec(name, *a)
            ),
        )
        assert vllm_available() is want, (cuda, installed)
    monkeypatch.undo()
    monkeypatch.setattr(vllm_engine, "vllm_available", lambda: False)
    engine, _ = open_engine(str(tiny_model_dir), backend="auto")
    assert engine.name == "torch"
    with pytest.raises(ValueError, match="vLLM"):
        open_engine("/nonexistent", backend="vllm")
    with pytest.raises(ValueError, match="backend"):
        open_engine("/nonexistent", backend="tensorrt")


def test_vllm_processor_picks_the_verifiable_token():
    """The per-request processor the vLLM engine installs is plain torch: check it here."""
    from crypto.sampling import gumbel_noise, sample_tokens
    from node.engine import vllm_engine

    logits = torch.randn(300, generator=torch.Generator().manual_seed(1))
    picker = _Picker(seed=77, temperature=0.7, top_p=0.9, key="k")
    out = picker([11, 12, 13], logits.clone())  # position 3
    want = sample_tokens(logits[None], gumbel_noise(77, 3, 300)[None], 0.7, 0.9)[0]
    assert int(out.argmax()) == int(want)
    assert torch.isinf(out).sum() == 299  # only the chosen token is left to vLLM
    ((position, (tok, lp)),) = vllm_engine._PICKS.pop("k").items()
    assert position == 3 and tok == int(want)
    assert lp == pytest.approx(float(torch.log_softmax(logits / 0.7, -1)[want]), abs=1e-5)


def test_vllm_picks_become_the_result():
    from node.engine.vllm_engine import picked

    picks = {0: (7, -0.1), 1: (9, -0.2), 2: (1, -0.3)}  # 1 is EOS
    params = SamplingParams(max_new_tokens=8)
    eos = frozenset({1})
    assert picked(picks, [7, 9, 1], eos, params) == ([7, 9, 1], [-0.1, -0.2, -0.3], "stop")
    assert picked(picks, [7, 9], eos, params)[2] == "stop"  # vLLM left the stop token out
    short = SamplingParams(max_new_tokens=2)
    assert picked(picks, [7, 9], eos, short) == ([7, 9], [-0.1, -0.2], "length")
    with pytest.raises(RuntimeError, match="differ"):
        picked(picks, [7, 8, 1], eos, params)
    with pytest.raises(RuntimeError, match="skipped"):
        picked({0: (7, -0.1), 2: (1, -0.3)}, [7], eos, params)


def test_continuous_batching_refills_rows_and_still_proves(llama):
    """More sequences than rows, ending at different times: rows are refilled (and the
    last row moved into a freed one) while others decode; every result still verifies."""
    reqs = requests([3, 11, 6, 20, 4, 9, 15, 7, 5, 12, 8, 10], seed=5)
    params = SamplingParams(max_new_tokens=40, temperature=1.2)
    eos = midway_token(llama, reqs, params, 4, 8)
    engine = TorchEngine(llama, eos_token_ids=frozenset({eos}), max_batch=4)
    results = engine.generate(reqs, params)
    lengths = {len(r.tokens) for r in results}
    assert len(lengths) > 3 and 40 in lengths  # sequences ended at many different steps
    verify_all(llama, results, params, eos=eos)
    # the same sequences come out of the generic (transformers) forward with buckets
    generic = TorchEngine(llama, eos_token_ids=frozenset({eos}), max_batch=4, fast=False)
    assert not generic.fast and engine.fast
    assert [r.tokens for r in generic.generate(reqs, params)] == [r.tokens for r in results]


def test_other_architectures_use_the_generic_forward():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(
        GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=256)
    ).eval()
    engine = TorchEngine(gpt2, eos_token_ids=frozenset({EOS}))
    assert not engine.fast
    params = SamplingParams(max_new_tokens=35)
    results = engine.generate(requests([5, 9, 3]), params)
    assert all(len(r.proofs) == 1 + 2 for r in results if len(r.tokens) == 35)
    verify_all(gpt2, results, params)


def test_fused_weights_follow_in_place_weight_updates():
    """A trainer updates weights in place (load_state_dict copies into them): the fast
    path's fused copies must notice, or it would sample from the old policy."""
    model = tiny_llama(0, layers=2, hidden=64)
    engine = TorchEngine(model, eos_token_ids=frozenset({EOS}))
    reqs = requests([6, 9])
    params = SamplingParams(max_new_tokens=30)
    before = [r.tokens for r in engine.generate(reqs, params)]
    model.load_state_dict(tiny_llama(1, layers=2, hidden=64).state_dict())  # in place
    after = engine.generate(reqs, params)
    assert [r.tokens for r in after] != before
    verify_all(model, after, params)  # proven against the new weights
