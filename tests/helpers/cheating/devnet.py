"""The devnet with cheating workers among its inference nodes (a demo of the validators at
work, and what ``bench/gpu_devnet.py`` runs):

    python -m tests.helpers.cheating.devnet --cheaters 1 --cheats other_weights,int8_weights \
        [every flag of intellect-node devnet]

The last ``--cheaters`` of the ``--inference`` workers are cheating workers (``worker.py``:
the real binary with a cheating inference role), each making the cheats of ``--cheats``
(``catalogue.py``, SPEC §19.1), one per batch in turn; the trainer's steps wait for the
honest workers' batches only. Everything else is ``intellect-node devnet`` (``run_devnet``,
given ``launch`` and ``batches_per_step``). It needs the checkout's ``tests/``: the
installed ``intellect-node`` holds no cheating code.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

from node.cli.devnet import Launch
from tests.helpers.cheating.catalogue import CHEATS, WORKER_WIDE_CHEATS, parse_cheats


def cheating_workers(inference: int, cheaters: int, cheats: str) -> dict[str, Any]:
    """``run_devnet``'s ``launch`` and ``batches_per_step`` for ``cheaters`` of
    ``inference`` workers making ``cheats``."""
    if not 0 <= cheaters <= inference:
        raise ValueError("--cheaters must be between 0 and --inference")
    if cheaters and not parse_cheats(cheats):
        raise ValueError("--cheats must name at least one cheat")
    cheating = Launch("tests.helpers.cheating.worker", {"CHEATS": cheats}, f"cheats: {cheats}")

    def launch(i: int) -> Launch:
        return cheating if i >= inference - cheaters else Launch(label="honest")

    chosen: Callable[[int], Launch] = launch
    return {"launch": chosen, "batches_per_step": max(1, inference - cheaters)}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tests.helpers.cheating.devnet",
        description="intellect-node devnet with cheating inference nodes among its workers",
        epilog="every other flag is intellect-node devnet's (intellect-node devnet --help)",
    )
    p.add_argument(
        "--cheaters",
        type=int,
        default=1,
        help="how many of the inference nodes cheat (default 1); each makes the cheats of "
        "--cheats, one per batch in turn",
    )
    p.add_argument(
        "--cheats",
        default="other_weights",
        metavar="NAMES",
        help="the cheats the --cheaters make, comma-separated (default other_weights): "
        f"{', '.join(c for c in CHEATS if c not in WORKER_WIDE_CHEATS)}; or "
        f"{', '.join(WORKER_WIDE_CHEATS)} alone (SPEC section 19.1: what each one is and "
        "which check catches it)",
    )
    p.add_argument("--inference", type=int, default=2, help="inference nodes (default 2)")
    return p


def main(argv: list[str] | None = None) -> int:
    from node.cli import devnet
    from node.cli.main import main as intellect_node

    ours, rest = parser().parse_known_args(argv)
    try:
        extra = cheating_workers(ours.inference, ours.cheaters, ours.cheats)
    except ValueError as exc:
        print(f"{parser().prog}: error: {exc}", file=sys.stderr)
        return 2
    devnet.run_devnet = partial(devnet.run_devnet, **extra)  # what `devnet` runs
    return intellect_node(["devnet", "--inference", str(ours.inference), *rest])


if __name__ == "__main__":
    sys.exit(main())
