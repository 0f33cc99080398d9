"""The table of known peers of this run: who, which role, where, when last heard from.

A pure state machine: the runtime feeds it what it hears (presence replies and gossip
heartbeats, leave notices) with the current time, and asks it to expire peers that have
been silent for longer than the TTL. It has no clock and no sockets of its own.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class PeerRecord:
    peer_id: str
    role: str
    addrs: list[str]
    last_seen: float
    first_seen: float


@dataclass
class PeerTable:
    self_id: str
    ttl: float
    peers: dict[str, PeerRecord] = field(default_factory=dict)

    def seen(self, peer_id: str, role: str, addrs: list[str], now: float) -> bool:
        """Record that ``peer_id`` is alive; True if it was not known before."""
        if peer_id == self.self_id:
            return False
        rec = self.peers.get(peer_id)
        if rec is None:
            self.peers[peer_id] = PeerRecord(peer_id, role, list(addrs), now, now)
            return True
        rec.role = role
        if addrs:
            rec.addrs = list(addrs)
        rec.last_seen = max(rec.last_seen, now)
        return False

    def leave(self, peer_id: str) -> bool:
        """Forget a peer that announced it is leaving; True if it was known."""
        return self.peers.pop(peer_id, None) is not None

    def expire(self, now: float) -> list[str]:
        """Forget every peer silent for more than ``ttl``; return their ids."""
        gone = [p for p, r in self.peers.items() if now - r.last_seen > self.ttl]
        for p in gone:
            del self.peers[p]
        return gone

    def __contains__(self, peer_id: object) -> bool:
        return peer_id in self.peers

    def by_role(self) -> dict[str, int]:
        return dict(Counter(r.role for r in self.peers.values()))
