"""A fixed held-out task set, disjoint from every training assignment, evaluated as RL
papers report it: sampled from the policy, with greedy decoding beside it.

Training tasks come from ``node.tasks.assign``: keys are digests under the assignment
domain. The held-out keys are digests under their own domain (``HELDOUT_DOMAIN``) and a
seed, ``per_level`` distinct prompts per difficulty level. Disjoint keys are not enough
where a level has few problems (arithmetic level 1 has 100), so the trainer also drops
every training group whose prompt ``contains`` reports as held out: the held-out prompts
are never trained on.

``evaluate`` reports, per level and overall (``"all"``: the mean over every held-out task,
so with equal counts per level the mean of the levels), three figures (no proofs):
``sampled``, the mean reward over ``draws`` seeded draws per task at the run's training
temperature (the headline figure: what the policy does when it samples, which GRPO moves
first); ``greedy``, the accuracy of the temperature-0 answer (the policy's mode, which
sharpening moves last); and ``pass_at_k`` with k = ``draws`` (whether any draw was right).
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
DEFAULT_DRAWS = 8  # k >= 8, as RL papers sample


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
        self,
        engine: Any,
        tokenizer: Any,
        *,
        draws: int = DEFAULT_DRAWS,
        temperature: float = 1.0,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    ) -> dict[str, dict[str, float]]:
        """``{"sampled": {"1": ..., "all": ...}, "greedy": {...}, "pass_at_k": {...}}``
        (levels as strings): ``draws`` draws per task at ``temperature`` (seeds
        0..draws-1) and one greedy answer; pass@k with k = ``draws``."""
        if draws < 1:
            raise ValueError("draws must be >= 1")
        sampled = self._rewards(engine, tokenizer, draws, temperature, max_new_tokens)
        greedy = self._rewards(engine, tokenizer, 1, 0.0, max_new_tokens)
        return {
            "sampled": accuracy_by_level(self.tasks, [sum(r) / draws for r in sampled]),
            "greedy": accuracy_by_level(self.tasks, [r[0] for r in greedy]),
            "pass_at_k": accuracy_by_level(
                self.tasks,
                [pass_at_k(draws, sum(1 for x in r if x > 0), draws) for r in sampled],
            ),
        }

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
        self,
        model_dir: str | Path,
        *,
        draws: int = DEFAULT_DRAWS,
        temperature: float = 1.0,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    ) -> dict[str, dict[str, float]]:
        """``evaluate`` on the model in ``model_dir`` (the torch engine)."""
        from node.engine import open_engine

        engine, tokenizer = open_engine(str(model_dir), backend="torch", max_batch=64)
        return self.evaluate(
            engine, tokenizer, draws=draws, temperature=temperature, max_new_tokens=max_new_tokens
        )


def metrics_fields(scores: dict[str, dict[str, float]], draws: int) -> dict[str, Any]:
    """An evaluation's fields of a ``metrics.jsonl`` line (the trainer's and the baseline's):
    each figure over every level (``heldout_sampled`` first: the headline), the draws per
    task (pass@k's k), then per level."""
    sampled, greedy, passed = scores["sampled"], scores["greedy"], scores["pass_at_k"]
    return {
        "heldout_sampled": sampled["all"],
        "heldout_greedy": greedy["all"],
        "heldout_pass_at_k": passed["all"],
        "heldout_draws": draws,
        "heldout_by_level": {
            level: {"sampled": v, "greedy": greedy[level], "pass_at_k": passed[level]}
            for level, v in sampled.items()
            if level != "all"
        },
    }


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
