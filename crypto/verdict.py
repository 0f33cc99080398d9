"""One rollout's verification verdict: TOPLOC, sampling and termination together.

The validator recomputes, with one prefill pass over prompt + output[:-1], the hidden
states the worker committed to and the logits that chose every output token, then calls
``check_rollout``. A rollout passes only if every TOPLOC chunk passes, every token is one
the seeded noise picks, and the ending is legitimate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from crypto.sampling import SamplingCheck, SamplingResult, check_sampling, check_termination
from crypto.toploc import DEFAULT_CHUNK, DEFAULT_TOPK, ProofResult, Thresholds, verify_proofs


@dataclass(frozen=True)
class RolloutClaim:
    """What the worker says it did for one sequence."""

    tokens: list[int]
    proofs: list[bytes]
    seed: int
    finish_reason: str  # "stop" (EOS) or "length"
    max_new_tokens: int
    temperature: float
    top_p: float = 1.0


@dataclass(frozen=True)
class VerifyConfig:
    thresholds: Thresholds = field(default_factory=Thresholds)
    sampling: SamplingCheck = field(default_factory=SamplingCheck)
    chunk_size: int = DEFAULT_CHUNK
    topk: int = DEFAULT_TOPK


@dataclass(frozen=True)
class RolloutVerdict:
    toploc: list[ProofResult]
    sampling: SamplingResult
    termination_ok: bool

    @property
    def toploc_ok(self) -> bool:
        return bool(self.toploc) and all(r.passed for r in self.toploc)

    @property
    def passed(self) -> bool:
        return self.toploc_ok and self.sampling.passed and self.termination_ok

    @property
    def reason(self) -> str:
        if not self.toploc_ok:
            return "toploc"
        if not self.sampling.passed:
            return "sampling"
        if not self.termination_ok:
            return "termination"
        return "ok"


def check_rollout(
    claim: RolloutClaim,
    activations: list[torch.Tensor],
    logits: torch.Tensor,
    *,
    eos_token_id: int,
    config: VerifyConfig | None = None,
) -> RolloutVerdict:
    """``activations`` and ``logits`` [n, V] are the validator's own recomputation."""
    cfg = config or VerifyConfig()
    if not claim.tokens or logits.shape[0] != len(claim.tokens):
        raise ValueError("logits must have one row per output token")
    toploc = verify_proofs(
        activations,
        claim.proofs,
        chunk_size=cfg.chunk_size,
        topk=cfg.topk,
        thresholds=cfg.thresholds,
    )
    sampling = check_sampling(
        logits,
        torch.tensor(claim.tokens),
        claim.seed,
        temperature=claim.temperature,
        top_p=claim.top_p,
        check=cfg.sampling,
    )
    termination = check_termination(
        finish_reason=claim.finish_reason,
        num_tokens=len(claim.tokens),
        max_new_tokens=claim.max_new_tokens,
        last_token=claim.tokens[-1],
        eos_token_id=eos_token_id,
        eos_logits=logits[-1],
        temperature=claim.temperature,
        check=cfg.sampling,
    )
    return RolloutVerdict(toploc, sampling, termination)
