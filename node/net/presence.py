"""Presence: who of this run is up, with which role, where.

A signed heartbeat (``NodeInfo``) goes out on gossip every ``heartbeat_period()``: longer
as the network grows, so that a node receives about ``presence_rate`` heartbeats a second
whatever the network's size. The same message answers a direct presence request
(``/intellect/presence``, the greeting). What we hear goes into the ``PeerTable``; a peer
silent for the TTL is asked directly first (a busy node is not dead, and gossip may miss),
forgotten only if it does not answer. On shutdown a ``leaving`` notice goes out on gossip
and directly to every connected peer, who drop us at once.
Each heartbeat also counts what its sender has announced: ``on_heard`` passes that on
(to the announcements service, which fetches what gossip did not bring).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from crypto.identity import Identity
from node.config import NodeConfig
from node.net.gossip import drain, subscribe, topic_validator
from node.net.network import Network
from node.net.peers import PeerTable
from node.net.requests import Requests, Responder
from protocol import ids
from protocol.errors import WireError
from protocol.messages import NodeInfo
from protocol.wire import open_message, seal

log = logging.getLogger("intellect.node")
MAX_PROBES = 4  # silent peers asked directly at once (a probe may dial)


@dataclass(frozen=True)
class PresenceStatus:
    heartbeat_s: float
    peer_ttl_s: float
    expired: int


@dataclass(frozen=True)
class PeerRow:
    """One known peer as ``/status`` lists it."""

    peer_id: str
    role: str
    addrs: list[str]
    last_seen_s: float
    connected: bool
    in_use: bool


class Presence:
    """Heartbeats, greetings, liveness probes and leaving, over ``peers``."""

    def __init__(
        self,
        cfg: NodeConfig,
        identity: Identity,
        network: Network,
        requests: Requests,
        peers: PeerTable,
        announced: Callable[[], tuple[int, int]],
        on_heard: Callable[[NodeInfo, str], None],
    ) -> None:
        """``announced()`` is our (session, count) of announcements for the heartbeat;
        ``on_heard(info, via)`` is called for every heartbeat of an up peer."""
        self.cfg, self.identity, self.network, self.requests = cfg, identity, network, requests
        self.peers, self._announced, self._on_heard = peers, announced, on_heard
        self.leaving = False  # from the moment a stop was requested
        self._probing: set[str] = set()
        self._rng = random.Random()
        self._nursery: trio.Nursery | None = None
        self._heartbeats = trio.CancelScope()

    def node_info(self) -> NodeInfo:
        """Who we are; ``leaving`` from the moment a stop was requested."""
        session, count = self._announced()
        return NodeInfo(
            **self.requests.header(),
            role=self.cfg.role,
            state="leaving" if self.leaving else "up",
            addrs=self.network.addrs[:8],
            session=session,
            announced=count,
        )

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Answer greetings, take heartbeats from gossip, beat, and expire silent peers."""
        # Presence requests of one peer answered per second and at once (SPEC §6): an
        # honest node sends one per connection (the greeting), one per silence of
        # ``peer_ttl`` (the probe, never two at once), one when leaving, and one per
        # ``intellect-node ping`` its operator types: a few a minute, rarely two at a time.
        # The defaults (20/s, 4) are twice bench/fairness.py's honest peer (one every
        # 100 ms) and a fifth of ``peer_request_rate``: presence is the cheapest request to
        # flood, and each still costs ~5 ms of py-libp2p's stream set-up and a signature.
        rate = self.cfg.net.peer_presence_rate
        self.requests.serve(
            ids.PRESENCE,
            NodeInfo,
            self._handle_presence,
            per_peer=self.cfg.net.peer_presence_streams,
            rate=(rate, rate),
        )
        assert self.network.host is not None
        own = self.network.host.get_id().to_bytes()
        validator = topic_validator(self.requests, own, "gossip-presence", self._on_gossip)
        sub = await subscribe(self.network, ids.presence_topic(self.cfg.run.id), validator)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(drain, sub)
            nursery.start_soon(self._heartbeat_loop)
            nursery.start_soon(self._expiry_loop)
            task_status.started()

    def stop_heartbeats(self) -> None:
        """No "up" may follow our "leaving"."""
        self.leaving = True
        self._heartbeats.cancel()

    async def greet(self, peer: str) -> NodeInfo:
        """Presence exchange with a connected (or dialable) peer; records it."""
        reply: NodeInfo = await self.requests.request(
            peer, ids.PRESENCE, self.node_info(), NodeInfo
        )
        self.heard(reply)
        if reply.state == "up":
            await self.network.add_to_dht(peer)
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
        except Exception as exc:  # a dial's failure: its message, on one line
            return {
                "ok": False,
                "error": " ".join(str(exc).split()) or type(exc).__name__,
                "elapsed_ms": _ms_since(started),
            }
        return {"ok": True, "role": reply.role, "rtt_ms": _ms_since(started)}

    def heard(self, msg: NodeInfo, via: str = "direct") -> None:
        """A heartbeat, greeting or leaving notice from ``msg.sender``."""
        if msg.sender == self.identity.peer_id:
            return
        if msg.state == "leaving":
            if self.peers.leave(msg.sender, msg.seq):
                log.info("peer left peer=%s role=%s", msg.sender[-8:], msg.role)
            return
        if self.peers.left_after(msg.sender, msg.seq):
            return  # a heartbeat sent before its leave notice, arriving late
        if self.peers.seen(msg.sender, msg.role, msg.addrs, time.monotonic(), msg.seq):
            log.info("peer joined peer=%s role=%s", msg.sender[-8:], msg.role)
        self._on_heard(msg, via)

    def heartbeat_period(self) -> float:
        """Seconds between our heartbeats: ``heartbeat_interval``, or longer in a network
        whose heartbeats would otherwise exceed ``presence_rate`` a second in all."""
        known = len(self.peers.peers) + 1
        return max(self.cfg.net.heartbeat_interval, known / self.cfg.net.presence_rate)

    def peer_ttl(self) -> float:
        """Silence after which a peer is in doubt: ``peer_ttl``, scaled with the period."""
        return self.cfg.net.peer_ttl * self.heartbeat_period() / self.cfg.net.heartbeat_interval

    def status(self) -> PresenceStatus:
        return PresenceStatus(
            heartbeat_s=round(self.heartbeat_period(), 3),
            peer_ttl_s=round(self.peers.ttl, 3),
            expired=self.requests.metrics.get("peers_expired"),
        )

    def rows(self, connected: set[str], in_use: set[str], listed: int) -> list[PeerRow]:
        """The known peers, sorted by role; in a network of more than ``listed``, only
        those we are connected to or use."""
        now = time.monotonic()
        records = sorted(self.peers.peers.values(), key=lambda r: (r.role, r.peer_id))
        if len(records) > listed:
            records = [r for r in records if r.peer_id in in_use or r.peer_id in connected]
        return [
            PeerRow(
                peer_id=r.peer_id,
                role=r.role,
                addrs=r.addrs,
                last_seen_s=round(now - r.last_seen, 3),
                connected=r.peer_id in connected,
                in_use=r.peer_id in in_use,
            )
            for r in records
        ]

    async def leave(self) -> None:
        """Tell gossip and every connected peer that we are leaving, within a short deadline
        (peers we are not connected to hear it through gossip, or forget us after the TTL)."""
        known = sorted(self.network.connected_peers())
        with trio.move_on_after(min(3.0, self.cfg.net.read_timeout)):
            try:
                await self._publish()
            except Exception as exc:  # shutting down: report, never block the exit
                log.debug("leave gossip failed: %s", exc)
            async with trio.open_nursery() as nursery:
                for peer in known:
                    nursery.start_soon(self._send_leave, peer)
        log.info("left the network notified=%d", len(known))

    async def _send_leave(self, peer: str) -> None:
        try:
            await self.requests.request(peer, ids.PRESENCE, self.node_info(), NodeInfo)
        except Exception as exc:
            log.debug("leave notice to %s failed: %s", peer[-8:], exc)

    async def _handle_presence(self, msg: NodeInfo, r: Responder) -> None:
        self.heard(msg)
        await r.send(self.node_info())
        if msg.state == "up":  # a peer of our run: a DHT peer too (a bootstrap has no other)
            await self.network.add_to_dht(r.peer)

    def _on_gossip(self, data: bytes) -> None:
        msg = open_message(data, NodeInfo)
        if msg.sender == self.identity.peer_id:
            return
        self.requests.admit(msg)
        self.heard(msg, via="gossip")

    async def _publish(self) -> None:
        data = seal(self.identity, self.node_info())
        self.requests.count_out("gossip-presence", data)
        await self.network.publish(ids.presence_topic(self.cfg.run.id), data)

    async def _heartbeat_loop(self) -> None:
        with self._heartbeats:
            while True:
                try:
                    await self._publish()
                except Exception as exc:
                    log.warning("heartbeat publish failed: %s", exc)
                # jitter: nodes started together must not beat in step
                await trio.sleep(self.heartbeat_period() * self._rng.uniform(0.9, 1.1))

    async def _expiry_loop(self) -> None:
        while True:
            await trio.sleep(min(1.0, self.cfg.net.peer_ttl / 4))
            self.peers.ttl = self.peer_ttl()
            connected = self.network.connected_peers()
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
        metrics = self.requests.metrics
        try:
            with trio.fail_after(self.cfg.net.connect_timeout + self.cfg.net.read_timeout):
                await self.greet(peer)
            metrics.inc("liveness_probes", outcome="alive")
        except Exception as exc:
            metrics.inc("liveness_probes", outcome="dead")
            log.debug("probe of silent peer %s failed: %s", peer[-8:], exc)
            if self.peers.silent(time.monotonic()).count(peer) and self.peers.forget(peer):
                metrics.inc("peers_expired")
                log.info(
                    "peer expired peer=%s (silent and not answering for more than %.1f s)",
                    peer[-8:],
                    self.peers.ttl,
                )
        finally:
            self._probing.discard(peer)


def _ms_since(started: float) -> float:
    return round((trio.current_time() - started) * 1000, 2)
