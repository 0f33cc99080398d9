"""Task sets, the answer checker and deterministic assignment."""

import json
import random
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from node.tasks import Task, assign, assignment_key, load_taskset
from node.tasks.answers import MAX_ANSWER_CHARS, answers_match, extract_answer, score
from node.tasks.arithmetic import ArithmeticTasks, make_problem
from node.tasks.mathfile import MathFileError, MathFileTasks

W1 = "0x" + "ab" * 20
W2 = "0x" + "cd" * 20


def test_arithmetic_is_deterministic_and_correct():
    ts = ArithmeticTasks(1, 5)
    for key in range(300):
        a, b = ts.task(key), ts.task(key)
        assert a == b
        assert a.prompt.endswith("\nAnswer:") and a.task_id.startswith(f"arith/d{a.difficulty}/")
        assert a.reward(f" {a.answer}") == 1.0
        assert a.reward(f" {int(a.answer) + 1}") == 0.0
        assert a.reward(a.solution) == 1.0  # the worked solution ends in the answer
        for lhs, rhs in re.findall(r"([0-9+*()-]+)=(-?[0-9]+)", a.solution):
            assert eval(lhs) == int(rhs), a.solution  # and every step is right
        question = a.prompt.split("\n")[0]
        if a.difficulty <= 4:  # pure expressions: the answer is their value
            assert int(a.answer) == eval(question.removesuffix("=?"))
    assert ArithmeticTasks(1, 5).task(7) == ts.task(7)  # a fresh instance agrees
    assert len({ts.task(k).prompt for k in range(300)}) > 250


def test_difficulty_levels():
    for level in range(1, 6):
        ts = ArithmeticTasks(level, level)
        assert {ts.task(k).difficulty for k in range(50)} == {level}
    mixed = ArithmeticTasks(2, 4)
    assert {mixed.task(k).difficulty for k in range(200)} == {2, 3, 4}
    assert load_taskset("arithmetic").name == "arithmetic-v2-d1-3"
    assert load_taskset("arithmetic:5").name == "arithmetic-v2-d5-5"
    assert load_taskset("arithmetic:2-4").name == "arithmetic-v2-d2-4"
    with pytest.raises(ValueError, match="difficulty"):
        load_taskset("arithmetic:0-9")
    with pytest.raises(ValueError, match="difficulty range"):
        load_taskset("arithmetic:easy")
    with pytest.raises(ValueError, match="difficulty"):
        make_problem(6, random.Random(0))


@pytest.mark.parametrize(
    ("gold", "completion", "expected"),
    [
        ("0.5", "1/2", 1.0),
        ("1/2", "Answer: 0.5", 1.0),
        ("\\frac{1}{2}", "so the answer is \\boxed{0.5}.", 1.0),
        ("\\dfrac{3}{4}", "0.75", 1.0),
        ("2\\sqrt{2}", "\\boxed{\\sqrt{8}}", 1.0),
        ("\\frac{\\pi}{2}", "\\boxed{\\pi/2}", 1.0),
        ("x+1", "1+x", 1.0),
        ("12", "Answer: 12 apples", 1.0),
        ("12", "12.0", 1.0),
        ("10", "first \\boxed{9}, no: \\boxed{\\boxed{10}}", 1.0),
        ("7", "17", 0.0),
        ("3", "-3", 0.0),
        ("1/3", "0.333", 0.0),
        ("7", "", 0.0),
        ("7", "\\boxed{", 0.0),
        ("5", "9" * (MAX_ANSWER_CHARS + 1), 0.0),
    ],
)
def test_checker_on_tricky_answers(gold, completion, expected):
    assert score(gold, completion) == expected


def test_integers_are_compared_as_math_verify_compares_them_without_it(monkeypatch):
    """The integer fast path reaches math-verify's verdict on every pair of plain integers
    (leading zeros, signs, large values) and never calls it; anything else still goes
    through math-verify."""
    import node.tasks.answers as answers

    rng = random.Random(5)
    pairs = [("7", "007"), ("-0", "0"), ("12", "-12"), ("3" * 40, "3" * 40), ("10", "1")]
    for _ in range(40):
        a = rng.choice([rng.randint(-20, 20), rng.randint(-(10**12), 10**12)])
        b = a if rng.random() < 0.5 else a + rng.choice([-1, 1, 10, -100])
        pairs.append((str(a), rng.choice(["", "0", "00"]) + str(b) if b >= 0 else str(b)))
    slow = {(g, p): answers._verify(answers._parse(g), answers._parse(p)) for g, p in pairs}
    answers.answers_match.cache_clear()
    calls = []
    monkeypatch.setattr(answers, "_verify", lambda *a, **k: calls.append(a))
    assert {(g, p): answers_match(g, p) for g, p in pairs} == slow
    assert not calls and sum(slow.values()) >= 10 and not all(slow.values())
    assert not answers_match("12", "12.0") and calls  # not an integer: math-verify judged
    answers.answers_match.cache_clear()


