"""Who is in the ring for each outer step: the leader's roster, as a pure state machine.

The leader (the run's ``trainer_peer_id``) forms one roster per (outer step, attempt).
Members ask for it (``arrive``) once their inner phase is done, and again with
``attempt + 1`` when an all-reduce attempt failed. A roster is formed when every member of
the previous roster that is still alive has arrived, or when the wait runs out
(``sync_timeout`` for a new step: a member that died during its inner steps is evicted;
``resync_timeout`` for a retry: a member that died during the all-reduce is evicted), both
counted from the leader's own arrival. Peers
that arrive for a step without being members are *joiners*: admitted at that boundary
(after the known members, in order of arrival). The first roster waits (without a deadline) for ``min_members``.
No roster is formed without the leader, and each arrival names the hash of the outer
parameters it starts the step from: only peers whose hash is the leader's are put in the
roster (the others are refused as ``diverged``). So a member that missed a step's result
(it failed an attempt that others completed) can never rejoin with different parameters.

A peer that arrives after its (step, attempt) roster was formed without it, for an older
step, or with another parameter layout is refused (``Refused``): it is no longer in sync
with the group and must recover its state before it may join again. ``leave`` is immediate.
Times are passed in; nothing here reads a clock or a socket.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

Key = tuple[int, int]  # (outer step, attempt)


class Refused(Exception):
    """The peer may not take part in this (step, attempt)."""


@dataclass
class Membership:
    leader: str
    min_members: int = 1
    sync_timeout: float = 600.0
    resync_timeout: float = 30.0
    admit: frozenset[str] | None = None  # None: any trainer of the run may join
    members: list[str] = field(default_factory=list)  # the last roster formed
    layout: str = ""
    current: Key = (-1, 0)
    rosters: dict[Key, list[str]] = field(default_factory=dict)
    arrived: dict[str, tuple[float, str]] = field(default_factory=dict)  # of ``current``
    evicted: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)

    def arrive(
        self, peer: str, key: Key, now: float, alive: set[str], layout: str = "", state: str = ""
    ) -> list[str] | None:
        """``peer`` is ready for ``key``: the roster if it is formed (``None``: ask again)."""
        if self.admit is not None and peer != self.leader and peer not in self.admit:
            self._refuse("not_admitted")
        if key < self.current:  # the group has moved on to a later step or attempt
            self._refuse("stale")
        if key in self.rosters:
            roster = self.rosters[key]
            if peer not in roster:
                self._refuse("diverged" if peer in self.arrived else "late")
            return roster
        if layout and self.layout and layout != self.layout:
            self._refuse("layout")
        if key > self.current:
            self.current, self.arrived = key, {}
        self.arrived.setdefault(peer, (now, state))
        if layout and not self.layout:
            self.layout = layout
        return self._form(now, alive)

    def poll(self, now: float, alive: set[str]) -> list[str] | None:
        """Form the current roster if its wait is over (the leader calls this as time passes)."""
        return None if self.current in self.rosters or not self.arrived else self._form(now, alive)

    def leave(self, peer: str) -> None:
        """A graceful leave: out of the group at once (and of the attempt being formed)."""
        self.members = [m for m in self.members if m != peer]
        self.arrived.pop(peer, None)

    def _form(self, now: float, alive: set[str]) -> list[str] | None:
        step, attempt = self.current
        if self.leader not in self.arrived:
            return None
        waited = now - self.arrived[self.leader][0]  # from when the leader is ready
        expected = [m for m in self.members if m in alive or m == self.leader]
        if not self.rosters:  # the very first roster: wait (for ever) for enough members
            if len(self.arrived) < self.min_members:
                return None
        elif not all(m in self.arrived for m in expected):
            limit = self.sync_timeout if attempt == 0 else self.resync_timeout
            if waited < limit:
                return None
        state = self.arrived[self.leader][1]
        agree = {p: t for p, (t, s) in self.arrived.items() if s == state}
        known = [m for m in self.members if m in agree]
        joiners = sorted((t, p) for p, t in agree.items() if p not in self.members)
        roster = known + [p for _, p in joiners]
        if self.leader in roster:  # the leader first: it publishes the result
            roster.remove(self.leader)
            roster.insert(0, self.leader)
        for m in self.members:
            if m not in agree:
                self.evicted[m] += 1
        self.members = roster
        self.rosters[self.current] = roster
        for old in [k for k in self.rosters if k[0] < step - 1]:
            del self.rosters[old]
        return roster

    def _refuse(self, why: str) -> None:
        self.refused[why] += 1
        raise Refused(why)
