"""A small math file made by the project: word problems with worked solutions, as JSONL
in the fields ``mathfile`` reads (``problem``, ``solution`` ending in ``\\boxed{}``,
``answer``, ``level``).

The devnet's Qwen2-family run (``devnet --model-family qwen2``) takes its tasks from this
file rather than from the built-in arithmetic, so the run's task set is a data file that
travels by hash like a real one. The problems are drawn from a seeded generator, so the
same ``count`` and ``seed`` always write the same bytes (the base model built on them is
cached by the file's digest). Some are written with non-ASCII text (``×``, ``−``,
``café``, ``km/h``, French), which a byte-level tokenizer must carry through the loop.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

DEFAULT_COUNT = 400
FORMAT = 1  # bump when the problems change: the file's bytes (and its digest) do

Problem = tuple[str, str, int]  # problem, worked solution (without the box), answer


def _add(rng: random.Random) -> Problem:
    a, b = rng.randint(2, 49), rng.randint(2, 49)
    return f"What is {a} + {b}?", f"{a} + {b} = {a + b}.", a + b


def _subtract(rng: random.Random) -> Problem:
    a, b = rng.randint(20, 99), rng.randint(1, 19)
    return f"Compute {a} − {b}.", f"{a} − {b} = {a - b}.", a - b


def _multiply(rng: random.Random) -> Problem:
    a, b = rng.randint(2, 12), rng.randint(2, 12)
    return f"Compute {a} × {b}.", f"{a} × {b} = {a * b}.", a * b


def _cafe(rng: random.Random) -> Problem:
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    return (
        f"A café bakes {a} croissants an hour. How many does it bake in {b} hours?",
        f"{a} × {b} = {a * b}.",
        a * b,
    )


def _train(rng: random.Random) -> Problem:
    a, b = rng.randint(20, 90), rng.randint(2, 5)
    return (
        f"Un train roule à {a} km/h. Combien de km parcourt-il en {b} heures ?",
        f"{a} × {b} = {a * b}.",
        a * b,
    )


def _two_steps(rng: random.Random) -> Problem:
    a, b, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(1, 30)
    return (
        f"What is {a} × {b} + {c}?",
        f"{a} × {b} = {a * b}, and {a * b} + {c} = {a * b + c}.",
        a * b + c,
    )


LEVELS: dict[int, list[Callable[[random.Random], Problem]]] = {
    1: [_add, _subtract],
    2: [_multiply, _cafe],
    3: [_train, _two_steps],
}


def rows(count: int = DEFAULT_COUNT, seed: int = 0) -> list[dict[str, object]]:
    """``count`` problems, the levels in turn."""
    rng = random.Random(f"intellect-node/problems/{FORMAT}/{seed}")
    out: list[dict[str, object]] = []
    for n in range(count):
        level = 1 + n % len(LEVELS)
        problem, worked, answer = rng.choice(LEVELS[level])(rng)
        out.append(
            {
                "problem": problem,
                "solution": f"{worked} \\boxed{{{answer}}}",
                "answer": str(answer),
                "level": level,
            }
        )
    return out


def write_problems(path: str | Path, count: int = DEFAULT_COUNT, seed: int = 0) -> Path:
    """Write the problems to ``path`` (a ``.jsonl`` file, replaced whole) and return it."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows(count, seed))
    staging = p.with_name(f".{p.name}.partial")
    staging.write_text(text, encoding="utf-8")
    staging.replace(p)
    return p
