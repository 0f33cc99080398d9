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

# pull(phase, round) -> the bytes the left neighbour offers for that (phase, round)
Pull = Callable[[str, int], Awaitable[bytes]]
PHASES = ("rs", "ag")


class Aborted(Exception):
    """This all-reduce attempt was abandoned (by us or by the group)."""


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


async def all_reduce(
    vec: torch.Tensor, rank: int, n: int, encoding: str, outbox: Outbox, pull: Pull
) -> tuple[torch.Tensor, int]:
    """The average over the ring of flat fp32 ``vec``; and the payload bytes we received.

    ``pull`` raises on any failure (the caller then abandons the attempt); a chunk that does
    not decode (wrong size, non-finite) raises ``WireError`` from ``quant.decode``.
    """
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
        acc[lo:hi] += quant.decode(data, encoding, hi - lo)
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
        out[lo:hi] = quant.decode(held, encoding, hi - lo)
    return out, received
