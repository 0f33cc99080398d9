"""The validator's votes on-chain: each verdict posted once, from one account.

The validator role (``node/roles/services/validator.py``) judges a batch and hands its ``Verdict``
here; ``post`` sends ``accept`` or ``reject`` (``ledger/client.py``), one transaction at a
time (the account's nonce). A post the chain refuses is kept to be posted again
(``VerdictPosts``, ``node/roles/decisions/judging.py``): not counted as a refusal while the chain is
down or its clock has not reached the fetch deadline yet, given up at once when the
verdict window has closed, and counted as posted when another validator's vote already
said it. ``posted`` is what ``/status`` shows of them (``PostedVerdicts``).
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from ledger.client import LedgerUnreachable
from node.roles.decisions.judging import VerdictPosts, refusal
from node.roles.decisions.status import PostedVerdicts
from node.roles.decisions.work import Key, Verdict
from node.roles.given import Started, VoteLedger
from node.roles.io.chain import ChainSetupError

log = logging.getLogger("intellect.validator")


class Votes:
    """The verdicts this validator posts (``post``) and those waiting to be posted again
    (``unposted``)."""

    ledger = Started[VoteLedger](ChainSetupError, "the ledger is opened when the role starts")

    def __init__(self) -> None:
        self._ledger: VoteLedger | None = None  # opened when the role starts
        self.posting = trio.Lock()
        self.unposted = VerdictPosts()
        self.posted = PostedVerdicts()  # what /status shows of the verdicts posted

    async def post(self, key: Key, v: Verdict) -> tuple[dict[str, Any], float | None] | None:
        """Post ``v`` on ``key``: its ``/status`` entry and latency once the chain has it
        (or another validator's vote said it already); None when it waits to be posted
        again, or was given up."""
        worker, work_key = key
        try:
            async with self.posting:  # one transaction of ours at a time (its nonce)
                if v.accepted:
                    await trio.to_thread.run_sync(self.ledger.accept, worker, work_key)
                else:
                    await trio.to_thread.run_sync(self.ledger.reject, worker, work_key, v.reason)
        except Exception as exc:  # e.g. the chain's clock lags ours: posted again later
            if (why := refusal(exc)) != "stands":  # else another validator's vote said it
                # the chain down, or its clock not there yet: no refusal, never given up for it
                counted = not isinstance(exc, LedgerUnreachable) and why != "not yet"
                now, last = trio.current_time(), why == "too late"
                tries = self.unposted.refused(key, v, now, counted=counted, last=last)
                if why == "not yet":  # no failure: the chain's clock gets there
                    log.info("the chain is not at %s's fetch deadline yet", work_key.hex()[:16])
                    return None
                log.error(
                    "posting the verdict on %s failed (attempt %d of %d): %s",
                    *(work_key.hex()[:16], tries, self.unposted.attempts, exc),
                )
                return None
        self.unposted.posted(key)
        return self.posted.posted(key, v.reason, v.detail, v.seconds, trio.current_time())
