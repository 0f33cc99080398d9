"""How a rejected input is logged: each one is counted in the metrics (``Requests.reject``);
this decides what a person reading the log sees of it.

Most reasons are a peer's fault worth a line each (``malformed``, ``bad_signature``, a
``wrong_run`` of a misconfigured peer). ``stale``, ``replay`` and ``busy`` are expected in
volume: a node that joins hears the gossip its peers still relay (about 200 lines in its
first seconds, each at INFO, hid everything else), pubsub delivers a message once per mesh
peer, and a holder whose upload slots are all taken refuses everyone else (a worker whose
slots 8 outsiders kept full logged 1,100 to 5,300 lines a run). Those go to DEBUG one by
one, and to INFO as one summary line per ``interval`` with their counts, so that a clock
gone wrong (every input stale) or a holder always busy still shows.
"""

from __future__ import annotations

import logging
from collections import Counter

from protocol.errors import Reason

QUIET = frozenset({Reason.STALE, Reason.REPLAY, Reason.BUSY})
SUMMARY_INTERVAL = 60.0  # seconds between summary lines of the quiet reasons


class RejectionLog:
    """Pure: the level of each rejection's line and, now and then, a summary line. No clock
    of its own: ``now`` (seconds, monotonic) comes with each rejection, and a summary is due
    at the first quiet rejection ``interval`` after the first one it sums up."""

    def __init__(self, interval: float = SUMMARY_INTERVAL) -> None:
        self.interval = interval
        self.counts: Counter[str] = Counter()
        self.since: float | None = None  # when the first rejection not yet summed up came

    def level(self, reason: Reason) -> int:
        return logging.DEBUG if reason in QUIET else logging.INFO

    def summary(self, reason: Reason, now: float) -> str | None:
        """Count ``reason`` if it is a quiet one; the summary line once one is due."""
        if reason not in QUIET:
            return None
        if self.since is None:
            self.since = now
        self.counts[reason.value] += 1
        if now - self.since < self.interval:
            return None
        counts = " ".join(f"{r}={n}" for r, n in sorted(self.counts.items()))
        line = f"rejected input in the last {now - self.since:.0f} s: {counts} (each at DEBUG)"
        self.counts.clear()
        self.since = None
        return line
