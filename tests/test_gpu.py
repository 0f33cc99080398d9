"""GPU checks (marker ``gpu``; never in CI): run with ``pytest -m gpu tests/test_gpu.py`` on
a machine with an NVIDIA GPU (and vLLM for the last test). They fail, not skip, without one."""

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
