"""The roles' shared words for work on the ledger: a submission's ``Key``, the
``Verdict`` on it, and the chain's records of both (``Submission``, ``Ruling``: read by
``node/roles/io/chain.py``).

A ``Verdict`` is what a validator decides about one submitted batch and posts on-chain
(``accept``, or ``reject`` with the ledger's reason), and what the chain then says about
the submission (``node/roles/io/chain.py`` reads it back for the trainer). The batch checker
(``node/roles/children/checking.py``) returns one too. It is not ``crypto.verdict.BatchVerdict``:
that is the evidence of the proof check on the batch's rollouts (TOPLOC, sampling,
termination), one of the inputs a ``Verdict`` is made from.
"""

from __future__ import annotations

from dataclasses import dataclass

Key = tuple[str, bytes]  # (worker address, work key): how the ledger keys a submission

ACCEPTED = "accepted"
REJECT_REASONS = ("invalid", "mismatch", "unavailable")  # the ledger's reasons to reject


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    reason: str  # "accepted", or why rejected: one of REJECT_REASONS ("rejected": unknown)
    detail: str = ""  # in words, for the log and /status
    rollouts: int = 0  # rollouts recomputed to reach it
    seconds: float = 0.0  # spent recomputing

    @classmethod
    def accept(cls, detail: str = "ok", *, rollouts: int = 0, seconds: float = 0.0) -> Verdict:
        return cls(True, ACCEPTED, detail, rollouts, seconds)

    @classmethod
    def reject(
        cls, reason: str, detail: str, *, rollouts: int = 0, seconds: float = 0.0
    ) -> Verdict:
        return cls(False, reason, detail, rollouts, seconds)


@dataclass(frozen=True)
class Later:
    """No verdict now: the batch rests on what this validator has not seen yet (a step its
    trainer has not announced to it). Judged again later, never rejected for it: a bonded
    reject of a batch served before the announcement was overturned by validators served
    after it, and the honest validator's bond burned (issue #54)."""

    why: str


@dataclass(frozen=True)
class Submission:
    worker: str  # lower-case 0x address
    key: bytes
    units: int
    policy_version: int
    block: int
    block_hash: bytes = b""  # of ``block``: seeds the spot check (decisions/spotcheck.py)


@dataclass(frozen=True)
class Ruling:
    """A validator's vote as the chain recorded it: the verdict that stands on the
    submission ``key`` after it (accepted: its status is "accepted"; the reject reason is
    the vote's, "rejected" when an accept vote left it rejected)."""

    key: Key
    verdict: Verdict
    final: bool  # a quorum overturned the first verdict
    block: int
