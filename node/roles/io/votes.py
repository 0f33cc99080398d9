"""The validator's votes on-chain: each verdict posted once, from one account.

The validator role (``node/roles/services/validator.py``) judges a batch and hands its ``Verdict``
here; ``post`` sends ``accept`` or ``reject`` (``ledger/client.py``), one send at a time
(the account's nonces in order), then follows it to its confirmations beside the others (on
a chain of 2 s blocks and 3 confirmations each takes 6-8 s, which one after the other
capped a validator at one verdict per 7 s). The validator role starts each post as a task
of its own, so judging goes on meanwhile. A post the chain refuses is kept to be posted again
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
FOLLOWED = 16  # verdicts followed to their confirmations at once (one thread each)


class Votes:
    """The verdicts this validator posts (``post``) and those waiting to be posted again
    (``unposted``)."""

    ledger = Started[VoteLedger](ChainSetupError, "the ledger is opened when the role starts")

    def __init__(self) -> None:
        self._ledger: VoteLedger | None = None  # opened when the role starts
        self.posting = trio.Lock()
        self.following = trio.CapacityLimiter(FOLLOWED)
        self.unposted = VerdictPosts()
        self.posted = PostedVerdicts()  # what /status shows of the verdicts posted

    async def post(self, key: Key, v: Verdict) -> tuple[dict[str, Any], float | None] | None:
        """Post ``v`` on ``key``: its ``/status`` entry and latency once the chain has it
        (or another validator's vote said it already); None when it waits to be posted
        again, or was given up."""
        worker, work_key = key
        try:
            async with self.posting:  # sent one at a time, so nonces reach the chain in order
                sent = await trio.to_thread.run_sync(
                    self.ledger.send_vote, worker, work_key, v.accepted, v.reason
                )
            async with self.following:  # then followed to its confirmations beside the others
                await trio.to_thread.run_sync(self.ledger.wait, sent)
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
