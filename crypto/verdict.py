"""The verdict on a rollout batch: TOPLOC, sampling and termination, judged per batch.

Where the rollout came from: a worker generated it (``node/engine/``) and shipped it in a
signed ``RolloutBatch`` (``protocol/rollouts.py``); the validator (``node/roles/services/validator.py``)
fetched it. The validator's batch checker (``node/roles/children/checking.py``) recomputes, with one
prefill pass per rollout over prompt + output[:-1], the hidden states the worker committed
to and the logits that chose every output token, on any device and in bf16 or fp32, then
calls ``check_batch`` (or ``check_rollout`` for one sequence). Where it goes next: the
validator posts accept or reject for the batch's work key on-chain (``ledger/client.py``).
A ``BatchVerdict`` is the evidence of this proof check; the decision the validator posts
is a ``node.roles.decisions.work.Verdict``, made from it and from the cheaper checks.

The batch is the unit that is submitted, paid and slashed, so it is the unit judged:

- **Structural evidence** rejects outright, whichever rollout it is in: a TOPLOC chunk
  beyond the profile's per-chunk thresholds (other weights, other prompt, edited states),
  a token no honest noise explains (outside the nucleus widened by ``forged_factor · κ``
  units, or a gap that large against the tokens surely in it: an edited or forced token),
  an implausible ending.
- **Statistical evidence** is pooled: the sampling statistic S = Σ min(z, κ) of every
  position of every rollout against the bound that honest noise exceeds with probability
  below the profile's ``false_slash`` (``crypto.sampling.honest_bound``). Honest near-ties
  (a few positions whose gap is a fraction of a unit) never sink a batch; a systematic
  substitution (another checkpoint, a cheaper quantized model) moves many positions by
  several units and is rejected with overwhelming confidence.
- **Boundary events are counted**: below top-p 1, a token near the nucleus boundary that
  the noise moved across it changes an honest draw. The batch's count of such events is
  judged against the count honest noise reaches with probability below the budget
  (``crypto.sampling.count_bound``); the statistic and the count share ``false_slash``.

A profile (``PROFILES``) fixes the precision the run's workers and validators compute in
and the honest-noise model measured for it (``intellect-node model calibrate`` measures a
model on one's own hardware). SPEC §18.1 derives the rule and the designed false-slash
probability.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from crypto.sampling import (
    SamplingCheck,
    SamplingResult,
    budgets,
    check_sampling_many,
    check_termination,
    count_bound,
    honest_bound,
)
from crypto.toploc import (
    DEFAULT_CHUNK,
    DEFAULT_TOPK,
    PAPER,
    STRICT_FP32,
    ProofResult,
    Thresholds,
    verify_proofs_batch,
)


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
    """A verification profile: per-chunk TOPLOC thresholds and the honest-noise model."""

    thresholds: Thresholds = field(default_factory=Thresholds)
    sampling: SamplingCheck = field(default_factory=SamplingCheck)
    chunk_size: int = DEFAULT_CHUNK
    topk: int = DEFAULT_TOPK
    name: str = "custom"
    # cheaper models a batch must not be nearer to than to the policy (``crypto.substitution``;
    # the validator builds each from the policy: ``node.rollouts.suspects``)
    suspects: tuple[str, ...] = ()

    def for_layers(self, layers: int) -> VerifyConfig:
        """This profile for a model with ``layers`` residual layers (the noise unit grows
        like their square root)."""
        return replace(self, sampling=replace(self.sampling, layers=layers))


# Workers in bf16 (GPUs), validators in bf16 or fp32 on a GPU or a CPU. Measured (SPEC
# §18.1): honest score-difference RMS 0.45 units and largest gap 1.13 units on the H200
# fixture (4 layers) and on a 22-layer 1.1B model (CPU bf16 worker), the H200's 1.1B
# largest gap about 1.04 units; TOPLOC chunks at most 1.93 mantissa units on average
# against the paper's 10. The profile keeps 1.33x the RMS and 1.55x the largest gap.
# A substitute of int8 weights stays inside those bounds on a trained policy (SPEC §18.2):
# the substitution test looks for it.
GPU_BF16 = VerifyConfig(
    PAPER, SamplingCheck(noise_rms=0.6, noise_max=1.75), name="gpu-bf16", suspects=("int8",)
)
# The TOPLOC paper's per-chunk thresholds with the same noise model.
PAPER_PROFILE = replace(GPU_BF16, name="paper")
# Workers and validators both in fp32 (the CPU engine): recomputation reproduces the
# bf16-rounded states exactly and logits to ~1e-6 relative, so far smaller deviations are
# evidence of substitution (a bf16 model claimed as fp32, one optimizer step).
FP32 = VerifyConfig(STRICT_FP32, SamplingCheck(noise_rms=0.1, noise_max=0.5), name="strict-fp32")
PROFILES: dict[str, VerifyConfig] = {p.name: p for p in (GPU_BF16, PAPER_PROFILE, FP32)}
DEFAULT_PROFILE = GPU_BF16.name


def profile(name: str) -> VerifyConfig:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(
            f"unknown verification profile {name!r}; choose from {', '.join(PROFILES)}"
        ) from None


def proof_parameters(name: str) -> tuple[int, int]:
    """The TOPLOC chunk size and top-k profile ``name`` checks: the only ones a batch of a
    run under it may be proven with."""
    p = profile(name)
    return p.chunk_size, p.topk


@dataclass(frozen=True)
class RolloutVerdict:
    toploc: list[ProofResult]
    sampling: SamplingResult
    termination_ok: bool

    @property
    def toploc_ok(self) -> bool:
        return bool(self.toploc) and all(r.passed for r in self.toploc)

    @property
    def structural_ok(self) -> bool:
        """No evidence that rejects outright (everything but the pooled statistic)."""
        return self.toploc_ok and not self.sampling.bad_positions and self.termination_ok

    @property
    def passed(self) -> bool:
        """This rollout alone, judged as a batch of one."""
        return self.structural_ok and self.sampling.passed

    @property
    def reason(self) -> str:
        if not self.toploc_ok:
            return "toploc"
        if not self.sampling.passed:
            return "sampling"
        if not self.termination_ok:
            return "termination"
        return "ok"

    def describe(self) -> str:
        """Why this rollout looks wrong, in one line ("" when nothing does)."""
        parts = []
        failed = [i for i, r in enumerate(self.toploc) if not r.passed]
        if failed or not self.toploc:
            worst = max(self.toploc, key=lambda r: r.mant_err_mean, default=None)
            parts.append(
                f"toploc chunks {failed} fail"
                + (
                    f" (worst: {worst.exp_mismatches} exponent mismatches,"
                    f" mean mantissa error {worst.mant_err_mean:.2f})"
                    if worst
                    else ""
                )
            )
        s = self.sampling
        if s.bad_positions:
            parts.append(
                f"tokens not drawn by the seeded sampler at positions {s.bad_positions[:8]}"
            )
        if s.suspect_positions:
            parts.append(f"gaps beyond the noise bound at positions {s.suspect_positions[:8]}")
        if s.boundary_positions:
            parts.append(f"nucleus-boundary events at positions {s.boundary_positions[:8]}")
        if not self.termination_ok:
            parts.append("implausible ending")
        return "; ".join(parts)


def check_rollout(
    claim: RolloutClaim,
    activations: list[torch.Tensor],
    logits: torch.Tensor,
    *,
    eos_token_id: int,
    config: VerifyConfig | None = None,
    rollouts: int = 1,
) -> RolloutVerdict:
    """``activations`` and ``logits`` [n, V] are the validator's own recomputation, on any
    device and in any float dtype; ``rollouts``: the size of the batch it is judged in."""
    cfg = config or GPU_BF16
    _check_shape(claim, logits)
    (toploc,) = _toploc([claim], [activations], cfg)
    (sampling,) = _sampling([claim], [logits], cfg)
    return _judge(
        claim, toploc, logits, sampling, eos_token_id=eos_token_id, cfg=cfg, rollouts=rollouts
    )


def _check_shape(claim: RolloutClaim, logits: torch.Tensor) -> None:
    if not claim.tokens or logits.shape[0] != len(claim.tokens):
        raise ValueError("logits must have one row per output token")


def _toploc(
    claims: list[RolloutClaim], activations: list[list[torch.Tensor]], cfg: VerifyConfig
) -> list[list[ProofResult]]:
    """The TOPLOC results of every claim's chunks, all chunks checked together."""
    return verify_proofs_batch(
        activations,
        [c.proofs for c in claims],
        chunk_size=cfg.chunk_size,
        topk=cfg.topk,
        thresholds=cfg.thresholds,
    )


