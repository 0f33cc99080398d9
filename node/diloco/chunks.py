"""A ring chunk on the wire: the ``chunk`` request of ``/intellect/diloco/1.0.0``.

Every exchange of the ring is a pull (``node.diloco.ring``): a member asks its left
neighbour in the roster for what it offers in a (phase, round) of an attempt
(``pull_chunk``), and answers only its right neighbour (``serve_chunk``). The puller knows
the size of every chunk before it asks (``pulled_sizes``), so a reply that declares
another size is refused before a byte of it is read; the bytes must then match the
digest their sender declared. Either failure is the sender's (the stream is authenticated
and encrypted: nothing on the way can change a byte), so it is a ``BadChunk``, for which
the puller blames its left neighbour and the leader refuses it for the rest of the step.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import trio

from node.diloco.quant import Compressor
from node.diloco.ring import DIGEST_SIZE, PHASES, Aborted, BadChunk, Outbox, bounds, chunk_of
from node.net.requests import RemoteRefusal, Responder
from node.net.runtime import Node
from protocol.diloco import DILOCO, MAX_CHUNK, DilocoChunk, DilocoRequest
from protocol.errors import Reason, WireError

Round = tuple[int, int, str, int]  # (outer step, attempt, phase, round)


@dataclass
class Attempt:
    roster: list[str]
    outbox: Outbox
    norms: list[float]
    sizes: dict[tuple[str, int], int]  # of the chunks we pull (``pulled_sizes``)


def pulled_sizes(numel: int, rank: int, n: int, codec: Compressor) -> dict[tuple[str, int], int]:
    """The bytes of each chunk member ``rank`` of ``n`` pulls, by (phase, round), in an
    all-reduce of ``numel`` values: ``ring.all_reduce``'s chunk order and the codec's
    lengths (a sparse codec: one payload of the whole vector per all-gather round, then a
    digest in the closing round). Every
    member knows them before it pulls, so a reply that declares another size is refused
    before a byte of it is read (a peer could otherwise make us buffer up to the 2³¹ bytes
    the field allows, until the read deadline)."""
    if not codec.summable:  # n − 1 payloads, then the closing round's digest
        sizes = {("ag", r): codec.wire_size(numel) for r in range(n - 1)}
        return {**sizes, ("ag", n - 1): DIGEST_SIZE}
    spans, left = bounds(numel, n), (rank - 1) % n
    return {
        (phase, r): codec.wire_size(hi - lo)
        for phase in PHASES
        for r in range(n - 1)
        for lo, hi in [spans[chunk_of(phase, left, r, n)]]
    }


def check_reply(reply: DilocoChunk, want: Round, size: int) -> None:
    """A chunk reply we may read: for the round we asked and of the size we expect (another
    size is a chunk that cannot decode: the left neighbour is blamed, as for one that does
    not)."""
    if (reply.step, reply.attempt, reply.phase, reply.round) != want:
        raise WireError(Reason.MALFORMED, "a chunk for another round")
    if reply.size != size:
        raise BadChunk(f"a chunk of {reply.size} B declared, {size} B expected")


async def pull_chunk(node: Node, left: str, want: Round, size: int) -> bytes | None:
    """The chunk ``left`` offers for ``want``, of ``size`` bytes; None while it has not
    offered it yet (ask again). ``BadChunk`` for a reply of another size or bytes that do not
    match their declared digest."""
    step, attempt, phase, rnd = want
    msg = DilocoRequest(
        **node.header(),
        op="chunk",
        step=step,
        attempt=attempt,
        phase=phase,
        round=rnd,
        layout="",
        norm=0.0,
        state="",
        blame="",
    )
    try:
        async with node.open_request(left, DILOCO, msg, DilocoChunk) as ex:
            reply: DilocoChunk = ex.reply
            check_reply(reply, want, size)
            data = await ex.reader.read_frame(reply.size, node.cfg.net.read_timeout)
    except RemoteRefusal as exc:
        if exc.reason == Reason.BUSY.value:  # not offered yet: ask again
            return None
        raise
    if len(data) != reply.size or hashlib.sha256(data).digest() != reply.digest:
        # a whole frame of other bytes than it declared (an early end of the stream is
        # EOFError, not this): the sender's doing, as a chunk that does not decode is
        raise BadChunk("the chunk's bytes do not match the digest its sender declared")
    return data


async def serve_chunk(
    node: Node, attempt: Attempt | None, msg: DilocoRequest, responder: Responder
) -> None:
    """Answer a ``chunk`` request for ``attempt`` (None: not started here yet): only our
    right neighbour in its roster may pull, once we offer the chunk."""
    if attempt is None:
        raise WireError(Reason.BUSY, "attempt not started here yet")
    roster = attempt.roster
    right = roster[(roster.index(node.peer_id) + 1) % len(roster)]
    if msg.sender != right or msg.phase not in PHASES:
        raise WireError(Reason.NOT_MEMBER, "only our right neighbour in the roster may pull")
    try:
        with trio.fail_after(node.cfg.net.read_timeout / 2):
            data = await attempt.outbox.take(msg.phase, msg.round)
    except trio.TooSlowError:
        raise WireError(Reason.BUSY, "not offered yet") from None
    except Aborted:
        raise WireError(Reason.ABORTED, "attempt abandoned") from None
    if len(data) > MAX_CHUNK:
        raise WireError(Reason.INTERNAL, "chunk too large")
    await responder.send(
        DilocoChunk(
            **node.header(),
            step=msg.step,
            attempt=msg.attempt,
            phase=msg.phase,
            round=msg.round,
            size=len(data),
            digest=hashlib.sha256(data).digest(),
        )
    )
    await responder.write(data)
