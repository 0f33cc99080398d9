import pytest
import trio.testing


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)
