"""The validator's schedule: which batch to fetch next, when to retry, when to give up;
and which verdicts to post again (``VerdictPosts``).

A batch is judged when its key was submitted on-chain (the chain is the record of work
claimed) and a peer announced that it holds it, or the worker registered the peer that must
serve it (where to fetch it). Several fetches may run at once, at most one per worker
(``next_fetch``): a worker that sends slowly holds only its own. Fetches that fail are
retried with exponential back-off (``retry_s`` doubling up to ``retry_max_s``), from any of
those peers in turn.
A submitted key is *unavailable* (the validator rejects it as such: work no validator
could see is never paid, SPEC §19) once ``fetch_deadline_s`` after its submission has
passed and ``last_tries`` fetches from each of its peers that failed at or after that
time say nobody serves it: at the deadline every key not yet fetched is asked for again at once,
then after ``retry_s``, 2 × ``retry_s``, ... (one stream refused under load is no proof).
The clock alone never makes a key unavailable: time the validator spent elsewhere (judging
a backlog, waiting for a step announcement or for weights) is not the worker's fault, and
a key it gets to only after the deadline is fetched and judged on its merits (the worker
serves it for the whole verdict window, SPEC §13). Every key is judged at most once.
A fetched batch that could not be judged now (the weights of its version are not here, or
the batch checker failed) is fetched and judged again after ``check_retry_s``, doubling,
up to ``check_tries`` times in all; then it is given up, left without a verdict (its worker
stops waiting once the verdict window passes). Only keys still to judge keep an entry:
a judged key is remembered by its key alone, so the queue's walks stay as short as the
backlog however long the run.
A verdict the chain refuses is posted again after ``retry_s``, up to ``attempts`` refusals,
unless the refusal says it stands already (``STANDS``: another validator posted the same
verdict first, and the contract takes no vote that agrees with the standing one; or this
validator voted before a restart): then it counts as posted. A refusal no later post can
change (``TOO_LATE``: final, window closed, matured) gives the post up at once.
Announcements of keys never submitted are bounded: each peer may have at most
``per_peer_unsubmitted`` of them waiting, all peers together ``max_pending``, and each
waits at most ``fetch_deadline_s`` for its submission before it is forgotten (a flood from
one peer cannot crowd out the others' work). A submitted key is always taken, however full
the queue: each costs its worker gas and collateral, and free peer ids filling the queue
with announcements once kept every real submission out (never judged: honest work unpaid,
bad work unslashed). Only the peer the worker registered on-chain can serve a batch that
passes (the server must be its signer, the signer the registered key): once the chain
names it, it is asked first; announcers after it are kept for the evidence they may serve
(a batch of the worker's signed with a key it did not register is ``invalid``), at most
``max_peers`` of them (each peer is asked three times before a key is called unavailable:
200 free ids announcing a withheld batch pushed that past the verdict window). Pure: no
clock, no sockets; the role passes ``now`` in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ledger.client import LedgerRevert
from node.roles.decisions.work import Key, Verdict

# the contract's refusals of a vote that say the verdict stands already (WorkLedger._vote)
STANDS = ("work already accepted", "work already rejected", "already voted on this work")
# and those after which no post can be taken
TOO_LATE = ("verdict is final", "verdict window closed", "work has matured")
# and those that only say the chain's clock has not got there yet: a busy development chain
# stamps each block at least a second after the last, so its clock can run a minute or more
# ahead of ours, and a verdict counted out by them before then was never posted
NOT_YET = ("fetch deadline not reached",)


def refusal(exc: Exception) -> str | None:
    """ "stands", "too late" or "not yet" for a revert that says so, else None (post it
    again; "not yet" is posted again without counting as a refusal, until it is too late)."""
    if not isinstance(exc, LedgerRevert):
        return None
    if exc.reason in NOT_YET:
        return "not yet"
    return "stands" if exc.reason in STANDS else "too late" if exc.reason in TOO_LATE else None


@dataclass
class _Entry:
    peers: list[str] = field(default_factory=list)  # who announced it, first first
    holder: str | None = None  # the peer the worker registered: asked first
    noticed_at: float | None = None
    submitted_at: float | None = None
    units: int | None = None  # on-chain
    policy_version: int | None = None  # on-chain
    attempts: int = 0
    next_try: float = 0.0
    late_failures: int = 0  # fetches that failed at or after the fetch deadline
    in_flight: bool = False
    done: bool = False  # fetched, in judgement now
    check_failures: int = 0  # judgements that could not finish (check_failed)


@dataclass
class JudgingQueue:
    fetch_deadline_s: float = 120.0
    retry_s: float = 1.0
    retry_max_s: float = 30.0
    last_tries: int = 3  # failed fetches per peer after the deadline: then unavailable
    max_pending: int = 4096  # keys announced and not (yet) submitted (floods stop here)
    per_peer_unsubmitted: int = 64  # announced by one peer and not (yet) submitted on-chain
    max_peers: int = 4  # announcers asked for a key (after its registered peer)
    check_retry_s: float = 30.0  # first wait before a batch that could not be judged is retried
    check_tries: int = 3  # judgements that could not finish: then it is given up
    entries: dict[Key, _Entry] = field(default_factory=dict)  # keys still to judge
    closed: set[Key] = field(default_factory=set)  # judged, unavailable or given up
    dropped: int = 0  # notices refused because the queue or the peer's share was full
    expired: int = 0  # announced keys never submitted within the fetch deadline
    given_up: int = 0  # batches that could not be judged check_tries times

    def waiting(self) -> int:
        """Keys tracked and not yet judged (the one in judgement now too)."""
        return len(self.entries)

    def _entry(self, key: Key, *, submitted: bool = False) -> _Entry | None:
        if key in self.closed:
            return None
        entry = self.entries.get(key)
        if entry is None:
            if not submitted and self._unsubmitted() >= self.max_pending:
                self.dropped += 1
                return None
            entry = self.entries[key] = _Entry()
        return entry

    def _unsubmitted(self) -> int:
        return sum(1 for e in self.entries.values() if e.submitted_at is None)

    def _unsubmitted_by(self, peer: str) -> int:
        return sum(
            1
            for e in self.entries.values()
            if e.submitted_at is None and not e.done and e.peers[:1] == [peer]
        )

    def _expire(self, now: float) -> None:
        for key in [
            k
            for k, e in self.entries.items()
            if e.submitted_at is None
            and e.noticed_at is not None
            and now >= e.noticed_at + self.fetch_deadline_s
        ]:
            del self.entries[key]
            self.expired += 1

    def noticed(self, key: Key, peer: str, now: float) -> None:
        """``peer`` announced that it holds the batch."""
        self._expire(now)
        if key in self.closed:
            return
        if key not in self.entries and self._unsubmitted_by(peer) >= self.per_peer_unsubmitted:
            self.dropped += 1
            return
        entry = self._entry(key)
        if entry is None or entry.done:
            return
        if entry.noticed_at is None:
            entry.noticed_at = now
        announcers = len(entry.peers) - (entry.holder is not None)
        if peer not in entry.peers and announcers < self.max_peers:
            entry.peers.append(peer)

    def submitted(
        self, key: Key, units: int, policy_version: int, now: float, holder: str | None = None
    ) -> None:
        """The key was submitted on-chain (``now``: when this validator learned of it).
        ``holder``: the peer the worker registered on-chain, asked first (a validator that
        was down when the batch was announced has no announcement to go by; the worker that
        submitted it must serve it); None when the chain could not say."""
        entry = self._entry(key, submitted=True)
        if entry is None or entry.done or entry.submitted_at is not None:
            return
        entry.submitted_at, entry.units, entry.policy_version = now, units, policy_version
        if holder is not None:  # the one that can serve it first (the module docstring)
            entry.holder = holder
            entry.peers = [holder, *(p for p in entry.peers if p != holder)][: self.max_peers + 1]

    def passed(self, key: Key) -> None:
        """The key was submitted and is not this validator's to judge now (assigned to
        others, or held as a backup: ``node/roles/io/docket.py``): its announcements are
        forgotten; a later ``submitted`` (a backup's time) takes it afresh."""
        entry = self.entries.get(key)
        if entry is not None and entry.submitted_at is None and not entry.in_flight:
            del self.entries[key]

    def next_fetch(self, now: float) -> tuple[Key, str] | None:
        """The batch to fetch now and the peer to ask (the oldest submission first), or
        None. The caller reports ``fetched`` or ``fetch_failed``. Fetches may run at once,
        at most one per worker: a worker whose batches come slowly holds one of them."""
        fetching = self._fetching_workers()
        ready = [
            (e.submitted_at, k)
            for k, e in self.entries.items()
            if not e.done
            and not e.in_flight
            and k[0] not in fetching
            and e.peers
            and e.submitted_at is not None
            and not self._gave_up(e)
            # past the deadline: the last tries, the first at once (not a judgement's retry)
            and (
                e.next_try <= now
                or (now >= self._deadline(e) and not e.late_failures and not e.check_failures)
            )
        ]
        if not ready:
            return None
        _, key = min(ready)
        entry = self.entries[key]
        entry.in_flight = True
        return key, entry.peers[entry.attempts % len(entry.peers)]

    def _fetching_workers(self) -> set[str]:
        """The workers a batch of which is being fetched now."""
        return {k[0] for k, e in self.entries.items() if e.in_flight}

    def fetch_failed(self, key: Key, now: float) -> None:
        entry = self.entries[key]
        entry.in_flight = False
        entry.attempts += 1
        if entry.submitted_at is not None and now >= self._deadline(entry):
            entry.late_failures += 1
            back_off = self.retry_s * 2 ** (entry.late_failures - 1)
        else:
            back_off = self.retry_s * 2 ** (entry.attempts - 1)
        entry.next_try = now + min(self.retry_max_s, back_off)

    def versions(self) -> set[int]:
        """The policy versions of submitted keys not judged yet: the weights to keep."""
        return {e.policy_version for e in self.entries.values() if e.policy_version is not None}

    def fetched(self, key: Key) -> None:
        """The batch arrived and goes to judgement; it is not fetched again unless the
        judgement cannot finish (``check_failed``)."""
        entry = self.entries[key]
        entry.in_flight = False
        entry.done = True

    def judged(self, key: Key) -> None:
        """A verdict on ``key`` was reached: it is never fetched nor judged again."""
        self.entries.pop(key, None)
        self.closed.add(key)

    def check_failed(self, key: Key, now: float) -> float | None:
        """The fetched batch could not be judged now: it is fetched again after a back-off;
        returns when, or None when it has failed ``check_tries`` times and is given up."""
        entry = self.entries[key]
        entry.check_failures += 1
        if entry.check_failures >= self.check_tries:
            self.judged(key)
            self.given_up += 1
            return None
        entry.done = False
        entry.next_try = now + self.check_retry_s * 2 ** (entry.check_failures - 1)
        return entry.next_try

    def _deadline(self, e: _Entry) -> float:
        assert e.submitted_at is not None
        return e.submitted_at + self.fetch_deadline_s

    def _gave_up(self, e: _Entry) -> bool:
        """The last tries of ``e`` after its deadline failed, ``last_tries`` from each peer
        in turn: nobody serves it."""
        return e.late_failures >= self.last_tries * max(1, len(e.peers))

    def unavailable(self, now: float) -> list[Key]:
        """Submitted keys past the deadline whose batch nobody serves: its last tries after
        the deadline failed, or no peer is known to ask; each is returned once (and counts
        as judged)."""
        out = []
        for key, e in self.entries.items():
            if (
                not e.done
                and not e.in_flight
                and e.submitted_at is not None
                and now >= self._deadline(e)
                and (not e.peers or self._gave_up(e))
            ):
                out.append(key)
        for key in out:
            self.judged(key)
        return out

    def wake_at(self, now: float, *, can_fetch: bool = True) -> float | None:
        """When something next becomes due (a retry or a deadline), for the role's sleep.
        A fetch that cannot start before another ends (``can_fetch`` False: every fetch
        slot taken; or its worker's batch being fetched) is not a time: the end of that
        fetch wakes the role (else it would wake at once, again and again)."""
        fetching = self._fetching_workers()
        times = []
        for key, e in self.entries.items():
            if e.done or e.in_flight or e.submitted_at is None:
                continue
            deadline = self._deadline(e)
            if self._gave_up(e):
                times.append(now)  # unavailable now
            elif not e.peers:
                times.append(deadline)
            elif not can_fetch or key[0] in fetching:
                continue
            elif e.late_failures or e.check_failures:  # the next of the last tries, a retry
                times.append(max(now, e.next_try))
            else:  # the next try, or the first of the last ones at the deadline
                times.append(max(now, min(e.next_try, deadline)))
        return min(times) if times else None


@dataclass
class _Unposted:
    verdict: Verdict
    due: float  # when to post it again
    attempts: int  # posts the chain refused so far


@dataclass
class VerdictPosts:
    """Verdicts the chain refused to take (e.g. its clock lags ours): each is posted again
    ``retry_s`` after a refusal, and given up after ``attempts`` refusals in all. Pure: the
    role posts, and passes ``now`` in."""

    attempts: int = 30
    retry_s: float = 2.0
    waiting: dict[Key, _Unposted] = field(default_factory=dict)
    given_up: int = 0

    def __len__(self) -> int:
        return len(self.waiting)

    def due(self, now: float) -> list[tuple[Key, Verdict]]:
        """The verdicts to post again now."""
        return [(k, u.verdict) for k, u in self.waiting.items() if u.due <= now]

    def refused(
        self, key: Key, verdict: Verdict, now: float, *, counted: bool = True, last: bool = False
    ) -> int:
        """The chain refused the post of ``verdict`` on ``key``; returns how many times it
        has now (at ``attempts``, or at once when ``last``, the verdict is given up).
        ``counted=False``: the chain did not answer at all (down, restarting), which is no
        refusal: posted again, never given up for it."""
        before = self.waiting[key].attempts if key in self.waiting else 0
        tries = before + 1 if counted else before
        if tries < self.attempts and not last:
            self.waiting[key] = _Unposted(verdict, now + self.retry_s, tries)
        else:
            self.waiting.pop(key, None)
            self.given_up += 1
        return tries

    def posted(self, key: Key) -> None:
        self.waiting.pop(key, None)
