"""The books of a run, reconciled: the oracle of the chaos run (``bench/chaos.py``).

After a run in which nodes were killed, frozen and restarted, three independent records
must agree: the chain's events (what was submitted and judged), the trainer's own files
(``metrics.jsonl``: which batches each step trained on; ``trainer-state.json``: what a
restart resumes from) and each worker's batch store (what it submitted). ``reconcile``
takes them as plain data (``Books``, read by ``read_books``) and returns every violation
found, as one line each (an empty list: the books add up):

- every submitted batch has exactly one final verdict: its status on-chain is accepted
  or rejected, at least one validator voted, no validator voted twice, and no vote names
  a batch that was never submitted;
- every submitted batch is in its worker's store, with the units and policy version the
  chain recorded (what the worker claimed is what it can serve);
- every accepted batch was trained on at most once, only accepted batches were trained
  on, each inside the async window of its step, the steps were each recorded once and in
  order, and the trainer's state agrees with its metrics;
- no accepted batch inside the window was lost: an accepted batch that was not trained on
  must not have been available (accepted, its worker, the trainer, the bootstrap and the
  chain all up for ``slack_s`` seconds) when a step it was in the window of began waiting
  for batches;
- no honest stake was slashed: no reject vote on an honest worker's batch, and the chain
  counts no slash for it;
- no node hangs: each exited 0 on SIGTERM within its deadline.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Key = tuple[str, bytes]  # (worker address, lower-case; work key)


@dataclass(frozen=True)
class Work:
    """A ``WorkSubmitted`` event."""

    units: int
    policy_version: int
    block: int


@dataclass(frozen=True)
class Vote:
    """A ``WorkAccepted`` or ``WorkRejected`` event: the status it left, and when (chain time)."""

    validator: str
    accepted: bool
    status: str  # accepted or rejected: the submission's status after this vote
    time: float


@dataclass(frozen=True)
class Stored:
    """A batch in a worker's store."""

    step: int
    policy_version: int
    tokens: int


@dataclass(frozen=True)
class Outage:
    """A node that could not work, from ``start`` to ``end`` (wall clock): frozen by
    SIGSTOP until SIGCONT, or killed until its restarted role answered."""

    node: str
    kind: str
    start: float
    end: float


@dataclass
class Books:
    async_level: int
    honest: set[str]  # worker addresses that never cheat
    names: dict[str, str]  # worker address -> node name (its outages are under the name)
    submitted: dict[Key, Work]
    votes: dict[Key, list[Vote]]
    status: dict[Key, str]  # the submission's status on-chain now
    slashed: dict[str, int]  # worker address -> slashes the chain counts
    stored: dict[str, dict[bytes, Stored]]  # worker address -> work key -> batch
    lines: list[dict[str, Any]]  # metrics.jsonl
    state: dict[str, Any]  # trainer-state.json
    outages: list[Outage] = field(default_factory=list)
    exits: dict[str, int | None] = field(default_factory=dict)  # None: did not exit in time


def key_text(key: Key) -> str:
    return f"{key[0]}:{key[1].hex()}"


def _parse_key(text: str) -> Key:
    worker, work = text.split(":")
    return worker.lower(), bytes.fromhex(work)


def _verdicts(b: Books) -> list[str]:
    out = []
    for key, work in b.submitted.items():
        votes = b.votes.get(key, [])
        status = b.status.get(key)
        if status not in ("accepted", "rejected"):
            out.append(f"{key_text(key)}: no final verdict (status {status})")
        if not votes:
            out.append(f"{key_text(key)}: no validator voted on it")
        twice = [v for v, n in Counter(v.validator for v in votes).items() if n > 1]
        if twice:
            out.append(f"{key_text(key)}: validator {twice[0]} voted {len(votes)} times")
        if votes and status in ("accepted", "rejected") and votes[-1].status != status:
            out.append(f"{key_text(key)}: last vote left {votes[-1].status}, chain says {status}")
        stored = b.stored.get(key[0], {}).get(key[1])
        if stored is None:
            out.append(f"{key_text(key)}: submitted, but not in its worker's store")
        elif (stored.tokens, stored.policy_version) != (work.units, work.policy_version):
            out.append(
                f"{key_text(key)}: stored {stored.tokens} tokens v{stored.policy_version}, "
                f"on-chain {work.units} units v{work.policy_version}"
            )
    out += [f"{key_text(k)}: voted on, never submitted" for k in b.votes if k not in b.submitted]
    return out


