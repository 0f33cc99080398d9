"""A verifiable task (a prompt, its reference answer, its reward) and a set of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from node.tasks.answers import score


@dataclass(frozen=True)
class Task:
    task_id: str
    prompt: str
    answer: str  # the reference answer
    difficulty: int
    solution: str = ""  # a worked solution ending in the answer (for SFT), if known

    def reward(self, completion: str) -> float:
        return score(self.answer, completion)


class TaskSet(Protocol):
    name: str  # identifies the task set (and its version) in rollout batches

    def task(self, key: int) -> Task:
        """The task for a 64-bit key."""
        ...
