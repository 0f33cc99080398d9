"""A fixed held-out task set, disjoint from every training assignment, evaluated greedily.

Training tasks come from ``node.tasks.assign``: keys are digests under the assignment
domain. The held-out keys are digests under their own domain (``HELDOUT_DOMAIN``) and a
seed, ``per_level`` distinct prompts per difficulty level. Disjoint keys are not enough
where a level has few problems (arithmetic level 1 has 100), so the trainer also drops
every training group whose prompt ``contains`` reports as held out: the held-out prompts
are never trained on.

``evaluate`` decodes greedily (temperature 0 through the engine, no proofs) and reports
the accuracy per level and overall (``"all"``: the mean over every held-out task, so with
equal counts per level the mean of the levels).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crypto.hashing import digest_parts
from node.tasks import Task, TaskSet, load_taskset

HELDOUT_DOMAIN = b"intellect-node/heldout/v1"
DEFAULT_MAX_NEW_TOKENS = 40


def heldout_key(seed: int, level: int, index: int) -> int:
    d = digest_parts(
        HELDOUT_DOMAIN, seed.to_bytes(8, "big"), level.to_bytes(8, "big"), index.to_bytes(8, "big")
    )
    return int.from_bytes(d[:8], "big")


@dataclass
class HeldOut:
    """``per_level`` distinct tasks for each level of ``taskset_spec`` (arithmetic: each
    level of its range; another task set: tasks grouped by their difficulty)."""

    taskset_spec: str = "arithmetic"
    per_level: int = 50  # arithmetic level 1 has 100 problems: half stay trainable
    seed: int = 0

    def __post_init__(self) -> None:
        if self.per_level < 1:
            raise ValueError("per_level must be >= 1")
        self.tasks: list[Task] = _draw(self.taskset_spec, self.per_level, self.seed)
        self.prompts = frozenset(t.prompt for t in self.tasks)

    def contains(self, prompt: str) -> bool:
        return prompt in self.prompts

    def batch_filter(self, batch: Any, taskset: TaskSet) -> Callable[[Any], bool]:
        """For ``samples_from_batch(..., drop=...)``: whether a group of ``batch`` is a
        held-out task. The group's task is recomputed from its assignment (worker, step,
        index), as a validator does, not read from the batch."""
        from node.tasks import assignment_key

        def drop(group: Any) -> bool:
            key = assignment_key(batch.worker, batch.step, group.index)
            return self.contains(taskset.task(key).prompt)

        return drop

    @property
    def levels(self) -> list[int]:
        return sorted({t.difficulty for t in self.tasks})

    def evaluate(
        self, engine: Any, tokenizer: Any, *, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    ) -> dict[str, float]:
        """Greedy accuracy: ``{"1": ..., "2": ..., "all": ...}`` (levels as strings)."""
        rewards = self._rewards(engine, tokenizer, 1, 0.0, max_new_tokens)
        return accuracy_by_level(self.tasks, [r[0] for r in rewards])

    def sample_stats(
        self,
        engine: Any,
        tokenizer: Any,
        *,
        samples: int = 64,
        k: int = 16,
        temperature: float = 1.0,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    ) -> dict[str, dict[str, float]]:
        """What sampling could find, per level (levels as strings): ``samples`` draws per
        task at ``temperature`` (seeds 0..samples-1). ``sampled``: the mean reward;
        ``pass_at_k``: the chance that k of the draws hold a right one (the unbiased
        estimator ``1 - C(n - c, k) / C(n, k)`` per task, averaged); ``pass_at_k_if_even``:
        ``1 - (1 - sampled) ** k``, what pass@k would be if every task of the level were
        answered right at the level's mean rate. A ``pass_at_k`` at or above the even
        figure means the right answers are spread over the tasks (lucky guesses) rather
        than concentrated on tasks the policy nearly knows, which RL could sharpen;
        ``best_task``: the highest share of right draws of any one task of the level."""
        if not 1 <= k <= samples:
            raise ValueError("need 1 <= k <= samples")
        rewards = self._rewards(engine, tokenizer, samples, temperature, max_new_tokens)
        by: dict[int, list[int]] = {}  # level -> right draws of each task
        for t, draws in zip(self.tasks, rewards, strict=True):
            by.setdefault(t.difficulty, []).append(sum(1 for r in draws if r > 0))
        out: dict[str, dict[str, float]] = {}
        for level, rights in sorted(by.items()):
            sampled = sum(rights) / (len(rights) * samples)
            out[str(level)] = {
                "sampled": sampled,
                "pass_at_k": sum(pass_at_k(samples, c, k) for c in rights) / len(rights),
                "pass_at_k_if_even": 1 - (1 - sampled) ** k,
                "best_task": max(rights) / samples,
                "k": float(k),
            }
        return out

    def _rewards(
        self, engine: Any, tokenizer: Any, draws: int, temperature: float, max_new_tokens: int
    ) -> list[list[float]]:
        """Each task's reward on ``draws`` completions (seeds 0..draws-1), without proofs."""
        from node.engine.base import GenRequest, SamplingParams
        from node.engine.models import prompt_ids

        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, prove=False)
        requests = [
            GenRequest(prompt_ids(tokenizer, t.prompt), seed)
            for t in self.tasks
            for seed in range(draws)
        ]
        results = engine.generate(requests, params)
        return [
            [
                t.reward(tokenizer.decode(r.tokens, skip_special_tokens=True))
                for r in results[i * draws : (i + 1) * draws]
            ]
            for i, t in enumerate(self.tasks)
        ]

    def evaluate_dir(
        self, model_dir: str | Path, *, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    ) -> dict[str, float]:
        """``evaluate`` on the model in ``model_dir`` (the torch engine)."""
        from node.engine import open_engine

        engine, tokenizer = open_engine(str(model_dir), backend="torch", max_batch=64)
        return self.evaluate(engine, tokenizer, max_new_tokens=max_new_tokens)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that ``k`` of ``n`` draws, ``c`` of them right, include a right one."""
    from math import comb

    return 1.0 - comb(n - c, k) / comb(n, k)


def accuracy_by_level(tasks: Sequence[Task], rewards: Sequence[float]) -> dict[str, float]:
    by: dict[int, list[float]] = {}
    for t, r in zip(tasks, rewards, strict=True):
        by.setdefault(t.difficulty, []).append(float(r))
    out = {str(level): sum(v) / len(v) for level, v in sorted(by.items())}
    out["all"] = sum(rewards) / len(rewards) if rewards else 0.0
    return out


def _draw(spec: str, per_level: int, seed: int) -> list[Task]:
    from node.tasks.arithmetic import ArithmeticTasks

    taskset = load_taskset(spec)
    if isinstance(taskset, ArithmeticTasks):
        out: list[Task] = []
        for level in range(taskset.lo, taskset.hi + 1):
            out += _distinct(ArithmeticTasks(level, level), per_level, seed, level, {level})
        return out
    return _distinct(taskset, per_level, seed, 0, None)


def _distinct(
    taskset: TaskSet, count: int, seed: int, level: int, levels: set[int] | None
) -> list[Task]:
    """``count`` tasks with distinct prompts (fewer if the space is smaller)."""
    seen: set[str] = set()
    out: list[Task] = []
    index = 0
    while len(out) < count and index < 50 * count:
        t = taskset.task(heldout_key(seed, level, index))
        index += 1
        if t.prompt not in seen and (levels is None or t.difficulty in levels):
            seen.add(t.prompt)
            out.append(t)
    return out
