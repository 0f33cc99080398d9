"""Token bucket that paces gossip publishing below the rate the mesh can carry.

Pure: ``delay(now)`` says how long to wait before the next send may go out and
``take(now)`` spends one token. The single publisher task sleeps for the delay, then
takes (so it is tested with trio's MockClock).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TokenBucket:
    rate: float  # tokens per second
    burst: float  # bucket capacity
    tokens: float = -1.0
    stamp: float | None = None

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        if self.tokens < 0:
            self.tokens = self.burst

    def _refill(self, now: float) -> None:
        if self.stamp is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    def delay(self, now: float) -> float:
        """Seconds until one token is available (0 if one is available now)."""
        self._refill(now)
        return 0.0 if self.tokens >= 1 else (1 - self.tokens) / self.rate

    def take(self, now: float) -> None:
        self._refill(now)
        if self.tokens < 1 - 1e-9:  # float slack after sleeping exactly delay(now)
            raise RuntimeError("no token available; wait delay(now) first")
        self.tokens -= 1
