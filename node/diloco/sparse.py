"""Sparse pseudo-gradients: top-k per block at 2 bits, with error feedback (SparseLoCo).

INTELLECT-1 sent int8 pseudo-gradients; SparseLoCo (Sarfi et al. 2025) sends, of each block
of values, only the ``k`` largest in magnitude, each as a 2-bit code, and keeps the rest in
an error-feedback buffer that is added to the next pseudo-gradient, so nothing is lost,
only late. This codec:

- the vector is cut into blocks of ``BLOCK`` = 4096 values (the last may be shorter); of
  block ``j`` (``b_j`` values) the ``k_j = min(k, b_j)`` entries of largest ``|x|`` are sent,
  at their positions in the block (``POS_BITS`` = 12 bits each, strictly increasing);
- each sent value gets a 2-bit code: 0 large negative, 1 small negative, 2 small
  non-negative, 3 large non-negative ("large": at least the mean magnitude of the block's
  sent values of that sign); the block's table holds, per code, the mean of the values that
  got it (0 for an unused code), so decoding is ``table[code]`` and, as with int8's bucket
  means, the decoded block is never longer than the values it stands for: the declared
  norm of the vector still bounds what a peer may send;
- bytes (little-endian): the tables (``4·nb`` float32, ``nb`` blocks), then the positions
  (``K·12`` bits, ``K = Σ k_j``, least significant bit first, zero-padded to a byte), then
  the codes (``K·2`` bits, the same): ``16·nb + ⌈12K/8⌉ + ⌈2K/8⌉`` bytes, ``wire_size``.
  With k = 64 that is 128 bytes per 4096 values (0.25 bits per value), with the default
  k = 384, 688 bytes (1.34 bits per value).
``decode`` refuses another length, a non-finite table, a table value of the wrong sign for
its code (codes 0–1 must decode to ≤ 0, codes 2–3 to ≥ 0: a code out of its range), a
position at or past its block's length, positions not strictly increasing within a block,
and non-zero padding bits.

Members send different positions, so their payloads cannot be added hop by hop as a dense
ring does (``summable`` is false): ``node/diloco/ring.py`` gathers every member's whole
payload instead and sums them in roster order.

Error feedback (``ErrorFeedback``): a member sends ``v = Δ + e`` (its pseudo-gradient plus
its buffer) and keeps ``e ← v − decode(encode(v))``; so after any number of outer steps the
sum of what it sent plus ``e`` is the sum of its pseudo-gradients, in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from node.diloco.quant import Compressor, le_floats
from protocol.errors import Reason, WireError

BLOCK = 4096
POS_BITS = 12  # 2**12 = BLOCK
CODE_BITS = 2
CODES = 1 << CODE_BITS
DEFAULT_K = 384  # chosen on the pretraining bench: docs/benchmarks.md, diloco.py


def _blocks(n: int, k: int) -> tuple[int, int, int]:
    """(blocks, values of the last block, entries sent in all) of ``n`` values."""
    if n == 0:
        return 0, 0, 0
    nb = -(-n // BLOCK)
    last = n - BLOCK * (nb - 1)
    return nb, last, k * (nb - 1) + min(k, last)


def _pack(values: np.ndarray, bits: int) -> bytes:
    """``values`` (each < 2**bits) as ``bits`` bits each, least significant first."""
    v = values.astype(np.uint32)
    planes = ((v[:, None] >> np.arange(bits, dtype=np.uint32)) & 1).astype(np.uint8)
    return np.packbits(planes.reshape(-1), bitorder="little").tobytes()


def _unpack(data: bytes, bits: int, count: int) -> np.ndarray:
    flat = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")
    if flat[count * bits :].any():
        raise WireError(Reason.MALFORMED, "sparse chunk with non-zero padding bits")
    planes = flat[: count * bits].reshape(count, bits).astype(np.int64)
    out: np.ndarray = planes @ (np.int64(1) << np.arange(bits, dtype=np.int64))
    return out


@dataclass(frozen=True)
class Sparse(Compressor):
    """Top-``k`` of every block of 4096 values at 2 bits (module docstring)."""

    k: int = DEFAULT_K
    summable: ClassVar[bool] = False
    feedback: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if not 1 <= self.k <= BLOCK:
            raise ValueError(f"sparse k must be in [1, {BLOCK}]: {self.k}")

    @property
    def wire(self) -> str:
        return f"sparse-{self.k}"

    def wire_size(self, n: int) -> int:
        nb, _, total = _blocks(n, self.k)
        return 4 * CODES * nb + -(-total * POS_BITS // 8) + -(-total * CODE_BITS // 8)

    def select(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(block [K], position [K])`` of the entries sent: the top ``k_j`` by magnitude
        of each block, in increasing position."""
        n = x.numel()
        nb, last, _ = _blocks(n, self.k)
        mag = torch.full((nb * BLOCK,), -1.0)  # padding is never chosen over a value
        mag[:n] = x.abs()
        k = min(self.k, BLOCK)
        pos = mag.view(nb, BLOCK).topk(k, dim=1).indices.sort(dim=1).values  # [nb, k]
        rows = torch.arange(nb).unsqueeze(1).expand(nb, k)
        keep = torch.ones(nb, k, dtype=torch.bool)
        keep[-1, min(k, last) :] = False  # the last block's padding sorts after its values
        return rows[keep], pos[keep]

    def encode(self, x: torch.Tensor) -> bytes:
        x = x.detach().reshape(-1).float().contiguous()
        if not bool(torch.isfinite(x).all()):
            raise ValueError("cannot send non-finite values")
        n = x.numel()
        if n == 0:
            return b""
        nb = _blocks(n, self.k)[0]
        block, pos = self.select(x)
        vals = x[block * BLOCK + pos]
        neg = vals < 0
        side = block * 2 + (~neg).long()  # per block and sign
        mag = vals.abs().double()
        total = torch.zeros(nb * 2, dtype=torch.float64).index_add_(0, side, mag)
        count = torch.bincount(side, minlength=nb * 2).double().clamp(min=1)
        large = mag >= (total / count)[side]
        codes = torch.where(neg, torch.where(large, 0, 1), torch.where(large, 3, 2))
        slot = block * CODES + codes
        sums = torch.zeros(nb * CODES, dtype=torch.float64).index_add_(0, slot, vals.double())
        used = torch.bincount(slot, minlength=nb * CODES).double()
        table = torch.where(used > 0, sums / used.clamp(min=1), torch.zeros_like(sums)).float()
        return (
            table.numpy().astype("<f4").tobytes()
            + _pack(pos.numpy(), POS_BITS)
            + _pack(codes.numpy(), CODE_BITS)
        )

    def decode_entries(self, data: bytes, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        self._check_size(data, n)
        nb, last, total = _blocks(n, self.k)
        if n == 0:
            return torch.zeros(0, dtype=torch.int64), torch.zeros(0)
        tables = le_floats(data[: 4 * CODES * nb]).view(nb, CODES)
        if not bool(torch.isfinite(tables).all()):
            raise WireError(Reason.MALFORMED, "sparse chunk holds non-finite values")
        if bool((tables[:, :2] > 0).any() or (tables[:, 2:] < 0).any()):
            raise WireError(Reason.MALFORMED, "sparse chunk: a code's value out of its range")
        at = 4 * CODES * nb
        pos_bytes = -(-total * POS_BITS // 8)
        pos = torch.from_numpy(_unpack(data[at : at + pos_bytes], POS_BITS, total))
        codes = torch.from_numpy(_unpack(data[at + pos_bytes :], CODE_BITS, total))
        sent = torch.full((nb,), min(self.k, BLOCK), dtype=torch.int64)
        sent[-1] = min(self.k, last)
        block = torch.repeat_interleave(torch.arange(nb), sent)
        length = torch.full((nb,), BLOCK, dtype=torch.int64)
        length[-1] = last
        if bool((pos >= length[block]).any()):
            raise WireError(Reason.MALFORMED, "sparse chunk: a position past its block")
        same = block[1:] == block[:-1]
        if bool((pos[1:] <= pos[:-1])[same].any()):
            raise WireError(Reason.MALFORMED, "sparse chunk: positions not strictly increasing")
        return block * BLOCK + pos, tables[block, codes]

    def decode(self, data: bytes, n: int) -> torch.Tensor:
        index, values = self.decode_entries(data, n)
        return torch.zeros(n).index_put_((index,), values)


class ErrorFeedback:
    """The part of a member's pseudo-gradients it has not sent yet, in fp32."""

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None

    def compensate(self, delta: torch.Tensor) -> torch.Tensor:
        """``Δ + e``: what the member sends of this step (a buffer of another length, e.g.
        the formation's, is not carried over)."""
        delta = delta.detach().reshape(-1).float()
        if self.buffer is None or self.buffer.numel() != delta.numel():
            return delta.clone()
        return delta + self.buffer

    def holds(self, numel: int) -> bool:
        """Something unsent that ``compensate`` adds to a vector of ``numel`` values."""
        buf = self.buffer
        return buf is not None and buf.numel() == numel and bool(buf.any())

    def keep(self, sent_for: torch.Tensor, sent: torch.Tensor) -> None:
        """After a step whose average took ``sent`` of ``sent_for`` (``compensate``'s
        result): the rest waits for the next step."""
        self.buffer = sent_for.detach().reshape(-1).float() - sent.reshape(-1)

    def reset(self) -> None:
        """Nothing held back (a joiner, a restart: SPEC §15)."""
        self.buffer = None
