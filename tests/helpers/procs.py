"""A parent process whose first line of output is its child's pid, and whether a process
has ended: for tests of what happens to a child when its parent dies or is signalled."""

import os
import signal
import subprocess
import sys
from contextlib import contextmanager


@contextmanager
def parent_and_child(script, *args, **popen):
    """``script`` run by Python with ``args`` (``popen``: more ``Popen`` arguments): yields
    the parent process and the pid its first line names; both killed on exit."""
    parent = subprocess.Popen(
        [sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True, **popen
    )
    child = None
    try:
        child = int(parent.stdout.readline())
        yield parent, child
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()
        if child is not None:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass


def gone(pid):
    """Whether process ``pid`` has ended (a zombie until its parent reaps it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True
