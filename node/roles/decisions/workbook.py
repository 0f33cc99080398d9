"""The trainer's decisions, with no I/O but their own files: what it may train on
(``WorkBook``), which batches a step takes (``step_batches``), when a failed fetch is tried
again (``FetchRetry``), what survives a restart (``TrainerState``), and which checkpoints
are kept. The trainer role (``node/roles/services/trainer.py``) drives them.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.files import write_atomic
from node.roles.decisions.status import curve_point
from node.roles.decisions.work import Key, Ruling, Submission


def step_batches(
    usable: list[Key], waited: float, per_step: int, step_wait: float
) -> list[Key] | None:
    """The batches a step trains on once it has ``per_step`` usable ones, or at least one
    after waiting ``step_wait`` seconds (all usable ones then); None: keep waiting."""
    if len(usable) >= per_step or (usable and waited >= step_wait):
        return usable[: max(per_step, len(usable))]
    return None


def prune_checkpoints(root: Path, step: int, keep: int) -> None:
    """Remove the checkpoints (``v<N>`` directories or files) older than the last ``keep``."""
    for p in root.glob("v*"):
        try:
            v = int(p.name[1:].split(".")[0])
        except ValueError:
            continue
        if v <= step - keep:
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


def append_line(path: Path, line: dict[str, Any]) -> None:
    """Append one JSON line (after a line a crash cut short, on a line of its own)."""
    with open(path, "a+b") as f:
        cut = False
        if f.seek(0, 2) > 0:
            f.seek(-1, 2)
            cut = f.read(1) != b"\n"
        f.write((b"\n" if cut else b"") + json.dumps(line).encode() + b"\n")
        f.flush()


def recorded_step(path: Path) -> int:
    """The step of the last line of ``metrics.jsonl`` (-1: none)."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return -1
    for raw in reversed(lines):
        try:
            return int(json.loads(raw)["step"])
        except (ValueError, KeyError, TypeError):
            continue  # a line a crash cut short
    return -1


def recorded_curve(path: Path) -> list[dict[str, Any]]:
    """The learning curve so far, from ``metrics.jsonl`` (a restarted trainer shows it all):
    one ``curve_point`` per step, the last line of a step that was recorded twice winning."""
    by_step: dict[int, dict[str, Any]] = {}
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    for raw in lines:
        try:
            point = curve_point(json.loads(raw))
            by_step[int(point["step"])] = point
        except (ValueError, TypeError, AttributeError):
            continue  # a line a crash cut short
    return [by_step[s] for s in sorted(by_step)]


def key_text(key: Key) -> str:
    return f"{key[0]}:{key[1].hex()}"


