"""The node runtime: builds the network services of one node and runs them.

``Node`` is the composition root and the public API that roles and services use; the
work is done by services, each in its own file under ``node/net/``:
- ``network.py``: the py-libp2p host, gossipsub and DHT (dial, close, provide, find);
- ``requests.py``: request/response protocols: read, verify, admit, guard, count;
- ``presence.py``: heartbeats, greetings, liveness probes, leaving;
- ``discovery.py``: DHT lookups and provides of our role, connection watermarks;
- ``reachability.py``: AutoNAT: whether peers can dial us, and dial-backs for peers;
- ``relay.py``: circuit relay v2 (relaying for others, reservations while behind NAT) and
  DCUtR hole punching;
- ``announcements.py``: paced gossip announcements, delivered once, gaps fetched by request;
- ``status.py``: the ``/status`` view assembled from each service's typed status, and
  the gauges of ``/metrics`` (``metrics.py``: ``prometheus_client`` on the node's registry).
Roles and services build on this API only, never on a service's internals:
- ``serve_requests(protocol, request_type, handler)``: a request/response protocol whose
  request envelope the runtime reads, verifies, admits and counts before the handler sees
  it; the handler answers through a ``Responder`` (one reply, then bulk frames if the
  protocol carries any). ``request`` / ``open_request`` are the dialing side.
- ``subscribe(topic, handler)``: every announcement on ``topic``, delivered once;
  ``announce(topic, body)`` publishes one.
- ``known_peers``, ``connected_peers``, ``connect``, ``disconnect``,
  ``provide``, ``find_providers``: the peers of this run and the DHT.
- ``add_status(name, section)``: a role's own figures in ``/status``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

import trio
from libp2p.peer.peerinfo import PeerInfo

from crypto.identity import Identity
from node.config import NodeConfig
from node.net.announcements import AnnouncementHandler, Announcements
from node.net.bans import PeerBans
from node.net.collector import Collections
from node.net.discovery import Discovery
from node.net.metrics import Metrics
from node.net.network import Network
from node.net.peers import PeerTable
from node.net.presence import Presence
from node.net.reachability import Reachability
from node.net.relay import Relays
from node.net.requests import Exchange, RequestHandler, Requests, now_ms
from node.net.status import StatusGauges, StatusView, node_status
from protocol.errors import WireError
from protocol.messages import Header, NodeInfo

log = logging.getLogger("intellect.node")
H = TypeVar("H", bound=Header)  # the reply type a request asks for


class Node:
    """One node of a run: its identity, its network services, and their public API."""

    def __init__(self, cfg: NodeConfig, identity: Identity) -> None:
        self.cfg = cfg
        self.identity = identity
        self.peer_id = identity.peer_id
        self.metrics = Metrics()
        self._seq = time.time_ns() // 1000
        self._stop = trio.Event()
        self._status_sections: dict[str, Callable[[], dict[str, Any]]] = {}
        peers = self.peers = PeerTable(
            self.peer_id, cfg.net.peer_ttl, per_role=cfg.net.peers_per_role
        )
        self.network = Network(cfg, identity)
        self.requests = Requests(cfg, identity, self.network, peers, self.metrics, self.header)
        self.announcements = Announcements(
            cfg.net, cfg.run.id, identity, self.network, self.requests
        )
        self.presence = Presence(
            cfg,
            identity,
            self.network,
            self.requests,
            peers,
            announced=lambda: (self.announcements.session, self.announcements.count),
            on_heard=lambda msg, via: self.announcements.heard(
                msg.sender, msg.session, msg.announced, via
            ),
        )
        self.discovery = Discovery(
            cfg, self.network, peers, self.presence, self.metrics, self.requests.use
        )
        self.reachability = Reachability(self.network, self.metrics)
        self.relays = Relays(
            cfg, self.network, self.reachability, self.metrics, pin=self.discovery.links.pin
        )
        self._view = StatusView(
            cfg,
            self.network,
            peers,
            self.presence,
            self.discovery,
            self.reachability,
            self.relays,
            self.announcements,
            self.metrics,
            self._status_sections,
        )
        self.metrics.add_collector(StatusGauges(self._view))
        self.collections = Collections()  # the garbage collector's pauses (collector.py)
        self.add_status("collector", self.collections.status)

    @property
    def addrs(self) -> list[str]:
        """The addresses we advertise (once serving)."""
        return self.network.addrs

    # ---- lifecycle --------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[Node] = trio.TASK_STATUS_IGNORED) -> None:
        self.collections.install()
        try:
            async with self.network.running(), trio.open_nursery() as nursery:
                await nursery.start(self.presence.serve)
                await nursery.start(self.announcements.serve)
                await nursery.start(self.discovery.serve)
                await nursery.start(self.reachability.serve)
                await nursery.start(self.relays.serve)
                log.info(
                    "node up peer_id=%s role=%s run=%s addrs=%s",
                    self.peer_id,
                    self.cfg.role,
                    self.cfg.run.id,
                    self.addrs,
                )
                task_status.started(self)
                await self._stop.wait()
                self.presence.stop_heartbeats()
                await self.announcements.flush()
                await self.presence.leave()
                nursery.cancel_scope.cancel()
        except BaseException as exc:
            # py-libp2p 0.8.1's pubsub and swarm tasks may raise while their nurseries close
            # (``RuntimeError: Nursery is closed to new arrivals``): once we are stopping,
            # that must not turn a clean stop into a failure.
            if not (self._stop.is_set() and _only_errors(exc)):
                raise
            log.warning("py-libp2p raised while stopping (ignored): %r", exc)
        finally:
            self.collections.uninstall()
        log.info("node stopped peer_id=%s", self.peer_id)

    def request_stop(self) -> None:
        self.presence.leaving = True
        self._stop.set()

    # ---- messages ---------------------------------------------------------------------

    def header(self) -> dict[str, Any]:
        """A fresh message header (run id, our peer id, next sequence number, now)."""
        self._seq += 1
        return {
            "run_id": self.cfg.run.id,
            "sender": self.peer_id,
            "seq": self._seq,
            "ts_ms": now_ms(),
        }

    def node_info(self) -> NodeInfo:
        """Who we are; ``leaving`` from the moment a stop was requested."""
        return self.presence.node_info()

    def reject(self, protocol: str, peer: str, err: WireError) -> None:
        """Count and log an input rejected for ``err.reason``."""
        self.requests.reject(protocol, peer, err)

    # ---- requests and announcements ---------------------------------------------------

    def refuse_banned(self, bans: PeerBans) -> None:
        """Refuse every request of a peer ``bans`` holds (SPEC §2's bans), on any protocol."""
        self.requests.bans = bans

    def serve_requests(
        self,
        protocol: str,
        request_type: type[Header],
        handler: RequestHandler,
        *,
        deadline: float | None = None,
        per_peer: int | None = None,
    ) -> None:
        """Serve request/response ``protocol`` (see ``Requests.serve``)."""
        self.requests.serve(protocol, request_type, handler, deadline=deadline, per_peer=per_peer)

    async def request(self, peer: str, protocol: str, message: Header, reply_type: type[H]) -> H:
        """Send one request to ``peer`` and return its verified, admitted reply."""
        reply: H = await self.requests.request(peer, protocol, message, reply_type)
        return reply

    def open_request(
        self, peer: str, protocol: str, message: Header, *reply_types: type[Header]
    ) -> AbstractAsyncContextManager[Exchange]:
        """A request whose reply is followed by bulk frames (see ``Requests.open_request``)."""
        return self.requests.open_request(peer, protocol, message, *reply_types)

    def subscribe(self, topic: str, handler: AnnouncementHandler) -> None:
        """Call ``handler`` for every admitted announcement on ``topic`` (each once)."""
        self.announcements.subscribe(topic, handler)

    def announce(self, topic: str, body: bytes) -> None:
        """Queue an announcement for the paced publisher; raises ``trio.WouldBlock`` if full."""
        self.announcements.announce(topic, body)

    # ---- peers ------------------------------------------------------------------------

    def known_peers(self) -> list[str]:
        """Peer ids of this run we know of (heard from within the TTL)."""
        return list(self.peers.peers)

    def connected_peers(self) -> set[str]:
        """Peer ids we hold a connection to now."""
        return self.network.connected_peers()

    async def connect(self, info: PeerInfo) -> None:
        await self.network.connect(info)

    async def disconnect(self, peer: str) -> None:
        """Close our connection to ``peer`` (within ``connect_timeout``; failures logged)."""
        await self.network.disconnect(peer)

    async def provide(self, key: str) -> bool:
        """Announce in the DHT that we provide ``key``; False if no peer stored it."""
        return await self.network.provide(key)

    async def find_providers(self, key: str) -> set[str]:
        """Peers that provide ``key`` in the DHT, dialed where needed (see ``Network``)."""
        return await self.network.find_providers(key)

    def relayed(self, peer: str) -> bool:
        """True if only a circuit relay joins us to ``peer`` now (SPEC §17)."""
        return self.network.relayed(peer)

    async def direct_path(self, peer: str) -> bool:
        """Before a bulk transfer: if only a relay joins us to ``peer`` and hole punching
        may still make a direct connection, wait for it (a few seconds at most); True if
        the connection is direct (or not relayed) now."""
        return await self.relays.direct_path(peer)

    async def ping(self, peer: str) -> dict[str, Any]:
        """A presence round trip to ``peer``: its role and the time taken, or the error."""
        return await self.presence.ping(peer)

    # ---- views ------------------------------------------------------------------------

    def add_status(self, name: str, section: Callable[[], dict[str, Any]]) -> None:
        """Show ``section()`` under ``name`` in ``status()`` (a role's own figures)."""
        self._status_sections[name] = section

    def status(self) -> dict[str, Any]:
        return node_status(self._view)

    def prometheus(self) -> bytes:
        """``/metrics``: every metric of this node in the Prometheus text format."""
        return self.metrics.exposition()


def _only_errors(exc: BaseException) -> bool:
    """True if ``exc`` is an ``Exception`` or a group of nothing else (no cancellation)."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_errors(e) for e in exc.exceptions)
    return isinstance(exc, Exception)
