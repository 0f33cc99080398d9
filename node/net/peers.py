"""The table of known peers of this run: who, which role, where, when last heard from.

A pure state machine: the runtime feeds it what it hears (presence replies and gossip
heartbeats, leave notices) with the current time and the message's sequence number, and
asks it to expire peers that have been silent for longer than the TTL. It has no clock and
no sockets of its own.

A leave notice leaves a tombstone with its sequence number: a heartbeat the peer sent
before leaving that arrives late (gossip takes other paths than the direct notice) must
not bring it back. A message with a higher sequence number (the peer restarted) does.

The table is bounded: at most ``per_role`` records per role; a new peer of a full role
replaces the one heard from least recently. The runtime decides what to do with a peer
that fell silent (``silent``): forget it, or first ask it directly whether it is alive.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field

MAX_TOMBSTONES = 4096
PER_ROLE = 256


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
    per_role: int = PER_ROLE
    peers: dict[str, PeerRecord] = field(default_factory=dict)
    departed: OrderedDict[str, int] = field(default_factory=OrderedDict)

    def seen(self, peer_id: str, role: str, addrs: list[str], now: float, seq: int = 0) -> bool:
        """Record that ``peer_id`` is alive; True if it was not known before."""
        if peer_id == self.self_id:
            return False
        if self.left_after(peer_id, seq):
            return False
        self.departed.pop(peer_id, None)
        rec = self.peers.get(peer_id)
        if rec is None:
            same = [r for r in self.peers.values() if r.role == role]
            if len(same) >= self.per_role:
                del self.peers[min(same, key=lambda r: (r.last_seen, r.peer_id)).peer_id]
            self.peers[peer_id] = PeerRecord(peer_id, role, list(addrs), now, now)
            return True
        rec.role = role
        if addrs:
            rec.addrs = list(addrs)
        rec.last_seen = max(rec.last_seen, now)
        return False

    def left_after(self, peer_id: str, seq: int) -> bool:
        """True if ``peer_id`` sent a leave notice after the message numbered ``seq``."""
        return peer_id in self.departed and seq <= self.departed[peer_id]

    def leave(self, peer_id: str, seq: int = 0) -> bool:
        """Forget a peer that announced it is leaving; True if it was known."""
        self.departed[peer_id] = max(seq, self.departed.get(peer_id, 0))
        self.departed.move_to_end(peer_id)
        while len(self.departed) > MAX_TOMBSTONES:
            self.departed.popitem(last=False)
        return self.peers.pop(peer_id, None) is not None

    def silent(self, now: float) -> list[str]:
        """Peers not heard from for more than ``ttl`` (still in the table)."""
        return [p for p, r in self.peers.items() if now - r.last_seen > self.ttl]

    def forget(self, peer_id: str) -> bool:
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

    def roles(self) -> set[str]:
        return {r.role for r in self.peers.values()}
