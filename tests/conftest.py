import pytest
import trio.testing


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The suite's base policy (`model init --steps 300 --schedule 0`: ``QUICK``, quicker to
    build than the default), built once per machine (cached under .cache/)."""
    import fcntl
    from pathlib import Path

    from node.engine.tinymodel import QUICK, build_tiny_model

    cache = Path(__file__).resolve().parent.parent / ".cache" / "models"
    cache.mkdir(parents=True, exist_ok=True)
    # pytest-xdist runs one session per worker: the first builds, the others wait and copy
    with open(cache / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        out, _ = build_tiny_model(tmp_path_factory.mktemp("model") / "tiny", QUICK, cache_dir=cache)
    return out


@pytest.fixture(scope="session")
def base_model_dir(tmp_path_factory):
    """The default `model init` base policy (what the devnet runs), built once per machine
    into the cache under .cache/ that the devnet tests share."""
    import fcntl
    from pathlib import Path

    from node.engine.tinymodel import Recipe, build_tiny_model

    cache = Path(__file__).resolve().parent.parent / ".cache" / "models"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        out, _ = build_tiny_model(
            tmp_path_factory.mktemp("model") / "base", Recipe(), cache_dir=cache
        )
    return out


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir):
    from node.engine.models import load_model

    return load_model(tiny_model_dir)
