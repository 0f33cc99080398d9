"""Math problems with reference answers from a local JSONL or parquet file.

Rows follow NuminaMath-style fields: ``problem`` (required), and ``answer`` or a
``solution`` whose last ``\\boxed{}`` is the answer; an optional ``level`` ("Level 3" or
3) or ``difficulty`` gives the difficulty (default 1). Rows without a usable answer are
skipped when the file is read (their count is kept in ``skipped``). A solution with a
``\\boxed{}`` is kept as the task's worked solution (what ``model init`` trains on). The
task set's name carries the file's digest, so workers and validators agree on the exact
file.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from crypto.hashing import digest
from node.tasks.answers import last_boxed
from node.tasks.task import Task

PROMPT_SUFFIX = "\nPut the final answer in \\boxed{}."


class MathFileError(ValueError):
    pass


def _rows(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".jsonl":
        rows = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise MathFileError(f"{path}:{n}: not JSON: {exc}") from exc
            if not isinstance(row, dict):
                raise MathFileError(f"{path}:{n}: expected a JSON object")
            rows.append(row)
        return rows
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return list(pq.read_table(path).to_pylist())
    raise MathFileError(f"{path}: expected a .jsonl or .parquet file")


def _difficulty(row: dict[str, Any]) -> int:
    for field in ("level", "difficulty"):
        value = row.get(field)
        if isinstance(value, int):
            return value
        if isinstance(value, str) and (m := re.search(r"\d+", value)):
            return int(m.group())
    return 1


class MathFileTasks:
    def __init__(self, path: str | Path) -> None:
        p = Path(path)
        if not p.is_file():
            raise MathFileError(f"{p}: no such file")
        self.path = p
        self.file_digest = digest(p.read_bytes()).hex()[:16]
        self.name = f"math-{self.file_digest}"
        self.tasks: list[Task] = []
        self.skipped = 0
        for n, row in enumerate(_rows(p)):
            problem = row.get("problem")
            answer = row.get("answer")
            solution = row.get("solution")
            solution = solution if isinstance(solution, str) else ""
            if not isinstance(answer, str | int | float) or answer == "":
                answer = last_boxed(solution) if solution else None
            if not isinstance(problem, str) or not problem.strip() or answer in (None, ""):
                self.skipped += 1
                continue
            self.tasks.append(
                Task(
                    task_id=f"math/{self.file_digest}/{n}",
                    prompt=problem.strip() + PROMPT_SUFFIX,
                    answer=str(answer),
                    difficulty=_difficulty(row),
                    solution=solution if last_boxed(solution) is not None else "",
                )
            )
        if not self.tasks:
            raise MathFileError(f"{p}: no row has a problem and an answer")

    def __len__(self) -> int:
        return len(self.tasks)

    def task(self, key: int) -> Task:
        return self.tasks[key % len(self.tasks)]