def _training(b: Books) -> list[str]:
    out = []
    steps = [int(m["step"]) for m in b.lines]
    if steps != list(range(len(steps))):
        out.append(f"metrics.jsonl steps are {steps}, not 0..{len(steps) - 1} once each")
    used = [(int(m["step"]), _parse_key(k)) for m in b.lines for k in m.get("used", [])]
    for key, n in Counter(k for _, k in used).items():
        if n > 1:
            out.append(f"{key_text(key)}: trained on {n} times")
    for step, key in used:
        if b.status.get(key) != "accepted":
            out.append(f"{key_text(key)}: trained on at step {step - 1}, but it is not accepted")
        elif (work := b.submitted.get(key)) and work.policy_version + b.async_level < step - 1:
            out.append(
                f"{key_text(key)}: v{work.policy_version} trained on at step {step - 1}, "
                f"outside the async window {b.async_level}"
            )
    if b.state:
        if steps and int(b.state.get("step", -1)) != steps[-1]:
            out.append(f"trainer-state.json step {b.state.get('step')}, metrics end at {steps[-1]}")
        if int(b.state.get("batches_used", -1)) != len(used):
            out.append(
                f"trainer-state.json counts {b.state.get('batches_used')} batches used, "
                f"metrics.jsonl lists {len(used)}"
            )
        used_text = {key_text(k) for _, k in used}
        unknown = set(b.state.get("consumed", {})) - used_text
        if unknown:
            out.append(f"trainer-state.json consumed {len(unknown)} batches no step lists")
    return out


def _down_at(b: Books, nodes: set[str], t: float) -> float | None:
    """The end of the last outage of ``nodes`` that began before ``t`` (None: none)."""
    ends = [o.end for o in b.outages if o.node in nodes and o.start <= t]
    return max(ends) if ends else None


def _lost(b: Books, slack_s: float) -> list[str]:
    """Accepted batches left unused although a step could have taken them (see above)."""
    used = {_parse_key(k) for m in b.lines for k in m.get("used", [])}
    began = [  # (step the line's batches were chosen for, when it began waiting)
        (int(m["step"]) - 1, float(m["time"]) - float(m["seconds"]))
        for m in b.lines
        if int(m["step"]) >= 1 and "time" in m and "seconds" in m
    ]
    out = []
    for key, work in b.submitted.items():
        if b.status.get(key) != "accepted" or key in used:
            continue
        accepted_at = next((v.time for v in b.votes.get(key, []) if v.accepted), None)
        if accepted_at is None:
            continue
        nodes = {b.names.get(key[0], key[0]), "trainer", "bootstrap", "chain"}
        for step, t in began:
            if work.policy_version + b.async_level < step:
                continue  # outside this step's window
            up_since = max(accepted_at, _down_at(b, nodes, t) or accepted_at)
            if t - up_since >= slack_s:
                out.append(
                    f"{key_text(key)}: accepted v{work.policy_version}, available "
                    f"{t - up_since:.0f} s before step {step} began, never trained on"
                )
                break
    return out


def honest_slashes(b: Books) -> list[str]:
    """A reject vote on an honest worker's batch, or a slash the chain counts for one."""
    out = []
    for key, votes in b.votes.items():
        if key[0] in b.honest and any(not v.accepted for v in votes):
            out.append(f"{key_text(key)}: an honest worker's batch got a reject vote")
    out += [f"{w}: honest, slashed {n} times" for w, n in b.slashed.items() if w in b.honest and n]
    return out


def _exits(b: Books) -> list[str]:
    return [
        f"{name}: {'did not exit on SIGTERM in time' if code is None else f'exited {code}'}"
        for name, code in b.exits.items()
        if code != 0
    ]


def reconcile(b: Books, *, slack_s: float = 20.0) -> list[str]:
    """Every violation of the books (see the module docstring); empty when they add up."""
    return _verdicts(b) + _training(b) + _lost(b, slack_s) + honest_slashes(b) + _exits(b)