def _sampling(
    claims: list[RolloutClaim], logits: list[torch.Tensor], cfg: VerifyConfig
) -> list[SamplingResult]:
    """Every claim's sampling evidence, the claims sampled alike judged together
    (``check_sampling_many``)."""
    out: dict[int, SamplingResult] = {}
    alike: dict[tuple[float, float], list[int]] = {}
    for i, c in enumerate(claims):
        alike.setdefault((c.temperature, c.top_p), []).append(i)
    for (temperature, top_p), members in alike.items():
        rows = [(logits[i], claims[i].tokens, claims[i].seed) for i in members]
        results = check_sampling_many(
            rows, temperature=temperature, top_p=top_p, check=cfg.sampling
        )
        out.update(zip(members, results, strict=True))
    return [out[i] for i in range(len(claims))]


def _judge(
    claim: RolloutClaim,
    toploc: list[ProofResult],
    logits: torch.Tensor,
    sampling: SamplingResult,
    *,
    eos_token_id: int,
    cfg: VerifyConfig,
    rollouts: int,
) -> RolloutVerdict:
    termination = check_termination(
        finish_reason=claim.finish_reason,
        num_tokens=len(claim.tokens),
        max_new_tokens=claim.max_new_tokens,
        last_token=claim.tokens[-1],
        eos_token_id=eos_token_id,
        eos_logits=logits[-1],
        temperature=claim.temperature,
        check=cfg.sampling,
        rollouts=rollouts,
    )
    return RolloutVerdict(toploc, sampling, termination)


