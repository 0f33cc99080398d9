"""A cheating worker for tests: the real binary whose inference role cheats.

    CHEATS=greedy,truncated python -m tests.helpers.cheating.worker start --role inference ...

(the same flags as ``intellect-node start``). Everything but the inference role is the
node's own; the role is ``CheatingRole`` (``role.py``: the real ``InferenceRole`` with its
batch maker, serving and claims swapped), making the cheats ``CHEATS`` names (comma-separated,
``catalogue.py``), one per batch in turn. Its record of what each submitted batch was is
the ``cheating`` section of its ``/status``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import trio

from node.roles.services import inference
from tests.helpers.cheating.catalogue import parse_cheats

CHEATS = os.environ.get("CHEATS", "")


async def run(
    node: Any,
    cfg: Any,
    weights: Any = None,
    *,
    task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The cheating role as the service the runtime starts for ``--role inference``."""
    from tests.helpers.cheating.role import CheatingRole

    await CheatingRole(node, cfg, weights, cheats=CHEATS).serve(task_status=task_status)


if __name__ == "__main__":
    if not parse_cheats(CHEATS):
        sys.exit("tests.helpers.cheating.worker: CHEATS names no cheat (catalogue.py)")
    inference.run = run  # the runtime looks the role up when it starts it

    from node.cli import main

    sys.exit(main(sys.argv[1:]))
