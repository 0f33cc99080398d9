"""Circuit relay v2 and hole punching: how a node at home is reached (SPEC §17).

A node behind NAT can dial out but cannot be dialed, and in this design validators and
SHARDCAST pullers dial the holder of what they want. libp2p's answer, built from
py-libp2p 0.8.1's ``libp2p.relay.circuit_v2``:
- **relays.** A public node with ``relay`` on (the bootstrap role by default) serves the
  HOP protocol within ``RelayLimits`` (reservations, circuits per reserved peer, circuits a
  peer opens, bytes and seconds per circuit), counts what it accepts, refuses and cuts, and
  provides the run's relay key in the DHT once AutoNAT calls it public;
- **reservations.** A node that AutoNAT calls private finds relays through the DHT, holds
  reservations on ``RESERVE_ON`` of them (renewed before they expire, made again when the
  connection drops; those connections are never trimmed), and advertises
  ``<relay>/p2p-circuit`` addresses: in identify, its signed peer record, DHT provider
  records and presence (``Network.circuit_addrs``);
- **dialing.** ``Network.connect`` dials a peer that advertises circuit addresses through
  one of its relays (its other addresses are behind its NAT);
- **hole punching.** Every node runs STOP (accepting circuits) and DCUtR: once two nodes
  meet through a relay, py-libp2p's DCUtR dials both ways at once from the listen port
  (TCP simultaneous open through port-preserving NATs), and on success closes the relayed
  connection. ``Network.relayed(peer)`` tells bulk transfers whether only a relay joins us.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import multiaddr
import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.resources import RelayLimits
from libp2p.relay.circuit_v2.transport import CircuitV2Transport
from libp2p.tools.anyio_service import background_trio_service

from node.config import NodeConfig
from node.net.circuits import CountingDCUtR, CountingRelay, dial_circuit, reserve
from node.net.metrics import Metrics
from node.net.network import Network
from node.net.reachability import PRIVATE, PUBLIC, Reachability
from protocol import ids

log = logging.getLogger("intellect.node")

RESERVE_ON = 2  # relays a private node holds reservations on
TEND = 3.0  # seconds between reservation upkeep rounds
RENEW_BEFORE = 60.0  # renew a reservation this many seconds before it expires
PROVIDE_AGAIN = 1800.0  # seconds between provides of the relay key (a relay)
PROVIDE_LIMIT = 60.0  # seconds one provide (a DHT walk, then stores) may take
FIND_AGAIN = 15.0  # seconds between DHT lookups for relays while short of RESERVE_ON
RESERVE_TIMEOUT = 15.0  # one reservation: stream, request, answer
DIRECT_WAIT = 10.0  # seconds a bulk transfer waits for a hole punch under way
PUNCH_WINDOW = 60.0  # seconds after meeting a peer relayed that a hole punch may still come
PUNCH_RETRY = 60.0  # seconds before a peer still relayed gets new hole punches (doubling)
PUNCH_RETRY_MAX = 1800.0  # ... up to this


@dataclass(frozen=True)
class RelayStatus:
    serving: bool  # this node relays for others (HOP)
    limits: dict[str, int]  # what it allows (SPEC §17)
    reservations_held_for_others: int
    circuits_open: int
    counts: dict[str, int]  # reservations and circuits by outcome, relayed bytes
    reservations: dict[str, float]  # relays we hold a reservation on: seconds left
    circuit_addrs: list[str]  # what we advertise through them
    direct_upgrades: int  # relayed connections that hole punching made direct
    punches_failed: int  # hole punches that found no direct path
    punch_seconds: list[float]  # how long the last successful ones took (dials to direct)
    relayed_peers: list[str]  # peers only a relay joins us to now


class Relays:
    """Serves relaying (when enabled), holds reservations (when private), hole-punches."""

    def __init__(
        self,
        cfg: NodeConfig,
        network: Network,
        reachability: Reachability,
        metrics: Metrics,
        pin: Callable[[set[str]], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cfg, self.network, self.reachability, self.metrics = (
            cfg,
            network,
            reachability,
            metrics,
        )
        self.pin = pin  # keeps the connections to our relays from being trimmed
        self.clock = clock
        self.serving = (
            cfg.relay.enabled if cfg.relay.enabled is not None else cfg.role == "bootstrap"
        )
        self.limits = RelayLimits(
            duration=cfg.relay.circuit_seconds,
            data=cfg.relay.circuit_bytes,
            max_circuit_conns=cfg.relay.circuits_per_reservation,
            max_reservations=cfg.relay.max_reservations,
            reservation_ttl=cfg.relay.reservation_ttl,
        )
        self.protocol: CountingRelay | None = None
        self.transport: CircuitV2Transport | None = None
        self.dcutr: CountingDCUtR | None = None
        self.held: dict[str, tuple[float, str]] = {}  # relay peer -> (expires, its address)
        self._last_find = -1e18
        self._relayed_since: dict[str, float] = {}  # peers met through a relay, since when
        self._retried: dict[str, tuple[float, float]] = {}  # peer: last new budget, next gap
        self._provided_at: float | None = None

    # ---- status -----------------------------------------------------------------------

    def status(self) -> RelayStatus:
        now = self.clock()
        counts = {
            **{
                f"reservations {k}": v
                for k, v in self.metrics.by_label("relay_reservations", "outcome").items()
            },
            **{
                f"circuits {k}": v
                for k, v in self.metrics.by_label("relay_circuits", "outcome").items()
            },
            "relayed_bytes": self.metrics.get("relay_bytes"),
        }
        proto = self.protocol
        held_for_others = proto.reservations_held() if proto and self.serving else 0
        return RelayStatus(
            serving=self.serving,
            limits={
                "max_reservations": self.limits.max_reservations,
                "reservation_ttl_s": self.limits.reservation_ttl,
                "circuits_per_reservation": self.limits.max_circuit_conns,
                "circuits_per_peer": self.cfg.relay.circuits_per_peer,
                "circuit_bytes": self.limits.data,
                "circuit_seconds": self.limits.duration,
            },
            reservations_held_for_others=held_for_others,
            circuits_open=sum(proto.open_from.values()) if proto else 0,
            counts=counts,
            reservations={p: round(exp - now, 1) for p, (exp, _a) in self.held.items()},
            circuit_addrs=list(self.network.circuit_addrs),
            direct_upgrades=self.metrics.get("hole_punch_attempts", outcome="direct"),
            punches_failed=self.metrics.get("hole_punch_attempts", outcome="failed"),
            punch_seconds=list(self.dcutr.seconds) if self.dcutr else [],
            relayed_peers=sorted(
                p for p in self.network.connected_peers() if self.network.relayed(p)
            ),
        )

    async def direct_path(self, peer: str, limit: float = DIRECT_WAIT) -> bool:
        """Wait up to ``limit`` s for a direct connection to ``peer`` while only a relay
        joins us and a hole punch is under way or still to be tried; True if direct."""
        with trio.move_on_after(limit):
            while self.network.relayed(peer) and self._punch_pending(peer):  # noqa: ASYNC110 (polls the swarm)
                await trio.sleep(0.2)
        return not self.network.relayed(peer)

    def _punch_pending(self, peer: str) -> bool:
        """A hole punch to ``peer`` is running, or may still run: DCUtR tries each relayed
        peer a few times, so only within ``PUNCH_WINDOW`` of first meeting it relayed."""
        if self.dcutr is None:
            return False
        now = trio.current_time()
        since = self._relayed_since.setdefault(peer, now)
        if len(self._relayed_since) > 4096:  # peers met relayed long ago
            self._relayed_since = {
                p: t for p, t in self._relayed_since.items() if now - t < PUNCH_WINDOW
            }
        running, tries_left = self.dcutr.punching(ID.from_base58(peer))
        return running or (tries_left and now - since < PUNCH_WINDOW)

    # ---- running ----------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        host = self.network.host
        assert host is not None, "relays need a running host"
        self.protocol = CountingRelay(
            host, self.limits, self.serving, self.cfg.relay.circuits_per_peer, self.metrics
        )
        # no CLIENT role: with it the library reserves on a relay before every dial through
        # it; we reserve only when private (``_keep_reservations``)
        roles = RelayRole.STOP | (RelayRole.HOP if self.serving else RelayRole(0))
        self.transport = CircuitV2Transport(
            host, self.protocol, RelayConfig(roles=roles, limits=self.limits)
        )
        self.dcutr = CountingDCUtR(host, self.metrics)
        self.network.circuit_dialer = self._dial_circuit
        try:
            async with (
                background_trio_service(self.protocol),
                background_trio_service(self.dcutr),
            ):
                task_status.started()
                while True:
                    try:
                        await self._tend()
                    except Exception as exc:  # one round's failure must not end the service
                        log.warning("relay upkeep failed: %r", exc)
                    await trio.sleep(TEND)
        finally:
            self.network.circuit_dialer = None

    async def _tend(self) -> None:
        self._punch_again()
        state = self.reachability.state()
        if self.serving and state == PUBLIC:
            await self._provide()
        if state == PRIVATE:
            await self._keep_reservations()
        elif self.held and state == PUBLIC:  # reachable: nobody needs a circuit to us
            self._drop(list(self.held))
        elif self.held:  # unknown again: keep what we hold alive, reserve nothing new
            await self._keep_reservations(new=False)

    def _punch_again(self) -> None:
        """Peers still joined only by a relay after their hole punches get a new budget,
        ``PUNCH_RETRY`` s later, then twice as long each time up to ``PUNCH_RETRY_MAX``: a
        punch mistimed on a busy machine may well succeed later, one behind a NAT that maps
        ports at random never will."""
        if self.dcutr is None:
            return
        now = trio.current_time()
        for peer in self.network.connected_peers():
            if not self.network.relayed(peer):
                self._retried.pop(peer, None)  # direct (or gone): met relayed again, anew
                self._relayed_since.pop(peer, None)
                continue
            at, gap = self._retried.setdefault(peer, (now, PUNCH_RETRY))  # first met relayed
            if now - at < gap:
                continue
            if self.dcutr.try_again(ID.from_base58(peer)):
                self._retried[peer] = (now, min(2 * gap, PUNCH_RETRY_MAX))
                log.info("hole punching %s again", peer[-8:])
        if len(self._retried) > 4096:
            self._retried = {p: v for p, v in self._retried.items() if now - v[0] < v[1]}

    async def _provide(self) -> None:
        now = self.clock()
        if self._provided_at is not None and now - self._provided_at < PROVIDE_AGAIN:
            return
        with trio.move_on_after(PROVIDE_LIMIT):
            if await self.network.provide(ids.relay_key(self.cfg.run.id)):
                self._provided_at = now
                log.info("providing relay service (DHT)")

    async def _keep_reservations(self, new: bool = True) -> None:
        """Drop reservations whose relay connection went, renew those close to expiry,
        and (``new``) reserve on new relays while we hold fewer than ``RESERVE_ON``."""
        now = self.clock()
        connected = self.network.connected_peers()
        self._drop([p for p, (exp, _a) in self.held.items() if p not in connected or exp <= now])
        for relay, (exp, addr) in list(self.held.items()):
            if exp - now <= RENEW_BEFORE and not await self._reserve(relay, addr):
                self._drop([relay])
        if not new or len(self.held) >= RESERVE_ON or now - self._last_find < FIND_AGAIN:
            return
        self._last_find = now
        relays: set[str] = set()
        with trio.move_on_after(self.cfg.net.read_timeout * 2):
            relays = await self.network.find_providers(ids.relay_key(self.cfg.run.id))
        for relay in sorted(relays - set(self.held)):
            if len(self.held) >= RESERVE_ON:
                break
            direct = self.network.direct_addr(relay)
            if direct is not None:
                await self._reserve(relay, direct)

    async def _reserve(self, relay: str, addr: str) -> bool:
        """Reserve (or renew) on ``relay``, reached at ``addr``; True if it accepted."""
        host, transport = self.network.host, self.transport
        assert host is not None and transport is not None
        expires: float | None = None
        with trio.move_on_after(RESERVE_TIMEOUT):
            try:
                expires = await reserve(host, transport, ID.from_base58(relay))
            except Exception as exc:  # the relay left, or does not relay
                log.debug("reservation on %s failed: %r", relay[-8:], exc)
        if expires is None:
            return False
        first = relay not in self.held
        self.held[relay] = (expires, addr)
        if first:
            log.info("reservation on relay %s (%s)", relay[-8:], addr)
            self._advertise()
        return True

    def _drop(self, relays: list[str]) -> None:
        for relay in relays:
            if self.held.pop(relay, None) is not None:
                log.info("reservation on relay %s dropped", relay[-8:])
        if relays:
            self._advertise()

    def _advertise(self) -> None:
        """Our circuit addresses (one per relay) to every place our addresses go."""
        own = self.network.identity.peer_id
        self.network.set_circuit_addrs(
            [f"{addr}/p2p/{relay}/p2p-circuit" for relay, (_e, addr) in sorted(self.held.items())]
        )
        self.pin(set(self.held))
        log.debug("advertising %s for %s", self.network.circuit_addrs, own[-8:])

    async def _dial_circuit(self, circuit: str) -> None:
        """Dial ``<relay>/p2p-circuit/p2p/<peer>``; the connection joins the swarm."""
        assert self.transport is not None
        addr = multiaddr.Multiaddr(circuit)
        relay_part, target = self.transport.parse_circuit_ma(addr)
        relay = relay_part.get_peer_id()
        host = self.network.host
        assert host is not None
        if relay is not None and str(relay) not in self.network.connected_peers():
            direct = relay_part.decapsulate(multiaddr.Multiaddr(f"/p2p/{relay}"))
            await self.network.connect(PeerInfo(ID.from_base58(str(relay)), [direct]))
        await dial_circuit(host, self.transport, addr, target)
