import pytest
import trio.testing


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The `model init` base policy, built once per machine (cached under .cache/)."""
    from pathlib import Path

    from node.engine.tinymodel import Recipe, build_tiny_model

    cache = Path(__file__).resolve().parent.parent / ".cache" / "models"
    out, _ = build_tiny_model(tmp_path_factory.mktemp("model") / "tiny", Recipe(), cache_dir=cache)
    return out


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir):
    from node.engine.models import load_model

    return load_model(tiny_model_dir)
