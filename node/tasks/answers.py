"""Answer extraction and checking: math-verify (sympy underneath), no string matching.

A completion's final answer is the last ``\\boxed{...}`` in it, else what follows the last
``Answer:``, else the whole completion. Gold and predicted answers are parsed by
math-verify, which understands LaTeX and plain expressions, and compared numerically and
symbolically (``1/2`` equals ``0.5`` and ``\\frac{1}{2}``). A prediction longer than
``MAX_ANSWER_CHARS`` scores 0 without being parsed, so a model cannot stall the checker
with a huge expression; math-verify's own timeouts need the main thread, so they are
used there and off elsewhere.

Two plain integers (the arithmetic tasks' answers, and what a policy learning them writes)
are compared as integers without math-verify, which reaches the same verdict on them at
a hundred times the cost: scoring was 45% of the batch checker's CPU per batch. Verdicts are
cached by (gold, predicted): a group's samples often give the same answer.

math-verify (with sympy: 0.4 s) is imported on the first answer that needs it, not with the
module: every node process and CLI command imports the task sets.
"""

from __future__ import annotations

import re
import threading
from functools import lru_cache

MAX_ANSWER_CHARS = 256
_ANSWER_RE = re.compile(r"answer\s*(?:is)?\s*[:=]?", re.IGNORECASE)
_INTEGER_RE = re.compile(r"-?[0-9]{1,64}")


def last_boxed(text: str) -> str | None:
    """Contents of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def extract_answer(completion: str) -> str:
    boxed = last_boxed(completion)
    if boxed is not None:
        return boxed.strip()
    matches = list(_ANSWER_RE.finditer(completion))
    if matches:
        return completion[matches[-1].end() :].strip().rstrip(".")
    return completion.strip().rstrip(".")


def _timeout() -> int | None:
    """math-verify's timeout: 5 s on the main thread, none elsewhere (it needs signals)."""
    return 5 if threading.current_thread() is threading.main_thread() else None


def _parse(text: str) -> list[object]:
    from math_verify import parse

    wrapped = text if "$" in text or "\\boxed" in text else f"${text}$"
    return list(parse(wrapped, parsing_timeout=_timeout()))


def _verify(gold: list[object], predicted: list[object]) -> bool:
    from math_verify import verify

    return bool(verify(gold, predicted, timeout_seconds=_timeout()))


@lru_cache(maxsize=4096)
def answers_match(gold: str, predicted: str) -> bool:
    """Whether ``predicted`` is the same mathematical answer as ``gold``."""
    if not predicted or len(predicted) > MAX_ANSWER_CHARS:
        return False
    if _INTEGER_RE.fullmatch(gold.strip()) and _INTEGER_RE.fullmatch(predicted):
        return int(gold) == int(predicted)
    g, p = _parse(gold), _parse(predicted)
    if not g or not p:
        return False
    return _verify(g, p)


def score(gold: str, completion: str) -> float:
    """Reward in [0, 1]: 1 when the completion's final answer equals ``gold``."""
    return 1.0 if answers_match(gold, extract_answer(completion)) else 0.0
