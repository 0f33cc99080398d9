"""Ring all-reduce of one flat fp32 vector, with the transport passed in.

Members ``0 … n−1`` stand in a ring (the roster's order); the vector is cut into ``n``
contiguous chunks (``bounds``). Every exchange is a *pull*: member ``i`` asks its left
neighbour ``i−1`` for what that neighbour offers in a given phase and round, so the
listener only ever answers (``Outbox``) and the dialer only ever reads (``Pull``).

- Reduce-scatter, rounds ``r = 0 … n−2``: member ``i`` offers its running sum of chunk
  ``(i − r) mod n`` and pulls chunk ``(i − 1 − r) mod n`` from ``i − 1``, which it decodes
  and adds to its own values in fp32. After the last round it holds the full sum of chunk
  ``(i + 1) mod n``; it divides by ``n`` and encodes that average once.
- All-gather, rounds ``r = 0 … n−2``: member ``i`` offers the bytes it holds for chunk
  ``(i + 1 − r) mod n`` (its own encoding at ``r = 0``, afterwards exactly the bytes it
  received in the round before: forwarded, never re-encoded) and pulls chunk
  ``(i − r) mod n``.
Every member, the chunk's owner included, decodes the same bytes of every chunk, so all end
with bitwise-identical averages whatever the encoding. Each member sends ``2(n−1)/n`` of
the vector's encoded size, as in any ring.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import torch
import trio

from node.diloco import quant
from protocol.errors import WireError

# pull(phase, round) -> the bytes the left neighbour offers for that (phase, round)
Pull = Callable[[str, int], Awaitable[bytes]]
PHASES = ("rs", "ag")


class Aborted(Exception):
    """This all-reduce attempt was abandoned (by us or by the group)."""


class BadChunk(Exception):
    """The left neighbour sent a chunk that does not decode or breaks the declared norms."""


def norm_limits(norms: list[float], rank: int) -> Callable[[str, int], float]:
    """The largest L2 norm a chunk member ``rank`` receives may have, by (phase, round).

    ``norms``: the declared pseudo-gradient norms of the roster, in ring order. In
    reduce-scatter round ``r`` the chunk holds the sum of the contributions of members
    ``rank − 1 … rank − 1 − r`` (a chunk of a vector is no longer than the vector, and
    the int8 bucket means never lengthen a vector: each is the mean of its values); in the
    all-gather it is the average of all. A little slack covers rounding.
    """
    n = len(norms)

    def limit(phase: str, rnd: int) -> float:
        if phase == "rs":
            total = sum(norms[(rank - 1 - k) % n] for k in range(rnd + 1))
        else:
            total = sum(norms) / n
        return total * (1 + 1e-3) + 1e-6

    return limit


def bounds(numel: int, n: int) -> list[tuple[int, int]]:
    """``n`` contiguous ``[start, end)`` chunks covering ``numel`` values, sizes differing by ≤ 1."""
    base, extra = divmod(numel, n)
    out, start = [], 0
    for i in range(n):
        end = start + base + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out


def chunk_of(phase: str, rank: int, rnd: int, n: int) -> int:
    """The chunk member ``rank`` offers in ``phase`` round ``rnd``."""
    return (rank - rnd) % n if phase == "rs" else (rank + 1 - rnd) % n


class Outbox:
    """What one member offers its right neighbour in one attempt, by (phase, round)."""

    def __init__(self) -> None:
        self._data: dict[tuple[str, int], bytes] = {}
        self._ready: dict[tuple[str, int], trio.Event] = {}
        self._aborted = trio.Event()

    def _event(self, key: tuple[str, int]) -> trio.Event:
        return self._ready.setdefault(key, trio.Event())

    def offer(self, phase: str, rnd: int, data: bytes) -> None:
        self._data[(phase, rnd)] = data
        self._event((phase, rnd)).set()

    def abort(self) -> None:
        self._aborted.set()
        for ev in self._ready.values():
            ev.set()

    @property
    def aborted(self) -> bool:
        return self._aborted.is_set()

    async def take(self, phase: str, rnd: int) -> bytes:
        """The bytes offered for (phase, round), once offered (the caller bounds the wait);
        ``Aborted`` at once if the attempt is abandoned, before or while waiting."""
        if not self._aborted.is_set():
            await self._event((phase, rnd)).wait()
        if self._aborted.is_set():
            raise Aborted("attempt aborted")
        return self._data[(phase, rnd)]


def _received(data: bytes, encoding: str, n: int, most: float) -> torch.Tensor:
    try:
        out = quant.decode(data, encoding, n)
    except WireError as exc:
        raise BadChunk(str(exc)) from exc
    if float(out.norm()) > most:
        raise BadChunk(f"chunk norm {float(out.norm()):.4g} above the declared {most:.4g}")
    return out


async def all_reduce(
    vec: torch.Tensor,
    rank: int,
    n: int,
    encoding: str,
    outbox: Outbox,
    pull: Pull,
    limit: Callable[[str, int], float] | None = None,
) -> tuple[torch.Tensor, int]:
    """The average over the ring of flat fp32 ``vec``; and the payload bytes we received.

    ``pull`` raises on any failure (the caller then abandons the attempt); a chunk that does
    not decode (wrong size, non-finite) or is longer than ``limit(phase, round)`` raises
    ``BadChunk``: the left neighbour sent it.
    """
    most = limit or (lambda _phase, _rnd: float("inf"))
    if n == 1:
        return vec.detach().float().clone(), 0
    spans = bounds(vec.numel(), n)
    acc = vec.detach().float().clone()
    received = 0
    for r in range(n - 1):
        lo, hi = spans[chunk_of("rs", rank, r, n)]
        outbox.offer("rs", r, quant.encode(acc[lo:hi], encoding))
        lo, hi = spans[chunk_of("rs", (rank - 1) % n, r, n)]
        data = await pull("rs", r)
        received += len(data)
        acc[lo:hi] += _received(data, encoding, hi - lo, most("rs", r))
    out = torch.empty_like(acc)
    own = (rank + 1) % n
    lo, hi = spans[own]
    held = quant.encode(acc[lo:hi] / n, encoding)
    out[lo:hi] = quant.decode(held, encoding, hi - lo)
    for r in range(n - 1):
        outbox.offer("ag", r, held)
        lo, hi = spans[chunk_of("ag", (rank - 1) % n, r, n)]
        held = await pull("ag", r)
        received += len(held)
        out[lo:hi] = _received(held, encoding, hi - lo, most("ag", r))
    return out, received
