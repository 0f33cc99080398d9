"""The node runtime: one py-libp2p host with its DHT, gossip and request protocols.

``Node.serve`` runs everything under one nursery:
- request/response handlers for ``/intellect/presence`` and ``/intellect/sync``, each
  under a guard (nothing a peer sends can raise into py-libp2p, which would take the
  host down) and with a deadline on every read;
- discovery: dial the bootstrap peers, provide our role key in the DHT (again only when
  the DHT needs it: ``node/net/schedules.py``), look up the role keys this role works with on
  a schedule that backs off once they are found and returns when one disappears, and greet
  (presence exchange) what it finds, so a node that knows only B finds A through B;
- connections: kept between ``conn_low`` and ``conn_high`` (``node/net/connections.py``),
  with a few peers of each role protected as the peers in use; gossip relies on its mesh
  over these links, never on a full mesh;
- presence: a signed heartbeat on gossip every ``heartbeat_period()`` (longer as the
  network grows, so that a node receives about ``presence_rate`` heartbeats a second
  whatever the network's size); a peer silent for the TTL is asked directly first (a
  busy node is not dead, and gossip may miss), forgotten if it does not answer; on shutdown
  a ``leaving`` notice goes out on gossip and directly to every connected peer;
- announcements: a paced publisher, and gap repair by direct request for anything
  gossip did not bring.
Services and roles build on a small public API and never on the internals:
- ``serve_requests(protocol, request_type, handler)``: a request/response protocol whose
  request envelope the runtime reads, verifies, admits and counts before the handler sees
  it; the handler answers through a ``Responder`` (one reply, then bulk frames if the
  protocol carries any). ``request`` / ``open_request`` are the dialing side.
- ``subscribe(topic, handler)``: every announcement on ``topic``, delivered once;
  ``announce(topic, body)`` publishes one.
- ``add_status(name, section)``: a role's own figures in ``/status``.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio
from libp2p.abc import IHost, INetStream
from libp2p.kad_dht.provider_store import PROVIDER_RECORD_REPUBLISH_INTERVAL
from libp2p.network.stream.exceptions import StreamError
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from libp2p.tools.anyio_service import background_trio_service

from crypto.identity import Identity
from node.config import NodeConfig
from node.net.connections import ConnectionPlan
from node.net.delivery import Inbox, Outbox
from node.net.host import (
    WIRE,
    advertised_addrs,
    build_dht,
    build_host,
    build_pubsub,
    local_ipv4s,
    parse_addrs,
    providers_nearby,
)
from node.net.metrics import Metrics
from node.net.pacing import TokenBucket
from node.net.peers import PeerTable
from node.net.schedules import NEEDS, LookupSchedule, ProvideSchedule
from protocol import ids
from protocol.admission import Admission
from protocol.errors import Reason, WireError
from protocol.framing import FrameReader, read_frame, write_frame
from protocol.messages import (
    Announcement,
    Header,
    NodeInfo,
    Refusal,
    SyncReply,
    SyncRequest,
)
from protocol.wire import max_envelope_size, open_message, seal

log = logging.getLogger("intellect.node")
TEND_INTERVAL = 1.0  # seconds between connection upkeep rounds
DIAL_COOLDOWN = 60.0  # a peer that dropped our link (or we trimmed) is not dialed sooner
STATUS_FULL_LIST = 32  # /status lists every known peer up to this many, else the peers in use
MAX_CANDIDATES = 256  # DHT providers kept as dial candidates
PROVIDE_LIMIT = 60.0  # seconds a provide (a walk, then one store per close peer) may take
SYNC_GRACE = 2.0  # seconds gossip gets to deliver what a gossiped heartbeat counts
SYNC_BATCH = 64  # announcements asked for in one sync request at most
NEARBY_ASKED = 8  # connected peers asked for a role's providers by a well-connected node
REPLAY_PRESENCE = 8  # newest heartbeats (one per publisher) sent to a newly subscribed peer
GREET_AGAIN = 30.0  # seconds before a connected peer of unknown role is greeted again
MAX_PROBES = 4  # silent peers asked directly at once (a probe may dial)
AnnouncementHandler = Callable[[Announcement], None]


class Responder:
    """The listener's side of one request stream: send the reply, then any bulk frames."""

    def __init__(self, node: Node, stream: INetStream, protocol: str, peer: str) -> None:
        self.node, self.stream, self.protocol, self.peer = node, stream, protocol, peer

    async def send(self, message: Header) -> None:
        """Seal, count and write one reply envelope."""
        await self.node._reply(self.stream, self.protocol, message)

    async def write(self, data: bytes, deadline: float | None = None) -> None:
        """Write one raw frame (bulk data after the reply), counted as traffic."""
        self.node._count_out(self.protocol, data)
        await write_frame(self.stream, data, deadline or self.node.cfg.read_timeout)


@dataclass
class Exchange:
    """The dialer's side of one request stream after the reply: read further frames."""

    peer: str
    reply: Any
    reader: FrameReader
    stream: INetStream


RequestHandler = Callable[[Any, Responder], Awaitable[None]]


