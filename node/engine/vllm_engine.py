"""vLLM behind the ``Engine`` interface (NVIDIA GPUs; ``pip install 'intellect-node[gpu]'``).

Nothing here imports vLLM until a ``VLLMEngine`` is built, so CPU machines never need it.

Sampling stays verifiable: a per-request logits processor (vLLM's
``AdapterLogitsProcessor``, V1 model runner) draws each token with the same seeded
Gumbel-max as the torch engine (``crypto.sampling``), records the token and its
log-probability under ``log_softmax(logits / T)`` by position, and leaves vLLM only that
token to pick (every other logit ``-inf``, greedy). The recorded picks are the result;
vLLM's own token list must agree with them. The engine core runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the recorded log-probabilities are readable here.

TOPLOC proofs: the hidden states are recomputed by one batched prefill pass of the same
weights loaded with transformers on the same GPU (``recompute``, the validator's own
computation), not captured inside vLLM's decode. That costs one prefill (about a
sixteenth of generation) and a second copy of the weights; hooking vLLM's flattened
batch layout, which differs between vLLM's model runners, could not be built and checked
without a GPU. Status: written against vLLM's documented API and untested on a device.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

import torch

from crypto.sampling import gumbel_noise_rows, sample_tokens
from crypto.toploc import build_proofs_batch
from node.engine.base import GenRequest, GenResult, SamplingParams
from node.engine.continuous import chosen_logprobs
from node.engine.torch_engine import recompute

# request key -> {position: (token, log-prob)}: what the processor picked, position by
# position (a position computed twice, e.g. after a preemption, is overwritten)
_PICKS: dict[str, dict[int, tuple[int, float]]] = {}
_KEYS = itertools.count()


def vllm_available() -> bool:
    """vLLM importable and a CUDA device present (what automatic selection needs)."""
    if not torch.cuda.is_available():
        return False
    try:
        import importlib.util

        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


class _Picker:
    """Per-request processor: seeded Gumbel-max choice, logprob recorded, rest masked."""

    def __init__(self, seed: int, temperature: float, top_p: float, key: str) -> None:
        self.seed, self.temperature, self.top_p, self.key = seed, temperature, top_p, key

    def __call__(self, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        row = logits.float()[None]
        noise = gumbel_noise_rows([self.seed], [len(output_ids)], row.shape[-1], row.device)
        tok = sample_tokens(row, noise, self.temperature, self.top_p)
        lp = float(chosen_logprobs(row, tok, self.temperature)[0])
        _PICKS.setdefault(self.key, {})[len(output_ids)] = (int(tok[0]), lp)
        forced = torch.full_like(logits, -float("inf"))
        forced[int(tok[0])] = 0.0
        return forced


def _processor_class() -> type:
    from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

    class GumbelProcessor(AdapterLogitsProcessor):  # type: ignore[misc]
        def is_argmax_invariant(self) -> bool:
            return False

        def new_req_logits_processor(self, params: Any) -> _Picker | None:
            extra = params.extra_args or {}
            if "intellect_seed" not in extra:
                return None
            return _Picker(
                int(extra["intellect_seed"]),
                float(extra["intellect_temperature"]),
                float(extra["intellect_top_p"]),
                str(extra["intellect_key"]),
            )

    return GumbelProcessor


def picked(
    picks: dict[int, tuple[int, float]],
    vllm_tokens: list[int],
    eos_token_ids: frozenset[int],
    params: SamplingParams,
) -> tuple[list[int], list[float], str]:
    """The sequence the processor drew (tokens, log-probs, finish reason), checked against
    what vLLM returned. vLLM may or may not list a stop token; the picks always hold it."""
    tokens, logprobs = [], []
    for position in range(len(picks)):
        if position not in picks:
            raise RuntimeError(f"vLLM skipped the sampler at position {position}")
        tok, lp = picks[position]
        tokens.append(tok)
        logprobs.append(lp)
        if params.stop_at_eos and tok in eos_token_ids:
            break
    tokens, logprobs = tokens[: params.max_new_tokens], logprobs[: params.max_new_tokens]
    if tokens[: len(vllm_tokens)] != vllm_tokens:
        raise RuntimeError("vLLM's tokens differ from the ones the verifiable sampler chose")
    stop = params.stop_at_eos and bool(tokens) and tokens[-1] in eos_token_ids
    return tokens, logprobs, "stop" if stop else "length"


class VLLMEngine:
    name = "vllm"

    def __init__(
        self,
        model_dir: str,
        *,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.6,
        max_batch: int = 256,
    ) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
        from vllm import LLM

        from node.engine.models import load_model

        self.llm = LLM(
            model=model_dir,
            dtype=dtype,
            seed=0,
            max_num_seqs=max_batch,
            gpu_memory_utilization=gpu_memory_utilization,
            logits_processors=[_processor_class()],
        )
        self.loaded = load_model(model_dir, dtype=dtype, device="cuda")
        self.eos_token_ids = self.loaded.eos_token_ids
        self.vocab_size = int(self.loaded.model.get_output_embeddings().weight.shape[0])

    def generate(self, requests: list[GenRequest], params: SamplingParams) -> list[GenResult]:
        from vllm import SamplingParams as VParams
        from vllm.inputs import TokensPrompt

        keys = [f"r{next(_KEYS)}" for _ in requests]
        vparams = [
            VParams(
                temperature=0.0,  # the processor leaves one token; greedy takes it
                max_tokens=params.max_new_tokens,
                ignore_eos=not params.stop_at_eos,
                stop_token_ids=sorted(self.eos_token_ids) if params.stop_at_eos else None,
                extra_args={
                    "intellect_seed": r.seed,
                    "intellect_temperature": params.temperature,
                    "intellect_top_p": params.top_p,
                    "intellect_key": key,
                },
            )
            for r, key in zip(requests, keys, strict=True)
        ]
        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=r.prompt) for r in requests], vparams, use_tqdm=False
        )
        results = []
        for r, key, out in zip(requests, keys, outs, strict=True):
            tokens, logprobs, finish = picked(
                _PICKS.pop(key, {}), list(out.outputs[0].token_ids), self.eos_token_ids, params
            )
            results.append(GenResult(r.prompt, tokens, logprobs, finish, r.seed))
        if params.prove:
            states = [recompute(self.loaded.model, r.prompt, r.tokens)[0] for r in results]
            for res, proofs in zip(
                results,
                build_proofs_batch(states, chunk_size=params.proof_chunk, topk=params.proof_topk),
                strict=True,
            ):
                res.proofs = proofs
        return results