@dataclass
class WorkBook:
    """What the chain says about work, and what the trainer did with it. Pure: the role
    feeds it chain events and fetched batches.

    ``consumed`` maps every batch trained on to its policy version; entries older than the
    async window are forgotten (they can never be usable again). ``used_total`` counts every
    batch trained on, forgotten or not (``stale`` needs it: a forgotten batch is out of the
    window and no longer in ``consumed``, yet it was trained on)."""

    async_level: int
    submitted: dict[Key, Submission] = field(default_factory=dict)
    accepted: set[Key] = field(default_factory=set)
    rejected: set[Key] = field(default_factory=set)
    fetched: dict[Key, int] = field(default_factory=dict)  # in the inbox -> policy version
    consumed: dict[str, int] = field(default_factory=dict)  # key_text -> policy version
    used_total: int = 0  # batches trained on, ever

    @classmethod
    def resumed(cls, async_level: int, state: TrainerState) -> WorkBook:
        """The book of a trainer that resumes from ``state`` (empty: a fresh start)."""
        return cls(async_level, consumed=dict(state.consumed), used_total=state.batches_used)

    def in_window(self, version: int, step: int) -> bool:
        """Step ``step`` may train on work made with ``version``."""
        return version + self.async_level >= step

    def on_submission(self, sub: Submission) -> None:
        self.submitted[(sub.worker, sub.key)] = sub

    def on_ruling(self, r: Ruling) -> None:
        accepted = r.verdict.accepted
        (self.accepted if accepted else self.rejected).add(r.key)
        (self.rejected if accepted else self.accepted).discard(r.key)

    def wanted(self, step: int) -> list[Key]:
        """Accepted batches to fetch: not fetched, not consumed, still in the window."""
        return [
            k
            for k in self.accepted
            if k not in self.fetched
            and key_text(k) not in self.consumed
            and k in self.submitted
            and self.in_window(self.submitted[k].policy_version, step)
        ]

    def usable(self, step: int) -> list[Key]:
        """Fetched, accepted, unused batches that step ``step`` may train on (oldest
        submission first)."""
        keys = [
            k
            for k, version in self.fetched.items()
            if k in self.accepted
            and k in self.submitted
            and key_text(k) not in self.consumed
            and self.in_window(version, step)
        ]
        return sorted(keys, key=lambda k: (self.submitted[k].block, k[1]))

    def stale(self, step: int) -> int:
        """How many accepted batches fell out of the window unused (never trained on): the
        accepted ones out of the window, less those trained on (``used_total``, less the
        ones still in the window, which ``consumed`` remembers)."""
        out = sum(
            1
            for k in self.accepted
            if k in self.submitted and not self.in_window(self.submitted[k].policy_version, step)
        )
        used_in_window = sum(1 for v in self.consumed.values() if self.in_window(v, step))
        return out - (self.used_total - used_in_window)

    def drop_stale(self, step: int) -> list[Key]:
        """Forget the fetched batches step ``step`` (and so every later one) may not train
        on, used or not: returned, for the inbox to delete them."""
        stale = [k for k, version in self.fetched.items() if not self.in_window(version, step)]
        for k in stale:
            del self.fetched[k]
        return stale

    def consume(self, keys: list[Key], step: int) -> None:
        for k in keys:
            self.consumed[key_text(k)] = self.submitted[k].policy_version
        self.used_total += len(keys)
        floor = step - self.async_level
        self.consumed = {k: v for k, v in self.consumed.items() if v >= floor}


@dataclass
class FetchRetry:
    """When to ask again for an accepted batch that no holder could serve: ``retry_s``
    after the failure (the trainer retries until the batch leaves the window). Pure: the
    role passes ``now`` in."""

    retry_s: float = 2.0
    retry_at: dict[Key, float] = field(default_factory=dict)

    def due(self, keys: list[Key], now: float) -> list[Key]:
        """Those of ``keys`` to fetch now, in their order."""
        return [k for k in keys if now >= self.retry_at.get(k, 0.0)]

    def fetched(self, key: Key) -> None:
        self.retry_at.pop(key, None)

    def failed(self, key: Key, now: float) -> None:
        self.retry_at[key] = now + self.retry_s


@dataclass
class TrainerState:
    """What survives a restart (``trainer-state.json``), written after each checkpoint."""

    step: int = 0
    consumed: dict[str, int] = field(default_factory=dict)
    batches_used: int = 0
    tokens_trained: int = 0
    line: dict[str, Any] = field(default_factory=dict)  # the last step's metrics, before eval

    @classmethod
    def load(cls, path: Path) -> TrainerState:
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            return cls()
        return cls(
            step=int(raw["step"]),
            consumed={str(k): int(v) for k, v in raw["consumed"].items()},
            batches_used=int(raw.get("batches_used", 0)),
            tokens_trained=int(raw.get("tokens_trained", 0)),
            line=dict(raw.get("line", {})),
        )

    def save(self, path: Path) -> None:
        body = {
            "step": self.step,
            "consumed": self.consumed,
            "batches_used": self.batches_used,
            "tokens_trained": self.tokens_trained,
            "line": self.line,
        }
        write_atomic(path, json.dumps(body, sort_keys=True).encode())
