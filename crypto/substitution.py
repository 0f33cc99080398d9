"""The substitution test: is a batch nearer a cheaper model than the policy?

A worker that generates with a cheaper copy of the policy (its weights quantized to int8,
say) commits to hidden states that differ from the policy's by less than the per-chunk
TOPLOC thresholds allow, and on a trained, peaked policy it flips too few tokens for the
sampling statistic to see (SPEC §18.2 has the measurements). What it cannot hide is which
model its states are nearer to. The validator recomputes the batch with the policy (the
reference) and with the named suspect, built from the policy as a cheater would build it,
in the same precision, and reads the worker's committed values (its TOPLOC polynomials)
at the entries both recomputations put in their top-k: at each such entry whose sign and
exponent all three share, the mantissa distance to the reference minus the distance to
the suspect. Honest states are nearer the reference, a substitute's nearer the suspect.

The unit is an output position (the prompt is one cheap prefill a cheater can afford to
run with the policy): the differences of its entries summed. The rule is a sign test
over the batch's distinct output positions: ``k`` of the ``n`` positions with a non-zero
sum are nearer the suspect; the batch is rejected if their mean favours the suspect and
``P(Binomial(n, 1/2) >= k) <= alpha``. It assumes an honest position is at least as
likely nearer the reference as the suspect (measured: 0-44% of them were nearer), and
positions independent (each one's rounding noise is its own; an approximation, since a
rollout's positions share their history). A position is counted once per distinct
computation: by the tokens up to it (peaked samples repeat).

What it does not catch (SPEC §18.2): a worker that also blurs its commitments with noise
within the honest cross-hardware level hides the int8 shift, which is smaller than that
noise; and a suspect it does not name.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from crypto.toploc import _decode, _evaluate, _top_entries, chunks_of, mantissa_distance
from crypto.verdict import RolloutClaim, VerifyConfig


@dataclass(frozen=True)
class SubstitutionResult:
    suspect: str  # the suspect's name (``VerifyConfig.suspects``), and the precision
    nearer: int  # distinct positions nearer the suspect than the reference
    positions: int  # distinct positions whose two distances differ
    mean_diff: float  # mean of (distance to reference - to suspect): > 0 favours the suspect
    p_value: float  # P(Binomial(positions, 1/2) >= nearer)
    rejected: bool

    def describe(self) -> str:
        return (
            f"nearer {self.suspect} than the policy at {self.nearer} of {self.positions} "
            f"positions (p {self.p_value:.2g})"
        )


def sign_tail(k: int, n: int) -> float:
    """P(Binomial(n, 1/2) >= k), summed in log space (exact to float precision)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    log_half = n * math.log(0.5)
    terms = [
        math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + log_half
        for i in range(k, n + 1)
    ]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def position_keys(prompt: Sequence[int], tokens: Sequence[int]) -> list[bytes]:
    """What the state at each recomputed position (prompt + tokens[:-1]) was computed
    from: a digest of the tokens up to and including it, chained."""
    keys: list[bytes] = []
    h = hashlib.blake2b(b"intellect-node/position", digest_size=16)
    for t in [*prompt, *tokens[:-1]]:
        h.update(int(t).to_bytes(4, "little"))
        keys.append(h.copy().digest())
    return keys


def substitution_test(
    suspect: str,
    prompts: Sequence[Sequence[int]],
    claims: Sequence[RolloutClaim],
    reference: list[list[torch.Tensor]],
    suspected: list[list[torch.Tensor]],
    config: VerifyConfig,
    alpha: float,
) -> SubstitutionResult:
    """The test of ``claims`` (with their ``prompts``) against the activations of the
    reference and of the suspect, one list per claim as ``recompute_batch`` gives them."""
    sums: dict[bytes, float] = {}
    diffs_of = _position_diffs(claims, reference, suspected, config)
    for prompt, claim, diffs in zip(prompts, claims, diffs_of, strict=True):
        keys = position_keys(prompt, claim.tokens)
        for position, diff in diffs:
            sums.setdefault(keys[position], diff)
    differing = [d for d in sums.values() if d != 0]
    nearer = sum(d > 0 for d in differing)
    mean = sum(differing) / len(differing) if differing else 0.0
    p = sign_tail(nearer, len(differing))
    return SubstitutionResult(suspect, nearer, len(differing), mean, p, mean > 0 and p <= alpha)


@dataclass
class _Shared:
    """One chunk's entries in both recomputations' top-k, and the worker's proof."""

    claim: int
    first: int  # the chunk's first position
    width: int  # its hidden size (flat index // width = row)
    modulus: int
    coeffs: np.ndarray
    index: np.ndarray  # the shared flat indices
    ours: np.ndarray  # their bf16 patterns in the reference's recomputation
    theirs: np.ndarray  # and in the suspect's


def _position_diffs(
    claims: Sequence[RolloutClaim],
    reference: list[list[torch.Tensor]],
    suspected: list[list[torch.Tensor]],
    config: VerifyConfig,
) -> list[list[tuple[int, float]]]:
    """Per claim, (position, summed distance to the reference minus distance to the
    suspect) for every position with a shared entry whose sign and exponent agree: every
    chunk of the batch selected together, every proof evaluated at once."""
    size, topk = config.chunk_size, config.topk
    # the output's chunks only: the prompt's are one cheap prefill, which a cheater can
    # afford to run with the policy before decoding with the suspect
    mine = [chunks_of(acts, size, False)[1:] for acts in reference]
    other = [chunks_of(acts, size, False)[1:] for acts in suspected]
    a = _top_entries([c for chunks in mine for c in chunks], topk)
    b = _top_entries([c for chunks in other for c in chunks], topk)
    shared: list[_Shared] = []
    n = 0
    for number, (claim, chunks, acts) in enumerate(zip(claims, mine, reference, strict=True)):
        first = acts[0].shape[0]  # the prompt's length: the first output position
        for c, chunk in enumerate(chunks, start=1):
            decoded = _decode(claim.proofs[c], topk) if c < len(claim.proofs) else None
            common, i, j = np.intersect1d(a[n][0], b[n][0], return_indices=True)
            if decoded is not None and len(common):
                m, coeffs = decoded
                width = chunk.shape[-1]
                shared.append(
                    _Shared(number, first, width, m, coeffs, common, a[n][1][i], b[n][1][j])
                )
            first += chunk.shape[0]
            n += 1
    out: list[list[tuple[int, float]]] = [[] for _ in claims]
    if not shared:
        return out
    longest = max(len(s.index) for s in shared)
    xs = np.zeros((len(shared), longest), dtype=np.int64)
    for row, s in enumerate(shared):
        xs[row, : len(s.index)] = s.index % s.modulus
    worker = _evaluate(np.stack([s.coeffs for s in shared]), xs)
    for row, s in enumerate(shared):
        out[s.claim].extend(_rows(s, worker[row, : len(s.index)]))
    return out


def _rows(s: _Shared, worker: np.ndarray) -> list[tuple[int, float]]:
    same_ours, to_ours = mantissa_distance(worker, s.ours)
    same_theirs, to_theirs = mantissa_distance(worker, s.theirs)
    same = same_ours & same_theirs
    # symmetric in the two recomputations, so their selection into the top-k (which
    # inflates both) favours neither
    score = to_ours - to_theirs
    rows = s.index[same] // s.width
    if not len(rows):
        return []
    sums = np.bincount(rows, weights=score[same])
    present = np.bincount(rows) > 0
    return [(s.first + int(r), float(sums[r])) for r in np.flatnonzero(present)]
