"""The validator's revocation votes: a registration whose stored signature is invalid is
voted out (SPEC §19, ``revoke_registration``).

The EVM cannot check an Ed25519 signature, so anyone can register someone else's peer key
with a bad one: a squat, which keeps the key's owner from registering it. The validator
role (``node/roles/services/validator.py``) calls ``vote`` after each read of the chain:
every account whose registration the chain logged a change of (``Registered``,
``PeerKeyChanged``; all of them since the contract's block at the first read, so squats
made while the validator was down count too) is read once, and if it is registered with
an invalid signature this validator votes to revoke it. At ``quorum`` votes the contract
frees the key and burns ``min_stake`` of the squatter's stake, unbonding stake included
(issue #54: a squatter that unbonded at once paid nothing). Votes are simulated first, so
a vote the chain refuses (``already voted to revoke``, no longer registered) costs no gas.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from ledger.records import LedgerRevert

log = logging.getLogger("intellect.validator")


class RevocationLedger(Protocol):
    def revoke_registration(self, worker: str) -> object: ...


class Revocations:
    """The accounts still to check (``check``) and the votes this validator posted."""

    def __init__(self) -> None:
        self.unchecked: set[str] = set()
        self.voted = 0  # revocation votes posted (/status, tests)

    def check(self, workers: set[str]) -> None:
        self.unchecked |= {w.lower() for w in workers}

    def vote(
        self, ledger: RevocationLedger, registration: Callable[[str], tuple[bytes, bool]]
    ) -> list[str]:
        """Blocking: vote to revoke each unchecked account registered with an invalid
        signature (``registration``: its peer key and whether the signature is valid, now);
        returns those voted on. One the chain could not be asked about now stays to be
        checked at the next call."""
        voted = []
        for worker in sorted(self.unchecked):
            try:
                peer_key, valid = registration(worker)
                if any(peer_key) and not valid:
                    ledger.revoke_registration(worker)
                    voted.append(worker)
                    log.warning(
                        "voted to revoke %s's registration of peer key %s: its signature is "
                        "invalid (a squat)",
                        worker,
                        peer_key.hex()[:16],
                    )
            except LedgerRevert as exc:  # e.g. voted before, revoked meanwhile: nothing to do
                log.info("no revocation vote on %s: %s", worker, exc.reason)
            except Exception as exc:  # the chain may be briefly unreachable: next time
                log.warning("registration of %s not checked: %s", worker, exc)
                continue
            self.unchecked.discard(worker)
        self.voted += len(voted)
        return voted
