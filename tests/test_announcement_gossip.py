"""Announcements go out on gossip (``node/net/announcements.py``): what a node announces
reaches a subscriber of another node through the announce topic itself, not only later
through the sync repair that a heartbeat starts.

In process: two ``Announcements`` services whose networks share one in-memory topic (what
one publishes, the other's topic validator sees), under trio's mock clock; no heartbeat is
ever sent, so nothing can arrive by sync.
"""

from types import SimpleNamespace

import trio
from libp2p.peer.id import ID

from crypto.identity import Identity
from node.config import NodeConfig
from node.net.announcements import Announcements
from node.net.metrics import Metrics
from node.net.requests import Requests, now_ms
from protocol import ids
from protocol.messages import Announcement
from protocol.wire import open_message

RUN = "test-run"


class Topic:
    """One gossip topic: every published message goes to every other node's validator."""

    def __init__(self):
        self.validators = {}  # own id bytes -> validator
        self.published = []  # (topic, data)
        self.sent = trio.Event()  # set once something was published (and validated)

    def network_of(self, identity):
        own = ID.from_base58(identity.peer_id)
        topic = self

        class PubSub:
            def set_topic_validator(self, name, validator, is_async):
                topic.validators[own.to_bytes()] = validator

            async def subscribe(self, name):
                return SimpleNamespace(get=trio.sleep_forever)

        async def publish(name, data):
            topic.published.append((name, data))
            for who, validate in topic.validators.items():
                if who != own.to_bytes():
                    validate(None, SimpleNamespace(from_id=own.to_bytes(), data=data))
            topic.sent.set()

        host = SimpleNamespace(get_id=lambda: own, set_stream_handler=lambda *args: None)
        return SimpleNamespace(host=host, pubsub=PubSub(), publish=publish)


def service(topic, identity, run=RUN):
    cfg = NodeConfig(
        run={"id": run},
        net={
            "max_clock_skew": 30.0,
            "peer_max_streams": 8,
            "peer_request_burst": 100,
            "peer_shun_cooldown": 60.0,
            "read_timeout": 5.0,
            "announce_buffer": 64,
            "gossip_queue": 16,
        },
    )
    seq = iter(range(now_ms() * 1000, now_ms() * 1000 + 10_000))

    def header():
        return {"run_id": run, "sender": identity.peer_id, "seq": next(seq), "ts_ms": now_ms()}

    network = topic.network_of(identity)
    peers = SimpleNamespace(peers={})
    requests = Requests(cfg, identity, network, peers, Metrics(), header)
    return Announcements(cfg.net, run, identity, network, requests)


async def test_an_announcement_reaches_another_node_by_gossip(autojump_clock):
    topic = Topic()
    a, b = Identity.generate(), Identity.generate()
    sender, receiver = service(topic, a), service(topic, b)
    heard, both = [], trio.Event()

    def on_block(msg):
        heard.append(msg)
        if len(heard) == 2:
            both.set()

    receiver.subscribe("blocks", on_block)
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.serve)
        await nursery.start(receiver.serve)
        sender.announce("blocks", b"one")
        sender.announce("blocks", b"two")
        with trio.move_on_after(5):  # virtual seconds: far more than pacing needs
            await both.wait()
        nursery.cancel_scope.cancel()
    assert [m.body for m in heard] == [b"one", b"two"], "nothing announced came by gossip"
    assert all(m.sender == a.peer_id and m.topic == "blocks" for m in heard)
    assert receiver.status().delivered_via == {"gossip": 2}
    assert sender.status().published == 2
    # on the run's announce topic, as signed announcements with the session's indices
    assert {name for name, _ in topic.published} == {ids.announce_topic(RUN)}
    sent = [open_message(data, Announcement) for _, data in topic.published]
    assert [(m.session, m.index) for m in sent] == [(sender.session, 0), (sender.session, 1)]


async def test_a_gossiped_announcement_of_another_run_is_refused(autojump_clock):
    """Gossip goes through admission like a request: an announcement of another run is
    counted as ``wrong_run`` and delivered to nobody (one on the same topic name is not
    enough: the run is in the signed header)."""
    topic = Topic()
    stranger = service(topic, Identity.generate(), run="other-run")
    receiver = service(topic, Identity.generate())
    heard = []
    receiver.subscribe("blocks", heard.append)
    async with trio.open_nursery() as nursery:
        await nursery.start(stranger.serve)
        await nursery.start(receiver.serve)
        stranger.announce("blocks", b"one")
        with trio.fail_after(5):  # virtual seconds
            await topic.sent.wait()  # published, and seen by the receiver's validator
        nursery.cancel_scope.cancel()
    assert len(topic.published) == 1
    assert heard == [], "an announcement of another run was delivered"
    metrics = receiver.requests.metrics
    assert metrics.get("rejected", reason="wrong_run", protocol="gossip-announce") == 1
