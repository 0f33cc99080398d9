"""Pseudo-gradient chunks on the wire: the ``Compressor`` interface and its dense codecs.

A ``Compressor`` turns a flat fp32 vector of ``n`` values into bytes and back. It is the
whole contract between the exchange (``node/diloco/ring.py``), the group's chunk checks
(``node/diloco/chunks.py``: the size of a frame is known before it is read) and a codec:

- ``wire``: its name on the wire (the roster's ``encoding``: members of one group agree);
- ``wire_size(n)``: the exact bytes of the encoding of ``n`` values (nothing else is read);
- ``encode(x)``: the bytes of flat fp32 ``x`` (``ValueError`` for non-finite values);
- ``decode(data, n)``: the ``n`` values ``data`` encodes, or ``WireError`` for bytes that
  are not a valid encoding (another length, non-finite or out-of-range values), before any
  of it touches a sum: the exchange blames the peer that sent them;
- ``summable``: the decoded chunks of several members may be added hop by hop (a dense
  ring); a sparse codec is not (``node/diloco/sparse.py``: every member's positions are
  its own), and is exchanged whole instead;
- ``feedback``: what it does not send is kept by the member and added to its next
  pseudo-gradient (error feedback, ``sparse.ErrorFeedback``).
``node/diloco/codecs.py`` names them (the settings, the roster's wire names).

The dense codecs here:

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
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from protocol.errors import Reason, WireError

BINS = 256
RANGE_IN_SIGMAS = 6.0
TABLE_BYTES = BINS * 4


class Compressor(ABC):
    """A codec of pseudo-gradient chunks (see the module docstring)."""

    summable: ClassVar[bool] = True
    feedback: ClassVar[bool] = False

    @property
    @abstractmethod
    def wire(self) -> str:
        """The name the roster carries (``encoding``)."""

    @abstractmethod
    def wire_size(self, n: int) -> int:
        """Bytes of one encoded chunk of ``n`` values."""

    @abstractmethod
    def encode(self, x: torch.Tensor) -> bytes:
        """The wire bytes of flat fp32 ``x``."""

    @abstractmethod
    def decode(self, data: bytes, n: int) -> torch.Tensor:
        """The flat fp32 tensor of ``n`` values ``data`` encodes; ``WireError`` if malformed."""

    def decode_entries(self, data: bytes, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(index, values)`` of the entries ``data`` sets (all ``n`` for a dense codec)."""
        return torch.arange(n), self.decode(data, n)

    def roundtrip(self, x: torch.Tensor) -> torch.Tensor:
        """What the group receives of ``x``: ``decode(encode(x))``."""
        return self.decode(self.encode(x), x.numel())

    def _check_size(self, data: bytes, n: int) -> None:
        if len(data) != self.wire_size(n):
            raise WireError(
                Reason.MALFORMED, f"{self.wire} chunk of {n} values must be {self.wire_size(n)} B"
            )


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.detach().reshape(-1).float().contiguous()


def _finite(out: torch.Tensor) -> torch.Tensor:
    if not bool(torch.isfinite(out).all()):
        raise WireError(Reason.MALFORMED, "chunk holds non-finite values")
    return out


def le_floats(data: bytes) -> torch.Tensor:
    """Little-endian float32 bytes as a tensor, whatever this host's byte order."""
    return torch.from_numpy(np.frombuffer(data, dtype="<f4").astype(np.float32))


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


@dataclass(frozen=True)
class Int8(Compressor):
    """256 buckets over μ ± 3σ, a table of the bucket means (module docstring)."""

    @property
    def wire(self) -> str:
        return "int8"

    def wire_size(self, n: int) -> int:
        return TABLE_BYTES + n

    def encode(self, x: torch.Tensor) -> bytes:
        codes, table = quantize(_flat(x))
        return table.numpy().astype("<f4").tobytes() + codes.numpy().tobytes()

    def decode(self, data: bytes, n: int) -> torch.Tensor:
        self._check_size(data, n)
        table = le_floats(data[:TABLE_BYTES])
        codes = torch.from_numpy(np.frombuffer(data, dtype=np.uint8, offset=TABLE_BYTES).copy())
        return _finite(table[codes.to(torch.int64)])  # n = 0: no codes (frombuffer refuses 0 B)


@dataclass(frozen=True)
class Fp32(Compressor):
    """Raw float32: exact."""

    @property
    def wire(self) -> str:
        return "fp32"

    def wire_size(self, n: int) -> int:
        return 4 * n

    def encode(self, x: torch.Tensor) -> bytes:
        x = _flat(x)
        if not bool(torch.isfinite(x).all()):
            raise ValueError("cannot send non-finite values")
        return x.numpy().astype("<f4").tobytes()

    def decode(self, data: bytes, n: int) -> torch.Tensor:
        self._check_size(data, n)
        return _finite(le_floats(data))
