"""The group's exchanges of one flat fp32 vector, with the transport passed in: a ring
all-reduce for a dense ``Compressor``, a ring all-gather of whole payloads for a sparse one.

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

A sparse compressor (``summable`` false: ``node/diloco/sparse.py``) cannot be summed hop by
hop, since every member sends its own positions. Its exchange is an all-gather of whole
payloads on the same ring, rounds ``r = 0 … n−2`` of phase ``ag``: member ``i`` offers the
payload of member ``(i − r) mod n`` (its own at ``r = 0``, afterwards exactly the bytes it
received in the round before) and pulls that of member ``(i − 1 − r) mod n``, which it
checks (decodes, and its norm against that member's declared norm) before it offers it
on. Then every member holds the same ``n`` payloads and adds them in roster order in fp32,
so all end bitwise identical. A closing round ``n − 1`` of phase ``ag`` follows: member
``i`` offers the digest of the ``n`` payloads it gathered (``gathered_digest``, 32 bytes)
and pulls its left neighbour's, which must equal its own. Without it a member could finish
an attempt that the others abandon: the payloads a member gathers never cross the edge
from itself to its right neighbour, so a member whose own payload that neighbour refused
(a cheater, blamed there) or a member whose left neighbour had already forwarded it
everything when a later member died, would record the step's result while the group
retries without it. The left neighbour's digest arrives only once that neighbour has
gathered everything, which needs every edge of the ring but the one into it, and our own
gathering needs that one: a member finishes only if every edge carried what it had to.
(A member that dies between its last pull and its offer of the digest can still leave a
neighbour finished while others retry; as in the dense ring, the leader then refuses the
finished member as ``diverged``, and it recovers.) Each member receives ``n − 1`` payloads of the whole vector:
the ring's ``2(n−1)/n`` dense chunks become ``n − 1`` sparse ones, a good trade while a
payload is smaller than ``2/n`` of a dense chunk: against int8's 8 bits per value, up to 11
members at 1.34 bits (k = 384 of 4096), 64 at 0.25 (k = 64).
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable

import torch
import trio

from node.diloco.quant import Compressor
from protocol.errors import WireError

# pull(phase, round) -> the bytes the left neighbour offers for that (phase, round)
Pull = Callable[[str, int], Awaitable[bytes]]
PHASES = ("rs", "ag")


class Aborted(Exception):
    """This all-reduce attempt was abandoned (by us or by the group)."""


class BadChunk(Exception):
    """The left neighbour sent a chunk that does not decode or breaks the declared norms."""


class Mismatch(Exception):
    """The left neighbour gathered other payloads than we did (the sparse all-gather's
    closing round): the attempt fails, blaming no one (whoever changed a payload on its way
    may be anywhere upstream)."""


DIGEST_SIZE = 32  # the sparse all-gather's closing round: a sha256 digest


def gathered_digest(payloads: list[bytes]) -> bytes:
    """The digest of the ``n`` payloads of a sparse all-gather, in roster order: sha256 of
    their sha256 digests, concatenated."""
    return hashlib.sha256(b"".join(hashlib.sha256(p).digest() for p in payloads)).digest()


def norm_limits(
    norms: list[float], rank: int, summable: bool = True
) -> Callable[[str, int], float]:
    """The largest L2 norm a chunk member ``rank`` receives may have, by (phase, round).

    ``norms``: the declared pseudo-gradient norms of the roster, in ring order. In
    reduce-scatter round ``r`` the chunk holds the sum of the contributions of members
    ``rank − 1 … rank − 1 − r`` (a chunk of a vector is no longer than the vector, and
    the int8 bucket means never lengthen a vector: each is the mean of its values); in the
    all-gather it is the average of all. Not ``summable`` (the sparse all-gather): round
    ``r`` brings the payload of member ``rank − 1 − r`` alone, no longer than its vector
    (a subset of its entries, as bucket means). A little slack covers rounding.
    """
    n = len(norms)

    def limit(phase: str, rnd: int) -> float:
        if not summable:
            total = norms[(rank - 1 - rnd) % n]
        elif phase == "rs":
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


def _entries(
    data: bytes, codec: Compressor, n: int, most: float
) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        index, values = codec.decode_entries(data, n)
    except WireError as exc:
        raise BadChunk(str(exc)) from exc
    if float(values.norm()) > most:
        raise BadChunk(f"chunk norm {float(values.norm()):.4g} above the declared {most:.4g}")
    return index, values


def _received(data: bytes, codec: Compressor, n: int, most: float) -> torch.Tensor:
    """A dense chunk, checked (its entries are all its values)."""
    return _entries(data, codec, n, most)[1]


async def all_reduce(
    vec: torch.Tensor,
    rank: int,
    n: int,
    codec: Compressor,
    outbox: Outbox,
    pull: Pull,
    limit: Callable[[str, int], float] | None = None,
    *,
    payload: bytes | None = None,
) -> tuple[torch.Tensor, int]:
    """The average over the ring of flat fp32 ``vec``; and the payload bytes we received.

    ``pull`` raises on any failure (the caller then abandons the attempt); a chunk that does
    not decode (wrong size, non-finite, out of range) or is longer than
    ``limit(phase, round)`` raises ``BadChunk``: the left neighbour sent it. ``payload``:
    ``codec.encode(vec)`` if the caller has it already (the sparse all-gather sends it).
    """
    most = limit or (lambda _phase, _rnd: float("inf"))
    if n == 1:
        return vec.detach().float().clone(), 0
    if not codec.summable:
        return await all_gather(vec, rank, n, codec, outbox, pull, most, payload)
    spans = bounds(vec.numel(), n)
    acc = vec.detach().float().clone()
    received = 0
    for r in range(n - 1):
        lo, hi = spans[chunk_of("rs", rank, r, n)]
        outbox.offer("rs", r, codec.encode(acc[lo:hi]))
        lo, hi = spans[chunk_of("rs", (rank - 1) % n, r, n)]
        data = await pull("rs", r)
        received += len(data)
        acc[lo:hi] += _received(data, codec, hi - lo, most("rs", r))
    out = torch.empty_like(acc)
    own = (rank + 1) % n
    lo, hi = spans[own]
    held = codec.encode(acc[lo:hi] / n)
    out[lo:hi] = codec.decode(held, hi - lo)
    for r in range(n - 1):
        outbox.offer("ag", r, held)
        lo, hi = spans[chunk_of("ag", (rank - 1) % n, r, n)]
        held = await pull("ag", r)
        received += len(held)
        out[lo:hi] = _received(held, codec, hi - lo, most("ag", r))
    return out, received


async def all_gather(
    vec: torch.Tensor,
    rank: int,
    n: int,
    codec: Compressor,
    outbox: Outbox,
    pull: Pull,
    most: Callable[[str, int], float],
    payload: bytes | None = None,
) -> tuple[torch.Tensor, int]:
    """The sparse exchange (module docstring): every member's whole payload goes round the
    ring unchanged, checked by each member before it forwards it; the closing round's
    digests agree; all ``n`` are summed in roster order. The average and the payload bytes
    we received (the closing round's digest is not a payload)."""
    numel = vec.numel()
    held = codec.encode(vec) if payload is None else payload
    payloads = [b""] * n
    payloads[rank] = held
    entries: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * n
    entries[rank] = codec.decode_entries(held, numel)
    received = 0
    for r in range(n - 1):
        outbox.offer("ag", r, held)
        held = await pull("ag", r)
        received += len(held)
        owner = (rank - 1 - r) % n
        entries[owner] = _entries(held, codec, numel, most("ag", r))
        payloads[owner] = held
    digest = gathered_digest(payloads)
    outbox.offer("ag", n - 1, digest)
    if await pull("ag", n - 1) != digest:
        raise Mismatch("the left neighbour gathered other payloads than we did")
    total = torch.zeros(numel)
    for got in entries:  # roster order on every member: the same fp32 sums
        assert got is not None
        total.index_add_(0, got[0], got[1])
    return total / n, received
