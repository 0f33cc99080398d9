"""How many connections a node keeps, which ones it closes and which peers it dials.

A pure state machine (no sockets, no clock): every tick the runtime tells it which peers
are connected now (with their roles, where known) and acts on what it answers.

- Watermarks: above ``high`` settled connections, close the surplus down to halfway
  between ``low`` and ``high`` (down to ``low`` would leave room that the peers cut off rush
  to fill, round after round); below ``low``, dial known peers up to ``low``.
- Grace: a connection younger than ``grace`` seconds is neither closed nor counted against
  ``high`` (a greeting may be running on it; a DHT query opens links to peers close to a
  key for one round and the runtime closes them after it, as ``transient``).
- Pinned peers (the relays a node behind NAT holds reservations on) are never closed.
- Peers in use: for every role, up to ``keep_per_role`` connected peers of that role are
  protected from closing; the choice is sticky (a peer stays in use while it is
  connected), so the gossip mesh over these links stays stable.
- What is closed first: peers of unknown role, then peers of the role with the most
  connections, newest connection first (long-lived links carry the mesh).
- A peer that dropped our connection (it trimmed us, or died) and a peer we trimmed are
  not dialed again for ``cooldown`` seconds: two nodes must not fight over a link.
- Links in use for data (``LinkUse``: a shard, a rollout batch or a DiLoCo exchange open on
  them, or ended less than ``IN_USE_S`` ago) are neither counted against ``high`` nor
  closed: closing one cut the transfer under way. In a 31-node SHARDCAST swarm (12
  connections at most, holdings asked of 16 peers) 419 shard fetches of 1,379 were cut that
  way, and the dialling and greeting held both cores. So does a holdings query for a given
  version, at the asking end (a download's refresh: without it the queried links churned
  and the origin sent 2.1 copies, not 1.5); a poll for a peer's newest does not (every
  node polls its peers: a bootstrap polled by eleven nodes kept every link).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

MAX_COOLDOWNS = 4096
IN_USE_S = 10.0  # a link whose last data exchange ended this recently is still in use


@dataclass
class LinkUse:
    """Which peers' links carry data now or lately (the module docstring)."""

    open: Counter[str] = field(default_factory=Counter)  # data exchanges open, per peer
    ended: dict[str, float] = field(default_factory=dict)  # peer -> its last one's end

    def began(self, peer: str) -> None:
        self.open[peer] += 1

    def finished(self, peer: str, now: float) -> None:
        self.open[peer] -= 1
        if self.open[peer] <= 0:
            del self.open[peer]
        self.ended[peer] = now

    def peers(self, now: float) -> set[str]:
        """Peers with a data exchange open, or one that ended less than IN_USE_S ago."""
        self.ended = {p: t for p, t in self.ended.items() if now - t < IN_USE_S}
        return set(self.open) | set(self.ended)


