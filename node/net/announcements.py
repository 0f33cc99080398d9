"""Announcements: small signed notices on gossip, each delivered once, none lost for good.

Publishing goes through a paced queue (gossipsub drops what exceeds its rate, SPEC §7):
each announcement gets the next index of our session and is kept in the ``Outbox``.
Receiving: every announcement is verified and admitted in gossip's topic validator,
delivered to the topic's subscribers once (``Inbox``), and anything gossip did not bring
is fetched by request (``/intellect/sync``): a publisher's heartbeat counts what it has
announced (``heard``), and what we lack of it is asked for, after a grace period when the
heartbeat came by gossip (which may overtake the announcements it counts), and after more
of them, up to ``SYNC_PATIENCE``, while gossip keeps bringing that publisher's messages.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import trio

from crypto.identity import Identity
from node.config import NetConfig
from node.net.delivery import Inbox, Outbox
from node.net.gossip import drain, subscribe, topic_validator
from node.net.network import Network
from node.net.pacing import TokenBucket
from node.net.requests import Requests, Responder
from protocol import ids
from protocol.errors import WireError
from protocol.messages import Announcement, SyncReply, SyncRequest
from protocol.wire import open_message, seal

log = logging.getLogger("intellect.node")
SYNC_GRACE = 2.0  # seconds gossip gets to deliver what a gossiped heartbeat counts
SYNC_PATIENCE = 10.0  # seconds a sync waits at most while gossip still makes progress
SYNC_BATCH = 64  # announcements asked for in one sync request at most
# syncs running at once at most: heartbeats are signed with keys that cost nothing to make,
# and one sync per claimed publisher let a flood of them start thousands of tasks, each
# dialling addresses the heartbeat named; a publisher left out now is asked at its next one
MAX_SYNCS = 16
AnnouncementHandler = Callable[[Announcement], None]


@dataclass(frozen=True)
class AnnouncementStatus:
    published: int
    delivered: dict[str, int]
    delivered_via: dict[str, int]  # "gossip" / "sync": how each arrived
    duplicates: dict[str, int]  # arrivals already delivered, by path
    queued: int


class Announcements:
    """Paced publishing, once-only delivery and gap repair of announcements."""

    def __init__(
        self, cfg: NetConfig, run_id: str, identity: Identity, network: Network, requests: Requests
    ) -> None:
        """``cfg``: the node's ``[net]`` section; ``run_id``: the run whose topic it uses."""
        self.cfg, self.run_id = cfg, run_id
        self.identity, self.network, self.requests = identity, network, requests
        self.outbox = Outbox(session=requests.header()["seq"], capacity=cfg.announce_buffer)
        self.inbox = Inbox(horizon=cfg.announce_buffer)
        self.delivered: Counter[str] = Counter()
        self.delivered_via: Counter[str] = Counter()
        self.duplicates: Counter[str] = Counter()
        self._handlers: defaultdict[str, list[AnnouncementHandler]] = defaultdict(list)
        self._pacer = TokenBucket(rate=cfg.gossip_rate, burst=max(1.0, cfg.gossip_rate / 10))
        self._queue_send, self._queue_recv = trio.open_memory_channel[tuple[str, bytes]](
            cfg.gossip_queue
        )
        # publishers a sync is running for -> the newest count heard from them meanwhile
        self._syncing: dict[str, int] = {}
        self._drained = trio.Event()  # set by the publisher whenever its queue runs empty
        self._nursery: trio.Nursery | None = None

    @property
    def session(self) -> int:
        return self.outbox.session

    @property
    def count(self) -> int:
        """How many we have published this session."""
        return self.outbox.count

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve sync requests, validate and deliver the announce topic, publish the queue."""
        self.requests.serve(ids.SYNC, SyncRequest, self._handle_sync)
        assert self.network.host is not None
        own = self.network.host.get_id().to_bytes()
        validator = topic_validator(
            self.requests, own, "gossip-announce", lambda data: self._receive(data, "gossip")
        )
        sub = await subscribe(self.network, ids.announce_topic(self.run_id), validator)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(drain, sub)
            nursery.start_soon(self._publisher_loop)
            task_status.started()

    def subscribe(self, topic: str, handler: AnnouncementHandler) -> None:
        """Call ``handler`` for every admitted announcement on ``topic`` (each once)."""
        self._handlers[topic].append(handler)

    def announce(self, topic: str, body: bytes) -> None:
        """Queue an announcement for the paced publisher; raises ``trio.WouldBlock`` if full."""
        self._queue_send.send_nowait((topic, body))

    async def flush(self, limit_s: float = 5.0) -> None:
        """Give the paced publisher up to ``limit_s`` to send what is still queued."""
        self._drained = trio.Event()
        if self._queue_send.statistics().current_buffer_used:
            with trio.move_on_after(limit_s):
                await self._drained.wait()
        dropped = self._queue_send.statistics().current_buffer_used
        if dropped:
            log.warning(
                "stopping with %d announcements unsent (could not publish them in %.0f s)",
                dropped,
                limit_s,
            )

    def heard(self, sender: str, session: int, announced: int, via: str) -> None:
        """A peer's heartbeat says it has announced ``announced`` in ``session``: ask it for
        what we lack (after ``SYNC_GRACE`` if the heartbeat came by gossip)."""
        if sender in self._syncing:  # a sync waiting out its grace: let it ask for all
            self._syncing[sender] = max(announced, self._syncing[sender])
        if sender not in self._syncing and len(self._syncing) >= MAX_SYNCS:
            self.requests.metrics.inc("syncs_deferred")
            return
        missing = self.inbox.missing(sender, session, announced, limit=SYNC_BATCH)
        if missing and sender not in self._syncing and self._nursery is not None:
            grace = SYNC_GRACE if via == "gossip" else 0.0
            self._syncing[sender] = announced
            self._nursery.start_soon(self._sync_from, sender, session, missing, grace)

    def status(self) -> AnnouncementStatus:
        return AnnouncementStatus(
            published=self.outbox.count,
            delivered=dict(self.delivered),
            delivered_via=dict(self.delivered_via),
            duplicates=dict(self.duplicates),
            queued=self._queue_send.statistics().current_buffer_used,
        )

    async def _publisher_loop(self) -> None:
        topic_name = ids.announce_topic(self.run_id)
        async for topic, body in self._queue_recv:
            await trio.sleep(self._pacer.delay(trio.current_time()))
            self._pacer.take(trio.current_time())
            index = self.outbox.next_index()
            msg = Announcement(
                **self.requests.header(),
                topic=topic,
                session=self.outbox.session,
                index=index,
                body=body,
            )
            data = seal(self.identity, msg)
            self.outbox.add(index, data)
            self.requests.count_out("gossip-announce", data)
            try:
                await self.network.publish(topic_name, data)
            except Exception as exc:  # peers can still fetch it from the outbox
                log.warning("announce publish failed index=%d: %s", index, exc)
            if not self._queue_send.statistics().current_buffer_used:
                self._drained.set()

    def _receive(self, data: bytes, via: str) -> None:
        msg = open_message(data, Announcement)
        if msg.sender == self.identity.peer_id:
            return
        self.requests.admit(msg)
        if not self.inbox.add(msg.sender, msg.session, msg.index):
            self.duplicates[via] += 1
            return
        self.delivered[msg.sender] += 1
        self.delivered_via[via] += 1
        for handler in self._handlers.get(msg.topic, []):
            try:
                handler(msg)
            except Exception as exc:  # a subscriber's bug must not stop delivery or relay
                self.requests.metrics.inc("subscriber_errors", topic=msg.topic)
                log.exception("announcement handler failed topic=%s: %s", msg.topic, exc)

    async def _handle_sync(self, msg: SyncRequest, r: Responder) -> None:
        items = self.outbox.get(msg.session, msg.indices)
        await r.send(SyncReply(**self.requests.header(), items=items))

    async def _sync_from(self, sender: str, session: int, indices: list[int], grace: float) -> None:
        """Ask ``sender`` for the announcements ``indices``; after a grace period, for
        those still missing by then of all it is known to have announced."""
        try:
            if grace > 0:
                # gossip still bringing this publisher's announcements is only behind (a
                # busy mesh, or a busy machine, can lag more than one grace period): wait
                # while it makes progress, up to SYNC_PATIENCE, then ask for what is missing
                waited = 0.0
                while True:
                    before = self.inbox.held(sender, session)
                    await trio.sleep(grace)
                    waited += grace
                    if waited >= SYNC_PATIENCE or self.inbox.held(sender, session) == before:
                        break
                announced = self._syncing[sender]
                indices = self.inbox.missing(sender, session, announced, limit=SYNC_BATCH)
                if not indices:
                    return  # gossip brought them meanwhile
            req = SyncRequest(**self.requests.header(), session=session, indices=indices)
            reply: SyncReply = await self.requests.request(sender, ids.SYNC, req, SyncReply)
            for item in reply.items:
                try:
                    self._receive(item, "sync")
                except WireError as err:
                    self.requests.reject(ids.SYNC, sender, err)
            self.requests.metrics.inc("synced_announcements", len(reply.items))
        except Exception as exc:
            log.debug("sync from %s failed: %s", sender[-8:], exc)
        finally:
            self._syncing.pop(sender, None)
