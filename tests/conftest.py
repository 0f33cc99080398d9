import pytest
import trio.testing


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The `model init` base policy, built once per machine (cached under .cache/)."""
    import fcntl
    from pathlib import Path

    from node.engine.tinymodel import Recipe, build_tiny_model

    cache = Path(__file__).resolve().parent.parent / ".cache" / "models"
    cache.mkdir(parents=True, exist_ok=True)
    # pytest-xdist runs one session per worker: the first builds, the others wait and copy
    with open(cache / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        out, _ = build_tiny_model(
            tmp_path_factory.mktemp("model") / "tiny", Recipe(), cache_dir=cache
        )
    return out


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir):
    from node.engine.models import load_model

    return load_model(tiny_model_dir)
