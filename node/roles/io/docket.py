"""What the chain gives a validator to judge: the submissions since its last read.

The validator role (``node/roles/services/validator.py``) reads its docket when the chain can have
changed (``PacedReads``, ``node/roles/io/chain.py``). ``open`` reads, once at the start, what
the validator is: its account, whether it was removed (then it judges only work submitted
up to its removal, and leaves the rest to the others: ``not_ours``), and the chain before
this start (``History``, ``node/roles/io/catchup.py``: what it voted on already, and the
trainer's clock then; a submission of then whose verdict window has closed is not handed
out: a vote on it would be refused). ``read`` returns each new submission it is to judge as a ``Case``,
with the clock it is judged against when it came before this start, and the peer its
worker registered (asked first for the batch). ``revoke_squats`` votes out the
registrations with an invalid signature among those the chain changed
(``node/roles/io/revocations.py``).

Assigned (``[validator] judge = "assigned"``, ``node/roles/decisions/assignment.py``), the
docket hands out only the submissions this validator ranks among the first quorum + 1 of;
it holds those it is a backup for until their time, and hands them out then if the chain
shows no verdict on them yet (``Backup``). It follows the validators' terms from the
contract's events, and takes the quorum and the verdict window of the parameters in force
when it reads the submission (a parameter change between a submission and its read, rare
and timelocked, moves only which validators the docket thinks judge it).
"""

from __future__ import annotations

import heapq
import logging
import time
from collections import deque
from dataclasses import dataclass, field

from ledger.records import Params
from node.roles.decisions.assignment import ValidatorTerms, duty, ranking
from node.roles.decisions.work import Submission
from node.roles.given import Started, ValidatorLedger
from node.roles.io.catchup import History, read_history
from node.roles.io.chain import ChainSetupError, Registrations, SubmissionWatcher
from node.roles.io.revocations import Revocations

log = logging.getLogger("intellect.validator")


@dataclass(frozen=True)
class Case:
    """A submission to judge: ``then`` is the trainer's clock (step, version) when it was
    submitted if that was before this start, or when the docket first read it for a backup
    handed out later (None: it is now); ``holder`` the peer its worker registered (None:
    none, or the chain could not say)."""

    sub: Submission
    then: tuple[int | None, int] | None
    holder: str | None


@dataclass(order=True)
class Backup:
    """A submission this validator takes at chain time ``due`` if no verdict stands then."""

    due: int
    case: Case = field(compare=False)


