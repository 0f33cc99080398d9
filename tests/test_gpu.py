"""GPU checks (marker ``gpu``; never in CI): run with ``pytest -m gpu tests/test_gpu.py`` on
a machine with an NVIDIA GPU (and vLLM for ``test_vllm_engine_glue``). They fail, not skip,
without one. The CUDA default of the torch engine is static-shape decoding replayed from
CUDA graphs (``node.engine.graphs``), so every torch-engine test here runs that path."""

import copy
import functools

import pytest
import torch

from crypto.verdict import RolloutClaim, check_rollout
from node.engine import open_engine
from node.engine.base import GenRequest, SamplingParams
from node.engine.models import load_model
from node.engine.torch_engine import recompute

pytestmark = pytest.mark.gpu


def check_all(model, results, params, eos):
    for r in results:
        acts, logits = recompute(model, r.prompt, r.tokens)
        claim = RolloutClaim(
            r.tokens, r.proofs, r.seed, r.finish_reason, params.max_new_tokens, params.temperature
        )
        verdict = check_rollout(claim, acts, logits, eos_token_id=eos)
        assert verdict.passed, verdict.reason


def prompts(tokenizer, n):
    return [tokenizer(f"{i % 10}+{i % 7}=?\nAnswer:")["input_ids"] for i in range(n)]


def test_torch_engine_on_cuda(tiny_model_dir):
    engine, tok = open_engine(str(tiny_model_dir), backend="torch")
    assert engine.device.type == "cuda" and engine.dtype == torch.bfloat16
    params = SamplingParams(max_new_tokens=48)
    results = engine.generate([GenRequest(p, i) for i, p in enumerate(prompts(tok, 64))], params)
    check_all(engine.model, results, params, tok.eos_token_id)


def test_vllm_engine_glue(tiny_model_dir):
    engine, tok = open_engine(str(tiny_model_dir), backend="vllm")
    assert engine.name == "vllm"
    params = SamplingParams(max_new_tokens=48)
    results = engine.generate([GenRequest(p, i) for i, p in enumerate(prompts(tok, 64))], params)
    assert all(len(r.logprobs) == len(r.tokens) and r.proofs for r in results)
    # the validator's view: the same weights in transformers, on the GPU
    check_all(load_model(tiny_model_dir, device="cuda").model, results, params, tok.eos_token_id)
    # same seeds, same tokens: the verifiable sampler, not vLLM's, chose them
    again = engine.generate([GenRequest(p, i) for i, p in enumerate(prompts(tok, 64))], params)
    assert [r.tokens for r in again] == [r.tokens for r in results]


def test_the_validator_judges_on_the_gpu(tiny_model_dir):
    """Recomputation and every check on CUDA tensors (a validator with a GPU)."""
    from crypto.verdict import GPU_BF16, check_batch
    from node.engine.calibration import claim_of, model_layers, recompute_all

    engine, tok = open_engine(str(tiny_model_dir), backend="torch")
    params = SamplingParams(max_new_tokens=48, top_p=0.9)
    results = engine.generate([GenRequest(p, i) for i, p in enumerate(prompts(tok, 32))], params)
    recomputed = recompute_all(
        engine.model, [r.prompt for r in results], [r.tokens for r in results]
    )
    assert recomputed[0][1].device.type == "cuda"
    claims = [claim_of(r, vars(params)) for r in results]
    config = GPU_BF16.for_layers(model_layers(engine.model))
    for i in range(0, 32, 16):
        verdict = check_batch(
            claims[i : i + 16], recomputed[i : i + 16], eos_token_id=tok.eos_token_id, config=config
        )
        assert verdict.passed, verdict.reason


@functools.cache
def _built(shape):
    from node.engine.calibration import build_random_llama, shape_recipe

    recipe = shape_recipe(shape)
    return recipe, build_random_llama(recipe["config"], 0, recipe["lm_head_scale"])


def _shape(shape):
    """A random-init Llama of a fixture shape on the GPU (built once, copied per test)."""
    recipe, model = _built(shape)
    return recipe, copy.deepcopy(model).cuda()


def _shape_1_1b():
    return _shape("1.1b")


def _graph_run(top_p=1.0):
    """Sequences of many lengths (37 of 4,096 tokens end them) through 16 rows, proofs on:
    buckets shrink as rows retire and grow as they are refilled."""
    from node.engine.calibration import random_prompts

    recipe, model = _shape("small")
    reqs = [
        GenRequest(p, 500 + i)
        for i, p in enumerate(random_prompts(40, recipe["config"]["vocab_size"]))
    ]
    return model, reqs, SamplingParams(max_new_tokens=80, top_p=top_p), frozenset(range(3, 40))


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_cuda_graph_decoding_equals_the_same_steps_run_eagerly(top_p):
    from node.engine.torch_engine import TorchEngine

    model, reqs, params, eos = _graph_run(top_p)
    graphed = TorchEngine(model, eos_token_ids=eos, max_batch=16)  # the CUDA default
    eager = TorchEngine(model, eos_token_ids=eos, max_batch=16, graphs=False)
    ours = graphed.generate(reqs, params)
    assert graphed.static and graphed.graph_failure is None
    keys = graphed.decoder.graphs.graphs.keys()
    assert len({k[1] for k in keys if k[0] == "step"}) >= 3  # several buckets replayed
    assert len({len(r.tokens) for r in ours}) > 5  # sequences ended at many lengths
    assert ours == eager.generate(reqs, params)  # tokens, log-probs, finish, proofs
    assert graphed.generate(reqs, params) == ours  # the graphs replayed in a second call


