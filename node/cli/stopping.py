"""How a node hears that it should stop: SIGINT or SIGTERM once, and once more to force it.

The signals are counted in their handler, as they arrive. trio's signal receiver keeps one
pending signal of each kind until its task reads it, so a second Ctrl-C that came before
the task read the first (the loop busy, as when the node shuts its network down) was merged
into the first and lost: the node went on stopping politely, and only a third Ctrl-C
forced it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

import trio

FORCED = 130  # the exit status of a forced stop (128 + SIGINT)


@contextmanager
def stop_on_signals(
    stop: Callable[[], None], *, exit: Callable[[int], object] = os._exit
) -> Iterator[None]:
    """Inside a trio run: the first SIGINT or SIGTERM calls ``stop`` in the loop (which
    nothing blocks: trio is woken for it), the second exits the process at once
    (``FORCED``), whatever the loop or a thread is waiting for. The previous handlers
    are back on exit."""
    token = trio.lowlevel.current_trio_token()
    heard = 0

    def say(line: bytes) -> None:
        """At once, even while the loop is busy (no print: it is not reentrant); a closed
        standard output must not keep the node from stopping."""
        try:
            os.write(1, line)
        except OSError:
            pass

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal heard
        heard += 1
        if heard == 1:
            say(b"stopping: announcing departure to peers (Ctrl-C again to force)\n")
            token.run_sync_soon(stop)  # signal-safe, and wakes the loop
            return
        say(b"forced: exiting now, without waiting\n")
        exit(FORCED)

    kinds = (signal.SIGINT, signal.SIGTERM)
    previous = {kind: signal.signal(kind, handler) for kind in kinds}
    try:
        yield
    finally:
        for kind, old in previous.items():
            signal.signal(kind, old)
