"""Who is in the ring for each outer step: the leader's roster, as a pure state machine.

The leader (the run's ``trainer_peer_id``) forms one roster per (outer step, attempt).
Members ask for it (``arrive``) once their inner phase is done, and again with
``attempt + 1`` when an all-reduce attempt failed. A roster is formed when every member of
the previous roster that is still alive has arrived, or when the wait runs out
(``sync_timeout`` for a new step: a member that died during its inner steps is evicted;
``resync_timeout`` for a retry: a member that died during the all-reduce is evicted), both
counted from the leader's own arrival. Peers
that arrive for a step without being members are *joiners*: admitted at that boundary
(after the known members, in order of arrival); a joiner that announced itself (``expect``,
before it recovers the state of that step from a member) is waited for like a member, but
once every member is there, at most ``join_timeout`` (from the leader's arrival): a peer of
the run announces itself for free, and one that never came held every step the whole
``sync_timeout``. The first roster waits (without a deadline) for ``min_members``.
No roster is formed without the leader, and each arrival names the hash of the outer
parameters it starts the step from: only peers whose hash is the leader's are put in the
roster (the others are refused as ``diverged``). So a member that missed a step's result
(it failed an attempt that others completed) can never rejoin with different parameters.

Only the leader opens a (step, attempt): a peer that asks for a later one than the leader's
waits (``None``) and counts as arrived, from its first ask, once the leader opens it. If any
peer could open one, a single sync for step 2⁶³ from any peer of the run would make every
honest arrival, the leader's own included, ``stale``: the group would halt for good. Once
the leader opened a (step, attempt), an honest peer asks at most for its next attempt (after
it got its roster) or for the next step's first (after a roster of this step, or as a joiner
at ``next_step``): anything beyond is refused (``ahead``). The parameter layout is the
leader's, set by its first arrival (an early peer's layout is checked when the leader opens).

A peer that arrives after its (step, attempt) roster was formed without it, for an older
step, or with another parameter layout is refused (``Refused``): it is no longer in sync
with the group and must recover its state before it may join again. ``leave`` is immediate.
Pseudo-gradients out of range: each arrival declares the L2 norm of its pseudo-gradient; a
peer whose norm is above ``max_norm_ratio`` (10) × the lower median of the step's declared
norms is left out of the step's roster (the leader never is). The roster carries the norms,
so that every member can check what it receives against them (``ring.all_reduce``); a
member that received a chunk that does not decode or breaks them blames its left
neighbour (``blame``), which is then refused for the rest of that step. Either way the step completes
without it, and it is counted in ``rejected``; having missed the step, it must recover.
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
    join_timeout: float = 120.0  # announced joiners, once every member is there
    admit: frozenset[str] | None = None  # None: any trainer of the run may join
    members: list[str] = field(default_factory=list)  # the last roster formed
    layout: str = ""
    current: Key = (-1, 0)
    rosters: dict[Key, list[str]] = field(default_factory=dict)
    max_norm_ratio: float = 10.0  # a pseudo-gradient norm above this × the median is refused
    arrived: dict[str, tuple[float, str, float]] = field(default_factory=dict)  # t, state, norm
    norms: dict[Key, list[float]] = field(default_factory=dict)  # the roster's declared norms
    excluded: dict[int, set[str]] = field(default_factory=dict)  # step -> refused for it
    rejected: Counter[str] = field(default_factory=Counter)  # pseudo-gradients refused, by why
    joining: dict[str, int] = field(default_factory=dict)  # peer -> the step it will join at
    # peer -> (key, t, state, norm, layout): asked for a key later than the leader's
    early: dict[str, tuple[Key, float, str, float, str]] = field(default_factory=dict)
    evicted: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)

    def arrive(
        self,
        peer: str,
        key: Key,
        now: float,
        alive: set[str],
        layout: str = "",
        state: str = "",
        norm: float = 0.0,
    ) -> list[str] | None:
        """``peer`` is ready for ``key``: the roster if it is formed (``None``: ask again)."""
        if self.admit is not None and peer != self.leader and peer not in self.admit:
            self._refuse("not_admitted")
        if peer in self.excluded.get(key[0], ()):  # before "stale": the step was retried
            self._refuse("excluded")  # without it, and it should learn why
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
            if peer != self.leader:
                self._wait(peer, key, now, state, norm, layout)
                return None
            self._open(key, layout)
        self.arrived.setdefault(peer, (now, state, norm))
        return self._form(now, alive)

    def _ahead(self, key: Key) -> bool:
        """No honest peer can ask for ``key`` yet: it is beyond the next attempt of the
        current step and the first attempt of the next step (before the leader opened
        anything, a member resuming from a checkpoint may ask for any step)."""
        step, attempt = self.current
        return step >= 0 and (key > (step + 1, 0) or (key[0] == step and key[1] > attempt + 1))

    def _wait(self, peer: str, key: Key, now: float, state: str, norm: float, layout: str) -> None:
        """``peer`` asks for ``key``, later than the leader's: it waits, without moving the
        group (only the leader does), unless no honest peer could ask for ``key`` now."""
        if self._ahead(key):
            self._refuse("ahead")
        if self.early.get(peer, ((-1, 0),))[0] != key:  # its first ask for ``key`` counts
            self.early[peer] = (key, now, state, norm, layout)

    def _open(self, key: Key, layout: str) -> None:
        """The leader moves the group to ``key``: the peers that asked for it first count as
        arrived (those with another layout are refused when they ask again)."""
        self.current, self.layout = key, self.layout or layout
        self.arrived = {
            p: (t, s, n)
            for p, (k, t, s, n, lay) in self.early.items()
            if k == key and not (lay and self.layout and lay != self.layout)
        }
        self.early = {p: e for p, e in self.early.items() if e[0] > key and not self._ahead(e[0])}

    def resolve(self, key: Key) -> Key:
        """The attempt a request for ``key`` is answered with: the current attempt of the
        same step if the group abandoned ``key``'s attempt before the asker got its roster
        (it was still training, or its request was slow); ``key`` otherwise."""
        if key[0] == self.current[0] and key[1] < self.current[1]:
            return self.current
        return key

    def next_step(self) -> int:
        """The outer step a joiner recovering now would start from."""
        step = max(self.current[0], 0)
        return step + 1 if self.current in self.rosters else step

    def expect(self, peer: str, at_least: int) -> int | None:
        """A joiner will recover and come for ``next_step()`` (if that is ≥ ``at_least``):
        the step it is expected at (the roster of that step waits for it)."""
        if self.admit is not None and peer != self.leader and peer not in self.admit:
            self._refuse("not_admitted")
        step = self.next_step()
        if step < at_least:
            return None
        self.joining[peer] = step
        return step

    def blame(self, peer: str, accuser: str, step: int, attempt: int) -> None:
        """``accuser`` received from ``peer``, its left neighbour in the roster of ``step``'s
        ``attempt``, a chunk that did not decode or broke the declared norms: ``peer`` is
        refused for the rest of ``step`` (it must recover to take part again). A blame of
        anyone else (not the accuser's left neighbour in that roster, the leader, or from
        outside the roster) is ignored: a member can only have pulled from its left."""
        roster = self.rosters.get((step, attempt))
        if roster is None or accuser not in roster or peer == self.leader:
            return
        if roster[(roster.index(accuser) - 1) % len(roster)] != peer:
            return
        if peer not in self.excluded.setdefault(step, set()):
            self.excluded[step].add(peer)
            self.rejected["chunk"] += 1
            self.arrived.pop(peer, None)

    def poll(self, now: float, alive: set[str]) -> list[str] | None:
        """Form the current roster if its wait is over (the leader calls this as time passes)."""
        return None if self.current in self.rosters or not self.arrived else self._form(now, alive)

    def leave(self, peer: str) -> None:
        """A graceful leave: out of the group at once (and of the attempt being formed)."""
        self.members = [m for m in self.members if m != peer]
        self.arrived.pop(peer, None)
        self.early.pop(peer, None)

    def _form(self, now: float, alive: set[str]) -> list[str] | None:
        step, attempt = self.current
        if self.leader not in self.arrived:
            return None
        waited = now - self.arrived[self.leader][0]  # from when the leader is ready
        out = self.excluded.get(step, set())
        joiners = [p for p, s in self.joining.items() if s == step and p not in self.members]
        expected = [
            m for m in self.members + joiners if (m in alive or m == self.leader) and m not in out
        ]
        if not self.rosters:  # the very first roster: wait (for ever) for enough members
            if len(self.arrived) < self.min_members:
                return None
        elif not all(m in self.arrived for m in expected):
            limit = self.sync_timeout if attempt == 0 else self.resync_timeout
            if all(m in self.arrived for m in expected if m not in joiners):
                limit = min(limit, self.join_timeout)  # only announced joiners are missing
            if waited < limit:
                return None
        state = self.arrived[self.leader][1]
        agree = {p: t for p, (t, s, _) in self.arrived.items() if s == state and p not in out}
        self._refuse_outliers(agree, step)
        known = [m for m in self.members if m in agree]
        arrivals = sorted((t, p) for p, t in agree.items() if p not in self.members)
        roster = known + [p for _, p in arrivals]
        self.joining = {p: s for p, s in self.joining.items() if s > step}
        if self.leader in roster:  # the leader first: it publishes the result
            roster.remove(self.leader)
            roster.insert(0, self.leader)
        for m in self.members:
            if m not in agree:
                self.evicted[m] += 1
        self.members = roster
        self.rosters[self.current] = roster
        self.norms[self.current] = [self.arrived[p][2] for p in roster]
        for old in [k for k in self.rosters if k[0] < step - 1]:
            del self.rosters[old]
            self.norms.pop(old, None)
        return roster

    def _refuse_outliers(self, agree: dict[str, float], step: int) -> None:
        """Drop from ``agree`` every peer (not the leader) whose declared pseudo-gradient
        norm is above ``max_norm_ratio`` × the lower median of the non-zero declared norms
        (a member that had nothing to train on contributes a zero pseudo-gradient: it must
        not make every real one an outlier)."""
        norms = sorted(n for p in agree if (n := self.arrived[p][2]) > 0)
        if len(norms) < 2:
            return
        ref = norms[(len(norms) - 1) // 2]
        for p in list(agree):
            if p != self.leader and self.arrived[p][2] > self.max_norm_ratio * ref:
                del agree[p]
                self.excluded.setdefault(step, set()).add(p)
                self.rejected["norm"] += 1

    def _refuse(self, why: str) -> None:
        self.refused[why] += 1
        raise Refused(why)