class RemoteRefusal(Exception):
    """The peer answered our request with a ``Refusal``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"peer refused: {reason}: {detail}")
        self.reason = reason


def now_ms() -> int:
    return int(time.time() * 1000)


class Node:
    def __init__(self, cfg: NodeConfig, identity: Identity) -> None:
        self.cfg = cfg
        self.identity = identity
        self.peer_id = identity.peer_id
        self.metrics = Metrics()
        self.peers = PeerTable(self.peer_id, cfg.peer_ttl, per_role=cfg.peers_per_role)
        self.links = ConnectionPlan(
            low=cfg.conn_low,
            high=cfg.conn_high,
            grace=cfg.connect_timeout,
            cooldown=DIAL_COOLDOWN,
        )
        base = cfg.discovery_interval
        self.lookups = LookupSchedule(
            NEEDS[cfg.role],
            base=base,
            longest=max(base, cfg.discovery_max_interval),
            longest_missing=max(base, cfg.discovery_max_interval / 2),
        )
        self.provides = ProvideSchedule(
            republish=float(PROVIDER_RECORD_REPUBLISH_INTERVAL), retry=4 * base
        )
        self._candidates: dict[str, tuple[str, PeerInfo]] = {}  # from DHT lookups
        self._probing: set[str] = set()
        self._dialing: set[str] = set()
        self._transient: set[str] = set()  # links opened by DHT queries, not yet tended
        self._greeted: dict[str, float] = {}  # connected peers of unknown role we greeted
        self._rng = random.Random()
        self.admission = Admission(cfg.run_id, max_skew_ms=int(cfg.max_clock_skew * 1000))
        self._seq = time.time_ns() // 1000
        self.outbox = Outbox(session=self._seq, capacity=cfg.announce_buffer)
        self.inbox = Inbox(horizon=cfg.announce_buffer)
        self.delivered: Counter[str] = Counter()
        self.delivered_via: Counter[str] = Counter()  # "gossip" / "sync": how each arrived
        self.duplicates: Counter[str] = Counter()  # arrivals already delivered, by path
        self.dht_providers: set[str] = set()  # peers learned from DHT provider records
        self.announcement_handlers: list[AnnouncementHandler] = []
        self._topic_handlers: defaultdict[str, list[AnnouncementHandler]] = defaultdict(list)
        self._status_sections: dict[str, Callable[[], dict[str, Any]]] = {}
        self._pacer = TokenBucket(rate=cfg.gossip_rate, burst=max(1.0, cfg.gossip_rate / 10))
        self._queue_send, self._queue_recv = trio.open_memory_channel[tuple[str, bytes]](
            cfg.gossip_queue
        )
        # publishers a sync is running for -> the newest count heard from them meanwhile
        self._syncing: dict[str, int] = {}
        self._providing = False  # a provide round is running
        self._stop = trio.Event()
        self._drained = trio.Event()  # set by the publisher whenever its queue runs empty
        self._nursery: trio.Nursery | None = None
        self.host: IHost | None = None
        self.addrs: list[str] = []

    # ---- messages we send -------------------------------------------------------------

    def header(self) -> dict[str, Any]:
        """A fresh message header (run id, our peer id, next sequence number, now)."""
        return self._header()

    def _header(self) -> dict[str, Any]:
        self._seq += 1
        return {
            "run_id": self.cfg.run_id,
            "sender": self.peer_id,
            "seq": self._seq,
            "ts_ms": now_ms(),
        }

    def node_info(self) -> NodeInfo:
        """Who we are; ``leaving`` from the moment a stop was requested."""
        return NodeInfo(
            **self._header(),
            role=self.cfg.role,
            state="leaving" if self._stop.is_set() else "up",
            addrs=self.addrs[:8],
            session=self.outbox.session,
            announced=self.outbox.count,
        )

    def _count_out(self, protocol: str, data: bytes) -> None:
        self.metrics.inc("messages", direction="out", protocol=protocol)
        self.metrics.inc("bytes", len(data), direction="out", protocol=protocol)

    def _count_in(self, protocol: str, data: bytes) -> None:
        self.metrics.inc("messages", direction="in", protocol=protocol)
        self.metrics.inc("bytes", len(data), direction="in", protocol=protocol)

    def reject(self, protocol: str, peer: str, err: WireError) -> None:
        """Count and log an input rejected for ``err.reason`` (services call this too)."""
        self._reject(protocol, peer, err)

    def _reject(self, protocol: str, peer: str, err: WireError) -> None:
        self.metrics.inc("rejected", reason=err.reason.value, protocol=protocol)
        log.info(
            "rejected input protocol=%s peer=%s reason=%s detail=%s",
            protocol,
            peer[-8:],
            err.reason,
            err.detail,
        )

    # ---- lifecycle --------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[Node] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await self._serve(task_status)
        except BaseException as exc:
            # py-libp2p 0.8.1's pubsub and swarm tasks may raise while their nurseries close
            # (``RuntimeError: Nursery is closed to new arrivals``): once we are stopping,
            # that must not turn a clean stop into a failure.
            if not (self._stop.is_set() and _only_errors(exc)):
                raise
            log.warning("py-libp2p raised while stopping (ignored): %r", exc)
        log.info("node stopped peer_id=%s", self.peer_id)

    async def _serve(self, task_status: trio.TaskStatus[Node]) -> None:
        host = self.host = build_host(self.identity)
        pubsub = build_pubsub(
            host, replay_newest={ids.presence_topic(self.cfg.run_id): REPLAY_PRESENCE}
        )
        dht = self.dht = build_dht(host)
        self.pubsub = pubsub
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(host.run(parse_addrs(self.cfg.listen)))
            await stack.enter_async_context(background_trio_service(pubsub))
            # the router is a service of its own: without it gossipsub's heartbeat never
            # runs (no mesh upkeep, no IHAVE gossip, and a message cache that never shifts,
            # replayed whole to every new peer)
            await stack.enter_async_context(background_trio_service(pubsub.router))
            await stack.enter_async_context(background_trio_service(dht))
            await pubsub.wait_until_ready()
            self.addrs = advertised_addrs(
                [str(a) for a in host.get_transport_addrs()], local_ipv4s()
            )
            host.set_stream_handler(ids.PRESENCE, self._guard(ids.PRESENCE, self._handle_presence))
            host.set_stream_handler(ids.SYNC, self._guard(ids.SYNC, self._handle_sync))
            presence, announce = (
                ids.presence_topic(self.cfg.run_id),
                ids.announce_topic(self.cfg.run_id),
            )
            pubsub.set_topic_validator(
                presence, self._gossip_validator("gossip-presence", self._on_presence_gossip), False
            )
            pubsub.set_topic_validator(
                announce,
                self._gossip_validator("gossip-announce", self._on_gossip_announcement),
                False,
            )
            presence_sub = await pubsub.subscribe(presence)
            announce_sub = await pubsub.subscribe(announce)
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._drain, presence_sub)
                nursery.start_soon(self._drain, announce_sub)
                heartbeats = trio.CancelScope()
                nursery.start_soon(self._heartbeat_loop, heartbeats)
                nursery.start_soon(self._expiry_loop)
                nursery.start_soon(self._discovery_loop)
                nursery.start_soon(self._publisher_loop)
                log.info(
                    "node up peer_id=%s role=%s run=%s addrs=%s",
                    self.peer_id,
                    self.cfg.role,
                    self.cfg.run_id,
                    self.addrs,
                )
                task_status.started(self)
                await self._stop.wait()
                heartbeats.cancel()  # no "up" may follow our "leaving"
                await self._flush_announcements()
                await self._leave()
                nursery.cancel_scope.cancel()

    def request_stop(self) -> None:
        self._stop.set()

    async def _flush_announcements(self, limit_s: float = 5.0) -> None:
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

    async def _leave(self) -> None:
        """Tell gossip and every connected peer that we are leaving, within a short deadline
        (peers we are not connected to hear it through gossip, or forget us after the TTL)."""
        known = sorted(self.connected_peers())
        with trio.move_on_after(min(3.0, self.cfg.read_timeout)):
            try:
                await self._publish_presence()
            except Exception as exc:  # shutting down: report, never block the exit
                log.debug("leave gossip failed: %s", exc)
            async with trio.open_nursery() as nursery:
                for peer in known:
                    nursery.start_soon(self._send_leave, peer)
        log.info("left the network notified=%d", len(known))

    async def _send_leave(self, peer: str) -> None:
        try:
            await self.request(peer, ids.PRESENCE, self.node_info(), NodeInfo)
        except Exception as exc:
            log.debug("leave notice to %s failed: %s", peer[-8:], exc)

    # ---- request/response -------------------------------------------------------------

    def _guard(
        self,
        protocol: str,
        handler: Callable[[INetStream, str], Awaitable[None]],
        deadline: float | None = None,
    ) -> Callable[[INetStream], Awaitable[None]]:
        """Wrap a stream handler so no exception or hang escapes into the host."""
        limit = deadline if deadline is not None else self.cfg.read_timeout * 3

        async def guarded(stream: INetStream) -> None:
            peer = stream.muxed_conn.peer_id.to_base58()
            try:
                with trio.fail_after(limit):
                    await handler(stream, peer)
            except WireError as err:
                self._reject(protocol, peer, err)
                await self._refuse(stream, err)
            except EOFError:
                self._reject(protocol, peer, WireError(Reason.TRUNCATED, "closed before a request"))
            except trio.TooSlowError:
                self._reject(protocol, peer, WireError(Reason.TIMEOUT, "handler deadline"))
            except StreamError as exc:
                self._reject(protocol, peer, WireError(Reason.RESET, str(exc)))
            except Exception as exc:
                self.metrics.inc("rejected", reason=Reason.INTERNAL.value, protocol=protocol)
                log.exception("handler failed protocol=%s peer=%s: %s", protocol, peer[-8:], exc)
            finally:
                await _close_quietly(stream)

        return guarded

    async def _refuse(self, stream: INetStream, err: WireError) -> None:
        refusal = Refusal(**self._header(), reason=err.reason.value, detail=err.detail[:256])
        try:
            await write_frame(stream, seal(self.identity, refusal), deadline=1.0)
        except Exception:
            await _reset_quietly(stream)

    async def _read_request(
        self, stream: INetStream, peer: str, protocol: str, cls: type[Header]
    ) -> Any:
        data = await read_frame(stream, max_envelope_size(cls), self.cfg.read_timeout)
        self._count_in(protocol, data)
        msg = open_message(data, cls)
        self.admission.admit(msg, now_ms(), remote_peer=peer)
        return msg

    async def _reply(self, stream: INetStream, protocol: str, message: Header) -> None:
        data = seal(self.identity, message)
        self._count_out(protocol, data)
        await write_frame(stream, data, self.cfg.read_timeout)

    def serve_requests(
        self,
        protocol: str,
        request_type: type[Header],
        handler: RequestHandler,
        *,
        deadline: float | None = None,
    ) -> None:
        """Serve request/response ``protocol``: each stream's one request envelope is read,
        verified and admitted (every rejection counted under ``protocol``), then
        ``handler(request, responder)`` answers. A ``WireError`` it raises goes back to the
        peer as a ``Refusal``; nothing it raises reaches the host. ``deadline`` bounds the
        whole exchange (default 3 × ``read_timeout``); a handler that streams bulk data
        passes a longer one and bounds each write itself."""
        assert self.host is not None, "serve_requests needs a running node"

        async def handle(stream: INetStream, peer: str) -> None:
            msg = await self._read_request(stream, peer, protocol, request_type)
            await handler(msg, Responder(self, stream, protocol, peer))

        self.host.set_stream_handler(protocol, self._guard(protocol, handle, deadline))

    def add_status(self, name: str, section: Callable[[], dict[str, Any]]) -> None:
        """Show ``section()`` under ``name`` in ``status()`` (a role's own figures)."""
        self._status_sections[name] = section

    def subscribe(self, topic: str, handler: AnnouncementHandler) -> None:
        """Call ``handler`` for every admitted announcement on ``topic`` (each once)."""
        self._topic_handlers[topic].append(handler)

    async def _handle_presence(self, stream: INetStream, peer: str) -> None:
        msg: NodeInfo = await self._read_request(stream, peer, ids.PRESENCE, NodeInfo)
        self._on_node_info(msg)
        await self._reply(stream, ids.PRESENCE, self.node_info())
        if msg.state == "up":  # a peer of our run: a DHT peer too (a bootstrap has no other)
            await self._add_to_dht(peer)

    async def _handle_sync(self, stream: INetStream, peer: str) -> None:
        msg: SyncRequest = await self._read_request(stream, peer, ids.SYNC, SyncRequest)
        items = self.outbox.get(msg.session, msg.indices)
        await self._reply(stream, ids.SYNC, SyncReply(**self._header(), items=items))

    async def request(
        self, peer: str, protocol: str, message: Header, reply_type: type[Header]
    ) -> Any:
        """Send one request to ``peer`` and return its verified, admitted reply.

        Dials the peer first at the addresses it announced if we are not connected.
        """
        async with self.open_request(peer, protocol, message, reply_type) as exchange:
            return exchange.reply

    @asynccontextmanager
    async def open_request(
        self, peer: str, protocol: str, message: Header, *reply_types: type[Header]
    ) -> AsyncIterator[Exchange]:
        """Open a stream to ``peer``, send ``message``, read and verify the reply (one of
        ``reply_types``; a ``Refusal`` raises ``RemoteRefusal``), and yield the exchange so
        the caller can read the bulk frames that follow. The stream closes on exit."""
        assert self.host is not None
        pid = ID.from_base58(peer)
        record = self.peers.peers.get(peer)
        if record and record.addrs and pid not in self.host.get_connected_peers():
            await self.connect(PeerInfo(pid, parse_addrs(record.addrs)))
        with trio.fail_after(self.cfg.connect_timeout):
            stream = await self.host.new_stream(pid, [protocol])
        try:
            data = seal(self.identity, message)
            self._count_out(protocol, data)
            await write_frame(stream, data, self.cfg.read_timeout)
            reader = FrameReader(stream)
            try:
                reply_data = await reader.read_frame(
                    max_envelope_size(*reply_types, Refusal), self.cfg.read_timeout
                )
            except EOFError as exc:
                raise WireError(Reason.TRUNCATED, "peer closed without replying") from exc
            self._count_in(protocol, reply_data)
            try:
                reply = open_message(reply_data, *reply_types, Refusal)
                self.admission.admit(reply, now_ms(), remote_peer=peer)
            except WireError as err:
                self._reject(protocol, peer, err)
                raise
            if isinstance(reply, Refusal):
                raise RemoteRefusal(reply.reason, reply.detail)
            yield Exchange(peer, reply, reader, stream)
        finally:
            await _close_quietly(stream)

    async def connect(self, info: PeerInfo) -> None:
        assert self.host is not None
        with trio.fail_after(self.cfg.connect_timeout):
            await self.host.connect(info)

    async def greet(self, peer: str) -> NodeInfo:
        """Presence exchange with a connected (or dialable) peer; records it."""
        reply: NodeInfo = await self.request(peer, ids.PRESENCE, self.node_info(), NodeInfo)
        self._on_node_info(reply)
        if reply.state == "up":
            await self._add_to_dht(peer)
        return reply

    async def _add_to_dht(self, peer: str) -> None:
        try:
            await self.dht.add_peer(ID.from_base58(peer))
        except Exception as exc:
            log.debug("dht add_peer %s failed: %s", peer[-8:], exc)

    async def ping(self, peer: str) -> dict[str, Any]:
        """A presence round trip to ``peer``: its role and the time taken, or the error."""
        started = trio.current_time()
        try:
            reply = await self.greet(peer)
        except trio.TooSlowError:
            return {"ok": False, "error": "timeout (dial)", "elapsed_ms": _ms_since(started)}
        except WireError as err:
            return {
                "ok": False,
                "error": f"{err.reason.value}: {err.detail}",
                "elapsed_ms": _ms_since(started),
            }
        except Exception as exc:
            return {
                "ok": False,
                "error": f"{type(exc).__name__}: {exc}",
                "elapsed_ms": _ms_since(started),
            }
        return {"ok": True, "role": reply.role, "rtt_ms": _ms_since(started)}

    # ---- what services ask of the network -----------------------------------------------

    def known_peers(self) -> list[str]:
        """Peer ids of this run we know of (heard from within the TTL)."""
        return list(self.peers.peers)

    async def provide(self, key: str) -> bool:
        """Announce in the DHT that we provide ``key``; False if no peer stored it."""
        return bool(await self.dht.provide(key))

    async def find_providers(self, key: str) -> set[str]:
        """Peers (not us) that provide ``key`` in the DHT, each dialed at its provider
        record's addresses if we hold no connection to it; those we cannot dial are left
        out."""
        out: set[str] = set()
        connected = self.connected_peers()
        for info in await self.dht.find_providers(key):
            peer = info.peer_id.to_base58()
            if peer == self.peer_id:
                continue
            if info.addrs and peer not in connected:
                try:
                    await self.connect(info)
                except Exception:
                    continue
            out.add(peer)
        return out

    async def disconnect(self, peer: str) -> None:
        """Close our connection to ``peer`` (within ``connect_timeout``; failures logged)."""
        assert self.host is not None
        with trio.move_on_after(self.cfg.connect_timeout):
            try:
                await self.host.disconnect(ID.from_base58(peer))
            except Exception as exc:
                log.debug("closing the connection to %s failed: %s", peer[-8:], exc)

    # ---- presence ---------------------------------------------------------------------

    def _on_node_info(self, msg: NodeInfo, via: str = "direct") -> None:
        if msg.sender == self.peer_id:
            return
        if msg.state == "leaving":
            if self.peers.leave(msg.sender, msg.seq):
                log.info("peer left peer=%s role=%s", msg.sender[-8:], msg.role)
            return
        if self.peers.left_after(msg.sender, msg.seq):
            return  # a heartbeat sent before its leave notice, arriving late
        if self.peers.seen(msg.sender, msg.role, msg.addrs, time.monotonic(), msg.seq):
            log.info("peer joined peer=%s role=%s", msg.sender[-8:], msg.role)
        if msg.sender in self._syncing:  # a sync waiting out its grace: let it ask for all
            self._syncing[msg.sender] = max(msg.announced, self._syncing[msg.sender])
        missing = self.inbox.missing(msg.sender, msg.session, msg.announced, limit=SYNC_BATCH)
        if missing and msg.sender not in self._syncing and self._nursery is not None:
            # a heartbeat on gossip may overtake the announcements it counts, still on their
            # way through the mesh: give gossip SYNC_GRACE seconds before asking directly
            grace = SYNC_GRACE if via == "gossip" else 0.0
            self._syncing[msg.sender] = msg.announced
            self._nursery.start_soon(self._sync_from, msg.sender, msg.session, missing, grace)

    async def _publish_presence(self) -> None:
        data = seal(self.identity, self.node_info())
        self._count_out("gossip-presence", data)
        await self.pubsub.publish(ids.presence_topic(self.cfg.run_id), data)

    def heartbeat_period(self) -> float:
        """Seconds between our heartbeats: ``heartbeat_interval``, or longer in a network
        whose heartbeats would otherwise exceed ``presence_rate`` a second in all."""
        known = len(self.peers.peers) + 1
        return max(self.cfg.heartbeat_interval, known / self.cfg.presence_rate)

    def peer_ttl(self) -> float:
        """Silence after which a peer is in doubt: ``peer_ttl``, scaled with the period."""
        return self.cfg.peer_ttl * self.heartbeat_period() / self.cfg.heartbeat_interval

    async def _heartbeat_loop(self, scope: trio.CancelScope) -> None:
        with scope:
            while True:
                try:
                    await self._publish_presence()
                except Exception as exc:
                    log.warning("heartbeat publish failed: %s", exc)
                # jitter: nodes started together must not beat in step
                await trio.sleep(self.heartbeat_period() * self._rng.uniform(0.9, 1.1))

    async def _expiry_loop(self) -> None:
        while True:
            await trio.sleep(min(1.0, self.cfg.peer_ttl / 4))
            self.peers.ttl = self.peer_ttl()
            connected = self.connected_peers()
            for peer in self.peers.silent(time.monotonic()):
                # a busy node is not a dead one, and gossip may have missed its heartbeats:
                # ask it directly (a few at a time if that means dialing) before forgetting
                dial = peer not in connected
                if peer in self._probing or (dial and len(self._probing) >= MAX_PROBES):
                    continue
                if self._nursery is not None:
                    self._probing.add(peer)
                    self._nursery.start_soon(self._probe, peer)

    async def _probe(self, peer: str) -> None:
        """Ask a silent peer directly; forget it only if it does not answer."""
        try:
            with trio.fail_after(self.cfg.connect_timeout + self.cfg.read_timeout):
                await self.greet(peer)
            self.metrics.inc("liveness_probes", outcome="alive")
        except Exception as exc:
            self.metrics.inc("liveness_probes", outcome="dead")
            log.debug("probe of silent peer %s failed: %s", peer[-8:], exc)
            if self.peers.silent(time.monotonic()).count(peer):
                self._expired(peer, "silent and not answering")
        finally:
            self._probing.discard(peer)

    def _expired(self, peer: str, why: str) -> None:
        if self.peers.forget(peer):
            self.metrics.inc("peers_expired")
            log.info(
                "peer expired peer=%s (%s for more than %.1f s)", peer[-8:], why, self.peers.ttl
            )

    # ---- discovery and connections ----------------------------------------------------

    def connected_peers(self) -> set[str]:
        """Peer ids we hold a connection to now."""
        if self.host is None:
            return set()
        return {pid.to_base58() for pid in self.host.get_connected_peers()}

    def reachable_peers(self) -> list[str]:
        """Known peers of this run we hold a connection to (asking them costs no dial)."""
        connected = self.connected_peers()
        return [p for p in self.peers.peers if p in connected]

    async def _discovery_loop(self) -> None:
        bootstrap = [info_from_p2p_addr(a) for a in parse_addrs(self.cfg.bootstrap)]
        await self._greet_all(bootstrap)
        assert self._nursery is not None
        self._nursery.start_soon(self._connection_loop, bootstrap)
        while True:
            now = trio.current_time()
            if self.lookups.observe(now, self.peers.roles()):
                log.info("a needed role disappeared: looking peers up again")
            table = self.dht.get_routing_table_size()
            before = self.connected_peers()
            if not self._providing and self.provides.is_due(now, table):
                self._providing = True  # beside the lookups: a walk can take a while
                self._nursery.start_soon(self._provide_round, table)
            if self.lookups.is_due(now):
                await self._look_up()
                delay = self.lookups.looked_up(trio.current_time(), self.peers.roles())
                log.debug("next DHT lookup round in %.1f s", delay)
            # links a DHT query opened (Kademlia asks the peers closest to a key, not our
            # neighbours) are the first to close if they take us above the high watermark
            self._transient |= self.connected_peers() - before
            await trio.sleep(min(TEND_INTERVAL, self.cfg.discovery_interval))

    async def _connection_loop(self, bootstrap: list[PeerInfo]) -> None:
        """Every second, whatever the lookups are doing: trim above, dial below."""
        while True:
            transient, self._transient = self._transient, set()
            await self._tend_connections(bootstrap, transient)
            await trio.sleep(TEND_INTERVAL)

    async def _look_up(self) -> None:
        """One lookup round: providers of the roles we work with (and of our own, for peers
        to link to); a role we know no live peer of is greeted at once (two providers)."""
        roles = sorted(self.lookups.needed | ({self.cfg.role} if self.lookups.needed else set()))
        known = self.peers.roles()
        greet: list[PeerInfo] = []
        assert self.host is not None
        with trio.move_on_after(self.cfg.read_timeout):
            for role in roles:
                key = ids.role_key(self.cfg.run_id, role)
                # in the network (enough links, or enough known peers to dial): ask our
                # neighbours only. A walk dials the peers closest to the key, who mostly are
                # not our neighbours, and each link it opens pushes some peer above its high
                # watermark to close another; gossip presence brings new peers anyway.
                connected = self.host.get_connected_peers()
                if connected and max(len(connected), len(self.peers.peers)) >= self.cfg.conn_low:
                    self.metrics.inc("dht_lookups", scope="connected")
                    found = await providers_nearby(
                        self.dht, key, connected, NEARBY_ASKED, self.cfg.connect_timeout
                    )
                else:
                    self.metrics.inc("dht_lookups", scope="network")
                    found = await self.dht.find_providers(key)
                fresh = [i for i in found if i.peer_id.to_base58() != self.peer_id]
                for info in fresh:
                    pid = info.peer_id.to_base58()
                    self.dht_providers.add(pid)
                    if info.addrs:
                        self._candidates[pid] = (role, info)
                if role not in known:
                    greet += [i for i in fresh if i.peer_id.to_base58() not in self.peers][:2]
        while len(self._candidates) > MAX_CANDIDATES:
            self._candidates.pop(next(iter(self._candidates)))
        if len(self.dht_providers) > MAX_CANDIDATES:
            self.dht_providers = set(list(self.dht_providers)[-MAX_CANDIDATES:])
        await self._greet_all(greet)

    async def _tend_connections(
        self, bootstrap: list[PeerInfo], transient: set[str] | None = None
    ) -> None:
        """Close connections above the high watermark, dial peers below the low one."""
        assert self.host is not None
        now = trio.current_time()
        connected = self.connected_peers()
        roles = {
            p: (self.peers.peers[p].role if p in self.peers.peers else None) for p in connected
        }
        for peer in self.links.update(now, roles):
            self.metrics.inc("connections_dropped")
            log.debug("connection to %s dropped by the peer or the network", peer[-8:])
        # a connected peer we know nothing of (a greeting that failed under load, a peer
        # that dialed us and has not greeted yet): greet it, at most every 30 s
        self._greeted = {p: t for p, t in self._greeted.items() if p in connected}
        assert self._nursery is not None
        for peer in connected:
            if roles[peer] is None and now - self._greeted.get(peer, -1e9) >= GREET_AGAIN:
                if peer not in self._dialing and now - self.links.since.get(peer, now) >= 1.0:
                    self._greeted[peer] = now
                    self._dialing.add(peer)
                    self._nursery.start_soon(
                        self._dial_and_greet, PeerInfo(ID.from_base58(peer), [])
                    )
        closing = self.links.to_close(now, transient or set())
        infos: dict[str, PeerInfo] = {}
        known: dict[str, str] = {}
        for peer, (role, info) in self._candidates.items():
            infos[peer], known[peer] = info, role
        for peer, rec in self.peers.peers.items():
            if rec.addrs:
                infos[peer] = PeerInfo(ID.from_base58(peer), parse_addrs(rec.addrs))
                known[peer] = rec.role
        if not known:  # nobody known at all: back to the bootstrap peers
            for info in bootstrap:
                peer = info.peer_id.to_base58()
                infos[peer], known[peer] = info, "bootstrap"
        dials = [infos[p] for p in self.links.to_dial(now, known, self._rng)]
        # in the background: the next round must not wait for a slow dial or close
        assert self._nursery is not None
        for peer in closing:
            self.metrics.inc("connections_trimmed")
            self._nursery.start_soon(self.disconnect, peer)
        for info in dials:
            peer = info.peer_id.to_base58()
            if peer not in self._dialing:
                self._dialing.add(peer)
                self.metrics.inc("connections_dialed")
                self._nursery.start_soon(self._dial_and_greet, info)

    async def _greet_all(self, infos: list[PeerInfo]) -> None:
        fresh = [i for i in infos if i.peer_id.to_base58() != self.peer_id]
        if fresh:
            async with trio.open_nursery() as nursery:
                for info in fresh:
                    nursery.start_soon(self._dial_and_greet, info)

    async def _provide_round(self, table: int) -> None:
        """One provide, beside the lookup rounds. The links its walk opens are not marked
        transient: over up to a minute that would sweep in links our own manager dialed
        and links peers opened to us; the watermarks close the surplus as usual."""
        ok = False
        try:
            with trio.move_on_after(PROVIDE_LIMIT):
                ok = await self._provide()
        finally:
            self.provides.provided(trio.current_time(), table, ok)
            self._providing = False

    async def _provide(self) -> bool:
        try:
            ok = await self.dht.provide(ids.role_key(self.cfg.run_id, self.cfg.role))
        except Exception as exc:
            log.debug("dht provide failed: %s", exc)
            return False
        if ok:
            self.metrics.inc("dht_provides")
        return bool(ok)

    async def _dial_and_greet(self, info: PeerInfo) -> None:
        peer = info.peer_id.to_base58()
        try:
            assert self.host is not None
            if info.addrs and info.peer_id not in self.host.get_connected_peers():
                await self.connect(info)
            await self.greet(peer)
        except (trio.TooSlowError, WireError, RemoteRefusal, StreamError, OSError) as exc:
            log.debug("greeting %s failed: %s", peer[-8:], exc)
        except Exception as exc:  # py-libp2p raises many unrelated types on dial failure
            log.debug("dialing %s failed: %s: %s", peer[-8:], type(exc).__name__, exc)
        finally:
            self._dialing.discard(peer)

    # ---- announcements ----------------------------------------------------------------

    def announce(self, topic: str, body: bytes) -> None:
        """Queue an announcement for the paced publisher; raises ``trio.WouldBlock`` if full."""
        self._queue_send.send_nowait((topic, body))

    async def _publisher_loop(self) -> None:
        topic_name = ids.announce_topic(self.cfg.run_id)
        async for topic, body in self._queue_recv:
            await trio.sleep(self._pacer.delay(trio.current_time()))
            self._pacer.take(trio.current_time())
            index = self.outbox.next_index()
            msg = Announcement(
                **self._header(), topic=topic, session=self.outbox.session, index=index, body=body
            )
            data = seal(self.identity, msg)
            self.outbox.add(index, data)
            self._count_out("gossip-announce", data)
            try:
                await self.pubsub.publish(topic_name, data)
            except Exception as exc:  # peers can still fetch it from the outbox
                log.warning("announce publish failed index=%d: %s", index, exc)
            if not self._queue_send.statistics().current_buffer_used:
                self._drained.set()

    def _on_gossip_announcement(self, data: bytes) -> None:
        self._on_announcement(data, "gossip")

    def _on_announcement(self, data: bytes, via: str) -> None:
        msg = open_message(data, Announcement)
        if msg.sender == self.peer_id:
            return
        self.admission.admit(msg, now_ms())
        if not self.inbox.add(msg.sender, msg.session, msg.index):
            self.duplicates[via] += 1
            return
        self.delivered[msg.sender] += 1
        self.delivered_via[via] += 1
        for handler in self.announcement_handlers + self._topic_handlers.get(msg.topic, []):
            try:
                handler(msg)
            except Exception as exc:  # a subscriber's bug must not stop delivery or relay
                self.metrics.inc("subscriber_errors", topic=msg.topic)
                log.exception("announcement handler failed topic=%s: %s", msg.topic, exc)

    def _on_presence_gossip(self, data: bytes) -> None:
        msg = open_message(data, NodeInfo)
        if msg.sender == self.peer_id:
            return
        self.admission.admit(msg, now_ms())
        self._on_node_info(msg, via="gossip")

    def _gossip_validator(
        self, protocol: str, handle: Callable[[bytes], None]
    ) -> Callable[[ID, Any], bool]:
        """A pubsub topic validator that runs ``handle`` (verify, admit, act) on each new
        message before gossipsub forwards it: a message we reject is counted, dropped, and
        never relayed to our peers (py-libp2p also caches the verdict and scores the peer)."""
        own = self.host.get_id().to_bytes() if self.host else b""

        def validate(_forwarder: ID, msg: Any) -> bool:
            if msg.from_id == own:
                return True
            data = bytes(msg.data)
            self._count_in(protocol, data)
            origin = ID(msg.from_id).to_base58() if msg.from_id else "?"
            try:
                handle(data)
            except WireError as err:
                self._reject(protocol, origin, err)
                return False
            except Exception as exc:  # never let a bug here escape into pubsub
                self.metrics.inc("rejected", reason=Reason.INTERNAL.value, protocol=protocol)
                log.exception(
                    "gossip handler failed protocol=%s origin=%s: %s", protocol, origin[-8:], exc
                )
                return False
            return True

        return validate

    @staticmethod
    async def _drain(sub: Any) -> None:
        """Empty a subscription: its messages were already handled by the topic validator."""
        while True:
            await sub.get()

    async def _sync_from(self, sender: str, session: int, indices: list[int], grace: float) -> None:
        """Ask ``sender`` for the announcements ``indices``; after a grace period, for
        those still missing by then of all it is known to have announced."""
        try:
            if grace > 0:
                await trio.sleep(grace)
                announced = self._syncing[sender]
                indices = self.inbox.missing(sender, session, announced, limit=SYNC_BATCH)
                if not indices:
                    return  # gossip brought them meanwhile
            req = SyncRequest(**self._header(), session=session, indices=indices)
            reply: SyncReply = await self.request(sender, ids.SYNC, req, SyncReply)
            for item in reply.items:
                try:
                    self._on_announcement(item, "sync")
                except WireError as err:
                    self._reject(ids.SYNC, sender, err)
            self.metrics.inc("synced_announcements", len(reply.items))
        except Exception as exc:
            log.debug("sync from %s failed: %s", sender[-8:], exc)
        finally:
            self._syncing.pop(sender, None)

    # ---- views ------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        connected = self.connected_peers()
        in_use = self.links.protected()
        records = sorted(self.peers.peers.values(), key=lambda r: (r.role, r.peer_id))
        if len(records) > STATUS_FULL_LIST:  # a large network: the peers we work with only
            records = [r for r in records if r.peer_id in in_use or r.peer_id in connected]
        return {
            "peer_id": self.peer_id,
            "role": self.cfg.role,
            "run_id": self.cfg.run_id,
            "model": str(self.cfg.model) if self.cfg.model else None,
            "addrs": self.addrs,
            "peers": [
                {
                    "peer_id": r.peer_id,
                    "role": r.role,
                    "addrs": r.addrs,
                    "last_seen_s": round(now - r.last_seen, 3),
                    "connected": r.peer_id in connected,
                    "in_use": r.peer_id in in_use,
                }
                for r in records
            ],
            "peer_count": len(self.peers.peers),
            "peers_listed": "all" if len(self.peers.peers) <= STATUS_FULL_LIST else "in use",
            "peers_by_role": self.peers.by_role(),
            "connections": {
                "count": len(connected),
                "settled": self.links.settled(_trio_now()),
                "low": self.cfg.conn_low,
                "high": self.cfg.conn_high,
                "in_use": len(in_use),
                "dialed": self.metrics.get("connections_dialed"),
                "trimmed": self.metrics.get("connections_trimmed"),
                "dropped": self.metrics.get("connections_dropped"),
            },
            "presence": {
                "heartbeat_s": round(self.heartbeat_period(), 3),
                "peer_ttl_s": round(self.peers.ttl, 3),
                "expired": self.metrics.get("peers_expired"),
            },
            "traffic": {
                "messages": self.metrics.by_label("messages", "direction"),
                "bytes": self.metrics.by_label("bytes", "direction"),
                "wire_bytes": dict(WIRE),  # all TCP bytes: encryption, muxing, libp2p's own
            },
            "rejected": self.metrics.by_label("rejected", "reason"),
            "announcements": {
                "published": self.outbox.count,
                "delivered": dict(self.delivered),
                "delivered_via": dict(self.delivered_via),
                "duplicates": dict(self.duplicates),
                "queued": self._queue_send.statistics().current_buffer_used,
            },
            "discovery": {
                "dht_lookups": sum(self.metrics.by_label("dht_lookups", "scope").values()),
                "dht_lookups_by_scope": self.metrics.by_label("dht_lookups", "scope"),
                "dht_provides": self.metrics.get("dht_provides"),
                "dht_providers": len(self.dht_providers),
                "next_lookup_in_s": round(max(0.0, self.lookups.due - _trio_now()), 3),
                "provides_ok": self.provides.last_ok is not None,
            },
            **{name: section() for name, section in self._status_sections.items()},
        }

    def prometheus(self) -> str:
        by_role = self.peers.by_role()
        gauges = {
            "peers": {(("role", r),): float(by_role.get(r, 0)) for r in ids.ROLES},
            "connections": {(): float(len(self.connected_peers()))},
            "announcements_published": {(): float(self.outbox.count)},
        }
        return self.metrics.render(gauges)


async def _reset_quietly(stream: INetStream) -> None:
    try:
        await stream.reset()
    except Exception:
        pass


async def _close_quietly(stream: INetStream) -> None:
    """Close (or failing that, reset) a stream within 1 s, even while being cancelled."""
    with trio.move_on_after(1.0) as scope:
        scope.shield = True
        try:
            await stream.close()
        except Exception:
            await _reset_quietly(stream)


def _trio_now() -> float:
    try:
        return trio.current_time()
    except RuntimeError:  # outside trio (a test reading the status)
        return 0.0


def _only_errors(exc: BaseException) -> bool:
    """True if ``exc`` is an ``Exception`` or a group of nothing else (no cancellation)."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_errors(e) for e in exc.exceptions)
    return isinstance(exc, Exception)


def _ms_since(started: float) -> float:
    return round((trio.current_time() - started) * 1000, 2)
