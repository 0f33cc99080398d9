"""What a node's model process does (``node.roles.children.offload``: a daemonic child): starts the
engine's proof workers, sends their pids, and waits to be killed."""

import time


def start_proof_workers(conn) -> None:
    from node.engine.graphs import proof_workers

    try:
        pids = sorted(proof_workers()._processes)  # type: ignore[attr-defined]
    except BaseException as exc:  # noqa: BLE001 - sent to the test, which shows it
        conn.send(f"{type(exc).__name__}: {exc}")
        return
    conn.send(pids)
    time.sleep(300)
