"""Arithmetic problems generated from a key, at five difficulty levels.

1: ``a + b`` with one-digit numbers; 2: ``a + b`` / ``a - b`` with two-digit numbers;
3: ``a * b + c``; 4: ``(a + b) * c - d``; 5: word problems. The same key always gives the
same problem. Prompts end with ``Answer:``; the reference answer is an integer, and each
task carries a worked solution (the steps, then ``\\boxed{answer}``) that ``model init``
uses for SFT, so the base policy writes a few steps before its answer on harder levels.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from node.tasks.task import Task

LEVELS = (1, 2, 3, 4, 5)
PROMPT_SUFFIX = "\nAnswer:"

_WORD: tuple[tuple[str, Callable[[int, int, int], tuple[int, str]]], ...] = (
    (
        "{n} has {a} apples and buys {b} bags of {c} apples each. How many apples now?",
        lambda a, b, c: (a + b * c, f"{b}*{c}={b * c}, {a}+{b * c}={a + b * c}."),
    ),
    (
        "A train has {a} cars with {b} seats each; {c} seats are empty. How many are taken?",
        lambda a, b, c: (a * b - c, f"{a}*{b}={a * b}, {a * b}-{c}={a * b - c}."),
    ),
    (
        "{n} reads {a} pages a day for {b} days, then {c} more. How many pages in all?",
        lambda a, b, c: (a * b + c, f"{a}*{b}={a * b}, {a * b}+{c}={a * b + c}."),
    ),
    (
        "{n} had {a} coins, gave away {b} and found {c}. How many coins now?",
        lambda a, b, c: (a - b + c, f"{a}-{b}={a - b}, {a - b}+{c}={a - b + c}."),
    ),
)
_NAMES = ("Ada", "Bo", "Cy", "Di", "Ed", "Fay", "Gus", "Hal")


class ArithmeticTasks:
    def __init__(self, min_difficulty: int = 1, max_difficulty: int = 1) -> None:
        if not (1 <= min_difficulty <= max_difficulty <= 5):
            raise ValueError("difficulty levels are 1..5 with min <= max")
        self.lo, self.hi = min_difficulty, max_difficulty
        self.name = f"arithmetic-v2-d{self.lo}-{self.hi}"

    def task(self, key: int) -> Task:
        rng = random.Random(key)
        level = rng.randint(self.lo, self.hi)
        question, answer, steps = make_problem(level, rng)
        return Task(
            task_id=f"arith/d{level}/{key:016x}",
            prompt=question + PROMPT_SUFFIX,
            answer=str(answer),
            difficulty=level,
            solution=f" {steps} \\boxed{{{answer}}}" if steps else f" \\boxed{{{answer}}}",
        )


def make_problem(level: int, rng: random.Random) -> tuple[str, int, str]:
    """(question, answer, worked steps; empty for one-operation problems)."""
    r = rng.randint
    if level == 1:
        a, b = r(0, 9), r(0, 9)
        return f"{a}+{b}=?", a + b, ""
    if level == 2:
        a, b = r(10, 99), r(10, 99)
        if rng.random() < 0.5:
            return f"{a}+{b}=?", a + b, ""
        a, b = max(a, b), min(a, b)
        return f"{a}-{b}=?", a - b, ""
    if level == 3:
        a, b, c = r(2, 12), r(2, 12), r(1, 50)
        return f"{a}*{b}+{c}=?", a * b + c, f"{a}*{b}={a * b}, {a * b}+{c}={a * b + c}."
    if level == 4:
        a, b, c, d = r(2, 30), r(2, 30), r(2, 9), r(1, 99)
        s, p = a + b, (a + b) * c
        steps = f"{a}+{b}={s}, {s}*{c}={p}, {p}-{d}={p - d}."
        return f"({a}+{b})*{c}-{d}=?", p - d, steps
    if level == 5:
        template, formula = _WORD[r(0, len(_WORD) - 1)]
        a, b, c = r(10, 60), r(2, 9), r(1, 9)
        answer, steps = formula(a, b, c)
        return template.format(n=rng.choice(_NAMES), a=a, b=b, c=c), answer, steps
    raise ValueError(f"difficulty must be one of {LEVELS}")
