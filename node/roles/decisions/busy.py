"""How busy a role is: the share of its serving time not spent working (``idle_share`` in
``/status`` and the learning bench). Pure: the role passes the times in (monotonic)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class BusyTime:
    since: float | None = None  # when the role began serving (None: not yet)
    busy_s: float = 0.0  # seconds spent working since
    _working: int = 0  # works under way now (``working``)
    _from: float = 0.0  # since when at least one has been

    def add(self, seconds: float) -> None:
        self.busy_s += seconds

    @contextmanager
    def working(self, clock: Callable[[], float] = time.monotonic) -> Iterator[None]:
        """Count the time of the block as busy; overlapping blocks (a validator's
        concurrent fetches and its judging) count their union once."""
        if not self._working:
            self._from = clock()
        self._working += 1
        try:
            yield
        finally:
            self._working -= 1
            if not self._working:
                self.busy_s += clock() - self._from

    def idle_share(self, now: float) -> float:
        """The share of the time since ``since`` not spent busy (0.0 before any time passed)."""
        if self.since is None or now <= self.since:
            return 0.0
        return round(max(0.0, 1.0 - self.busy_s / (now - self.since)), 3)
