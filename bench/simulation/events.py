"""The event loop: timed callbacks on a heap, run in time order (ties in the order they
were scheduled). A plain heap, not ``simpy``: the simulator's processes are callbacks, and
at 10,000 nodes a generator per transfer would cost more than the decisions it drives."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class EventLoop:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0
        self.processed = 0

    def at(self, when: float, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` at simulated time ``when`` (never before now)."""
        self._seq += 1
        heapq.heappush(self._heap, (max(when, self.now), self._seq, fn, args))

    def run(self, until: float = float("inf"), stop: Callable[[], bool] | None = None) -> None:
        heap = self._heap
        while heap:
            when, _, fn, args = heap[0]
            if when > until:
                break
            heapq.heappop(heap)
            self.now = when
            fn(*args)
            self.processed += 1
            if stop is not None and stop():
                break
