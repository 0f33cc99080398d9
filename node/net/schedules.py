"""When a node looks peers up in the DHT, and when it provides its role key again.

Two pure schedules, driven by the runtime with the current time; no clock, no sockets.

``LookupSchedule``: a node looks up the role keys it needs (``NEEDS``) at ``base``
seconds after it starts, then backs off by doubling the interval after every round, up
to ``longest`` once every needed role has a live peer in its table, and up to
``longest_missing`` while some needed role is still missing (a run may simply have no
validator yet: asking every ``base`` seconds forever would cost every node a lookup per
role per interval for nothing); a node that knows no peer at all does not back off. When a
needed role that was present disappears from the
table, the interval falls back to ``base`` and the next lookup is due at once. Gossip
presence, not the DHT, keeps a node's table current; lookups are how it first finds the
network and how it finds a role again.

``ProvideSchedule``: a provider record lives on the ``k`` peers closest to the key. It
needs refreshing when the DHT's republish interval has passed, or when the routing table
has at least doubled since the last provide and holds ``k`` peers or more (peers closer to
the key may have joined who do not hold it yet; in a table smaller than ``k`` the walk of
the first provide already asked the network, not the table, for the closest peers, and
a node whose table grows 1, 2, 4, 8, 16 would otherwise walk and dial five times while it
joins). A provide that reached nobody (or ran out of time) is retried after
``retry`` seconds, then after twice that for each further failure in a row, up to the
republish interval: every provide is a Kademlia walk that dials the peers closest to the
key, and on a loaded machine a walk that keeps timing out must not keep dialing every
``retry`` seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# the roles whose peers a node of each role works with
NEEDS: dict[str, frozenset[str]] = {
    "bootstrap": frozenset(),
    "inference": frozenset({"trainer", "validator"}),
    "validator": frozenset({"trainer", "inference"}),
    "trainer": frozenset({"inference", "validator"}),
}


@dataclass
class LookupSchedule:
    needed: frozenset[str]
    base: float  # the first interval, and again after a needed role disappeared
    longest: float  # the longest interval while every needed role is present
    longest_missing: float  # the longest interval while some needed role is missing
    interval: float = 0.0  # the interval used after the last round (0: no round yet)
    due: float = 0.0  # when the next round is due
    present: frozenset[str] = field(default_factory=frozenset)  # needed roles seen last

    def __post_init__(self) -> None:
        if not 0 < self.base <= min(self.longest, self.longest_missing):
            raise ValueError("need 0 < base <= longest, longest_missing")

    def start(self, now: float) -> None:
        """The node starts: the first round is due ``base`` seconds from now (the runtime
        has just dialed its bootstrap peers)."""
        self.due = now + self.base

    def is_due(self, now: float) -> bool:
        return now >= self.due

    def looked_up(self, now: float, roles: set[str] | frozenset[str]) -> float:
        """A round finished with ``roles`` (roles with a live peer) known; returns the
        delay until the next round."""
        self.present = frozenset(roles) & self.needed
        cap = self.longest if self.present == self.needed else self.longest_missing
        if not roles:  # knows no peer at all (its bootstrap greeting failed): no back-off
            cap = self.base
        self.interval = self.base if self.interval == 0 else min(cap, self.interval * 2)
        self.due = now + self.interval
        return self.interval

    def observe(self, now: float, roles: set[str] | frozenset[str]) -> bool:
        """The table now has live peers of ``roles``. If a needed role known before is
        gone, back off no longer: the next round is due now. True if so."""
        now_present = frozenset(roles) & self.needed
        lost = self.present - now_present
        self.present = now_present
        if lost:
            self.interval = 0.0
            self.due = now
            return True
        return False


@dataclass
class ProvideSchedule:
    republish: float  # the DHT's provider-record republish interval
    retry: float  # seconds before a provide that reached nobody is first tried again
    last_ok: float | None = None
    table_at_last: int = 0
    retry_at: float = 0.0
    failures: int = 0  # provides in a row that reached nobody
    k: int = 20  # the DHT's bucket size: peers a provider record is stored on

    def is_due(self, now: float, table_size: int) -> bool:
        if table_size == 0 or now < self.retry_at:
            return False  # nobody to store it (or too soon after a failure)
        if self.last_ok is None:
            return True
        if table_size >= max(2 * self.table_at_last, self.k):
            return True
        return now - self.last_ok >= self.republish

    def provided(self, now: float, table_size: int, ok: bool) -> None:
        if ok:
            self.last_ok, self.table_at_last, self.failures = now, table_size, 0
        else:
            self.retry_at = now + min(self.republish, self.retry * 2**self.failures)
            self.failures += 1
