import os
import sys
from pathlib import Path

import pytest
import trio.testing

CACHE = Path(__file__).resolve().parent.parent / ".cache" / "models"


def _recipes():
    from node.engine.tinymodel import QUICK, Recipe

    return {"tiny": QUICK, "base": Recipe()}


def _built(name: str, out: Path) -> Path:
    """The suite's model ``name`` at ``out``, taken from the cache under .cache/ (built into
    it by the first process to ask, the others waiting on the lock)."""
    import fcntl

    from node.engine.tinymodel import build_tiny_model

    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path, _ = build_tiny_model(out, _recipes()[name], cache_dir=CACHE)
    return path


def pytest_sessionstart(session):
    """Under pytest-xdist (``-n 2``), the controller builds both models into the cache before
    the workers start: a build in a worker competes with the other worker's tests for the
    cores, and took 548 s there instead of about 150 s alone. Once per machine."""
    import tempfile

    from node.engine.tinymodel import cache_path, is_built

    if not getattr(session.config.option, "numprocesses", None):
        return
    if "PYTEST_XDIST_WORKER" in os.environ:
        return
    missing = [n for n, r in _recipes().items() if not is_built(cache_path(CACHE, r), r)]
    if not missing:
        return
    print(
        f"\ntests/conftest.py: building the suite's models ({', '.join(missing)}) into {CACHE}"
        " before the workers start (once per machine, about 3.5 min on 2 cores)",
        file=sys.stderr,
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="suite-models-") as tmp:
        for name in missing:
            _built(name, Path(tmp) / name)


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The suite's base policy (`model init --steps 300 --schedule 0`: ``QUICK``, quicker to
    build than the default), built once per machine (cached under .cache/)."""
    return _built("tiny", tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture(scope="session")
def base_model_dir(tmp_path_factory):
    """The default `model init` base policy (what the devnet runs), built once per machine
    into the cache under .cache/ that the devnet tests share."""
    return _built("base", tmp_path_factory.mktemp("model") / "base")


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir):
    from node.engine.models import load_model

    return load_model(tiny_model_dir)


@pytest.fixture(scope="session")
def qwen2_tasks(tmp_path_factory):
    """The project's word-problem math file (``node/tasks/problems.py``)."""
    from node.tasks.problems import write_problems

    return write_problems(tmp_path_factory.mktemp("tasks") / "problems.jsonl")


@pytest.fixture(scope="session")
def qwen2_model_dir(tmp_path_factory, qwen2_tasks):
    """The Qwen2-family base model (``tinymodel.QWEN2``) on ``qwen2_tasks``, built once per
    machine into the cache under .cache/ (named by the file's bytes, not its place)."""
    import dataclasses
    import fcntl

    from node.engine.tinymodel import QWEN2, build_tiny_model

    CACHE.mkdir(parents=True, exist_ok=True)
    out = tmp_path_factory.mktemp("model") / "qwen2"
    with open(CACHE / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        recipe = dataclasses.replace(QWEN2, task=str(qwen2_tasks))
        path, _ = build_tiny_model(out, recipe, cache_dir=CACHE)
    return path
