"""What the chain gives a validator to judge: the submissions since its last read.

The validator role (``node/roles/services/validator.py``) reads its docket when the chain can have
changed (``PacedReads``, ``node/roles/io/chain.py``). ``open`` reads, once at the start, what
the validator is: its account, whether it was removed (then it judges only work submitted
up to its removal, and leaves the rest to the others: ``not_ours``), and the chain before
this start (``History``, ``node/roles/io/catchup.py``: what it voted on already, and the
trainer's clock then). ``read`` returns each new submission it is to judge as a ``Case``,
with the clock it is judged against when it came before this start, and the peer its
worker registered (asked first for the batch). ``revoke_squats`` votes out the
registrations with an invalid signature among those the chain changed
(``node/roles/io/revocations.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from node.roles.decisions.work import Submission
from node.roles.given import Started, ValidatorLedger
from node.roles.io.catchup import History, read_history
from node.roles.io.chain import ChainSetupError, Registrations, SubmissionWatcher
from node.roles.io.revocations import Revocations

log = logging.getLogger("intellect.validator")


@dataclass(frozen=True)
class Case:
    """A submission to judge: ``then`` is the trainer's clock (step, version) when it was
    submitted if that was before this start (None: it is now); ``holder`` the peer its
    worker registered (None: none, or the chain could not say)."""

    sub: Submission
    then: tuple[int, int] | None
    holder: str | None


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

    def open(self, ledger: ValidatorLedger, from_block: int) -> None:
        """Who this validator is on ``ledger``, and the chain from ``from_block`` so far."""
        self._ledger = ledger
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
        self.watcher = SubmissionWatcher(ledger, from_block, registrations=self.registrations)

    def read(self) -> tuple[bool, list[Case], Exception | None]:
        """(whether the chain had new submissions, the cases among them, and the error that
        cut the read short, if one did: the cases before it stand)."""
        assert self.watcher is not None and self.registrations is not None
        found, cases = False, []
        try:
            for sub in self.watcher.poll():
                found = True
                if self.until and self.ledger.block_time(sub.block) > self.until:
                    self.not_ours += 1  # not ours to judge: submitted after our removal
                    continue
                then = None
                if self.history.covers(sub.block):  # submitted before this start
                    if (sub.worker, sub.key) in self.history.voted:
                        continue  # voted on before: the chain refuses a second vote
                    then = self.history.clock_at(sub.block)  # not today's
                peer = registered_peer(self.registrations, sub.worker, sub.block)
                cases.append(Case(sub, then, peer))
        except Exception as exc:  # the chain may be briefly unreachable: read again later
            return found, cases, exc
        return found, cases, None

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
