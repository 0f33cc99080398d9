"""Live recovery over ``/intellect/diloco/1.0.0``: a joiner announces itself, then pulls a
member's whole state (``node.diloco.state``) at the boundary the leader expects it at.

``join`` (to the leader): be expected at outer step ``step`` or later; the leader answers
with the boundary (``ready``) or ``wait``, and the roster of that boundary then waits for
the joiner as for a member. ``state`` (to any member): the state it offers at the start of
``step``; ``busy`` until it reaches that boundary, ``not_found`` once it moved past it (the
joiner then asks the leader again). The state follows the ``DilocoChunk`` reply in raw frames
of at most ``STATE_FRAME`` bytes; the joiner checks the total size and the sha256 before
it loads anything.
"""

from __future__ import annotations

import hashlib
import logging

import trio

from node.diloco.membership import Membership, Refused
from node.net.requests import RemoteRefusal, Responder
from node.net.runtime import Node
from protocol.diloco import DILOCO, STATE_FRAME, DilocoChunk, DilocoRequest, DilocoRoster
from protocol.errors import Reason, WireError

log = logging.getLogger("intellect.diloco")
POLL = 0.2


class JoinRefused(Exception):
    """The leader will not let us join."""


def request(node: Node, op: str, step: int = 0) -> DilocoRequest:
    """A ``DilocoRequest`` for ``op`` that names only a step."""
    return DilocoRequest(
        **node.header(),
        op=op,
        step=step,
        attempt=0,
        phase="",
        round=0,
        layout="",
        norm=0.0,
        state="",
        blame="",
    )


async def ask_join(node: Node, leader: str, at_least: int = 0) -> DilocoRoster | None:
    """One ``join`` request to ``leader``: its reply (``ready``: the step it expects us at,
    and its last roster in ``members``; ``wait``: it has no boundary ≥ ``at_least`` yet),
    or ``None`` if the stream failed (ask again)."""
    try:
        reply = await node.request(leader, DILOCO, request(node, "join", at_least), DilocoRoster)
    except RemoteRefusal as exc:
        raise JoinRefused(f"the leader refused us: {exc}") from exc
    except Exception as exc:  # a slow or lost stream (py-libp2p raises many types)
        log.info("join request failed (retrying): %r", exc)
        return None
    if reply.sender != leader:
        raise JoinRefused("a join reply not from the leader")
    return reply


async def announce_join(node: Node, leader: str, at_least: int = 0) -> int:
    """Ask ``leader`` to expect us at step ``at_least`` or later; the step it expects us at."""
    while True:
        reply = await ask_join(node, leader, at_least)
        if reply is not None and reply.state == "ready":
            return int(reply.step)
        await trio.sleep(POLL)


async def answer_join(
    node: Node, membership: Membership, encoding: str, msg: DilocoRequest, responder: Responder
) -> None:
    """The leader's answer to ``join``: the step the joiner is expected at, or ``wait``."""
    try:
        at = membership.expect(msg.sender, msg.step)
    except Refused as exc:
        raise WireError(Reason.NOT_MEMBER, f"refused: {exc}") from exc
    await responder.send(
        DilocoRoster(
            **node.header(),
            step=msg.step if at is None else at,
            attempt=0,
            state="wait" if at is None else "ready",
            encoding=encoding,
            members=list(membership.members),
            norms=[],
        )
    )


async def fetch_state(node: Node, donor: str, step: int) -> bytes | None:
    """``donor``'s state at the start of ``step``; ``None`` if it has moved past it (the
    caller bounds the wait)."""
    while True:
        try:
            async with node.open_request(
                donor, DILOCO, request(node, "state", step), DilocoChunk
            ) as ex:
                reply: DilocoChunk = ex.reply
                parts, have = [], 0
                while have < reply.size:
                    part = await ex.reader.read_frame(
                        min(STATE_FRAME, reply.size - have), node.cfg.net.read_timeout
                    )
                    parts.append(part)
                    have += len(part)
            data = b"".join(parts)
            if hashlib.sha256(data).digest() != reply.digest or reply.step != step:
                raise WireError(Reason.MALFORMED, "state bytes do not match their digest")
            return data
        except RemoteRefusal as exc:
            if exc.reason == Reason.NOT_FOUND.value:
                return None
            if exc.reason != Reason.BUSY.value:
                raise
        except Exception as exc:  # a lost stream or a bad transfer: ask again
            log.info("state transfer failed (retrying): %r", exc)
        await trio.sleep(POLL)


async def serve_state(
    node: Node, snapshot: tuple[int, bytes] | None, msg: DilocoRequest, responder: Responder
) -> None:
    """Answer a ``state`` request from the ``snapshot`` (step, bytes) we offer."""
    if snapshot is None or snapshot[0] < msg.step:
        raise WireError(Reason.BUSY, "not at that outer step yet")
    step, data = snapshot
    if step > msg.step:
        raise WireError(Reason.NOT_FOUND, f"at outer step {step} already")
    await responder.send(
        DilocoChunk(
            **node.header(),
            step=step,
            attempt=0,
            phase="",
            round=0,
            size=len(data),
            digest=hashlib.sha256(data).digest(),
        )
    )
    for start in range(0, len(data), STATE_FRAME):
        await responder.write(data[start : start + STATE_FRAME])
