"""TOPLOC: locality-sensitive proofs of inference (Ong et al., arXiv 2501.16007).

A worker commits to the final hidden states of its generation (the LM head's input, after
the last normalization, in bf16) in 258 bytes per chunk; a validator recomputes them with
one prefill pass and checks the commitment. The scheme:

- Chunks: the prefill's prompt matrix ``[prompt_len, hidden]`` is one chunk (unless
  ``skip_prefill``); then every ``chunk_size`` (32) decode steps, stacked, are one chunk;
  the last may be shorter.
- Per chunk: the top-k (k = 128) entries by absolute value of the flattened bf16 chunk.
  Points ``x = flat_index mod m``, with ``m`` the largest modulus ≤ 65497 for which the k
  residues are distinct; values ``y`` = the entry's bf16 bit pattern (mod 65497; finite
  bf16 patterns are all below it).
- Proof: the polynomial of degree < k through the k points over GF(65497), by Newton
  divided differences, expanded to monomial coefficients. Bytes: ``m`` as u16 big-endian,
  then the k coefficients as u16 big-endian, ascending: 258 bytes for k = 128 (the
  reference implementation's format). A chunk with fewer than k entries uses all of
  them and pads the coefficients with zeros (still 2 + 2k bytes).
- Verification: the validator takes its own top-k indices, evaluates the polynomial at
  ``index mod m`` and compares with its own bf16 values: the number of sign/exponent
  mismatches, and the mean and median absolute mantissa difference over the matches.
  Default thresholds are the paper's: fail if mean > 10, median > 8, or fewer than 90
  of 128 exponents match (scaled for chunks with fewer than 128 entries).

Two bugs of the reference are avoided: the index is always reduced mod ``m`` before
evaluation, and a null or malformed proof (``m = 0``, wrong length, coefficients ≥ p)
fails verification instead of dividing by zero or crashing.

Top-k runs in torch over all chunks of a size at once; the field arithmetic is int64
numpy, vectorized across chunks; the only Python loops run over the k polynomial levels
(each one array operation for all chunks).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch

P = 65497  # prime modulus of the field; also the largest m
DEFAULT_TOPK = 128
DEFAULT_CHUNK = 32
_M_BATCH = 64  # candidate moduli tried per vectorized step


@dataclass(frozen=True)
class Thresholds:
    """When a chunk fails: the paper's defaults, all configurable."""

    max_mant_err_mean: float = 10.0
    max_mant_err_median: float = 8.0
    min_exp_matches: int = 90  # out of DEFAULT_TOPK; scaled for smaller k


# The paper's thresholds, tuned for bf16 inference on GPUs, where honest recomputation
# differs from generation by a few mantissa units.
PAPER = Thresholds()
# For runs whose workers and validators both compute in fp32 (the CPU engine): honest
# recomputation then reproduces the bf16-rounded states exactly in our measurements
# (bench/toploc.py prints the honest error), so far smaller deviations are evidence of
# substitution: a bf16 model claimed as fp32, or weights one optimizer step away.
STRICT_FP32 = Thresholds(max_mant_err_mean=0.2, max_mant_err_median=0.0, min_exp_matches=126)


@dataclass(frozen=True)
class ProofResult:
    exp_mismatches: int
    mant_err_mean: float
    mant_err_median: float
    passed: bool


@cache
def _inverses() -> np.ndarray:
    """Multiplicative inverses mod P of 0..P-1 (0 maps to 0), by Fermat: a^(P-2)."""
    a = np.arange(P, dtype=np.int64)
    result = np.ones_like(a)
    base, e = a.copy(), P - 2
    while e:
        if e & 1:
            result = result * base % P
        base = base * base % P
        e >>= 1
    result[0] = 0
    return result


def warm_up() -> None:
    """Make this process's table of inverses (a few milliseconds, once) before a proof
    is waited for."""
    _inverses()


def chunks_of(
    activations: list[torch.Tensor], chunk_size: int, skip_prefill: bool
) -> list[torch.Tensor]:
    """Split ``[prefill [L, H]] + decode states`` into the chunks that are proven.

    Decode states are one ``[H]`` tensor per step, or ``[k, H]`` blocks of k steps (an
    engine that keeps them in one buffer passes its rows without splitting them).
    """
    if chunk_size < 1:
        raise ValueError("chunk_size must be >= 1")
    out: list[torch.Tensor] = []
    decode = list(activations)
    if not skip_prefill:
        if not decode:
            raise ValueError("activations must start with the prefill matrix")
        prefill = decode.pop(0)
        if prefill.dim() != 2:
            raise ValueError("the prefill activations must be [prompt_len, hidden]")
        out.append(prefill)
    if not decode:
        return out
    rows = torch.cat(
        [d.reshape(-1, d.shape[-1]) if d.dim() == 2 else d.reshape(1, -1) for d in decode]
    )
    out.extend(rows[i : i + chunk_size] for i in range(0, rows.shape[0], chunk_size))
    return out


