"""The substitution test: is a batch nearer a cheaper model than the policy?

A worker that generates with a cheaper copy of the policy (its weights quantized to int8,
say) commits to hidden states that differ from the policy's by less than the per-chunk
TOPLOC thresholds allow, and on a trained, peaked policy it flips too few tokens for the
sampling statistic to see (SPEC §11.2 has the measurements). What it cannot hide is which
model its states are nearer to. The validator recomputes the batch with the policy (the
reference) and with the named suspect, built from the policy as a cheater would build it,
in the same precision, and reads the worker's committed values (its TOPLOC polynomials)
at the entries both recomputations put in their top-k: at each such entry whose sign and
exponent all three share, the mantissa distance to the reference minus the distance to
the suspect. Honest states are nearer the reference, a substitute's nearer the suspect.

The unit is a position: the differences of its entries summed. The rule is a sign test
over the batch's distinct positions: ``k`` of the ``n`` positions with a non-zero sum are
nearer the suspect; the batch is rejected if their mean favours the suspect and
``P(Binomial(n, 1/2) >= k) <= alpha``. An honest position is at least as likely nearer
the reference as the suspect, so honest work is rejected with probability at most
``alpha`` whatever the hardware's noise (positions taken as independent: each one's
rounding noise is its own). A position is counted once per distinct computation: by
the tokens up to it (a group's samples share their prompt; peaked samples repeat).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from crypto.toploc import _decode, _evaluate, _top_entries, chunks_of
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
    for prompt, claim, ours, theirs in zip(prompts, claims, reference, suspected, strict=True):
        keys = position_keys(prompt, claim.tokens)
        for position, diff in _position_diffs(claim.proofs, ours, theirs, config):
            if position < len(keys):
                sums.setdefault(keys[position], diff)
    diffs = [d for d in sums.values() if d != 0]
    nearer = sum(d > 0 for d in diffs)
    mean = sum(diffs) / len(diffs) if diffs else 0.0
    p = sign_tail(nearer, len(diffs))
    return SubstitutionResult(suspect, nearer, len(diffs), mean, p, mean > 0 and p <= alpha)


def _position_diffs(
    proofs: Sequence[bytes],
    ours: list[torch.Tensor],
    theirs: list[torch.Tensor],
    config: VerifyConfig,
) -> list[tuple[int, float]]:
    """(position, summed distance to ours minus distance to theirs) for every position of
    one rollout with a shared entry."""
    size, topk = config.chunk_size, config.topk
    mine, other = chunks_of(ours, size, False), chunks_of(theirs, size, False)
    a, b = _top_entries(mine, topk), _top_entries(other, topk)
    out: list[tuple[int, float]] = []
    first = 0  # the chunk's first position
    for n, chunk in enumerate(mine):
        rows, width = chunk.shape[0], chunk.shape[-1]
        decoded = _decode(proofs[n], topk) if n < len(proofs) else None
        if decoded is not None:
            out.extend(_chunk_diffs(decoded, a[n], b[n], width, first))
        first += rows
    return out


def _chunk_diffs(
    decoded: tuple[int, np.ndarray],
    ours: tuple[np.ndarray, np.ndarray],
    theirs: tuple[np.ndarray, np.ndarray],
    width: int,
    first: int,
) -> list[tuple[int, float]]:
    m, coeffs = decoded
    common, i, j = np.intersect1d(ours[0], theirs[0], return_indices=True)
    if not len(common):
        return []
    worker = _evaluate(coeffs[None, :], (common % m)[None, :])[0]
    mine, other = ours[1][i], theirs[1][j]
    same = ((worker >> 7) == (mine >> 7)) & ((worker >> 7) == (other >> 7))
    diff = np.abs((worker & 0x7F) - (mine & 0x7F)) - np.abs((worker & 0x7F) - (other & 0x7F))
    rows = common // width
    out: list[tuple[int, float]] = []
    for row in np.unique(rows[same]):
        out.append((first + int(row), float(diff[same & (rows == row)].sum())))
    return out
