"""How busy a role is: the share of its serving time not spent working (``idle_share`` in
``/status`` and the learning bench). Pure: the role passes the times in (monotonic)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class BusyTime:
    since: float | None = None  # when the role began serving (None: not yet)
    busy_s: float = 0.0  # seconds spent working since

    def add(self, seconds: float) -> None:
        self.busy_s += seconds

    def idle_share(self, now: float) -> float:
        """The share of the time since ``since`` not spent busy (0.0 before any time passed)."""
        if self.since is None or now <= self.since:
            return 0.0
        return round(max(0.0, 1.0 - self.busy_s / (now - self.since)), 3)
