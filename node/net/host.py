"""Construction of the py-libp2p host, DHT and gossipsub with this project's settings.

- Security: Noise only. py-libp2p's default host also offers TLS, SECIO and plaintext;
  we pass a security map with Noise alone, so a plaintext dialer fails negotiation.
- Muxer: yamux. Transport: TCP.
- Kademlia: py-libp2p 0.8.1 accepts a ``protocol_prefix`` but still speaks the module
  constant ``/ipfs/kad/1.0.0`` everywhere. ``use_kad_protocol`` rebinds that constant in
  each kad_dht module to ``/intellect/kad/1.0.0`` so that our DHT can never be joined to
  (or by) the public IPFS DHT.
- Gossipsub: heartbeat 1 s instead of 120 s; the library's per-topic spam limit (10 msg/s)
  is off because our own publisher paces; the subscription queue is raised from 32.
  py-libp2p replays its whole recent-message window to every peer that subscribes, i.e.
  every new link; on the presence topic ``Router`` sends only the newest heartbeat of each
  publisher, at most 8. At N = 30 new links (Kademlia walks and stores, trimmed again)
  came at ~0.5 a second per node, each replayed ~48 heartbeats: 38 of the 55 gossip
  messages a node sent a second (``bench/scale.py``).
- Gossipsub's adaptive gossip is off. py-libp2p (on by default) scores the network's
  "health" every 30 s and, below 0.7, sets the heartbeat to ``max(60, 0.75 x ours)`` s
  (below 0.4, 30 s) and widens the mesh bounds; a mesh under the degree (6) counts as poor
  and peer scores of 0 as worse, so a healthy 4-node network scored 0.49 and its heartbeat
  went from 1 s to 60 s, 30 s after it started. With it went the message cache's shift:
  the recent-message window grew from 3 s to 3 minutes, every new link was replayed
  everything of those minutes, and one burst of such replays at 30 nodes flooded every
  node with ~1,000 long-delivered copies for 40-55 s (issue #56's storm, docs/simulation.md);
  mesh repair and IHAVE gossip ran once a minute too.
- Gossipsub's mesh upkeep (``Router``). py-libp2p 0.8.1 grafts "opportunistically" at
  every heartbeat up to 2 linked peers outside the mesh scoring at least half the mesh's
  median; every score here is 0 (no score weights are set), so every linked peer
  qualifies, and its heartbeat sends PRUNE to the peers above the mesh's bound without
  backing off from them itself, so the next heartbeat may graft them again, and they,
  backing off, prune back. A node linked beyond its mesh (a bootstrap node: every newcomer
  links to it) was grafted by its peers every 60 s, pruned, regrafted and pruned again, and
  at 50 nodes the churn spread to the network (60-80 GRAFTs a second) and took delivery
  to seconds (docs/simulation.md). As go-libp2p does, we back off from a peer we prune, and
  graft only when the mesh is under its low bound (go-libp2p grafts opportunistically
  every 60 heartbeats, and only peers scoring above the median: with every score 0, none).
- Connections: py-libp2p 0.8.1's ``AutoConnector`` aims at (low + high watermark) / 2 = 200
  connections and, while under ``min_connections`` (50), dials up to 16 peers of the
  peerstore every 10 s: in a small network, a full mesh. Its pruner skips every connection
  with an open stream (gossipsub keeps one to each peer), so it never trims one. We turn the
  auto-connector off and keep the pruner out of the way; the runtime keeps its connections
  between its own watermarks (``node/net/connections.py``).
- Provider lookups among the connected peers (``providers_nearby``): py-libp2p's
  ``find_providers`` walks the network until it has 20 providers, so a lookup for a role
  with fewer providers (or none) asks every peer it hears of and dials each; a node that is
  already well connected asks only the peers it holds a link to.
- Gossip peer records (``verify_records_once``): gossipsub attaches the sender's signed
  peer record to every RPC and the receiver verifies it every time; a record identical to
  one verified in the last ``RECORD_RECHECK`` s is not verified again.
- Yamux window updates (``batch_yamux_window_updates``): granted once half a stream's
  window is consumed, as go-yamux does, not after every read. ``PY_YAMUX_RELEASE_ON_READ=0``
  alone does not do it in py-libp2p 0.8.1: its "partial slack" branch still grants every
  read's bytes at once, one WINDOW_UPDATE frame (a Noise message and a ``send``) per
  one or two gossip messages received: 6.5 % of a validator's CPU in ``bench/loop.py``.
- Yamux frames (``larger_yamux_frames``): we send DATA frames of up to ``YAMUX_FRAME``
  (1 MiB, within the receiver's window) instead of 64 KiB; py-libp2p's cost is per frame
  on both sides, and the receiver accepts any frame within its window.
- TCP reads (``tune_tcp_streams``): py-libp2p reads its TCP stream in the sizes its layers
  ask for: a Noise message is a 2-byte length and then its body, a yamux frame a 12-byte
  header and then its data, so every 64 KiB moved costs several ``recv`` calls. The
  wrapper reads ahead up to ``READ_AHEAD`` bytes per ``recv`` and serves the small reads
  from that buffer: a bare py-libp2p stream between two processes here goes from ~174 to
  ~370 MB/s (``bench/shardcast.py`` measures against an unpatched host, ``plain_host``).
- Whole gossip RPCs (``GuardedPubsub``): py-libp2p writes an RPC with one ``write``, but
  yamux sends it in pieces as the receiver's window allows, taking its lock per piece; two
  tasks writing to one peer's gossip stream (forwarding, the heartbeat's control messages,
  a replay) can interleave their pieces once the window runs short, and the receiver
  reads a garbled RPC. Our pubsub writes one RPC at a time per stream. An RPC protobuf
  cannot parse raised ``DecodeError`` out of py-libp2p's stream handler and took the whole
  node down (a worker of the adversarial matrix died of it): the guard resets that peer's
  stream, drops it from gossip as py-libp2p does for its own parse errors, and reports it.
  Each message received is checked in a task of its own (``push_msg``), outside the stream
  handler: a message whose ``key`` is no public key raised there and stopped the node; such
  a message is dropped and reported too.
- Any other stream handler (``gate_inbound_streams``) that raises loses its stream, never
  the host: py-libp2p lets the error end the connection's task group, and with it the node.
- Advertised addresses (``cache_addrs``): py-libp2p rebuilds them on every call, and calls
  it for every gossip RPC and Kademlia reply; the node's host keeps them ``ADDRS_TTL`` s.
- Yamux resets (``wake_readers_on_reset``): a local reset wakes a reader already waiting
  on the stream (py-libp2p 0.8.1 leaves it waiting for ever).
- Yamux writers out of window (``wake_writers_on_window``): woken by the peer's window
  update, not py-libp2p's 10 ms poll; with the poll the receiver's window never grew and
  a stream between two of our nodes moved 46 MB/s where the library alone moved 260
  (issue #60); woken, 600-670 MB/s here.
- Received bytes (``fewer_read_copies``): ``read_exactly`` hands on a read that came whole,
  and a Noise session joins a yamux frame's messages once: four of the ten copies
  py-libp2p makes of each received byte (~8 % of a stream's CPU).
- Wire bytes: py-libp2p counts no traffic; the same wrapper counts in ``WIRE`` every byte
  this process wrote to or read from a TCP socket (Noise, yamux, gossipsub, Kademlia and
  our protocols alike).
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections import OrderedDict, defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

import multiaddr
import trio
from google.protobuf.message import DecodeError
from libp2p import new_host
from libp2p.abc import IHost
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.io import msgio as msgio_module
from libp2p.io import utils as io_utils
from libp2p.io.abc import Reader
from libp2p.io.exceptions import ConnectionClosedError
from libp2p.io.trio import TrioTCPStream
from libp2p.kad_dht import common as kad_common
from libp2p.kad_dht import kad_dht as kad_module
from libp2p.kad_dht import peer_routing, provider_store, value_store
from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
from libp2p.kad_dht.utils import sort_peer_ids_by_distance
from libp2p.network.config import (
    OUTBOUND_STREAM_PROTOCOL_NEGOTIATION_TIMEOUT,
    ConnectionConfig,
)
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.peer.peerstore import env_to_send_in_RPC
from libp2p.pubsub import gossipsub as gossipsub_module
from libp2p.pubsub import pubsub as pubsub_module
from libp2p.pubsub import utils as pubsub_utils
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.security import secure_session as secure_session_module
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.exceptions import MuxedStreamError
from libp2p.stream_muxer.yamux import yamux as yamux_module

from crypto.identity import Identity
from protocol.ids import GOSSIPSUB, KAD

log = logging.getLogger("intellect.node")
SUBSCRIPTION_QUEUE = 4096
READ_AHEAD = 256 * 1024  # bytes per recv at most (tune_tcp_streams)
YAMUX_FRAME = 1024 * 1024  # most bytes per yamux frame we send, header in (larger_yamux_frames)
ADDRS_TTL = 5.0  # seconds a host's advertised addresses are kept (cache_addrs)
RECORD_RECHECK = 600.0  # seconds a verified gossip peer record is trusted unchanged
MAX_RECORDS = 4096  # verified peer records remembered (verify_records_once)
WIRE = {"in": 0, "out": 0}  # bytes through TCP sockets in this process (tune_tcp_streams)


def tune_tcp_streams() -> None:
    """Wrap py-libp2p's TCP stream (once): read ahead, and count bytes in ``WIRE``.

    A read asking for ``n`` bytes gets at most ``n``, first from what an earlier ``recv``
    read ahead, else from one ``recv`` of up to ``max(n, READ_AHEAD)`` bytes; the rest is
    kept for the next read. One task reads a connection at a time (the handshake, then the
    muxer), so the bytes kept always go to the layer that reads next."""
    if getattr(TrioTCPStream, "_intellect_tuned", False):
        return
    write, read = TrioTCPStream.write, TrioTCPStream.read

    async def counted_write(self: TrioTCPStream, data: bytes) -> None:
        await write(self, data)
        WIRE["out"] += len(data)

    async def read_ahead(self: TrioTCPStream, n: int | None = None) -> bytes:
        if n == 0:
            return b""
        ahead: memoryview | None = getattr(self, "_intellect_ahead", None)
        if not ahead:
            got = await read(self, max(n or 0, READ_AHEAD))
            WIRE["in"] += len(got)
            if n is None or len(got) <= n:
                return got
            ahead = memoryview(got)
        take = len(ahead) if n is None else min(n, len(ahead))
        rest = ahead[take:]
        # drained: drop the view, or it keeps the whole receive buffer alive
        self._intellect_ahead = rest if len(rest) else None  # type: ignore[attr-defined]
        return bytes(ahead[:take])

    TrioTCPStream.write = counted_write  # type: ignore[method-assign]
    TrioTCPStream.read = read_ahead  # type: ignore[method-assign]
    TrioTCPStream._intellect_tuned = True  # type: ignore[attr-defined]


def use_kad_protocol(protocol_id: str = KAD) -> None:
    """Make every py-libp2p kad_dht module speak ``protocol_id``."""
    pid = TProtocol(protocol_id)
    for module in (kad_common, kad_module, peer_routing, provider_store, value_store):
        module.PROTOCOL_ID = pid  # type: ignore[attr-defined]


def key_pair_of(identity: Identity) -> KeyPair:
    return create_new_key_pair(identity.private_bytes)


def batch_yamux_window_updates() -> None:
    """Grant a yamux stream's receive window back once half of it is consumed, as go-yamux
    does (``sendWindowUpdate``: no update while ``delta < maxWindow / 2``), not after
    every read: py-libp2p 0.8.1 answers every read of a few bytes with a WINDOW_UPDATE
    frame of its own (one more Noise message and ``send``) even with
    ``PY_YAMUX_RELEASE_ON_READ=0``, through its "partial slack" branch. Wraps
    ``YamuxStream._auto_tune_and_send_window_update`` once (py-libp2p then grants the
    whole consumed amount, and auto-tunes the window, as before); a sender never stalls
    for it: with the window used up, the reader's next reads consume at least half of it.
    Also sets ``PY_YAMUX_RELEASE_ON_READ=0`` for this process unless the environment
    already chose."""
    os.environ.setdefault("PY_YAMUX_RELEASE_ON_READ", "0")
    stream_cls = yamux_module.YamuxStream
    if getattr(stream_cls, "_intellect_batched", False):
        return
    grant = stream_cls._auto_tune_and_send_window_update

    async def batched(self: Any, *, bytes_read: int = 0) -> None:
        buffered = len(self.conn.stream_buffers.get(self.stream_id, b""))
        consumed = self.target_recv_window - (self.recv_window + buffered)
        if consumed < self._grow_threshold():
            return  # less than half the window consumed and not granted yet: wait
        await grant(self, bytes_read=bytes_read)

    stream_cls._auto_tune_and_send_window_update = batched  # type: ignore[method-assign]
    stream_cls._intellect_batched = True  # type: ignore[attr-defined]


def larger_yamux_frames(size: int = YAMUX_FRAME) -> None:
    """Send yamux DATA frames of up to ``size`` bytes, header included (py-libp2p: 64 KiB).

    py-libp2p's cost is per frame on both sides: two lock acquisitions, a header, a copy
    and a debug string each, and a Noise message per 64 KiB. A frame never exceeds the
    receiver's window (256 KiB at first, the yamux default; grown by py-libp2p up to
    16 MiB), and py-libp2p as shipped (like go-yamux) accepts any frame within the window,
    so only what we send changes. 1 MiB is also the largest body rust-yamux accepts, and a
    SHARDCAST upload frame fills exactly one (``node/shardcast/service.py``); such a frame
    holds the connection's other streams ~5 ms at 200 MB/s (0.8 s at 10 Mbit/s: a TCP
    send buffer of the same size does as much). Measured on a single 256 MiB SHARDCAST
    pull between two processes (``bench/shardcast.py``): 4 MiB shards, 122-137 MB/s at
    64 KiB and 146-158 at 256 KiB (each side ~30 % less CPU); 8 MiB shards, 167-170 at
    256 KiB, 171-179 at 1 MiB, 175-183 at 2 MiB. Noise still splits a frame into messages
    of at most 65,519 plaintext bytes."""
    yamux_module.MAX_MESSAGE_SIZE = size


def wake_readers_on_reset() -> None:
    """Wake a reader blocked on a yamux stream when the stream is reset locally.

    py-libp2p 0.8.1's ``YamuxStream.reset`` drops the stream's read event without setting
    it, so a task already waiting in ``read`` waits for ever. A circuit relay copies each
    direction in a task of its own; when one direction cuts the circuit (a relay limit) it
    resets both streams, and the other direction's task never ended: the circuit's slot
    was never released (found probing the relay, issue #29)."""
    stream_cls = yamux_module.YamuxStream
    if getattr(stream_cls, "_intellect_reset_wakes", False):
        return
    reset = stream_cls.reset

    async def reset_and_wake(self: Any) -> None:
        event = self.conn.stream_events.get(self.stream_id)
        try:
            await reset(self)
        finally:
            if event is not None:
                event.set()

    stream_cls.reset = reset_and_wake  # type: ignore[method-assign]
    stream_cls._intellect_reset_wakes = True  # type: ignore[attr-defined]


WINDOW_WAIT = 5.0  # seconds a writer waits for the peer's window, as py-libp2p does
CLOSED_CHECK = 0.05  # seconds between a waiting writer's looks at a closed stream


def wake_writers_on_window() -> None:
    """Wake a yamux writer when the peer grants window, instead of every 10 ms.

    py-libp2p 0.8.1's ``YamuxStream.write``, its send window used up, sleeps 10 ms between
    looks at the window. The receiver's auto-tuning doubles its window only when two
    updates come within 4 RTT (4 ms while no ping has measured it), so a sender that
    sleeps 10 ms on every empty window keeps the window where it is: a stream stuck at
    512 KiB per ~11 ms, 46 MB/s on a machine whose bare stream moves 300-600 (issue #60;
    which streams got stuck depended on when the first updates came). Here the window
    counter (``send_window``) becomes a property that sets an event when it rises above
    zero, and ``write`` hands the library no more than the window holds, waiting on that
    event between pieces, so the library's own 10 ms wait is never reached. A closed
    stream is noticed within ``CLOSED_CHECK``; ``WINDOW_WAIT`` with no window raises the
    library's ``MuxedStreamError``, as the library does."""
    stream_cls = yamux_module.YamuxStream
    if getattr(stream_cls, "_intellect_window_wakes", False):
        return
    # typed for bytes; it only takes len() and slices, and adds the chunk to a header
    write: Callable[[Any, memoryview], Awaitable[None]] = stream_cls.write  # type: ignore[assignment]

    def get_window(self: Any) -> int:
        return int(self.__dict__.get("_intellect_send_window", 0))

    def set_window(self: Any, value: int) -> None:
        self.__dict__["_intellect_send_window"] = value
        opened: trio.Event | None = self.__dict__.get("_intellect_window_open")
        if value > 0 and opened is not None:
            opened.set()

    async def window_open(self: Any) -> None:
        with trio.move_on_after(WINDOW_WAIT) as waited:
            while self.send_window <= 0 and not (self.closed or self.send_closed):
                opened = self.__dict__["_intellect_window_open"] = trio.Event()
                with trio.move_on_after(CLOSED_CHECK):
                    await opened.wait()
        if waited.cancelled_caught:
            raise MuxedStreamError("Timed out waiting for window update after 5 seconds.")

    async def write_in_window(self: Any, data: bytes) -> None:
        # pieces are views: the library copies each into its frame (header + chunk) anyway
        view = memoryview(data)
        sent = 0
        while sent < len(view):
            await window_open(self)
            room = self.send_window
            if room <= 0:  # closed: the library raises its own error
                await write(self, view[sent:])
                return
            piece = view[sent : sent + room]
            await write(self, piece)
            sent += len(piece)

    stream_cls.send_window = property(get_window, set_window)  # type: ignore[assignment]
    stream_cls.write = write_in_window  # type: ignore[method-assign]
    stream_cls._intellect_window_wakes = True  # type: ignore[attr-defined]


class _Prefixed(Reader):
    """A reader that first returns ``data`` (already read), then reads ``reader``."""

    def __init__(self, data: bytes, reader: Any) -> None:
        self._data: bytes | None = data
        self._reader = reader

    async def read(self, n: int | None = None) -> bytes:
        if self._data is not None:
            data, self._data = self._data, None
            return data
        return bytes(await self._reader.read(n))

    def __getattr__(self, name: str) -> Any:  # conn_state(), for the library's messages
        return getattr(self._reader, name)


def fewer_read_copies() -> None:
    """Hand a received byte on with fewer copies between the socket and a stream's reader.

    py-libp2p 0.8.1 copies every byte it receives about ten times on its way up. Two of
    its helpers are the worst: ``read_exactly`` gathers even a read that came whole into a
    ``bytearray`` and copies that into ``bytes`` (twice per byte for every Noise message
    and again for every yamux frame body), and ``SecureSession.read`` does the same while
    it joins a yamux frame from Noise messages. Here ``read_exactly`` returns a read that
    came whole as it is (a short one goes on as the library does, with its errors), and a
    ``SecureSession`` read with nothing buffered joins the messages once. The bytes and
    the errors are the library's; four copies of each byte are gone."""
    if getattr(io_utils, "_intellect_fewer_copies", False):
        return
    gather = io_utils.read_exactly

    async def read_exactly(reader: Any, n: int, retry_count: int = 100) -> bytes:
        data = await reader.read(n)
        if len(data) == n:
            return data if type(data) is bytes else bytes(data)
        return await gather(_Prefixed(bytes(data), reader), n, retry_count)

    for module in (io_utils, msgio_module, yamux_module):
        module.read_exactly = read_exactly  # type: ignore[attr-defined]

    session_cls = secure_session_module.SecureSession
    read = session_cls.read

    async def read_joined(self: Any, n: int | None = None) -> bytes:
        if not n or self.low_watermark != self.high_watermark:
            return bytes(await read(self, n))  # n None or 0, or bytes buffered: as shipped
        parts: list[bytes] = []
        have = 0
        while have < n:
            msg = await self.conn.read_msg()
            if msg == b"":
                if parts:
                    break
                raise ConnectionClosedError("Connection closed")
            need = n - have
            if len(msg) > need:
                self._fill(msg[need:])
                msg = msg[:need]
            parts.append(msg)
            have += len(msg)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    session_cls.read = read_joined  # type: ignore[method-assign]
    io_utils._intellect_fewer_copies = True  # type: ignore[attr-defined]


def build_host(identity: Identity, *, open_stream_s: float = 0.0) -> IHost:
    """The node's host: ``plain_host`` over TCP streams tuned by ``tune_tcp_streams``,
    yamux window updates batched (``batch_yamux_window_updates``) and sent in larger
    frames (``larger_yamux_frames``), and its advertised addresses cached
    (``cache_addrs``). ``open_stream_s``: the node's own deadline for opening a stream
    (``connect_timeout``); the library's protocol negotiation is given at least that long."""
    tune_tcp_streams()
    batch_yamux_window_updates()
    larger_yamux_frames()
    wake_readers_on_reset()
    wake_writers_on_window()
    fewer_read_copies()
    host = plain_host(identity, negotiate_s=open_stream_s)
    cache_addrs(host)
    return host


def gate_inbound_streams(host: IHost, gate: Callable[[str], float | None]) -> None:
    """Reset a new inbound stream of a peer (base58 id) for which ``gate`` answers a number
    as soon as the muxer hands it over, before py-libp2p negotiates its protocol
    (multistream-select: two messages each way, all through Noise): the cheapest refusal
    there is, for a peer that keeps opening streams after ``busy`` (``node/net/limits.py``).
    The number is how long its connection is then not read (``hold_reads``): even a
    stream reset on arrival costs ~2 ms of py-libp2p's work, a held connection nothing."""
    swarm: Any = host.get_network()
    negotiate = swarm.common_stream_handler

    async def gated(stream: Any) -> None:
        peer = stream.muxed_conn.peer_id.to_base58()
        hold = gate(peer)
        if hold is None:
            try:
                await negotiate(stream)
            except Exception as exc:  # one peer's stream must never end the host
                log.warning(
                    "stream handler failed peer=%s protocol=%s error=%r (stream reset)",
                    peer[-8:],
                    stream.get_protocol(),
                    exc,
                )
                await _reset(stream)
            return
        if hold > 0:  # every connection of the peer: its next stream may come on another
            held = {id(stream.muxed_conn): stream.muxed_conn}
            for conn in swarm.get_connections(stream.muxed_conn.peer_id):
                held[id(conn.muxed_conn)] = conn.muxed_conn
            for muxed in held.values():
                hold_reads(muxed, hold)
        await _reset(stream)

    swarm.set_stream_handler(gated)


async def _reset(stream: Any) -> None:
    try:
        await stream.reset()
    except Exception:  # the connection went meanwhile: nothing to reset
        pass


def hold_reads(muxed_conn: Any, seconds: float) -> None:
    """Read nothing more from ``muxed_conn`` (a yamux connection) for ``seconds`` from now
    (or until a later hold ends): its muxer's one reader waits before each read of the
    secured connection, so the peer's frames stay in the socket buffers, its new streams
    and writes stall on TCP's flow control, and it costs us no CPU meanwhile. Our writes
    to it stall too once its window is spent (their own deadlines end them)."""
    secured = muxed_conn.secured_conn
    until = trio.current_time() + seconds
    if getattr(secured, "_intellect_held_until", None) is None:
        read = secured.read

        async def held_read(n: int | None = None) -> bytes:
            wait = secured._intellect_held_until - trio.current_time()
            if wait > 0:
                await trio.sleep(wait)
            data: bytes = await read(n)
            # a hold that began while this read was waiting for the peer: what it read
            # (a new stream, say) waits for the hold's end too (the suite met a stream
            # opened just after the hold began, read and reset at once)
            wait = secured._intellect_held_until - trio.current_time()
            if wait > 0:
                await trio.sleep(wait)
            return data

        secured.read = held_read
        secured._intellect_held_until = until
    secured._intellect_held_until = max(secured._intellect_held_until, until)


def cache_addrs(host: IHost, ttl: float = ADDRS_TTL) -> None:
    """Keep the host's advertised addresses for ``ttl`` seconds once it has some.

    py-libp2p rebuilds them (multiaddr parsing and encapsulation, base58) on every call,
    and calls it for every gossip RPC it sends (to attach the signed peer record, also once
    per message it replays to a newly subscribed peer) and every Kademlia reply: 15% of an
    idle inference node's CPU in a 30-node network (``bench/scale.py``). An empty answer
    (not listening yet) is never kept."""
    listening = host.get_addrs
    kept: list[multiaddr.Multiaddr] = []

    def compute() -> list[multiaddr.Multiaddr]:
        # py-libp2p's own list cannot hold a circuit address: it cuts every address at its
        # first /p2p/ (there, the relay's) before appending ours
        extra: list[str] = getattr(host, "extra_addrs", [])
        if not extra:
            return listening()
        own = f"/p2p/{host.get_id()}"
        return [*listening(), *(multiaddr.Multiaddr(a + own) for a in extra)]

    stamp = 0.0

    def get_addrs() -> list[multiaddr.Multiaddr]:
        nonlocal kept, stamp
        now = time.monotonic()
        if not kept or now - stamp > ttl:
            kept, stamp = compute(), now
        return list(kept)

    def forget() -> None:  # ``extra_addrs`` changed (``Network.set_circuit_addrs``)
        nonlocal kept
        kept = []

    host.get_addrs = get_addrs  # type: ignore[method-assign]
    host.forget_addrs = forget  # type: ignore[attr-defined]


def plain_host(identity: Identity, *, negotiate_s: float = 0.0) -> IHost:
    """A py-libp2p host with this project's settings (Noise, yamux, no auto-connector) and
    nothing of ours on its TCP streams, unless ``tune_tcp_streams`` ran in this process.
    A stream's protocol negotiation may take ``negotiate_s`` (at least the library's 10 s):
    the library's own shorter cut would otherwise end, under a longer ``connect_timeout``,
    a stream to a CPU-starved peer that the node still waits for (found by the adversarial
    matrix at load 50: the worker got the stream after the validator had given it up)."""
    key_pair = key_pair_of(identity)
    security: Any = {
        NOISE_PROTOCOL_ID: NoiseTransport(
            key_pair, noise_privkey=create_x25519_key_pair().private_key
        )
    }
    # the library's pruner starts above 4096 connections (never, in practice), and any number
    # of inbound connections is accepted: the runtime trims down to its own watermarks
    negotiate = max(OUTBOUND_STREAM_PROTOCOL_NEGOTIATION_TIMEOUT, negotiate_s)
    limits = ConnectionConfig(
        max_connections=4096,
        min_connections=0,
        low_watermark=0,
        high_watermark=4096,
        outbound_stream_protocol_negotiation_timeout=negotiate,
        inbound_stream_protocol_negotiation_timeout=negotiate,
    )
    host = new_host(
        key_pair=key_pair,
        sec_opt=security,
        muxer_preference="YAMUX",
        connection_config=limits,
    )
    _no_auto_connect(host)
    return host


def _no_auto_connect(host: IHost) -> None:
    """Stop py-libp2p's auto-connector from dialing peers of the peerstore on its own."""

    async def nothing() -> None:
        return None

    connector = getattr(host.get_network(), "auto_connector", None)
    if connector is not None:
        connector.maybe_connect = nothing


def verify_records_once(
    consume: Callable[[Any, IHost, ID], bool], clock: Callable[[], float] = time.monotonic
) -> Callable[[Any, IHost, ID], bool]:
    """Wrap py-libp2p's ``maybe_consume_signed_record`` for gossip RPCs so that the same
    signed peer record from the same peer is verified once per ``RECORD_RECHECK`` s.

    Gossipsub attaches the sender's signed peer record to every RPC it sends, and the
    receiver verifies the signature, decodes the peer id and parses the addresses each
    time: several per cent of an idle node's CPU (``bench/scale.py --profile``). A record
    byte-identical to one already verified for that peer (and stored in the peerstore)
    proves nothing new while the peerstore still holds it; a changed record, one the
    peerstore dropped, or one not seen for ``RECORD_RECHECK`` s (the peerstore keeps it
    2 h) goes through the full check again. A record that fails is
    never remembered."""
    verified: OrderedDict[tuple[int, ID], tuple[bytes, float]] = OrderedDict()

    def consume_once(msg: Any, host: IHost, peer_id: ID) -> bool:
        if not msg.HasField("senderRecord"):
            return consume(msg, host, peer_id)
        key, raw, now = (id(host), peer_id), bytes(msg.senderRecord), clock()
        seen = verified.get(key)
        if (
            seen is not None
            and seen[0] == raw
            and now - seen[1] < RECORD_RECHECK
            and _record_stored(host, peer_id)
        ):
            return True
        ok = consume(msg, host, peer_id)
        if ok:
            verified[key] = (raw, now)
            verified.move_to_end(key)
            while len(verified) > MAX_RECORDS:
                verified.popitem(last=False)
        return ok

    return consume_once


def _record_stored(host: IHost, peer_id: ID) -> bool:
    """Whether the peerstore still holds ``peer_id``'s signed record. Never raises into
    py-libp2p's stream handler (that would take the host down): its peerstore raises
    ``PeerStoreError`` for a peer whose addresses expired."""
    try:
        return host.get_peerstore().get_peer_record(peer_id) is not None
    except Exception:
        return False


def _gossip_records_verified_once() -> None:
    if getattr(pubsub_utils, "_intellect_once", False):
        return
    once = verify_records_once(pubsub_utils.maybe_consume_signed_record)
    # py-libp2p's modules import it by name (its declared parameter types are narrower)
    gossipsub_module.maybe_consume_signed_record = once  # type: ignore[attr-defined,assignment]
    pubsub_module.maybe_consume_signed_record = once  # type: ignore[attr-defined,assignment]
    pubsub_utils._intellect_once = True  # type: ignore[attr-defined]


class Router(GossipSub):
    """py-libp2p's gossipsub router. On the ``replay_newest`` topics a newly subscribed peer
    is sent only the newest cached message of each publisher, at most the topic's cap,
    instead of the whole recent-message window. Its mesh upkeep is go-libp2p's: a peer the
    heartbeat prunes is backed off, and nothing is grafted "opportunistically" (module doc)."""

    replay_newest: dict[str, int] = {}  # noqa: RUF012 (set per instance by build_pubsub)

    def mesh_heartbeat(self) -> tuple[defaultdict[ID, list[str]], defaultdict[ID, list[str]]]:
        to_graft, to_prune = super().mesh_heartbeat()
        for peer, topics in to_prune.items():
            for topic in topics:
                self._add_back_off(peer, topic, False)
        return to_graft, to_prune

    def _perform_opportunistic_grafting(
        self, topic: str, peers_to_graft: defaultdict[ID, list[str]]
    ) -> int:
        return 0

    async def send_recent_messages(self, peer_id: ID, topic: str) -> None:
        cap = self.replay_newest.get(topic)
        if cap is None:
            await super().send_recent_messages(peer_id, topic)
            return
        pubsub = self.pubsub
        if pubsub is None or peer_id not in pubsub.peers:
            return
        if self.scorer is not None and not self.scorer.allow_publish(peer_id, [topic]):
            return  # the library's own replay applies this gate too
        seen: set[bytes] = set()
        msgs = []
        for mid in self.mcache.window(topic):
            msg = self.mcache.get(mid)
            if msg is None or msg.from_id in seen:
                continue
            seen.add(msg.from_id)
            msgs.append(msg)
            if len(msgs) >= cap:
                break
        stream = pubsub.peers[peer_id]
        record = env_to_send_in_RPC(pubsub.host)[0]  # our signed record, the same for each
        for msg in msgs:
            rpc = rpc_pb2.RPC(publish=[msg], senderRecord=record)
            try:
                await pubsub.write_msg(stream, rpc)
            except Exception:
                return


class GuardedPubsub(Pubsub):
    """py-libp2p's pubsub, writing one RPC at a time on each stream, and dropping the stream
    of a peer whose RPC cannot be parsed (``on_bad_rpc(peer, detail)`` is told) instead of
    letting ``DecodeError`` end the node."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.on_bad_rpc: Callable[[ID, str], None] | None = None
        self._write_locks: weakref.WeakKeyDictionary[Any, trio.Lock] = weakref.WeakKeyDictionary()

    async def write_msg(self, stream: Any, rpc_msg: rpc_pb2.RPC) -> bool:
        lock = self._write_locks.get(stream)
        if lock is None:
            lock = self._write_locks[stream] = trio.Lock()
        async with lock:
            ok: bool = await super().write_msg(stream, rpc_msg)
            return ok

    async def stream_handler(self, stream: Any) -> None:
        try:
            await super().stream_handler(stream)
        except Exception as exc:  # DecodeError, or py-libp2p choking on what parsed
            peer = stream.muxed_conn.peer_id
            what = "not parsed" if isinstance(exc, DecodeError) else "not processed"
            if self.on_bad_rpc is not None:
                self.on_bad_rpc(peer, f"gossip RPC {what}: {exc!r}")
            await _reset(stream)
            self._handle_dead_peer(peer)

    async def push_msg(self, msg_forwarder: ID, msg: rpc_pb2.Message) -> None:
        """py-libp2p runs this as a task of the pubsub service for each message received,
        so an error in it (a ``key`` field that is no public key raised ``DecodeError`` from
        the signature check) stopped the service and the node: one message killed a node.
        A peer's message that raises is dropped and reported; our own publish still
        raises to its caller."""
        try:
            await super().push_msg(msg_forwarder, msg)
        except Exception as exc:
            if msg_forwarder == self.my_id:
                raise
            if self.on_bad_rpc is not None:
                self.on_bad_rpc(msg_forwarder, f"gossip message not processed: {exc!r}")


def build_pubsub(
    host: IHost, heartbeat_interval: int = 1, replay_newest: dict[str, int] | None = None
) -> GuardedPubsub:
    pubsub_module.SUBSCRIPTION_CHANNEL_SIZE = SUBSCRIPTION_QUEUE
    _gossip_records_verified_once()
    router = Router(
        [TProtocol(GOSSIPSUB)],
        degree=6,
        degree_low=4,
        degree_high=12,
        heartbeat_interval=heartbeat_interval,
        spam_protection_enabled=False,
        max_pending_messages_per_peer=1000,
        adaptive_gossip_enabled=False,  # its "poor health" heartbeat is 60 s (module doc)
    )
    router.replay_newest = replay_newest or {}
    return GuardedPubsub(host, router, strict_signing=True)


async def providers_nearby(
    dht: KadDHT, key: str, peers: list[ID], limit: int, per_peer_s: float
) -> list[PeerInfo]:
    """The providers of ``key`` that the ``limit`` of ``peers`` closest to it know of: one
    GET_PROVIDERS each, in parallel, and no second hop, so nothing is dialed when ``peers``
    are connected. Unlike py-libp2p's lookup it always asks (records it found before stay
    in the local provider store for 48 h, and a role that disappeared must be looked for
    again); what it finds is cached there too."""
    store = dht.provider_store
    raw = kad_module._encode_key(key)
    found: dict[ID, PeerInfo] = {}

    async def ask(peer: ID) -> None:
        with trio.move_on_after(per_peer_s):
            try:
                providers, _closer = await store._get_providers_from_peer_with_closers(peer, raw)
            except Exception:  # py-libp2p raises many unrelated types on a failed stream
                return
            for info in providers:
                found.setdefault(info.peer_id, info)
                store.add_provider(raw, info)

    async with trio.open_nursery() as nursery:
        for peer in sort_peer_ids_by_distance(raw, peers)[:limit]:
            nursery.start_soon(ask, peer)
    return list(found.values())


def build_dht(host: IHost) -> KadDHT:
    use_kad_protocol()
    return KadDHT(host, DHTMode.SERVER, protocol_prefix=TProtocol("/intellect"))


def parse_addrs(addrs: list[str]) -> list[multiaddr.Multiaddr]:
    out = []
    for a in addrs:
        try:
            out.append(multiaddr.Multiaddr(a))
        except Exception as exc:  # multiaddr raises several unrelated types
            raise ValueError(f"not a multiaddr: {a!r} ({exc})") from exc
    return out


def local_ipv4s() -> list[str]:
    """IPv4 addresses of this machine's interfaces, loopback first."""
    import ifaddr

    ips = {ip.ip for a in ifaddr.get_adapters() for ip in a.ips if isinstance(ip.ip, str)}
    return sorted(ips, key=lambda ip: (not ip.startswith("127."), ip))


def advertised_addrs(listening: list[str], interface_ips: list[str]) -> list[str]:
    """Listen addresses as peers can dial them: ``0.0.0.0`` expands to each interface IP."""
    out: list[str] = []
    for addr in listening:
        if addr.startswith("/ip4/0.0.0.0/"):
            rest = addr[len("/ip4/0.0.0.0") :]
            out += [f"/ip4/{ip}{rest}" for ip in interface_ips if not ip.startswith("169.254.")]
        else:
            out.append(addr)
    return list(dict.fromkeys(out))
