"""Pseudo-gradient chunks on the wire: int8 with a 256-entry lookup table, or raw fp32.

int8 (PRIME's ``uniform_8bit_quantize``, after hivemind's ``Uniform8BitQuantization``):
the range rule is *mean ± 3 standard deviations in 256 equal buckets*. With
``μ = mean(x)``, ``σ = ‖x − μ‖ / sqrt(n − 1)`` and ``scale = 6σ / 256``, each value gets the
code ``clamp(round((x − μ) / scale) + 128, 0, 255)``; values beyond ±3σ fall into the end
buckets. The lookup table holds, for each code, the mean of the values that got it (0 for
an empty bucket), so decoding is ``table[code]`` and the bucket means keep the chunk's sum
close to the original even for the clipped tails. A constant chunk (σ = 0) uses scale 1:
every value gets code 128 and the table holds the value itself.

Byte formats (little-endian; ``n`` is known to both sides from the agreed chunk bounds):
- ``int8``: 256 float32 (the table, 1024 bytes) then ``n`` uint8 codes: ``1024 + n`` bytes;
- ``fp32``: ``n`` float32: ``4 n`` bytes, exact.
``decode`` checks the length and that every value it yields is finite, so a malformed or
NaN chunk from a peer is a ``WireError`` before it touches the sum.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from protocol.errors import Reason, WireError

BINS = 256
RANGE_IN_SIGMAS = 6.0
TABLE_BYTES = BINS * 4
ENCODINGS = ("int8", "fp32")


def wire_size(encoding: str, n: int) -> int:
    """Bytes of one encoded chunk of ``n`` values."""
    return TABLE_BYTES + n if encoding == "int8" else 4 * n


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(codes uint8 [n], table float32 [256])`` of a flat fp32 tensor (range rule above)."""
    x = x.detach().reshape(-1).float()
    if not bool(torch.isfinite(x).all()):
        raise ValueError("cannot quantize non-finite values")
    n = x.numel()
    if n == 0:
        return torch.zeros(0, dtype=torch.uint8), torch.zeros(BINS)
    mu = x.mean()
    centered = x - mu
    sigma = float(centered.norm()) / math.sqrt(max(n - 1, 1))
    scale = RANGE_IN_SIGMAS * sigma / BINS
    if not (scale > 0 and math.isfinite(scale)):
        scale = 1.0
    codes = torch.clamp(torch.round(centered / scale) + BINS // 2, 0, BINS - 1).to(torch.int64)
    sums = torch.zeros(BINS, dtype=torch.float64).index_add_(0, codes, x.double())
    counts = torch.bincount(codes, minlength=BINS).double()
    table = torch.where(counts > 0, sums / counts.clamp(min=1), torch.zeros_like(sums))
    return codes.to(torch.uint8), table.float()


def encode(x: torch.Tensor, encoding: str) -> bytes:
    """The wire bytes of flat fp32 ``x`` in ``encoding`` (``int8`` or ``fp32``)."""
    x = x.detach().reshape(-1).float().contiguous()
    if encoding == "fp32":
        if not bool(torch.isfinite(x).all()):
            raise ValueError("cannot send non-finite values")
        return x.numpy().astype("<f4").tobytes()
    if encoding == "int8":
        codes, table = quantize(x)
        return table.numpy().astype("<f4").tobytes() + codes.numpy().tobytes()
    raise ValueError(f"unknown encoding {encoding!r} (one of {ENCODINGS})")


def _le_floats(data: bytes) -> torch.Tensor:
    """Little-endian float32 bytes as a tensor, whatever this host's byte order."""
    return torch.from_numpy(np.frombuffer(data, dtype="<f4").astype(np.float32))


def decode(data: bytes, encoding: str, n: int) -> torch.Tensor:
    """The flat fp32 tensor of ``n`` values that ``data`` encodes; ``WireError`` if malformed."""
    if encoding not in ENCODINGS:
        raise WireError(Reason.MALFORMED, f"unknown encoding {encoding!r}")
    if len(data) != wire_size(encoding, n):
        raise WireError(
            Reason.MALFORMED, f"{encoding} chunk of {n} values must be {wire_size(encoding, n)} B"
        )
    if encoding == "fp32":
        out = _le_floats(data)
    else:
        table = _le_floats(data[:TABLE_BYTES])
        codes = torch.from_numpy(np.frombuffer(data, dtype=np.uint8, offset=TABLE_BYTES).copy())
        out = table[codes.to(torch.int64)]  # n = 0: no codes (torch.frombuffer refuses 0 B)
    if not bool(torch.isfinite(out).all()):
        raise WireError(Reason.MALFORMED, "chunk holds non-finite values")
    return out
