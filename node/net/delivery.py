"""At-most-once, eventually-complete delivery of gossip announcements.

Gossip may drop a message; it must never be the only way one arrives. Each publisher
numbers its announcements 0, 1, 2, … within a session and keeps the last few thousand
signed envelopes (``Outbox``); its heartbeat says how many it has published. A receiver
(``Inbox``) records which indices it holds per publisher and, comparing with the
heartbeat, asks the publisher directly for the ones it lacks. Both are pure.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass
class Outbox:
    session: int
    capacity: int
    count: int = 0
    _items: OrderedDict[int, bytes] = field(default_factory=OrderedDict)

    def next_index(self) -> int:
        return self.count

    def add(self, index: int, envelope: bytes) -> None:
        if index != self.count:
            raise ValueError(f"announcement index {index}, expected {self.count}")
        self._items[index] = envelope
        self.count += 1
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, session: int, indices: list[int]) -> list[bytes]:
        if session != self.session:
            return []
        return [self._items[i] for i in indices if i in self._items]


@dataclass
class _Stream:
    session: int
    below: int = 0  # every index < below has been received
    above: set[int] = field(default_factory=set)  # received indices >= below


@dataclass
class Inbox:
    """What a receiver holds from each publisher; decides what to fetch."""

    horizon: int = 4096  # never ask for indices further back than this
    _streams: dict[str, _Stream] = field(default_factory=dict)

    def add(self, sender: str, session: int, index: int) -> bool:
        """Record an announcement; True if it is new (deliver it), False if already held."""
        s = self._streams.get(sender)
        if s is None or session > s.session:
            s = self._streams[sender] = _Stream(session)
        elif session < s.session:
            return False  # an old session of a restarted publisher
        if index < s.below or index in s.above:
            return False
        s.above.add(index)
        while s.below in s.above:
            s.above.remove(s.below)
            s.below += 1
        return True

    def held(self, sender: str, session: int) -> int:
        """How many announcements of ``sender``'s ``session`` we hold."""
        s = self._streams.get(sender)
        if s is None or s.session != session:
            return 0
        return s.below + len(s.above)

    def missing(self, sender: str, session: int, published: int, limit: int) -> list[int]:
        """Up to ``limit`` indices < ``published`` not yet held, oldest first."""
        s = self._streams.get(sender)
        if s is None or session > s.session:
            s = self._streams[sender] = _Stream(session)
        elif session < s.session:
            return []
        start = max(s.below, published - self.horizon)
        out = []
        for i in range(start, published):
            if i not in s.above:
                out.append(i)
                if len(out) >= limit:
                    break
        return out

    def forget(self, sender: str) -> None:
        self._streams.pop(sender, None)
