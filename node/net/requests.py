"""The request layer: one request, one reply, then any bulk frames, on a fresh stream.

Listening (``serve``): each stream's one request envelope is read under a deadline,
verified and admitted (run id, signature, sequence, clock skew: ``protocol/admission.py``)
before the handler sees it; the handler answers through a ``Responder``. Every handler runs
under a guard: nothing a peer sends can raise into py-libp2p (which would take the host
down), a ``WireError`` goes back to the peer as a ``Refusal``, every rejection is counted by
reason. Dialing (``open_request`` / ``request``): dial the peer at the addresses it
announced if we are not connected, send, read and verify the reply.
Every message in or out is counted by protocol, for ``/status`` and ``/metrics``. A peer
on the node's ban list (``node/net/bans.py``) is refused ``banned`` before its request is
read, on every protocol.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio
from libp2p.abc import INetStream
from libp2p.custom_types import TProtocol
from libp2p.network.stream.exceptions import StreamError
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from crypto.identity import Identity
from node.config import NodeConfig
from node.net.bans import PeerBans
from node.net.connections import LinkUse
from node.net.host import parse_addrs
from node.net.limits import PeerLimits
from node.net.metrics import Metrics
from node.net.network import Network
from node.net.peers import PeerTable
from node.net.rejections import RejectionLog
from protocol import ids
from protocol.admission import Admission
from protocol.diloco import DILOCO, DILOCO_SHARD, DILOCO_STATE
from protocol.errors import Reason, WireError
from protocol.framing import FrameReader, read_frame, write_frame
from protocol.ids import ANY_RUN_PROTOCOLS
from protocol.messages import Header, Refusal
from protocol.wire import max_envelope_size, open_message, seal

log = logging.getLogger("intellect.node")
UNNEGOTIATED = "unknown"  # the protocol label of a stream reset before negotiation


def now_ms() -> int:
    return int(time.time() * 1000)


class RemoteRefusal(Exception):
    """The peer answered our request with a ``Refusal``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"peer refused: {reason}: {detail}")
        self.reason, self.detail = reason, detail


class Responder:
    """The listener's side of one request stream: send the reply, then any bulk frames."""

    def __init__(self, requests: Requests, stream: INetStream, protocol: str, peer: str) -> None:
        self.requests, self.stream, self.protocol, self.peer = requests, stream, protocol, peer

    async def send(self, message: Header) -> None:
        """Seal, count and write one reply envelope."""
        await self.requests.reply(self.stream, self.protocol, message)

    async def write(self, data: bytes, deadline: float | None = None) -> None:
        """Write one raw frame (bulk data after the reply), counted as traffic."""
        self.requests.count_out(self.protocol, data)
        await write_frame(self.stream, data, deadline or self.requests.cfg.net.read_timeout)


@dataclass
class Exchange:
    """The dialer's side of one request stream after the reply: read further frames."""

    peer: str
    reply: Any
    reader: FrameReader
    stream: INetStream


RequestHandler = Callable[[Any, Responder], Awaitable[None]]


# the data plane: a link with one of these open, or lately, is not trimmed (``LinkUse``);
# and our holdings queries for a given version (a download's refresh: ``carries_data``),
# not those for a peer's newest, which every node polls its peers with (a bootstrap that
# all the nodes polled kept every link)
DATA_PROTOCOLS = frozenset({ids.SHARDCAST, ids.BATCH, DILOCO, DILOCO_STATE, DILOCO_SHARD})


def carries_data(protocol: str, message: Header) -> bool:
    """Whether our request ``message`` on ``protocol`` keeps its link in use."""
    if protocol == ids.WEIGHTS:
        return bool(getattr(message, "version", 0))
    return protocol in DATA_PROTOCOLS