_GROUP_ELEMENTS = 1 << 26  # padded entries per top-k call, to bound memory


def _top_entries(chunks: list[torch.Tensor], topk: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per chunk: the flat indices and bf16 bit patterns of its k = min(topk, numel)
    entries of largest |value| (``select_top``), as numpy arrays."""
    out: list[tuple[np.ndarray, np.ndarray]] = [(np.empty(0), np.empty(0))] * len(chunks)
    for members, idx, picked in select_top(chunks, topk):
        idx_np, picked_np = idx.cpu().numpy(), picked.cpu().numpy()
        for row, n in enumerate(members):
            out[n] = (idx_np[row], picked_np[row])
    return out


def select_top(
    chunks: list[torch.Tensor], topk: int
) -> list[tuple[list[int], torch.Tensor, torch.Tensor]]:
    """The device half of a proof: per group of chunks, ``(members, idx [n, k], bits
    [n, k])`` on the chunks' device, where row r holds the flat indices and bf16 bit
    patterns of the k = min(topk, numel) entries of largest |value| of chunk
    ``members[r]``, ties broken by the lower index. Nothing here waits for the device, so
    an engine can queue it behind the decode step that wrote the states.

    The order is total (magnitude, then index), so the selection does not depend on the
    top-k algorithm, on the other chunks, or on padding: chunks of different sizes are
    padded to a power of two and selected together, a few top-k calls for a whole batch.
    Keys are ``magnitude bits << p | (2^p - 1 - index)``, in int32 when indices fit in
    16 bits (p = 16), else int64 (p = 32).
    """
    groups: dict[int, list[int]] = {}
    for n, chunk in enumerate(chunks):
        numel = chunk.numel()
        width = numel if numel <= topk else 1 << (numel - 1).bit_length()
        groups.setdefault(width, []).append(n)
    out = []
    for width, members in groups.items():
        per_call = max(1, _GROUP_ELEMENTS // width)
        for start in range(0, len(members), per_call):
            part = members[start : start + per_call]
            out.append((part, *_select(chunks, part, width, min(topk, width))))
    return out


def _select(
    chunks: list[torch.Tensor], part: list[int], width: int, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    device = chunks[part[0]].device
    flat = [chunks[n].reshape(-1) for n in part]
    if all(f.numel() == width for f in flat):  # one copy for chunks of one full size
        patterns = torch.stack(flat).to(torch.bfloat16).view(torch.int16)
    else:
        patterns = torch.zeros((len(part), width), dtype=torch.int16, device=device)
        for row, f in enumerate(flat):
            patterns[row, : f.numel()] = f.to(torch.bfloat16).view(torch.int16)
    shift, dtype = (16, torch.int32) if width <= 1 << 16 else (32, torch.int64)
    low = (1 << shift) - 1
    rev = low - torch.arange(width, dtype=dtype, device=device)
    # Padding never wins, without a mask: a chunk is padded only when it has more than k
    # entries, and every real entry's key (magnitude >= 0, then a lower index) is above
    # every padding entry's (magnitude 0, a higher index).
    keys = ((patterns & 0x7FFF).to(dtype) << shift) | rev
    top = keys.topk(k, dim=1, sorted=False).values
    idx = (low - (top & low)).long()
    picked = patterns.gather(1, idx).long() & 0xFFFF
    return idx, picked


def _find_modulus(indices: np.ndarray | torch.Tensor) -> int:
    """Largest m ≤ P for which ``indices mod m`` are pairwise distinct."""
    k = len(indices)
    if int(indices.max()) < P:  # distinct indices below P: P itself separates them
        return P
    indices = torch.as_tensor(indices)
    hi = P
    while hi >= k:
        ms = torch.arange(hi, max(k - 1, hi - _M_BATCH), -1, dtype=torch.int64)
        residues = (indices[None, :] % ms[:, None]).sort(dim=1).values
        distinct = (
            (residues[:, 1:] != residues[:, :-1]).all(dim=1)
            if k > 1
            else torch.ones_like(ms, dtype=torch.bool)
        )
        hit = torch.nonzero(distinct)
        if hit.numel():
            return int(ms[hit[0, 0]])
        hi = int(ms[-1]) - 1
    raise ValueError("no modulus separates these indices")  # impossible for distinct indices


def _mod(v: np.ndarray) -> np.ndarray:
    """v mod P for float64 arrays of exact integers below 2^52 in magnitude.

    ``floor(v / P)`` may come out one too small when v is an exact multiple of P; the
    result is then P instead of 0, which is the same residue, and ``_interpolate``
    normalizes its output with an integer ``% P``.
    """
    out: np.ndarray = v - np.floor(v * (1.0 / P)) * P
    return out


def _interpolate(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Monomial coefficients [B, k] of the polynomials through (xs, ys) [B, k] over GF(P).

    Arithmetic in float64 on exact integers (every product of two residues is below
    P² < 2^32, far inside float64's 2^53), which numpy runs ~1.7x faster than int64 ``%``.
    """
    inv = _inverses().astype(np.float64)
    k = xs.shape[1]
    xf = xs.astype(np.float64)
    xi = xs.astype(np.int32)
    a = ys.astype(np.float64)
    for j in range(1, k):  # Newton divided differences, level j, all chunks at once
        den = xi[:, j:] - xi[:, :-j]
        den += (den >> 31) & P  # (x_i - x_{i-j}) mod P without a division: xs lie in [0, P)
        a[:, j:] = _mod((a[:, j:] - a[:, j - 1 : -1]) * inv.take(den))
    poly = np.zeros_like(a)
    poly[:, 0] = a[:, k - 1]
    new = np.empty_like(a)
    for i in range(k - 2, -1, -1):  # poly = poly * (x - x_i) + a_i
        t = xf[:, i : i + 1] * poly
        new[:, 1:] = poly[:, :-1] - t[:, 1:]
        new[:, 0] = a[:, i] - t[:, 0]
        poly = _mod(new)
    return poly.astype(np.int64) % P


def _evaluate(coeffs: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """Horner evaluation of [B, k] coefficient rows at points [B, n], mod P."""
    ys = np.zeros_like(xs)
    for j in range(coeffs.shape[1] - 1, -1, -1):
        ys = (ys * xs + coeffs[:, j : j + 1]) % P
    return ys


def proof_size(topk: int = DEFAULT_TOPK) -> int:
    return 2 + 2 * topk


def build_proofs(
    activations: list[torch.Tensor],
    *,
    chunk_size: int = DEFAULT_CHUNK,
    topk: int = DEFAULT_TOPK,
    skip_prefill: bool = False,
) -> list[bytes]:
    """One proof (``2 + 2 * topk`` bytes) per chunk of ``activations``."""
    return build_proofs_batch(
        [activations], chunk_size=chunk_size, topk=topk, skip_prefill=skip_prefill
    )[0]


def build_proofs_batch(
    sequences: list[list[torch.Tensor]],
    *,
    chunk_size: int = DEFAULT_CHUNK,
    topk: int = DEFAULT_TOPK,
    skip_prefill: bool = False,
) -> list[list[bytes]]:
    """``build_proofs`` for several sequences at once: the chunks of every sequence share a
    few top-k calls and one interpolation per k (what an engine that generates in batches
    calls)."""
    if not 1 <= topk <= 4096:
        raise ValueError("topk must be in 1..4096")
    per_seq = [chunks_of(acts, chunk_size, skip_prefill) for acts in sequences]
    chunks = [c for seq in per_seq for c in seq]
    proofs = proofs_from_entries(_top_entries(chunks, topk), topk)
    out, start = [], 0
    for seq in per_seq:
        out.append(proofs[start : start + len(seq)])
        start += len(seq)
    return out


def proofs_from_entries(entries: list[tuple[np.ndarray, np.ndarray]], topk: int) -> list[bytes]:
    """The host half of a proof: one proof per chunk from its top entries (flat indices
    and bf16 bit patterns, as ``select_top`` gives them): the modulus, the interpolation
    over GF(P) (chunks with the same k together) and the encoding. Plain numpy: it runs
    in any process."""
    points: list[tuple[int, np.ndarray, np.ndarray]] = []
    for idx, bits in entries:
        m = _find_modulus(idx)
        points.append((m, idx % m, bits % P))
    proofs: list[bytes] = [b""] * len(entries)
    by_k: dict[int, list[int]] = {}
    for n, (_, xs, _) in enumerate(points):
        by_k.setdefault(len(xs), []).append(n)
    size = proof_size(topk)
    for k, members in by_k.items():
        coeffs = _interpolate(
            np.stack([points[n][1] for n in members]), np.stack([points[n][2] for n in members])
        )
        rows = np.zeros((len(members), 1 + topk), dtype=np.int64)
        rows[:, 0] = [points[n][0] for n in members]
        rows[:, 1 : 1 + k] = coeffs
        encoded = rows.astype(">u2").tobytes()  # [m u16be][topk × u16be] per row
        for row, n in enumerate(members):
            proofs[n] = encoded[row * size : (row + 1) * size]
    return proofs


def _decode(proof: bytes | None, topk: int) -> tuple[int, np.ndarray] | None:
    """(m, coefficients) or None for a null, short, long or out-of-field proof."""
    if not isinstance(proof, bytes | bytearray) or len(proof) != proof_size(topk):
        return None
    (m,) = struct.unpack_from(">H", proof)
    coeffs = np.frombuffer(bytes(proof), dtype=">u2", offset=2).astype(np.int64)
    if not 1 <= m <= P or bool((coeffs >= P).any()):
        return None
    return m, coeffs


def _failed(k: int) -> ProofResult:
    return ProofResult(
        exp_mismatches=k, mant_err_mean=math.inf, mant_err_median=math.inf, passed=False
    )


def verify_proofs(
    activations: list[torch.Tensor],
    proofs: list[bytes],
    *,
    chunk_size: int = DEFAULT_CHUNK,
    topk: int = DEFAULT_TOPK,
    skip_prefill: bool = False,
    thresholds: Thresholds | None = None,
) -> list[ProofResult]:
    """One result per chunk of the validator's own ``activations``.

    A missing, extra-short or malformed proof gives a failed result for its chunk; never
    an exception.
    """
    return verify_proofs_batch(
        [activations],
        [proofs],
        chunk_size=chunk_size,
        topk=topk,
        skip_prefill=skip_prefill,
        thresholds=thresholds,
    )[0]


def verify_proofs_batch(
    sequences: list[list[torch.Tensor]],
    proofs: list[list[bytes]],
    *,
    chunk_size: int = DEFAULT_CHUNK,
    topk: int = DEFAULT_TOPK,
    skip_prefill: bool = False,
    thresholds: Thresholds | None = None,
) -> list[list[ProofResult]]:
    """``verify_proofs`` for several sequences at once (``proofs[i]`` are sequence i's):
    the chunks of every sequence share a few top-k calls and one evaluation per k, and
    the statistics are array operations over all chunks (what a validator judging a
    batch calls; per sequence, the results are the same)."""
    if len(proofs) != len(sequences):
        raise ValueError("need the proofs of every sequence")
    th = thresholds or Thresholds()
    per_seq = [chunks_of(acts, chunk_size, skip_prefill) for acts in sequences]
    chunks = [c for seq in per_seq for c in seq]
    given = [
        seq_proofs[i] if i < len(seq_proofs) else None
        for seq, seq_proofs in zip(per_seq, proofs, strict=True)
        for i in range(len(seq))
    ]
    results: list[ProofResult] = [_failed(min(topk, c.numel())) for c in chunks]
    selected = _top_entries(chunks, topk)
    by_k: dict[int, list[int]] = {}
    for n, chunk in enumerate(chunks):
        by_k.setdefault(min(topk, chunk.numel()), []).append(n)
    for k, members in by_k.items():
        decoded = {n: _decode(given[n], topk) for n in members}
        valid = [n for n in members if decoded[n] is not None]
        if not valid:
            continue
        moduli = np.array([decoded[n][0] for n in valid], dtype=np.int64)  # type: ignore[index]
        coeffs = np.stack([decoded[n][1] for n in valid])  # type: ignore[index]
        idx = np.stack([selected[n][0] for n in valid])
        ours = np.stack([selected[n][1] for n in valid])
        theirs = _evaluate(coeffs, idx % moduli[:, None])
        exp_match, mant_err = mantissa_distance(theirs, ours)
        matches = exp_match.sum(axis=1)
        means, medians = _matched_mean_median(mant_err, exp_match, matches)
        need = math.ceil(th.min_exp_matches * k / DEFAULT_TOPK)
        passed = (
            (matches >= need)
            & (means <= th.max_mant_err_mean)
            & (medians <= th.max_mant_err_median)
        )
        for row, n in enumerate(valid):
            results[n] = ProofResult(
                k - int(matches[row]), float(means[row]), float(medians[row]), bool(passed[row])
            )
    out, start = [], 0
    for seq in per_seq:
        out.append(results[start : start + len(seq)])
        start += len(seq)
    return out


def mantissa_distance(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Of bf16 bit patterns ``a`` and ``b``: whether sign and exponent agree, and the
    absolute difference of their mantissas (in units of the last place)."""
    return (a >> 7) == (b >> 7), np.abs((a & 0x7F) - (b & 0x7F))


def _matched_mean_median(
    err: np.ndarray, matched: np.ndarray, counts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the mean and the median of ``err`` over the ``matched`` entries (inf for a
    row with none). Errors are small integers, so the sums are exact and the mean is the
    one ``np.mean`` of the matched entries gives."""
    safe = np.maximum(counts, 1)
    means = np.where(counts > 0, (err * matched).sum(axis=1) / safe, math.inf)
    ordered = np.sort(np.where(matched, err, np.iinfo(np.int64).max), axis=1)
    lo = np.take_along_axis(ordered, ((safe - 1) // 2)[:, None], axis=1)[:, 0]
    hi = np.take_along_axis(ordered, (safe // 2)[:, None], axis=1)[:, 0]
    medians = np.where(counts > 0, (lo.astype(np.float64) + hi) / 2, math.inf)
    return means, medians
