"""Verifiable tasks and their deterministic assignment.

A ``Task`` is a prompt with a reference answer and a difficulty; its reward for a
completion is in [0, 1]. A ``TaskSet`` (built in: ``arithmetic``, a math file) maps a
64-bit key to a task. Which task a worker does is not its choice: the key of the task at
``index`` in ``step`` is the digest of (worker address, step, index), so a validator
recomputes it and a worker cannot steer it except by registering another address (which
costs stake) — and then every index of every step is again drawn for it.
"""

from __future__ import annotations

from crypto.hashing import digest_parts
from node.tasks.task import Task, TaskSet

__all__ = ["RL_TASKSET", "Task", "TaskSet", "assign", "assignment_key", "load_taskset"]

# What the devnet and the central baseline train on: the task mix the ``model init`` base
# policy is built for. Level 1 is left out, as INTELLECT-2 left out tasks its base solved
# more than 80% of the time (that base: 0.96-1.00); levels 2-3 are two thirds of the draws
# of ``arithmetic`` (node/engine/tinymodel.py has the measurements).
RL_TASKSET = "arithmetic:2-3"

ASSIGN_DOMAIN = b"intellect-node/task-assignment/v1"


def assignment_key(worker: str, step: int, index: int) -> int:
    """64-bit key of the ``index``-th task of ``worker`` in ``step``."""
    if not worker.startswith("0x") or len(worker) != 42:
        raise ValueError(f"worker must be a 0x-prefixed 20-byte address, got {worker!r}")
    d = digest_parts(
        ASSIGN_DOMAIN, worker.lower().encode(), step.to_bytes(8, "big"), index.to_bytes(8, "big")
    )
    return int.from_bytes(d[:8], "big")


def assign(taskset: TaskSet, worker: str, step: int, count: int) -> list[Task]:
    """The tasks with indices ``0..count-1`` that ``worker`` must do in ``step``."""
    return [taskset.task(assignment_key(worker, step, i)) for i in range(count)]


def builtin_taskset(spec: str) -> bool:
    """Whether ``spec`` names the built-in task set (``arithmetic``, ``arithmetic:LO-HI``)
    rather than a task set file."""
    return spec == "arithmetic" or spec.startswith("arithmetic:")


def load_taskset(spec: str) -> TaskSet:
    """``arithmetic`` (levels 1-3) / ``arithmetic:LO-HI``, or a path to a
    ``.jsonl`` / ``.parquet`` math file."""
    from node.tasks.arithmetic import ArithmeticTasks
    from node.tasks.mathfile import MathFileTasks

    if builtin_taskset(spec):
        lo, hi = 1, 3
        if ":" in spec:
            rng = spec.split(":", 1)[1]
            try:
                lo, hi = (int(x) for x in rng.split("-")) if "-" in rng else (int(rng),) * 2
            except ValueError:
                raise ValueError(f"bad difficulty range in {spec!r}; e.g. arithmetic:1-3") from None
        return ArithmeticTasks(lo, hi)
    return MathFileTasks(spec)