def test_a_capture_that_fails_falls_back_to_the_same_eager_steps(monkeypatch):
    """An operation that synchronizes cannot be captured: the engine says why and runs the
    same steps eagerly."""
    from node.engine import graphs
    from node.engine.torch_engine import TorchEngine

    model, reqs, params, eos = _graph_run()
    expected = TorchEngine(model, eos_token_ids=eos, max_batch=16, graphs=False).generate(
        reqs, params
    )
    original = graphs.StaticDecoder.sample_fn

    def syncing(self, b):
        out = original(self, b)
        out[0, 0].item()  # a host synchronization: illegal while capturing
        return out

    monkeypatch.setattr(graphs.StaticDecoder, "sample_fn", syncing)
    engine = TorchEngine(model, eos_token_ids=eos, max_batch=16)
    assert engine.generate(reqs, params) == expected
    assert engine.graph_failure is not None and not engine.decoder.graphs.enabled


def test_graphs_follow_in_place_weight_updates():
    """Graphs hold addresses: weights copied in place (a new policy version) must not
    leave them replaying the old fused projections."""
    from node.engine.torch_engine import TorchEngine

    model, reqs, params, eos = _graph_run()
    engine = TorchEngine(model, eos_token_ids=eos, max_batch=16)
    before = engine.generate(reqs, params)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.01)
    after = engine.generate(reqs, params)
    assert [r.tokens for r in after] != [r.tokens for r in before]
    fresh = TorchEngine(model, eos_token_ids=eos, max_batch=16, graphs=False)
    assert after == fresh.generate(reqs, params)


@pytest.mark.parametrize("in_flight", [32, 1])
def test_honest_1_1b_shape_is_accepted_on_gpu_and_cpu_validators(in_flight):
    """TinyLlama's shape, random init, bf16 on the GPU: honest rollouts at 32 and 1 in
    flight accepted by a bf16 GPU validator and an fp32 CPU validator, as batches of 16."""
    from crypto.verdict import GPU_BF16, check_batch
    from node.engine.calibration import claim_of, random_prompts, recompute_all
    from node.engine.torch_engine import TorchEngine

    recipe, model = _shape_1_1b()
    count = 32 if in_flight == 32 else 8
    engine = TorchEngine(model, eos_token_ids=frozenset({2}), max_batch=in_flight)
    params = SamplingParams(max_new_tokens=128, stop_at_eos=False)
    prompts_ = random_prompts(count, recipe["config"]["vocab_size"])
    results = engine.generate([GenRequest(p, 70000 + i) for i, p in enumerate(prompts_)], params)
    claims = [claim_of(r, vars(params)) for r in results]
    config = GPU_BF16.for_layers(22)
    for validator in ("cuda/bf16", "cpu/fp32"):
        if validator == "cpu/fp32":
            model = model.float().cpu()  # in place: the GPU copy is not needed any more
        for i in range(0, count, 16):
            part = results[i : i + 16]
            rec = recompute_all(model, [r.prompt for r in part], [r.tokens for r in part])
            verdict = check_batch(claims[i : i + 16], rec, eos_token_id=2, config=config)
            assert verdict.passed, (validator, verdict.reason)
            assert verdict.margin < 0.5, validator


def test_an_int8_1_1b_worker_is_rejected_on_gpu():
    from crypto.verdict import GPU_BF16, check_batch
    from node.engine.calibration import claim_of, int8_weights, random_prompts, recompute_all
    from node.engine.torch_engine import TorchEngine

    recipe, model = _shape_1_1b()
    engine = TorchEngine(int8_weights(model), eos_token_ids=frozenset({2}), max_batch=16)
    params = SamplingParams(max_new_tokens=128, stop_at_eos=False)
    prompts_ = random_prompts(16, recipe["config"]["vocab_size"])
    results = engine.generate([GenRequest(p, 70000 + i) for i, p in enumerate(prompts_)], params)
    rec = recompute_all(model, [r.prompt for r in results], [r.tokens for r in results])
    verdict = check_batch(
        [claim_of(r, vars(params)) for r in results],
        rec,
        eos_token_id=2,
        config=GPU_BF16.for_layers(22),
    )
    assert not verdict.passed


def test_other_weights_are_made_on_the_gpu(tiny_model_dir):
    """The devnet's cheater on an H200 failed every other_weights batch: a CPU draw times
    a CUDA scalar tensor ("Expected all tensors to be on the same device")."""
    from tests.helpers.cheating.maker import alter_weights

    model = load_model(tiny_model_dir, device="cuda").model
    before = [p.detach().clone() for p in model.parameters()]
    alter_weights("other_weights", model)
    after = list(model.parameters())
    assert all(p.device.type == "cuda" for p in after)
    assert all(not torch.equal(a, b) for a, b in zip(before, after, strict=True) if a.numel() > 1)


def test_the_trainer_steps_in_bf16_autocast_on_the_gpu(tiny_model_dir):
    from node.training.fsdp_check import fixed_samples
    from node.training.grpo import GRPOConfig
    from node.training.policy import Policy

    policy = Policy(tiny_model_dir, GRPOConfig(lr=1e-3), device="cuda")
    assert policy.bf16
    seen = []  # the LM head's output dtype in the step's forwards: bf16 under autocast
    policy.model.lm_head.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    before = [p.detach().clone() for p in policy.model.parameters()]
    stats = policy.train_step(fixed_samples(policy), 1.0)
    assert seen and set(seen) == {torch.bfloat16}
    assert stats["grad_norm"] > 0
    after = list(policy.model.parameters())
    assert all(p.dtype == torch.float32 for p in after)  # fp32 master weights
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
