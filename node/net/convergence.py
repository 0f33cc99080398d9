"""When a network of nodes has converged (SPEC §8.1), judged from their ``/status``.

Pure: the caller collects every node's status; tests and ``bench/scale.py`` share it.
A network is converged when every node
- knows a live peer of every role present among the *other* nodes (``peers_by_role``), and
- holds at least ``min(low, N - 1)`` connections, and at most ``high`` settled ones (older
  than the grace period: a link just accepted, or opened for one DHT round, may briefly
  take a node above ``high`` before it closes one).
"""

from __future__ import annotations

from collections import Counter
from typing import Any


def problems(statuses: list[dict[str, Any]]) -> list[str]:
    """What keeps the network of these nodes from being converged (empty: converged)."""
    roles = Counter(st["role"] for st in statuses)
    out: list[str] = []
    for st in statuses:
        name = st["peer_id"][-8:]
        others = {r for r, n in roles.items() if n > (1 if r == st["role"] else 0)}
        missing = sorted(r for r in others if st["peers_by_role"].get(r, 0) < 1)
        if missing:
            out.append(f"{name} ({st['role']}) knows no live {', '.join(missing)}")
        c = st["connections"]
        low = min(c["low"], len(statuses) - 1)
        if c["count"] < low:
            out.append(f"{name} holds {c['count']} connections, fewer than {low}")
        if c["settled"] > c["high"]:
            out.append(f"{name} holds {c['settled']} settled connections, more than {c['high']}")
    return out