@dataclass
class ConnectionPlan:
    low: int
    high: int
    grace: float = 3.0
    cooldown: float = 60.0
    keep_per_role: int = 2
    since: dict[str, float] = field(default_factory=dict)  # connected peer -> since when
    roles: dict[str, str | None] = field(default_factory=dict)  # connected peer -> role
    in_use: dict[str, list[str]] = field(default_factory=dict)  # role -> protected peers
    cooling: dict[str, float] = field(default_factory=dict)  # peer -> not dialed before
    pinned: set[str] = field(default_factory=set)  # never closed (relays we reserve on)
    _closing: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        if not 0 <= self.low <= self.high or self.high < 1:
            raise ValueError("need 0 <= low <= high and high >= 1")

    def update(self, now: float, connected: dict[str, str | None]) -> list[str]:
        """The peers connected now, with their roles (None: not known); returns the peers
        that dropped since the last update without us closing them."""
        dropped = [p for p in self.since if p not in connected and p not in self._closing]
        for peer in dropped:
            self._cool(peer, now)
        self._closing &= set(connected)
        for peer in [p for p in self.since if p not in connected]:
            del self.since[peer]
        for peer in connected:
            self.since.setdefault(peer, now)
        self.roles = dict(connected)
        self.cooling = {p: t for p, t in self.cooling.items() if t > now}
        self._choose_in_use()
        return dropped

    def _choose_in_use(self) -> None:
        by_role: dict[str, list[str]] = {}
        for peer in sorted(self.since, key=lambda p: (self.since[p], p)):
            role = self.roles.get(peer)
            if role is not None:
                by_role.setdefault(role, []).append(peer)
        chosen: dict[str, list[str]] = {}
        for role, peers in by_role.items():
            keep = [p for p in self.in_use.get(role, []) if p in self.since]
            keep += [p for p in peers if p not in keep][: self.keep_per_role - len(keep)]
            chosen[role] = keep[: self.keep_per_role]
        self.in_use = chosen

    def settled(self, now: float, in_use: set[str] | frozenset[str] = frozenset()) -> int:
        """Connections older than ``grace``, not being closed and not carrying data
        (``in_use``): what ``high`` bounds."""
        return sum(
            1
            for p, since in self.since.items()
            if now - since >= self.grace and p not in self._closing and p not in in_use
        )

    def protected(self) -> set[str]:
        return {p for peers in self.in_use.values() for p in peers} | self.pinned

    def pin(self, peers: set[str]) -> None:
        """Keep the connections to ``peers`` whatever the watermarks say (replaces the
        previous set)."""
        self.pinned = set(peers)

    def to_close(
        self,
        now: float,
        transient: set[str] | frozenset[str] = frozenset(),
        in_use: set[str] | frozenset[str] = frozenset(),
    ) -> list[str]:
        """Connections to close now (their peers cool down: not dialed again soon).
        ``transient``: links opened for one errand only (a DHT query), closable at once;
        ``in_use``: links carrying data (``LinkUse``), neither counted nor closed."""
        # a link younger than grace does not count yet: a DHT query's links live for one
        # round, and must not make a node at its high watermark cut a settled one
        settled = [
            p
            for p in self.since
            if now - self.since[p] >= self.grace and p not in self._closing and p not in in_use
        ]
        if len(settled) + len(transient & set(self.since)) <= self.high:
            return []
        keep = self.protected()
        per_role = Counter(self.roles.get(p) for p in self.since)
        candidates = [
            p
            for p in self.since
            if p not in keep
            and p not in in_use
            and p not in self._closing
            and (p in transient or now - self.since[p] >= self.grace)
        ]
        candidates.sort(
            key=lambda p: (
                p not in transient,
                self.roles.get(p) is not None,
                -per_role[self.roles.get(p)],
                -self.since[p],
                p,
            )
        )
        out = candidates[: len(settled) + len(transient) - (self.low + self.high) // 2]
        for peer in out:
            self._closing.add(peer)
            self._cool(peer, now)
        return out

    def to_dial(self, now: float, known: dict[str, str], rng: random.Random) -> list[str]:
        """Known peers (peer -> role) to dial now: none at ``low`` connections or more;
        first one of each role we have no connection to, then any, in random order."""
        want = self.low - (len(self.since) - len(self._closing))
        if want <= 0:
            return []
        cooling = {p for p, until in self.cooling.items() if until > now}
        candidates = [p for p in known if p not in self.since and p not in cooling]
        rng.shuffle(candidates)
        connected_roles = {self.roles.get(p) for p in self.since}
        first: list[str] = []
        for peer in candidates:
            role = known[peer]
            if role not in connected_roles:
                first.append(peer)
                connected_roles.add(role)
        rest = [p for p in candidates if p not in first]
        if not first and not rest and not self.since:
            # isolated: any link is better than none, cooling or not
            rest = [p for p in known if p in cooling]
            rng.shuffle(rest)
        return (first + rest)[:want]

    def _cool(self, peer: str, now: float) -> None:
        self.cooling[peer] = now + self.cooldown
        while len(self.cooling) > MAX_COOLDOWNS:
            self.cooling.pop(next(iter(self.cooling)))