class Requests:
    """Request/response protocols over ``network``, with admission and counting."""

    def __init__(
        self,
        cfg: NodeConfig,
        identity: Identity,
        network: Network,
        peers: PeerTable,
        metrics: Metrics,
        header: Callable[[], dict[str, Any]],
    ) -> None:
        self.cfg, self.identity, self.network = cfg, identity, network
        self.peers, self.metrics, self.header = peers, metrics, header
        self.rejections = RejectionLog()
        self.use = LinkUse()  # the links carrying data (the connection watermarks spare them)
        self.bans = PeerBans()  # the node's ban list (``Node.refuse_banned``): refused
        self.admission = Admission(cfg.run.id, max_skew_ms=int(cfg.net.max_clock_skew * 1000))
        self.limits = PeerLimits(
            cfg.net.peer_max_streams,
            cfg.net.peer_request_rate,
            float(cfg.net.peer_request_burst),
            cooldown=cfg.net.peer_shun_cooldown,
        )
        network.inbound_gate = self.admits_stream
        network.on_bad_gossip = lambda peer, detail: self.reject(
            "gossip-rpc", peer, WireError(Reason.MALFORMED, detail)
        )

    # ---- counting ---------------------------------------------------------------------

    def count_out(self, protocol: str, data: bytes) -> None:
        self.metrics.inc("messages", direction="out", protocol=protocol)
        self.metrics.inc("bytes", len(data), direction="out", protocol=protocol)

    def count_in(self, protocol: str, data: bytes) -> None:
        self.metrics.inc("messages", direction="in", protocol=protocol)
        self.metrics.inc("bytes", len(data), direction="in", protocol=protocol)

    def reject(self, protocol: str, peer: str, err: WireError) -> None:
        """Count and log an input rejected for ``err.reason`` (an expected one, such as
        ``stale``, at DEBUG and in a summary now and then: ``node/net/rejections.py``)."""
        self.metrics.inc("rejected", reason=err.reason.value, protocol=protocol)
        log.log(
            self.rejections.level(err.reason),
            "rejected input protocol=%s peer=%s reason=%s detail=%s",
            protocol,
            peer[-8:],
            err.reason,
            err.detail,
        )
        if summary := self.rejections.summary(err.reason, time.monotonic()):
            log.info("%s", summary)

    def admit(self, msg: Header, remote_peer: str | None = None, protocol: str = "") -> None:
        """Admission of a verified message (run, sequence, clock); ``WireError`` if not.
        On a protocol of ``ANY_RUN_PROTOCOLS`` (the run manifest's) a message of any run
        is admitted."""
        any_run = protocol in ANY_RUN_PROTOCOLS
        self.admission.admit(msg, now_ms(), remote_peer=remote_peer, any_run=any_run)

    # ---- listening --------------------------------------------------------------------

    def serve(
        self,
        protocol: str,
        request_type: type[Header],
        handler: RequestHandler,
        *,
        deadline: float | None = None,
        per_peer: int | None = None,
        rate: tuple[float, float] | None = None,
    ) -> None:
        """Serve request/response ``protocol``: each stream's one request envelope is read,
        verified and admitted (every rejection counted under ``protocol``), then
        ``handler(request, responder)`` answers. A ``WireError`` it raises goes back to the
        peer as a ``Refusal``; nothing it raises reaches the host. ``deadline`` bounds the
        whole exchange (default 3 × ``read_timeout``); a handler that streams bulk data
        passes a longer one and bounds each write itself. Streams beyond the per-peer
        limits (``node/net/limits.py``; ``per_peer``: this protocol's streams of one peer
        at once; ``rate``: (rate, burst) of this protocol's streams per peer) are refused
        ``busy`` before their request is read."""
        host = self.network.host
        assert host is not None, "serving requests needs a running node"
        if rate is not None:
            self.limits.limit_protocol(protocol, *rate)

        async def handle(stream: INetStream, peer: str) -> None:
            msg = await self._read_request(stream, peer, protocol, request_type)
            await handler(msg, Responder(self, stream, protocol, peer))

        host.set_stream_handler(
            TProtocol(protocol), self._guard(protocol, handle, deadline, per_peer)
        )

    def _guard(
        self,
        protocol: str,
        handler: Callable[[INetStream, str], Awaitable[None]],
        deadline: float | None = None,
        per_peer: int | None = None,
    ) -> Callable[[INetStream], Awaitable[None]]:
        """Wrap a stream handler so no exception or hang escapes into the host, and no
        peer holds more than its share (refused streams cost one signed refusal)."""
        limit = deadline if deadline is not None else self.cfg.net.read_timeout * 3

        async def guarded(stream: INetStream) -> None:
            peer = stream.muxed_conn.peer_id.to_base58()
            if (ban := self.bans.banned(peer, time.time())) is not None:
                self.metrics.inc("rejected", reason=Reason.BANNED.value, protocol=protocol)
                try:  # not read: a peer caught lying gets nothing of ours until its ban ends
                    await self._refuse(stream, WireError(Reason.BANNED, ban.reason))
                finally:
                    await close_quietly(stream)
                return
            now = trio.current_time()
            refused = self.limits.open(peer, protocol, now, per_peer)
            if refused:
                # counted, not logged one by one: a flood would flood the log too
                self.metrics.inc("peer_limited", protocol=protocol, limit=refused)
                self.metrics.inc("rejected", reason=Reason.BUSY.value, protocol=protocol)
                if not self.limits.refusal(peer, now):  # it ignores busy: not worth a signature
                    await reset_quietly(stream)
                    return
                err = WireError(Reason.BUSY, f"per-peer limit: {refused}")
                try:
                    await self._refuse(stream, err)
                finally:
                    await close_quietly(stream)
                return
            data = protocol in DATA_PROTOCOLS
            if data:
                self.use.began(peer)
            try:
                with trio.fail_after(limit):
                    await handler(stream, peer)
            except WireError as err:
                self.reject(protocol, peer, err)
                await self._refuse(stream, err)
            except EOFError:
                self.reject(protocol, peer, WireError(Reason.TRUNCATED, "closed before a request"))
            except trio.TooSlowError:
                self.reject(protocol, peer, WireError(Reason.TIMEOUT, "handler deadline"))
            except StreamError as exc:
                self.reject(protocol, peer, WireError(Reason.RESET, str(exc)))
            except Exception as exc:
                self.metrics.inc("rejected", reason=Reason.INTERNAL.value, protocol=protocol)
                log.exception("handler failed protocol=%s peer=%s: %s", protocol, peer[-8:], exc)
            finally:
                if data:
                    self.use.finished(peer, trio.current_time())
                self.limits.close(peer, protocol)
                await close_quietly(stream)

        return guarded

    def admits_stream(self, peer: str) -> float | None:
        """Whether a new inbound stream of ``peer`` (any protocol) is negotiated at all:
        None if so; while the peer is shunned (``PeerLimits.shunned``: it ignored ``busy``)
        the seconds its connections are not to be read (``PeerLimits.held``, 0: none), and
        the network resets the stream on arrival (counted under the protocol ``unknown``)."""
        now = trio.current_time()
        if not self.limits.shunned(peer, now):
            return None
        self.metrics.inc("peer_limited", protocol=UNNEGOTIATED, limit="shunned")
        self.metrics.inc("rejected", reason=Reason.BUSY.value, protocol=UNNEGOTIATED)
        return self.limits.held(peer, now)

    async def _refuse(self, stream: INetStream, err: WireError) -> None:
        refusal = Refusal(**self.header(), reason=err.reason.value, detail=err.detail[:256])
        try:
            await write_frame(stream, seal(self.identity, refusal), deadline=1.0)
        except Exception:
            await reset_quietly(stream)

    async def _read_request(
        self, stream: INetStream, peer: str, protocol: str, cls: type[Header]
    ) -> Any:
        data = await read_frame(stream, max_envelope_size(cls), self.cfg.net.read_timeout)
        self.count_in(protocol, data)
        msg = open_message(data, cls)
        self.admit(msg, remote_peer=peer, protocol=protocol)
        return msg

    async def reply(self, stream: INetStream, protocol: str, message: Header) -> None:
        data = seal(self.identity, message)
        self.count_out(protocol, data)
        await write_frame(stream, data, self.cfg.net.read_timeout)

    # ---- dialing ----------------------------------------------------------------------

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
        host = self.network.host
        assert host is not None
        pid = ID.from_base58(peer)
        keeps_link = carries_data(protocol, message)
        if keeps_link:  # from the dial on: a link dialled for it is not trimmed before it runs
            self.use.began(peer)
        try:
            record = self.peers.peers.get(peer)
            if record and record.addrs and peer not in self.network.connected_peers():
                await self.network.connect(PeerInfo(pid, parse_addrs(record.addrs)))
            with trio.fail_after(self.cfg.net.connect_timeout):
                stream = await host.new_stream(pid, [TProtocol(protocol)])
            try:
                data = seal(self.identity, message)
                self.count_out(protocol, data)
                await write_frame(stream, data, self.cfg.net.read_timeout)
                reader = FrameReader(stream)
                try:
                    reply_data = await reader.read_frame(
                        max_envelope_size(*reply_types, Refusal), self.cfg.net.read_timeout
                    )
                except EOFError as exc:
                    raise WireError(Reason.TRUNCATED, "peer closed without replying") from exc
                self.count_in(protocol, reply_data)
                try:
                    reply = open_message(reply_data, *reply_types, Refusal)
                    self.admit(reply, remote_peer=peer, protocol=protocol)
                except WireError as err:
                    self.reject(protocol, peer, err)
                    raise
                if isinstance(reply, Refusal):
                    raise RemoteRefusal(reply.reason, reply.detail)
                yield Exchange(peer, reply, reader, stream)
            finally:
                await close_quietly(stream)
        finally:
            if keeps_link:
                self.use.finished(peer, trio.current_time())


async def reset_quietly(stream: INetStream) -> None:
    try:
        await stream.reset()
    except Exception:
        pass


async def close_quietly(stream: INetStream) -> None:
    """Close (or failing that, reset) a stream within 1 s, even while being cancelled."""
    with trio.move_on_after(1.0) as scope:
        scope.shield = True
        try:
            await stream.close()
        except Exception:
            await reset_quietly(stream)
