"""Discovery and connection upkeep: finding the peers a role works with, keeping links.

- Dial the bootstrap peers and greet them.
- Provide our role key in the DHT (again only when the DHT needs it: ``ProvideSchedule``).
- Look up the role keys this role works with on a schedule that backs off once they are
  found and returns when one disappears (``LookupSchedule``), and greet what is found, so
  a node that knows only B finds A through B.
- Every second, keep between ``conn_low`` and ``conn_high`` connections
  (``ConnectionPlan``), with a few peers of each role protected as the peers in use;
  gossip relies on its mesh over these links, never on a full mesh.
The decisions are in the pure state machines (``schedules.py``, ``connections.py``); this
service only feeds them the time and what the network says, and dials and closes.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

import trio
from libp2p.kad_dht.provider_store import PROVIDER_RECORD_REPUBLISH_INTERVAL
from libp2p.network.stream.exceptions import StreamError
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr

from node.config import NodeConfig
from node.net.connections import ConnectionPlan, LinkUse
from node.net.host import parse_addrs, providers_nearby
from node.net.metrics import Metrics
from node.net.network import Network
from node.net.peers import PeerTable
from node.net.presence import Presence
from node.net.requests import RemoteRefusal
from node.net.schedules import NEEDS, LookupSchedule, ProvideSchedule
from protocol import ids
from protocol.errors import WireError

log = logging.getLogger("intellect.node")
TEND_INTERVAL = 1.0  # seconds between connection upkeep rounds
DIAL_COOLDOWN = 60.0  # a peer that dropped our link (or we trimmed) is not dialed sooner
MAX_CANDIDATES = 256  # DHT providers kept as dial candidates
PROVIDE_LIMIT = 60.0  # seconds a provide (a walk, then one store per close peer) may take
NEARBY_ASKED = 8  # connected peers asked for a role's providers by a well-connected node
GREET_AGAIN = 30.0  # seconds before a connected peer of unknown role is greeted again


@dataclass(frozen=True)
class ConnectionStatus:
    count: int
    settled: int  # connections past their grace, not carrying data: what ``high`` bounds
    low: int
    high: int
    in_use: int
    carrying: int  # connections carrying data now or lately (``LinkUse``): not closed
    dialed: int
    trimmed: int
    dropped: int


@dataclass(frozen=True)
class DiscoveryStatus:
    dht_lookups: int
    dht_lookups_by_scope: dict[str, int]
    dht_provides: int
    dht_providers: int
    next_lookup_in_s: float
    provides_ok: bool


class Discovery:
    """The DHT lookups and provides of our role, and the connection watermarks."""

    def __init__(
        self,
        cfg: NodeConfig,
        network: Network,
        peers: PeerTable,
        presence: Presence,
        metrics: Metrics,
        use: LinkUse | None = None,
    ) -> None:
        self.cfg, self.network, self.peers = cfg, network, peers
        self.presence, self.metrics = presence, metrics
        self.use = use if use is not None else LinkUse()  # the links carrying data
        self.links = ConnectionPlan(
            low=cfg.net.conn_low,
            high=cfg.net.conn_high,
            grace=cfg.net.connect_timeout,
            cooldown=DIAL_COOLDOWN,
        )
        base = cfg.net.discovery_interval
        self.lookups = LookupSchedule(
            NEEDS[cfg.role],
            base=base,
            longest=max(base, cfg.net.discovery_max_interval),
            longest_missing=max(base, cfg.net.discovery_max_interval / 2),
        )
        self.provides = ProvideSchedule(
            republish=float(PROVIDER_RECORD_REPUBLISH_INTERVAL), retry=4 * base
        )
        self.dht_providers: set[str] = set()  # peers learned from DHT provider records
        self._candidates: dict[str, tuple[str, PeerInfo]] = {}  # from DHT lookups
        self._dialing: set[str] = set()
        self._transient: set[str] = set()  # links opened by DHT queries, not yet tended
        self._greeted: dict[str, float] = {}  # connected peers of unknown role we greeted
        self._providing = False  # a provide round is running
        self._rng = random.Random()
        self._nursery: trio.Nursery | None = None

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Greet the bootstrap peers, then look up, provide and tend links until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._discovery_loop)
            task_status.started()

    def in_use(self) -> set[str]:
        """The peers our links protect (a few of each role we work with)."""
        return self.links.protected()

    def connection_status(self, now: float, connected: set[str]) -> ConnectionStatus:
        """The watermarks and what upkeep did, with ``connected``: the peers linked now."""
        carrying = self.use.peers(now)
        return ConnectionStatus(
            count=len(connected),
            settled=self.links.settled(now, carrying),
            low=self.cfg.net.conn_low,
            high=self.cfg.net.conn_high,
            in_use=len(self.links.protected()),
            carrying=len(carrying & connected),
            dialed=self.metrics.get("connections_dialed"),
            trimmed=self.metrics.get("connections_trimmed"),
            dropped=self.metrics.get("connections_dropped"),
        )

    def status(self, now: float) -> DiscoveryStatus:
        by_scope = self.metrics.by_label("dht_lookups", "scope")
        return DiscoveryStatus(
            dht_lookups=sum(by_scope.values()),
            dht_lookups_by_scope=by_scope,
            dht_provides=self.metrics.get("dht_provides"),
            dht_providers=len(self.dht_providers),
            next_lookup_in_s=round(max(0.0, self.lookups.due - now), 3),
            provides_ok=self.provides.last_ok is not None,
        )

    async def _discovery_loop(self) -> None:
        bootstrap = [info_from_p2p_addr(a) for a in parse_addrs(self.cfg.net.bootstrap)]
        await self._greet_all(bootstrap)
        assert self._nursery is not None
        self._nursery.start_soon(self._connection_loop, bootstrap)
        while True:
            now = trio.current_time()
            if self.lookups.observe(now, self.peers.roles()):
                log.info("a needed role disappeared: looking peers up again")
            table = self.network.dht.get_routing_table_size()
            before = self.network.connected_peers()
            if not self._providing and self.provides.is_due(now, table):
                self._providing = True  # beside the lookups: a walk can take a while
                self._nursery.start_soon(self._provide_round, table)
            if self.lookups.is_due(now):
                await self._look_up()
                delay = self.lookups.looked_up(trio.current_time(), self.peers.roles())
                log.debug("next DHT lookup round in %.1f s", delay)
            # links a DHT query opened (Kademlia asks the peers closest to a key, not our
            # neighbours) are the first to close if they take us above the high watermark
            self._transient |= self.network.connected_peers() - before
            await trio.sleep(min(TEND_INTERVAL, self.cfg.net.discovery_interval))

    async def _connection_loop(self, bootstrap: list[PeerInfo]) -> None:
        """Every second, whatever the lookups are doing: trim above, dial below."""
        while True:
            transient, self._transient = self._transient, set()
            self._tend_connections(bootstrap, transient)
            await trio.sleep(TEND_INTERVAL)

    async def _look_up(self) -> None:
        """One lookup round: providers of the roles we work with (and of our own, for peers
        to link to); a role we know no live peer of is greeted at once (two providers)."""
        roles = sorted(self.lookups.needed | ({self.cfg.role} if self.lookups.needed else set()))
        known = self.peers.roles()
        greet: list[PeerInfo] = []
        host, dht, own = self.network.host, self.network.dht, self.network.identity.peer_id
        assert host is not None
        with trio.move_on_after(self.cfg.net.read_timeout):
            for role in roles:
                key = ids.role_key(self.cfg.run.id, role)
                # in the network (enough links, or enough known peers to dial): ask our
                # neighbours only. A walk dials the peers closest to the key, who mostly are
                # not our neighbours, and each link it opens pushes some peer above its high
                # watermark to close another; gossip presence brings new peers anyway.
                connected = host.get_connected_peers()
                if (
                    connected
                    and max(len(connected), len(self.peers.peers)) >= self.cfg.net.conn_low
                ):
                    self.metrics.inc("dht_lookups", scope="connected")
                    found = await providers_nearby(
                        dht, key, connected, NEARBY_ASKED, self.cfg.net.connect_timeout
                    )
                else:
                    self.metrics.inc("dht_lookups", scope="network")
                    found = await dht.find_providers(key)
                fresh = [i for i in found if i.peer_id.to_base58() != own]
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

    def _tend_connections(self, bootstrap: list[PeerInfo], transient: set[str]) -> None:
        """Close connections above the high watermark, dial peers below the low one (in
        the background: the next round must not wait for a slow dial or close)."""
        assert self._nursery is not None
        now = trio.current_time()
        connected = self.network.connected_peers()
        roles = {
            p: (self.peers.peers[p].role if p in self.peers.peers else None) for p in connected
        }
        for peer in self.links.update(now, roles):
            self.metrics.inc("connections_dropped")
            log.debug("connection to %s dropped by the peer or the network", peer[-8:])
        # a connected peer we know nothing of (a greeting that failed under load, a peer
        # that dialed us and has not greeted yet): greet it, at most every 30 s
        self._greeted = {p: t for p, t in self._greeted.items() if p in connected}
        for peer in connected:
            if roles[peer] is None and now - self._greeted.get(peer, -1e9) >= GREET_AGAIN:
                if peer not in self._dialing and now - self.links.since.get(peer, now) >= 1.0:
                    self._greeted[peer] = now
                    self._dialing.add(peer)
                    self._nursery.start_soon(
                        self._dial_and_greet, PeerInfo(ID.from_base58(peer), [])
                    )
        closing = self.links.to_close(now, transient, self.use.peers(now))
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
        for peer in closing:
            self.metrics.inc("connections_trimmed")
            self._nursery.start_soon(self.network.disconnect, peer)
        for info in dials:
            peer = info.peer_id.to_base58()
            if peer not in self._dialing:
                self._dialing.add(peer)
                self.metrics.inc("connections_dialed")
                self._nursery.start_soon(self._dial_and_greet, info)

    async def _greet_all(self, infos: list[PeerInfo]) -> None:
        own = self.network.identity.peer_id
        fresh = [i for i in infos if i.peer_id.to_base58() != own]
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
            ok = await self.network.provide(ids.role_key(self.cfg.run.id, self.cfg.role))
        except Exception as exc:
            log.debug("dht provide failed: %s", exc)
            return False
        if ok:
            self.metrics.inc("dht_provides")
        return ok

    async def _dial_and_greet(self, info: PeerInfo) -> None:
        peer = info.peer_id.to_base58()
        try:
            if info.addrs and peer not in self.network.connected_peers():
                await self.network.connect(info)
            await self.presence.greet(peer)
        except (trio.TooSlowError, WireError, RemoteRefusal, StreamError, OSError) as exc:
            log.debug("greeting %s failed: %s", peer[-8:], exc)
        except Exception as exc:  # py-libp2p raises many unrelated types on dial failure
            log.debug("dialing %s failed: %s: %s", peer[-8:], type(exc).__name__, exc)
        finally:
            self._dialing.discard(peer)
