"""The real binary with a role that comes up and then fails, for tests of how a node ends:

    python -m tests.helpers.failing_role start ...   (the same flags as ``intellect-node start``)

The role starts, waits until the file named by ``FAIL_WHEN`` exists, then fails as
``FAIL`` says: ``disk`` raises the OSError of a full disk (as a trainer's checkpoint write
would), ``bug`` a KeyError from a task of its own nursery (trio wraps it in a group).
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any

import trio

import node.roles
from node.cli.main import main


async def failing_role(
    node: Any, cfg: Any, weights: Any, *, task_status: Any = trio.TASK_STATUS_IGNORED
) -> None:
    task_status.started(None)
    trigger = trio.Path(os.environ["FAIL_WHEN"])
    while not await trigger.exists():  # noqa: ASYNC110 - the test makes it, in another process
        await trio.sleep(0.1)
    if os.environ.get("FAIL") == "bug":

        async def lookup() -> None:
            {}["missing"]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(lookup)
    path = cfg.resolved_data_dir / "trainer-state.json"
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


node.roles.role_service = lambda *args, **kw: failing_role

if __name__ == "__main__":
    sys.exit(main())
