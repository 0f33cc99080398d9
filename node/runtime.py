"""The node runtime: one py-libp2p host with its DHT, gossip and request protocols.

``Node.serve`` runs everything under one nursery:
- request/response handlers for ``/intellect/presence`` and ``/intellect/sync``, each
  under a guard (nothing a peer sends can raise into py-libp2p, which would take the
  host down) and with a deadline on every read;
- discovery: dial the bootstrap peers, provide our role key in the DHT, look up every
  role key, and greet (presence exchange) every peer found, so a node that knows only
  B finds A through B;
- presence: a signed heartbeat on gossip every ``heartbeat_interval``; peers silent for
  ``peer_ttl`` are forgotten; on shutdown a ``leaving`` notice goes out on gossip and
  directly to every known peer;
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
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio
from libp2p.abc import IHost, INetStream
from libp2p.network.stream.exceptions import StreamError
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from libp2p.tools.anyio_service import background_trio_service

from crypto.identity import Identity
from node.announcements import Inbox, Outbox
from node.config import NodeConfig
from node.host import (
    advertised_addrs,
    build_dht,
    build_host,
    build_pubsub,
    local_ipv4s,
    parse_addrs,
)
from node.metrics import Metrics
from node.pacing import TokenBucket
from node.peers import PeerTable
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
        self.peers = PeerTable(self.peer_id, cfg.peer_ttl)
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
        self._syncing: set[str] = set()
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
        host = self.host = build_host(self.identity)
        pubsub = build_pubsub(host)
        dht = self.dht = build_dht(host)
        self.pubsub = pubsub
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(host.run(parse_addrs(self.cfg.listen)))
            await stack.enter_async_context(background_trio_service(pubsub))
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
        log.info("node stopped peer_id=%s", self.peer_id)

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
        """Tell gossip and every known peer that we are leaving, within a short deadline."""
        known = list(self.peers.peers)
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
            try:
                await self.dht.add_peer(ID.from_base58(peer))
            except Exception as exc:
                log.debug("dht add_peer %s failed: %s", peer[-8:], exc)
        return reply

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

    # ---- presence ---------------------------------------------------------------------

    def _on_node_info(self, msg: NodeInfo) -> None:
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
        missing = self.inbox.missing(msg.sender, msg.session, msg.announced, limit=64)
        if missing and msg.sender not in self._syncing and self._nursery is not None:
            self._syncing.add(msg.sender)
            self._nursery.start_soon(self._sync_from, msg.sender, msg.session, missing)

    async def _publish_presence(self) -> None:
        data = seal(self.identity, self.node_info())
        self._count_out("gossip-presence", data)
        await self.pubsub.publish(ids.presence_topic(self.cfg.run_id), data)

    async def _heartbeat_loop(self, scope: trio.CancelScope) -> None:
        with scope:
            while True:
                try:
                    await self._publish_presence()
                except Exception as exc:
                    log.warning("heartbeat publish failed: %s", exc)
                await trio.sleep(self.cfg.heartbeat_interval)

    async def _expiry_loop(self) -> None:
        while True:
            await trio.sleep(min(1.0, self.cfg.peer_ttl / 4))
            for peer in self.peers.expire(time.monotonic()):
                log.info(
                    "peer expired peer=%s (silent for more than %.1f s)",
                    peer[-8:],
                    self.cfg.peer_ttl,
                )

    # ---- discovery --------------------------------------------------------------------

    async def _discovery_loop(self) -> None:
        bootstrap = [info_from_p2p_addr(a) for a in parse_addrs(self.cfg.bootstrap)]
        provided_at = -1e9
        while True:
            if trio.current_time() - provided_at > 30 or self.dht.get_routing_table_size() == 0:
                with trio.move_on_after(self.cfg.read_timeout):
                    await self._provide()
                    provided_at = trio.current_time()
            candidates: dict[str, PeerInfo] = {}
            for info in bootstrap:
                candidates[info.peer_id.to_base58()] = info
            with trio.move_on_after(self.cfg.read_timeout):
                for role in ids.ROLES:
                    self.metrics.inc("dht_lookups")
                    for info in await self.dht.find_providers(ids.role_key(self.cfg.run_id, role)):
                        pid = info.peer_id.to_base58()
                        if pid != self.peer_id:
                            self.dht_providers.add(pid)
                        candidates.setdefault(pid, info)
            assert self.host is not None
            for pid in self.host.get_connected_peers():
                candidates.setdefault(pid.to_base58(), PeerInfo(pid, []))
            fresh = [i for p, i in candidates.items() if p != self.peer_id and p not in self.peers]
            if fresh:
                async with trio.open_nursery() as nursery:
                    for info in fresh:
                        nursery.start_soon(self._dial_and_greet, info)
                if any(i.peer_id.to_base58() in self.peers for i in fresh):
                    provided_at = -1e9  # our closest peers changed: re-provide on the next round
            await trio.sleep(self.cfg.discovery_interval)

    async def _provide(self) -> None:
        try:
            await self.dht.provide(ids.role_key(self.cfg.run_id, self.cfg.role))
            self.metrics.inc("dht_provides")
        except Exception as exc:
            log.debug("dht provide failed: %s", exc)

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
        self._on_node_info(msg)

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

    async def _sync_from(self, sender: str, session: int, indices: list[int]) -> None:
        try:
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
            self._syncing.discard(sender)

    # ---- views ------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
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
                }
                for r in sorted(self.peers.peers.values(), key=lambda r: (r.role, r.peer_id))
            ],
            "peers_by_role": self.peers.by_role(),
            "traffic": {
                "messages": self.metrics.by_label("messages", "direction"),
                "bytes": self.metrics.by_label("bytes", "direction"),
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
                "dht_lookups": self.metrics.get("dht_lookups"),
                "dht_provides": self.metrics.get("dht_provides"),
                "dht_providers": len(self.dht_providers),
            },
            **{name: section() for name, section in self._status_sections.items()},
        }

    def prometheus(self) -> str:
        by_role = self.peers.by_role()
        gauges = {
            "peers": {(("role", r),): float(by_role.get(r, 0)) for r in ids.ROLES},
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


def _ms_since(started: float) -> float:
    return round((trio.current_time() - started) * 1000, 2)
