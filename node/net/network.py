"""The running py-libp2p host, gossipsub router and Kademlia DHT of one node.

``running()`` builds them with this project's settings (``node/net/host.py``), starts them
and stops them; the methods are the few things every service asks of the libp2p layer
(dial, close, who is connected, provide and look up DHT keys). Nothing here knows what
a presence message or an announcement is.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import trio
from libp2p.abc import IHost
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.tools.anyio_service import background_trio_service

from crypto.identity import Identity
from node.config import NodeConfig
from node.net.host import (
    advertised_addrs,
    build_dht,
    build_host,
    build_pubsub,
    gate_inbound_streams,
    local_ipv4s,
    parse_addrs,
)
from protocol import ids

log = logging.getLogger("intellect.node")
REPLAY_PRESENCE = 8  # newest heartbeats (one per publisher) sent to a newly subscribed peer


class Network:
    """One node's libp2p host, gossip and DHT; ``host`` is None until ``running()``."""

    def __init__(self, cfg: NodeConfig, identity: Identity) -> None:
        self.cfg = cfg
        self.identity = identity
        self.host: IHost | None = None
        self.pubsub: Any = None
        self.dht: Any = None
        self.listen_addrs: list[str] = []  # where we listen, as peers would dial it
        self.circuit_addrs: list[str] = []  # ``<relay>/p2p-circuit``: reservations we hold
        self.addrs: list[str] = []  # what we advertise: circuit addresses first, then those
        # dials ``<relay>/p2p-circuit/p2p/<peer>`` (``Relays``, once running)
        self.circuit_dialer: Callable[[str], Awaitable[None]] | None = None
        # peer id -> None if its new inbound stream is negotiated, else seconds to hold
        # its connection's reads after resetting the stream (``Requests`` sets it)
        self.inbound_gate: Callable[[str], float | None] | None = None
        # told (peer id, detail) of a gossip RPC that could not be parsed (``Requests``)
        self.on_bad_gossip: Callable[[str, str], None] | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Network]:
        """Listen, start gossipsub (with its router: without it gossipsub's heartbeat never
        runs: no mesh upkeep, no IHAVE gossip, and a message cache that never shifts,
        replayed whole to every new peer) and the DHT; stop them all on exit."""
        host = self.host = build_host(self.identity, open_stream_s=self.cfg.net.connect_timeout)
        gate_inbound_streams(
            host, lambda peer: None if self.inbound_gate is None else self.inbound_gate(peer)
        )
        self.pubsub = build_pubsub(
            host, replay_newest={ids.presence_topic(self.cfg.run.id): REPLAY_PRESENCE}
        )
        self.pubsub.on_bad_rpc = lambda peer, detail: (
            None if self.on_bad_gossip is None else self.on_bad_gossip(peer.to_base58(), detail)
        )
        self.dht = build_dht(host)
        async with AsyncExitStack() as stack:
            listen = parse_addrs(self.cfg.net.listen)
            probe_ports(listen)
            await stack.enter_async_context(host.run(listen))
            if len(host.get_transport_addrs()) < len(self.cfg.net.listen):
                # py-libp2p logs a failed bind at debug level and runs on, deaf
                raise OSError(
                    f"cannot listen on {', '.join(self.cfg.net.listen)}: the port is taken"
                    " (another node?) or the address is not one of this machine's"
                )
            await stack.enter_async_context(background_trio_service(self.pubsub))
            await stack.enter_async_context(background_trio_service(self.pubsub.router))
            await stack.enter_async_context(background_trio_service(self.dht))
            await self.pubsub.wait_until_ready()
            self.listen_addrs = advertised_addrs(
                [str(a) for a in host.get_transport_addrs()], local_ipv4s()
            )
            self.addrs = list(self.listen_addrs)
            yield self

    def connected_peers(self) -> set[str]:
        """Peer ids we hold a connection to now."""
        if self.host is None:
            return set()
        return {pid.to_base58() for pid in self.host.get_connected_peers()}

    def set_circuit_addrs(self, circuits: list[str]) -> None:
        """Advertise ``circuits`` (``<relay>/p2p/<relay id>/p2p-circuit``) from now on: in
        ``addrs`` (presence, ``/status``) and in the host's own addresses, which identify,
        our signed peer record and our DHT provider records carry."""
        assert self.host is not None
        self.circuit_addrs = list(circuits)
        self.addrs = [*self.circuit_addrs, *self.listen_addrs]
        self.host.extra_addrs = list(circuits)  # type: ignore[attr-defined]
        forget = getattr(self.host, "forget_addrs", None)
        if forget is not None:
            forget()

    def relayed(self, peer: str) -> bool:
        """True if every connection we hold to ``peer`` goes through a relay (False if we
        hold none, or a direct one)."""
        conns = self._connections(peer)
        return bool(conns) and all(is_relayed(c) for c in conns)

    def direct_addr(self, peer: str) -> str | None:
        """The address our direct connection to ``peer`` reaches it at, if we hold one."""
        for conn in self._connections(peer):
            if not is_relayed(conn):
                for addr in _transport_addrs(conn):
                    return addr
        return None

    def _connections(self, peer: str) -> list[Any]:
        if self.host is None:
            return []
        conns = self.host.get_network().get_connections(ID.from_base58(peer))
        return list(conns or [])

    async def connect(self, info: PeerInfo) -> None:
        """Dial ``info`` within ``connect_timeout`` (``trio.TooSlowError`` past it). A peer
        that advertises circuit addresses is behind NAT: it is dialed through its relays
        first, then at its other addresses, each try within ``connect_timeout`` (so a call
        may take that long once per relay, and once more)."""
        assert self.host is not None
        peer = info.peer_id.to_base58()
        circuits = [str(a) for a in info.addrs if "/p2p-circuit" in str(a)]
        if circuits and self.circuit_dialer is not None and peer not in self.connected_peers():
            suffix = f"/p2p/{peer}"
            for circuit in circuits:
                base = circuit[: -len(suffix)] if circuit.endswith(suffix) else circuit
                try:
                    with trio.fail_after(self.cfg.net.connect_timeout):
                        await self.circuit_dialer(base + suffix)
                    return
                except Exception as exc:  # that relay is gone or refused: the next
                    log.debug("dialing %s through %s failed: %r", peer[-8:], base, exc)
            info = PeerInfo(info.peer_id, [a for a in info.addrs if "/p2p-circuit" not in str(a)])
        with trio.fail_after(self.cfg.net.connect_timeout):
            await self.host.connect(info)

    async def disconnect(self, peer: str) -> None:
        """Close our connection to ``peer`` (within ``connect_timeout``; failures logged)."""
        assert self.host is not None
        with trio.move_on_after(self.cfg.net.connect_timeout):
            try:
                await self.host.disconnect(ID.from_base58(peer))
            except Exception as exc:
                log.debug("closing the connection to %s failed: %s", peer[-8:], exc)

    async def add_to_dht(self, peer: str) -> None:
        """Put ``peer`` in our DHT routing table (a peer of our run)."""
        try:
            await self.dht.add_peer(ID.from_base58(peer))
        except Exception as exc:
            log.debug("dht add_peer %s failed: %s", peer[-8:], exc)

    async def provide(self, key: str) -> bool:
        """Announce in the DHT that we provide ``key``; False if no peer stored it."""
        return bool(await self.dht.provide(key))

    async def find_providers(self, key: str) -> set[str]:
        """Peers (not us) that provide ``key`` in the DHT, each dialed at its provider
        record's addresses if we hold no connection to it; those we cannot dial are left
        out."""
        own = self.identity.peer_id
        out: set[str] = set()
        connected = self.connected_peers()
        for info in await self.dht.find_providers(key):
            peer = info.peer_id.to_base58()
            if peer == own:
                continue
            if info.addrs and peer not in connected:
                try:
                    await self.connect(info)
                except Exception:
                    continue
            out.add(peer)
        return out

    async def publish(self, topic: str, data: bytes) -> None:
        await self.pubsub.publish(topic, data)


def is_relayed(conn: Any) -> bool:
    """True if ``conn`` (a swarm connection) goes through a relay."""
    return any("/p2p-circuit" in a for a in _transport_addrs(conn))


def _transport_addrs(conn: Any) -> list[str]:
    try:
        return [str(a) for a in conn.get_transport_addresses()]
    except Exception:  # a connection closing meanwhile
        return []


def probe_ports(addrs: list[Any]) -> None:
    """Bind each fixed TCP port of ``addrs`` once, plainly, and let it go: py-libp2p binds
    with SO_REUSEPORT, so a second node on a port another node holds bound too, and the
    kernel split the dials between the two (half reached the wrong peer id)."""
    import socket

    for a in addrs:
        protocols = [p.name for p in a.protocols()]
        if "tcp" not in protocols or not int(a.value_for_protocol("tcp")):
            continue
        family, host = (
            (socket.AF_INET6, a.value_for_protocol("ip6"))
            if "ip6" in protocols
            else (socket.AF_INET, a.value_for_protocol("ip4") if "ip4" in protocols else "")
        )
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, int(a.value_for_protocol("tcp"))))
            except OSError as exc:
                raise OSError(f"cannot listen on {a}: {exc.strerror or exc}") from exc