def test_extract_answer():
    assert extract_answer("blah \\boxed{a{b}c} tail") == "a{b}c"
    assert extract_answer("x. The answer is: 42.") == "42"
    assert extract_answer(" 13") == "13"
    assert not answers_match("7", "seven thousand")


def write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")


ROWS = [
    {
        "problem": "What is 1/2 + 1/4?",
        "solution": "We add: \\boxed{\\frac{3}{4}}",
        "level": "Level 2",
    },
    {"problem": "Compute 6*7.", "answer": "42", "difficulty": 1},
    {"problem": "No answer here.", "solution": "none"},
    {"problem": "", "answer": "1"},
]


def test_math_jsonl_and_parquet_agree(tmp_path):
    write_jsonl(tmp_path / "m.jsonl", ROWS)
    columns = sorted({k for r in ROWS for k in r})  # parquet: every column in every row
    pq.write_table(
        pa.Table.from_pylist([{k: r.get(k) for k in columns} for r in ROWS]),
        tmp_path / "m.parquet",
    )
    js, pa_ = MathFileTasks(tmp_path / "m.jsonl"), MathFileTasks(tmp_path / "m.parquet")
    for ts in (js, pa_):
        assert len(ts) == 2 and ts.skipped == 2
        first = ts.tasks[0]
        assert first.answer == "\\frac{3}{4}" and first.difficulty == 2
        assert first.reward("so \\boxed{0.75}") == 1.0
        assert first.reward("\\boxed{3/5}") == 0.0
        assert ts.tasks[1].reward("Answer: 42") == 1.0
        assert ts.tasks[1].task_id.endswith("/1")
    assert js.name.startswith("math-") and js.name != pa_.name  # names bind the file bytes
    assert load_taskset(str(tmp_path / "m.jsonl")).name == js.name


def test_math_file_errors(tmp_path):
    with pytest.raises(MathFileError, match="no such file"):
        MathFileTasks(tmp_path / "none.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"problem": "x"\n')
    with pytest.raises(MathFileError, match="not JSON"):
        MathFileTasks(tmp_path / "bad.jsonl")
    (tmp_path / "list.jsonl").write_text("[1, 2]\n")
    with pytest.raises(MathFileError, match="JSON object"):
        MathFileTasks(tmp_path / "list.jsonl")
    write_jsonl(tmp_path / "empty.jsonl", [{"problem": "p"}])
    with pytest.raises(MathFileError, match="no row"):
        MathFileTasks(tmp_path / "empty.jsonl")
    (tmp_path / "x.csv").write_text("problem,answer\n")
    with pytest.raises(MathFileError, match="jsonl or .parquet"):
        MathFileTasks(tmp_path / "x.csv")


def test_assignment_reproducible_and_not_steerable():
    ts = ArithmeticTasks(1, 5)
    mine = assign(ts, W1, 3, 16)
    assert mine == assign(ArithmeticTasks(1, 5), W1, 3, 16)  # a validator gets the same
    assert assign(ts, W1.upper().replace("0X", "0x"), 3, 16) == mine  # address case ignored
    assert assign(ts, W1, 4, 16) != mine  # another step, other tasks
    assert assign(ts, W2, 3, 16) != mine  # another worker, other tasks
    assert len({t.task_id for t in mine}) == 16
    # the worker chooses nothing: key depends only on (address, step, index)
    keys = {assignment_key(W1, 3, i) for i in range(1000)}
    assert len(keys) == 1000
    # difficulty is not in the worker's hands: across steps, levels come out uniform
    levels = [t.difficulty for s in range(40) for t in assign(ts, W1, s, 25)]
    assert all(150 <= levels.count(d) <= 250 for d in range(1, 6))
    with pytest.raises(ValueError, match="address"):
        assignment_key("worker-1", 0, 0)


def test_task_reward_uses_the_checker():
    t = Task("t", "p", "0.5", 1)
    assert t.reward("\\boxed{\\frac{1}{2}}") == 1.0 and t.reward("\\boxed{2}") == 0.0