class Docket:
    """The submissions this validator is to judge, as the chain lists them (blocking)."""

    ledger = Started[ValidatorLedger](ChainSetupError, "the ledger is opened when the role starts")

    def __init__(self) -> None:
        self._ledger: ValidatorLedger | None = None  # opened when the role starts
        self.address = ""
        self.until = 0  # when this validator was removed on-chain (0: it was not)
        self.history = History(upto=-1)  # the chain before this start
        self.not_ours = 0  # submissions after the removal, left to the other validators
        self.watcher: SubmissionWatcher | None = None
        self.registrations: Registrations | None = None
        self.revocations = Revocations()
        self.assigned = False  # judges only its share (module docstring)
        self.terms = ValidatorTerms()  # followed when assigned
        self.backups: list[Backup] = []  # a heap: the earliest due first
        self.left = 0  # submissions left to the validators they were assigned to
        self.covered = 0  # backups another validator's verdict made unneeded
        self.taken = 0  # backups handed out: no verdict stood at their time
        self.closed = 0  # submissions before this start whose verdict window had closed
        self._times: dict[int, int] = {}  # block -> timestamp, of the blocks lately read
        self.unsorted: deque[Submission] = deque()  # read, not yet told ours or not
        self.passed: list[tuple[str, bytes]] = []  # keys not ours now (``take_passed``)
        self._params: Params | None = None  # the run's parameters, as of this read

    def open(self, ledger: ValidatorLedger, from_block: int, *, assigned: bool = False) -> None:
        """Who this validator is on ``ledger``, and the chain from ``from_block`` so far;
        ``assigned``: it judges only its share (the module docstring)."""
        self._ledger = ledger
        self.assigned = assigned
        self.address = ledger.address.lower()
        if not ledger.is_validator(self.address):
            self.until = ledger.validator_until(self.address)
            if not self.until:
                raise ChainSetupError(f"{self.address} is not a validator of this run's ledger")
            log.warning(
                "%s was removed as a validator: it judges only work submitted up to its "
                "removal (timestamp %d)",
                self.address,
                self.until,
            )
        self.registrations = Registrations(ledger)
        self.history = read_history(ledger, self.address, from_block)
        self.watcher = SubmissionWatcher(
            ledger,
            from_block,
            registrations=self.registrations,
            terms=self.terms if assigned else None,
        )

    def read(
        self, clock: tuple[int | None, int] | None = None
    ) -> tuple[bool, list[Case], Exception | None]:
        """(whether the chain had new submissions, the cases among them, and the error that
        cut the read short, if one did: the cases before it stand). ``clock``: the trainer's
        clock now, kept with the backups held for later."""
        assert self.watcher is not None and self.registrations is not None
        found, cases = False, []
        self._params = None  # read again, once, if a submission is to be ranked
        try:
            polled = self.watcher.poll()
            found = bool(polled)
            self.unsorted.extend(polled)
            while self.unsorted:  # one whose reads failed stays first, for the next read
                case = self._case(self.unsorted[0], clock)
                self.unsorted.popleft()
                if case is not None:
                    cases.append(case)
            self._due_backups(cases)
        except Exception as exc:  # the chain may be briefly unreachable: read again later
            return found, cases, exc
        return found, cases, None

    def _case(self, sub: Submission, clock: tuple[int | None, int] | None) -> Case | None:
        """``sub`` as a case to judge now; None when it is not (not ours, voted on before,
        or a backup held for later)."""
        assert self.registrations is not None
        if self.until and self.block_time(sub.block) > self.until:
            self.not_ours += 1  # not ours to judge: submitted after our removal
            return None
        then = None
        if self.history.covers(sub.block):  # submitted before this start
            if (sub.worker, sub.key) in self.history.voted:
                return None  # voted on before: the chain refuses a second vote
            if self._window_closed(sub):
                self.closed += 1
                return None  # closed while this validator was away: the chain refuses a vote
            then = self.history.clock_at(sub.block)  # not today's
        due = self._due(sub) if self.assigned else 0
        if due is None:
            self.left += 1
            self.passed.append((sub.worker, sub.key))
            return None
        case = Case(sub, then, registered_peer(self.registrations, sub.worker, sub.block))
        if due:
            heapq.heappush(self.backups, Backup(due, Case(sub, then or clock, case.holder)))
            self.passed.append((sub.worker, sub.key))
            return None
        return case

    def take_passed(self) -> list[tuple[str, bytes]]:
        """The keys read since the last call that are not this validator's to judge now
        (assigned to others, or backups held): their announcements can be forgotten."""
        taken, self.passed = self.passed, []
        return taken

    def _due(self, sub: Submission) -> int | None:
        """When this validator takes ``sub`` (chain time): 0 at once, None never (the
        assignment's ``duty``)."""
        t0 = self.block_time(sub.block)
        # the contract refuses a validator's vote on its own work: it is no judge of it
        validators = [v for v in self.terms.of(t0) if v != sub.worker]
        if self.address not in validators:
            if not validators:  # the terms were not read (a docket opened past them)
                log.warning("no validator terms known at %d: judging every submission", t0)
                self.assigned = False
                return 0
            return None  # not a validator of it: the contract refuses our vote
        params = self._run_params()
        rank = ranking(sub.block_hash, sub.worker, sub.key, validators).index(self.address)
        after = duty(rank, params.quorum, params.verdict_window)
        if after is None or after == 0:
            return after
        return t0 + after

    def _window_closed(self, sub: Submission) -> bool:
        """Whether ``sub``'s verdict window has closed. Its own window is that of the
        parameters it was submitted under, read (one ``submission`` call) only when the
        run's current window would have closed it: another epoch's may be longer."""
        now = self._chain_now()
        if self.block_time(sub.block) + self._run_params().verdict_window >= now:
            return False
        return self.ledger.submission(sub.worker, sub.key).verdict_until < now

    def _run_params(self) -> Params:
        """The run's parameters, read once per ``read``."""
        if self._params is None:
            self._params = self.ledger.params()
        return self._params

    def _chain_now(self) -> int:
        """The chain's clock: the confirmed head's timestamp, or this machine's clock when
        that is later (a development chain makes blocks only for transactions: idle, its
        clock stands still, and a backup waiting for a verdict nobody posts never came)."""
        assert self.watcher is not None
        return max(self.block_time(self.watcher.head), int(time.time()))

    def _due_backups(self, cases: list[Case]) -> None:
        """Add to ``cases`` the backups whose time came that the chain shows no verdict on."""
        if not self.backups:
            return
        now = self._chain_now()
        while self.backups and self.backups[0].due <= now:
            case = self.backups[0].case
            status = self.ledger.submission(case.sub.worker, case.sub.key).status
            heapq.heappop(self.backups)  # after the read: one that failed is kept
            if status == "pending":
                self.taken += 1
                cases.append(case)
            else:
                self.covered += 1

    def block_time(self, block: int) -> int:
        """The timestamp of ``block`` (the chain's, kept for the blocks lately read)."""
        if block not in self._times:
            if len(self._times) > 1024:
                self._times.clear()
            self._times[block] = self.ledger.block_time(block)
        return self._times[block]

    def revoke_squats(self) -> list[str]:
        """Blocking: after ``read``, vote to revoke each registration the chain changed
        since the last call that holds an invalid signature; returns the accounts voted on."""
        assert self.registrations is not None
        self.revocations.check(self.registrations.take_changed())
        return self.revocations.vote(self.ledger, self.registrations.get)


def registered_peer(
    registrations: Registrations, worker: str, block: int | None = None
) -> str | None:
    """The peer id ``worker`` had registered as of ``block`` (the submission's: the peer that
    made the batch serves it, whatever key the worker rotated to since), from
    ``registrations``, the validator's cache (one chain read per worker until it changes);
    None when it has none or the chain cannot say now."""
    from crypto.identity import peer_id_of

    try:
        peer_key, _ = registrations.get(worker, block)
    except Exception as exc:  # the chain may be briefly unreachable: notices still count
        log.debug("registration of %s not read: %s", worker, exc)
        return None
    return peer_id_of(peer_key) if any(peer_key) else None