def figures(b: Books) -> dict[str, int]:
    """Counts for a report: submitted, accepted, rejected, trained on, and the two the
    adversarial benchmark names (work lost, work counted twice)."""
    used = [k for m in b.lines for k in m.get("used", [])]
    accepted = sum(1 for s in b.status.values() if s == "accepted")
    return {
        "submitted": len(b.submitted),
        "accepted": accepted,
        "rejected": sum(1 for s in b.status.values() if s == "rejected"),
        "trained_on": len(set(used)),
        "steps": max((int(m["step"]) for m in b.lines), default=0),
        "double_counted_work": len(used) - len(set(used)),
        "lost_work": len(_lost(b, 20.0)),
        "honest_false_slashes": len(honest_slashes(b)),
    }


# ---- reading them ------------------------------------------------------------------------


def _batches(directory: Path) -> dict[bytes, Stored]:
    from protocol.rollouts import RolloutBatch
    from protocol.wire import open_message

    out = {}
    for path in sorted(directory.glob("*.batch")):
        batch = open_message(path.read_bytes(), RolloutBatch)
        out[batch.work_key()] = Stored(batch.step, batch.policy_version, batch.num_tokens)
    return out


def _metrics(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for raw in path.read_text().splitlines():
        try:
            out.append(json.loads(raw))
        except ValueError:
            continue  # a line a crash cut short (the trainer writes it again)
    return out


def read_books(
    client: Any,
    base: Path,
    workers: dict[str, str],
    *,
    async_level: int,
    honest: set[str],
    outages: list[Outage] | None = None,
    exits: dict[str, int | None] | None = None,
) -> Books:
    """The books from the chain (``client``: a ``LedgerClient``), the trainer's files under
    ``base / "trainer"`` and each worker's store under ``base / <name> / "batches"``
    (``workers``: name -> address)."""
    submitted, votes, status, slashed = chain_records(client, list(workers.values()))
    state_path = base / "trainer" / "trainer-state.json"
    return Books(
        async_level=async_level,
        honest=set(honest),
        names={address: name for name, address in workers.items()},
        submitted=submitted,
        votes=votes,
        status=status,
        slashed=slashed,
        stored={a: _batches(base / name / "batches") for name, a in workers.items()},
        lines=_metrics(base / "trainer" / "metrics.jsonl"),
        state=json.loads(state_path.read_text()) if state_path.exists() else {},
        outages=list(outages or []),
        exits=dict(exits or {}),
    )


def chain_records(
    client: Any, workers: list[str]
) -> tuple[dict[Key, Work], dict[Key, list[Vote]], dict[Key, str], dict[str, int]]:
    """What the chain's books hold (``client``: a ``LedgerClient``): every submission, the
    votes on each in order, each one's status now, and the slashes it counts per worker."""
    from ledger.codes import STATUS

    events = client.contract.events
    submitted = {
        (str(e["args"]["worker"]).lower(), bytes(e["args"]["key"])): Work(
            int(e["args"]["units"]), int(e["args"]["policy_version"]), int(e["blockNumber"])
        )
        for e in events.WorkSubmitted.get_logs(from_block=0)
    }
    raw = list(events.WorkAccepted.get_logs(from_block=0)) + list(
        events.WorkRejected.get_logs(from_block=0)
    )
    raw.sort(key=lambda e: (int(e["blockNumber"]), int(e["logIndex"])))
    times: dict[int, float] = {}
    votes: dict[Key, list[Vote]] = {}
    for e in raw:
        block = int(e["blockNumber"])
        if block not in times:
            times[block] = float(client.w3.eth.get_block(block)["timestamp"])
        key = (str(e["args"]["worker"]).lower(), bytes(e["args"]["key"]))
        votes.setdefault(key, []).append(
            Vote(
                str(e["args"]["validator"]).lower(),
                e["event"] == "WorkAccepted",
                STATUS[int(e["args"]["status"])],
                times[block],
            )
        )
    status = {k: client.submission(k[0], k[1]).status for k in submitted | votes}
    return submitted, votes, status, {a: client.worker(a).slashed for a in workers}
