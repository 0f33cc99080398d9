"""What a (re)started validator finds on the chain from before it started.

A validator reads every submission since the contract's block, so after a restart it meets
work submitted while it was down, possibly long ago. Two things about that work come from
the chain, not from the validator's own clock:

- **the window it is judged in.** A batch's staleness is judged against the run's clock
  as it stood when the batch was submitted (``StepClock.window``'s ``at``). A validator
  that was running then noted its own clock; one that was not has no such note, and the
  clock now (perhaps many steps later) would reject honest work that was inside the window
  when it was submitted. The chain recorded the policy version in force then (the
  ``PolicyVersion`` events up to the submission's block), so that version stands for the
  clock then: the step then was that version or one more (the trainer announces step n + 1
  while it trains step n), so the check is at most one step more lenient than a validator
  that was running, never stricter.
- **what it already voted on.** The contract refuses a second vote from the same
  validator; fetching and recomputing such a batch again would only end in a refused post.

Blocking (JSON-RPC): the role runs ``read_history`` in a worker thread.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from node.roles.decisions.work import Key
from node.roles.given import EventSource
from node.roles.io.chain import read_events


@dataclass
class History:
    """The chain up to block ``upto`` (inclusive), as the validator found it at start."""

    upto: int
    blocks: list[int] = field(default_factory=list)  # PolicyVersion events' blocks, in order
    versions: list[int] = field(default_factory=list)  # the version each one set
    voted: set[Key] = field(default_factory=set)  # submissions this validator voted on

    def covers(self, block: int) -> bool:
        return block <= self.upto

    def version_before(self, block: int) -> int:
        """The policy version in force before ``block`` (a version set in the same block is
        not counted: the submission may precede it there; 0 before any was set)."""
        i = bisect.bisect_left(self.blocks, block)
        return self.versions[i - 1] if i else 0

    def clock_at(self, block: int) -> tuple[int, int]:
        """(step, policy version) standing for the clock when work of ``block`` was
        submitted (see the module docstring)."""
        v = self.version_before(block)
        return v, v


def read_history(client: EventSource, validator: str, from_block: int) -> History:
    """The chain from ``from_block`` to its head now, read with one ``eth_getLogs``."""
    head = client.head()
    out = History(upto=head)
    if head < from_block:
        return out
    span = {"from_block": from_block, "to_block": head}
    me = validator.lower()
    for ev in read_events(client, ("PolicyVersion", "WorkAccepted", "WorkRejected"), span):
        args = ev["args"]
        if ev["event"] == "PolicyVersion":
            out.blocks.append(int(ev["blockNumber"]))
            out.versions.append(int(args["version"]))
        elif str(args["validator"]).lower() == me:
            out.voted.add((str(args["worker"]).lower(), bytes(args["key"])))
    return out
