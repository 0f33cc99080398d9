"""Structured log lines: time, level, the node's short id, component, then key=value text."""

from __future__ import annotations

import logging
import sys


def setup_logging(level: str, short_id: str) -> None:
    fmt = f"%(asctime)s %(levelname)-5s node={short_id} %(name)s: %(message)s"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(fmt, datefmt="%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("libp2p").setLevel(logging.DEBUG if level == "debug" else logging.CRITICAL)
    for noisy in ("multiaddr", "async_service", "anyio_service"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
