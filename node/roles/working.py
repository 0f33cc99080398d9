"""The inference role's decisions: which policy version to generate with, and which
submitted batches still wait for their verdict.

``VersionChoice``: for step n the newest version held that the async window admits
(version ≥ n − ``async_level``, and not newer than the trainer announced); it reports when
the worker switches. ``PendingVerdicts``: the batches submitted and not judged yet (the
worker's back-pressure), settled by what the ledger says of each. Pure: the role reads the
weights held and the ledger, and feeds them in.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

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

    def settle(self, key: bytes, status: str, reason: str = "rejected") -> bool:
        """The ledger's status of ``key``: accepted or rejected settle it; True when it must
        be submitted (again): a restored batch the ledger never heard of, a crash came
        between storing it and submitting it. It is no longer pending then, until
        ``submitted``. ``reason``: why the ledger rejected it (``invalid``, ...)."""
        if status == "none" and self.steps.get(key) == RESTORED:
            del self.steps[key]
            return True
        if status == "accepted":
            self.accepted += 1
            del self.steps[key]
        elif status == "rejected":
            self.rejected += 1
            self.rejected_by_reason[reason] += 1
            del self.steps[key]
        return False
