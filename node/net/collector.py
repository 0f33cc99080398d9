"""Python's cyclic garbage collector, kept from stalling the node's event loop.

A node's process holds some 320,000 objects that the collector tracks once it is up
(libp2p, torch's operator tables, the role's modules: imported once, kept for its life).
A full (generation 2) collection walks all of them: 190-270 ms on a loaded 2-core machine,
with the one thread that runs the event loop stopped meanwhile, about once a minute a node
(the gossip check's probe, ``bench/workers/gossip_probe.py``, 2026-12-06: every stall of
over 150 ms it recorded was such a collection). A gossip copy, a request or a verdict that
came then waited for it: the tail of the announcements' delay at 10 nodes.

``freeze``, once the node is up (its role started: everything it imports is imported),
moves every object tracked so far into the collector's permanent generation
(``gc.freeze``): later collections walk only what came after. Objects frozen are never
collected as cycles; reference counting still frees them, and what is frozen is what the
process keeps anyway. ``Collections`` times every collection (``gc.callbacks``) for the
node's ``/status`` (``collector``): how many were frozen, and per generation how many ran
and the longest.
"""

from __future__ import annotations

import gc
import sys
import time
from collections import deque
from typing import Any


def freeze() -> int:
    """Move every object the collector tracks now out of its sight; returns how many."""
    gc.collect()  # what is garbage already goes first, not into the permanent generation
    gc.freeze()
    return gc.get_freeze_count()


LONG_S = 0.05  # a collection this long is kept in ``long`` (a stall worth seeing)
LONG_KEPT = 256  # the latest so many


class Collections:
    """Each generation's collections since the node started: how many, the longest; and
    the latest of over ``keep_over_s`` (``long``: when, generation, seconds, and the
    interpreter's allocated blocks after it)."""

    def __init__(self, keep_over_s: float = LONG_S) -> None:
        self.count = [0, 0, 0]
        self.longest = [0.0, 0.0, 0.0]
        self.keep_over_s = keep_over_s
        self.long: deque[tuple[float, int, float, int]] = deque(maxlen=LONG_KEPT)
        self._started = 0.0

    def install(self) -> None:
        gc.callbacks.append(self._timed)

    def uninstall(self) -> None:
        if self._timed in gc.callbacks:
            gc.callbacks.remove(self._timed)

    def _timed(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        gen, took = int(info["generation"]), time.perf_counter() - self._started
        self.count[gen] += 1
        self.longest[gen] = max(self.longest[gen], took)
        if took > self.keep_over_s:
            self.long.append((time.time(), gen, took, sys.getallocatedblocks()))

    def status(self) -> dict[str, Any]:
        return {
            "frozen": gc.get_freeze_count(),
            "collections": list(self.count),
            "longest_s": [round(x, 4) for x in self.longest],
            "long": list(self.long),
        }
