"""The inference role's decisions: which policy version to generate with, and which
submitted batches still wait for their verdict.

``VersionChoice``: for step n the newest version held that the async window admits
(version ≥ n − ``async_level``, and not newer than the trainer announced); it reports when
the worker switches. ``PendingVerdicts``: the batches submitted and not judged yet (the
worker's back-pressure), settled by what the ledger says of each, and which stored ones
nobody fetches again. ``StoreRetention``: when to look for those. ``ChainReads``: when
the worker reads the chain at all. Pure: the role reads the weights held and the ledger,
and feeds them in.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from node.roles.decisions.clock import StepClock

RESTORED = -1  # the step of a batch found in the store after a restart (maybe unsubmitted)


@dataclass
class VersionChoice:
    async_level: int
    used: int | None = None  # the version of the last batch

    def pick(self, step: int, held: list[int], announced: int) -> int | None:
        """The newest version in ``held`` that step ``step`` may use, while the trainer has
        announced ``announced``; None when none (the next version downloads)."""
        lo = max(0, step - self.async_level)
        usable = [v for v in held if lo <= v <= announced]
        return max(usable) if usable else None

    def use(self, version: int) -> bool:
        """A batch was made with ``version``; True when that is a switch."""
        switched = version != self.used
        self.used = version
        return switched


@dataclass
class PendingVerdicts:
    steps: dict[bytes, int] = field(default_factory=dict)  # work key -> step (RESTORED)
    accepted: int = 0
    rejected: int = 0
    rejected_by_reason: Counter[str] = field(default_factory=Counter)
    expired: int = 0  # no verdict within the verdict window: never paid, never judged now
    # judged or expired, still stored -> (step, unlock_at: the maturity, when no vote can
    # change the verdict any more; until then other validators may fetch it to overturn)
    settled: dict[bytes, tuple[int, float]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.steps)

    def keys(self) -> list[bytes]:
        return list(self.steps)

    def restored(self, keys: list[bytes]) -> None:
        """After a restart: the batches in the store, submitted or not (the ledger says)."""
        for key in keys:
            self.steps.setdefault(key, RESTORED)

    def submitted(self, key: bytes, step: int) -> None:
        self.steps[key] = step
        self.settled.pop(key, None)  # waiting for a verdict (again): never spent meanwhile

    def settle(
        self,
        key: bytes,
        status: str,
        reason: str = "rejected",
        *,
        window_passed: bool = False,
        unlock_at: float = 0.0,
    ) -> bool:
        """The ledger's status of ``key``: accepted or rejected settle it, and so does a
        pending one whose verdict window passed (``window_passed``: no validator can judge
        it any more; it is never paid, and waiting for it would stop the worker for good).
        True when it must be submitted (again): a restored batch the ledger never heard
        of, a crash came between storing it and submitting it. It is no longer pending
        then, until ``submitted``. ``reason``: why the ledger rejected it (``invalid``,
        ...). ``unlock_at``: the submission's maturity (chain time)."""
        if status == "none" and self.steps.get(key) == RESTORED:
            del self.steps[key]
            return True
        if status == "pending" and window_passed:
            self.expired += 1
        elif status == "accepted":
            self.accepted += 1
        elif status == "rejected":
            self.rejected += 1
            self.rejected_by_reason[reason] += 1
        else:  # still waiting (or submitted, and the ledger has not seen it yet)
            return False
        self.settled[key] = (self.steps.pop(key), unlock_at)
        return False

    def refused(self, key: bytes, step: int, *, unreachable: bool) -> None:
        """The chain refused the stored batch ``key`` (the pool cap, the stake, its
        version): nobody fetches it, it is spent like a settled one. ``unreachable``: the
        submission may have landed, so it waits as a restored batch (the next read says)."""
        if unreachable:
            self.restored([key])
        else:
            self.settled[key] = (step, 0.0)

    def spent(self, floor: int, now: float, step_of: Callable[[bytes], int | None]) -> list[bytes]:
        """The settled batches nobody fetches again, forgotten here so the store can delete
        them: matured by ``now`` (chain time: no vote can overturn the verdict) and of a step
        below ``floor`` (the trainer is past them). ``step_of``: a restored batch's step,
        read once (None: not stored)."""
        spent = []
        for key, (step, unlock_at) in list(self.settled.items()):
            if step == RESTORED:
                found = step_of(key)
                step = RESTORED - 1 if found is None else found
                self.settled[key] = (step, unlock_at)
            if step < floor and unlock_at < now:
                del self.settled[key]
                spent.append(key)
        return spent


@dataclass
class StoreRetention:
    """When the worker looks for stored batches to delete (``PendingVerdicts.spent``), and
    below which step: every ``every_s`` seconds once a step is announced and a batch is
    settled; the floor is ``keep`` steps below the async window, the wider of the configured
    one and the clock's (the trainer cannot train on a batch made before it). Pure: the
    role passes the time in."""

    async_level: int = 0  # configured: the clock's may be narrowed to the chain's
    every_s: float = 30.0
    keep: int = 2
    next_at: float = 0.0

    def floor(self, now: float, clock: StepClock, settled: int) -> int | None:
        """The step floor when a look is due at ``now``, else None."""
        if clock.step is None or not settled or now < self.next_at:
            return None
        self.next_at = now + self.every_s
        return clock.step - max(self.async_level, clock.async_level) - self.keep


@dataclass
class ChainReads:
    """When the worker reads the chain: its pending batches' statuses only after a new
    block (a verdict is a transaction: no block, no verdict), its stake and rewards after a
    verdict, and every ``money_every`` seconds in any case (a settlement or a claim by
    anyone changes them too). Reading every status and four money figures every second cost
    a third of an idle worker's CPU (web3 encodes each call afresh) and that many calls a
    second on the chain's RPC per worker."""

    money_every: float = 15.0
    head: int | None = None
    money_at: float | None = None

    def statuses_due(self, head: int) -> bool:
        """Whether the chain has a block we have not read statuses at (then: it is read)."""
        due, self.head = head != self.head, head
        return due

    def money_due(self, now: float, verdicts: bool) -> bool:
        """Whether to read the money now (then: it is read); ``verdicts``: some came."""
        if verdicts or self.money_at is None or now - self.money_at >= self.money_every:
            self.money_at = now
            return True
        return False
