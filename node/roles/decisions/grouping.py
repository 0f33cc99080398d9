"""Which member of a DiLoCo trainer group trains on which accepted batch (SPEC §21).

Pure, no I/O but its own file. Every member decides alone and all decide alike, from what
each of them knows: the chain's record of the batch (its work key and the policy version
it was made with, ``v``) and the roster of the group's all-reduce that produced version
``v`` (for version 0, or the version a group resumed from, the roster of the group's
*formation*: an all-reduce of a zero vector before the first inner phase). The owner is

    roster_v[ int.from_bytes(sha256(work_key)[:8], "big") mod len(roster_v) ]

A batch therefore has one owner for ever, whatever step it is trained in (the async
window lets a batch made with version ``v`` be trained in a later outer step): no batch is
trained on by two members, and none twice by one (``WorkBook.consumed``). A batch whose
roster this member does not know (made before it joined) is not its own. A batch whose
owner died is not trained on (its worker is still paid: the work was accepted).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from node.files import write_atomic


def owner(work_key: bytes, roster: list[str]) -> str:
    """The member of ``roster`` that trains on the batch ``work_key``."""
    if not roster:
        raise ValueError("an empty roster owns nothing")
    digest = hashlib.sha256(work_key).digest()
    return roster[int.from_bytes(digest[:8], "big") % len(roster)]


def share(per_step: int, members: int) -> int:
    """Accepted batches one member waits for in an outer step (the group's ``per_step``
    spread over its members; the split by hash is not exactly even)."""
    return max(1, -(-per_step // max(1, members)))


def step_ready(mine: int, want: int, waited: float, step_wait: float, theirs_new: int) -> bool:
    """A member goes on to its inner phase with its ``mine`` usable batches: once it has
    its share ``want``; after ``step_wait`` seconds, with what it has if that is something
    or if other members have ``theirs_new`` accepted batches no earlier step counted (then
    with none: a zero pseudo-gradient); with nothing new anywhere it waits on, as a single
    trainer does."""
    return mine >= want or (waited >= step_wait and (mine > 0 or theirs_new > 0))


@dataclass
class Rosters:
    """The roster behind each policy version (``diloco-rosters.json``)."""

    by_version: dict[int, list[str]] = field(default_factory=dict)

    def mine(self, me: str, work_key: bytes, version: int) -> bool:
        roster = self.by_version.get(version)
        return roster is not None and owner(work_key, roster) == me

    def record(self, version: int, roster: list[str]) -> None:
        self.by_version[version] = list(roster)

    def latest(self) -> list[str]:
        return self.by_version[max(self.by_version)] if self.by_version else []

    def forget_before(self, version: int) -> None:
        """Versions older than ``version`` can no longer be trained on (the async window)."""
        self.by_version = {v: r for v, r in self.by_version.items() if v >= version}

    @classmethod
    def load(cls, path: Path) -> Rosters:
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            return cls()
        return cls({int(v): [str(p) for p in r] for v, r in raw.items()})

    def save(self, path: Path) -> None:
        body = {str(v): r for v, r in sorted(self.by_version.items())}
        write_atomic(path, json.dumps(body).encode())