@dataclass(frozen=True)
class BatchVerdict:
    """The verdict on a batch. ``statistic`` / ``bound`` is the pooled sampling evidence
    (``margin`` = their ratio: above 1 rejects); ``boundary`` / ``boundary_bound`` the
    count of nucleus-boundary events against what honest noise reaches (above rejects);
    ``rollouts`` keeps each rollout's detail."""

    passed: bool
    reason: str
    rollouts: list[RolloutVerdict]
    statistic: float
    bound: float
    boundary: int = 0
    boundary_bound: float = 0.0
    # the suspects tested, when they were (``crypto.substitution.SubstitutionResult``s)
    substitution: tuple[Any, ...] = ()

    @property
    def margin(self) -> float:
        return self.statistic / self.bound if self.bound > 0 else 0.0

    @property
    def flagged(self) -> list[int]:
        """Rollouts with any evidence against them (structural, suspect gaps, or failing
        the rule on their own)."""
        return [
            i
            for i, v in enumerate(self.rollouts)
            if not v.passed or v.sampling.suspect_positions or v.sampling.boundary_positions
        ]


def check_batch(
    claims: list[RolloutClaim],
    recomputed: list[tuple[list[torch.Tensor], torch.Tensor]],
    *,
    eos_token_id: int,
    config: VerifyConfig | None = None,
) -> BatchVerdict:
    """Judge a whole batch: ``recomputed[i]`` is (activations, logits) for ``claims[i]``."""
    cfg = config or GPU_BF16
    if not claims or len(claims) != len(recomputed):
        raise ValueError("need one recomputation per claim, and at least one claim")
    for c, (_, logits) in zip(claims, recomputed, strict=True):
        _check_shape(c, logits)
    toploc = _toploc(claims, [acts for acts, _ in recomputed], cfg)
    sampled = _sampling(claims, [logits for _, logits in recomputed], cfg)
    verdicts = [
        _judge(c, t, logits, s, eos_token_id=eos_token_id, cfg=cfg, rollouts=len(claims))
        for c, t, (_, logits), s in zip(claims, toploc, recomputed, sampled, strict=True)
    ]
    alpha_s, alpha_b = budgets(
        cfg.sampling, min(c.temperature for c in claims), min(c.top_p for c in claims)
    )
    statistic = sum(v.sampling.excess for v in verdicts)
    bound = honest_bound(
        sum(v.sampling.expected for v in verdicts),
        sum(v.sampling.variance for v in verdicts),
        cfg.sampling,
        alpha_s,
    )
    events = sum(len(v.sampling.boundary_positions) for v in verdicts)
    expected_events = sum(v.sampling.boundary_expected for v in verdicts)
    events_bound = count_bound(expected_events, alpha_b)
    evidence = (statistic, bound, events, events_bound)
    for kind, bad in (
        ("toploc", [i for i, v in enumerate(verdicts) if not v.toploc_ok]),
        ("sampling", [i for i, v in enumerate(verdicts) if v.sampling.bad_positions]),
        ("termination", [i for i, v in enumerate(verdicts) if not v.termination_ok]),
    ):
        if bad:
            first = verdicts[bad[0]]
            return BatchVerdict(
                False,
                f"{kind}: rollouts {bad[:8]} (rollout {bad[0]}: {first.describe()})",
                verdicts,
                *evidence,
            )
    if statistic > bound:
        worst = sorted(range(len(verdicts)), key=lambda i: -verdicts[i].sampling.excess)[:4]
        return BatchVerdict(
            False,
            f"sampling: statistic {statistic:.1f} above the honest bound {bound:.1f} "
            f"(profile {cfg.name}, false-slash {cfg.sampling.false_slash:g}); "
            f"largest contributions from rollouts {worst}",
            verdicts,
            *evidence,
        )
    if events > events_bound:
        many = [i for i, v in enumerate(verdicts) if v.sampling.boundary_positions][:8]
        return BatchVerdict(
            False,
            f"sampling: {events} nucleus-boundary events above the honest bound "
            f"{events_bound:.1f} (expected at most {expected_events:.2f}; profile {cfg.name}, "
            f"false-slash {cfg.sampling.false_slash:g}); in rollouts {many}",
            verdicts,
            *evidence,
        )
    return BatchVerdict(True, "ok", verdicts, *evidence)
