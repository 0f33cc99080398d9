"""Child processes that do not outlive the node that started them.

A process killed with SIGKILL runs no cleanup: its children are re-parented to init and go
on (a devnet's chain and nodes, a role's model process holding its GPU memory, torchrun's
ranks). On Linux a child can ask the kernel for a signal when its parent dies
(``prctl(PR_SET_PDEATHSIG)``); it is tied to the *thread* that started the child, so the
node starts its children from its main thread. Elsewhere these do nothing.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int] | None:
    if sys.platform != "linux":
        return None
    try:
        import ctypes

        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


def parent_death_signal() -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets SIGTERM when the process
    that started it dies. Looked up here, in the parent, so the child only calls it."""
    prctl = _prctl()
    if prctl is None:
        return None

    def set_signal() -> None:  # pragma: no cover - runs in the child, between fork and exec
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))

    return set_signal


def die_with_parent(parent: int) -> None:
    """In a child already running (``multiprocessing``'s spawn has no ``preexec_fn``): get
    SIGTERM when ``parent`` dies, and exit at once if it has died already."""
    prctl = _prctl()
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    if os.getppid() != parent:  # it died before we asked
        os._exit(1)
