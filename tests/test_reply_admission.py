"""Replies get the admission requests get (``node/net/requests.py`` ``open_request``): a
reply of another run, with a timestamp outside the clock skew, with a sequence number
already seen, or signed by another peer than the one asked, is refused and counted.

In process: ``Requests`` over a host whose streams are trio memory streams, the asked
peer a task that reads the request frame and writes the reply the test chose.
"""

from types import SimpleNamespace

import pytest
import trio
import trio.testing

from crypto.identity import Identity
from node.config import NodeConfig
from node.net.metrics import Metrics
from node.net.requests import Requests, now_ms
from protocol.errors import Reason, WireError
from protocol.framing import TrioStream, read_frame, write_frame
from protocol.messages import SyncReply, SyncRequest
from protocol.wire import seal

RUN = "test-run"
PROTOCOL = "/intellect/test/1.0.0"
SKEW_S = 30.0


class Stream(TrioStream):
    async def close(self):
        await self.stream.aclose()

    async def reset(self):
        await self.stream.aclose()


class Host:
    """Each new stream is one end of a memory stream pair; the other end goes to
    ``answer``, which plays the asked peer."""

    def __init__(self, nursery, answer):
        self.nursery, self.answer = nursery, answer

    async def new_stream(self, pid, protocols):
        ours, theirs = trio.testing.memory_stream_pair()
        self.nursery.start_soon(self.answer, TrioStream(theirs))
        return Stream(ours)


def requests_over(host, me):
    cfg = NodeConfig(
        run={"id": RUN},
        net={
            "max_clock_skew": SKEW_S,
            "peer_max_streams": 8,
            "peer_request_burst": 100,
            "peer_shun_cooldown": 60.0,
            "read_timeout": 5.0,
        },
    )
    network = SimpleNamespace(host=host, connected_peers=lambda: set())
    peers = SimpleNamespace(peers={})
    header = {"run_id": RUN, "sender": me.peer_id, "seq": 1, "ts_ms": now_ms()}
    return Requests(cfg, me, network, peers, Metrics(), lambda: header)


def a_reply(signer, *, run=RUN, seq=7, ts_ms=None, sender=None):
    return SyncReply(
        run_id=run,
        sender=sender or signer.peer_id,
        seq=seq,
        ts_ms=now_ms() if ts_ms is None else ts_ms,
        items=[b"x"],
    )


async def asked(replies, signer=None):
    """Ask the peer ``peer`` once per reply in ``replies`` (sealed by ``signer``, default
    the peer itself): each outcome (the reply, or the ``WireError``), and the requester's
    rejection counts by reason."""
    me, peer = Identity.generate(), Identity.generate()
    signer = signer or peer
    queue = list(replies)

    async def answer(stream):
        await read_frame(stream, 1 << 20, 5.0)
        await write_frame(stream, seal(signer, queue.pop(0)(signer)), 5.0)

    outcomes = []
    async with trio.open_nursery() as nursery:
        requests = requests_over(Host(nursery, answer), me)
        for n in range(len(replies)):
            request = SyncRequest(
                run_id=RUN, sender=me.peer_id, seq=n + 1, ts_ms=now_ms(), session=1, indices=[0]
            )
            try:
                outcomes.append(await requests.request(peer.peer_id, PROTOCOL, request, SyncReply))
            except WireError as err:
                outcomes.append(err)
    counts = {
        r: requests.metrics.get("rejected", reason=r.value, protocol=PROTOCOL) for r in Reason
    }
    return outcomes, {r: n for r, n in counts.items() if n}


async def test_an_honest_reply_is_admitted():
    (reply,), rejected = await asked([a_reply])
    assert isinstance(reply, SyncReply) and reply.items == [b"x"] and rejected == {}


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda signer: a_reply(signer, run="other-run"), Reason.WRONG_RUN),
        (lambda signer: a_reply(signer, ts_ms=now_ms() - 10 * 60_000), Reason.STALE),
        (lambda signer: a_reply(signer, ts_ms=now_ms() + 10 * 60_000), Reason.STALE),
    ],
    ids=["other-run", "old-timestamp", "future-timestamp"],
)
async def test_a_reply_outside_the_run_or_the_clock_skew_is_refused(make, reason):
    (outcome,), rejected = await asked([make])
    assert isinstance(outcome, WireError), f"a reply that is {reason.value} was admitted"
    assert outcome.reason == reason
    assert rejected == {reason: 1}


async def test_a_replayed_reply_is_refused():
    """Two replies with the same sequence number: the second is a replay."""
    outcomes, rejected = await asked([a_reply, a_reply])
    assert isinstance(outcomes[0], SyncReply)
    assert isinstance(outcomes[1], WireError), "a replayed reply was admitted"
    assert outcomes[1].reason == Reason.REPLAY and rejected == {Reason.REPLAY: 1}


async def test_a_reply_signed_by_another_peer_than_the_one_asked_is_refused():
    """Well signed, its sender its signer, but not the peer at the stream's other end."""
    (outcome,), rejected = await asked([a_reply], signer=Identity.generate())
    assert isinstance(outcome, WireError), "a reply of another peer was admitted"
    assert outcome.reason == Reason.SENDER_MISMATCH
    assert rejected == {Reason.SENDER_MISMATCH: 1}
