"""Which submissions a validator judges when it judges only its share (``[validator]
judge = "assigned"``, SPEC §19 "Assignment"), instead of every submission.

Every validator judging every batch does not scale: each must keep up with the whole run,
so adding validators adds no capacity (the simulator, ``bench/simulation/judging.py``,
found that no number of validators keeps up with 100 workers at the measured check cost).
Assigned, each submission goes to quorum + 1 of its validators: enough that a first
verdict its worker bought from one of them is overturned by the other quorum.

The ranking: each validator of the submission (those whose terms cover its time, as the
contract counts them: ``ValidatorTerms``) is scored by BLAKE2b-256 of the domain, the hash
of the block that recorded the submission, the worker's address, the work key and the
validator's address (``digest_parts``), lowest first. The block hash is what its worker
cannot choose: a worker that could grind its key until its own validators came first would
pick who judges it. The first quorum + 1 judge at once. The next quorum + 1 are backups for
validators that are down: rank quorum + 1 + j (j = 0, 1, ...) takes the submission at
``(j + 1) / (quorum + 2)`` of its verdict window if no verdict stands on it by then, so the
last backup still has a ``1 / (quorum + 2)`` share of the window. Later ranks leave it.

Pure: no chain, no clock. The validator's ``Docket`` (``node/roles/io/docket.py``) feeds
the terms from the contract's events and asks for each submission's duty.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from crypto.hashing import digest_parts

DOMAIN = b"intellect/judges/1"


@dataclass
class ValidatorTerms:
    """Each validator's terms as the contract's events give them: active for work submitted
    from ``since`` (``ValidatorProposed``'s ``active_at``) up to ``until``
    (``ValidatorRemoved``'s ``removed_at``; 0: not removed), timestamps."""

    terms: dict[str, tuple[int, int]] = field(default_factory=dict)

    def proposed(self, validator: str, active_at: int) -> None:
        self.terms[validator.lower()] = (active_at, 0)

    def removed(self, validator: str, removed_at: int) -> None:
        since, _ = self.terms.get(validator.lower(), (0, 0))
        self.terms[validator.lower()] = (since, removed_at)

    def of(self, submitted_at: int) -> list[str]:
        """The validators of work submitted at ``submitted_at`` (the contract's rule: since
        <= t and, if removed, t <= until), sorted."""
        return sorted(
            v
            for v, (since, until) in self.terms.items()
            if since <= submitted_at and (until == 0 or submitted_at <= until)
        )


def ranking(block_hash: bytes, worker: str, key: bytes, validators: list[str]) -> list[str]:
    """``validators`` (lower-case 0x addresses) in the submission's order: by BLAKE2b-256 of
    the domain, the block hash, the worker's address, the key and the validator's address
    (each as bytes, length-prefixed), lowest first."""

    def score(v: str) -> bytes:
        return digest_parts(DOMAIN, block_hash, _address(worker), key, _address(v))

    return sorted(validators, key=score)


def duty(rank: int, quorum: int, window_s: int) -> int | None:
    """Seconds after the submission at which the validator of ``rank`` takes it: 0 for the
    first quorum + 1 (at once), a backup's delay for the next quorum + 1 (taken only if no
    verdict stands then), None for the rest (left to the others)."""
    judges = quorum + 1
    if rank < judges:
        return 0
    if rank < 2 * judges:
        return (rank - judges + 1) * window_s // (quorum + 2)
    return None


def _address(account: str) -> bytes:
    return bytes.fromhex(account.lower().removeprefix("0x"))
