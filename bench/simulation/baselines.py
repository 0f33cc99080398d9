"""What SHARDCAST is compared with, on the same links: a single HTTP origin, and a relay
tree like SHARDCAST's first design (INTELLECT-2: the trainer uploads to a few relay
servers, workers download from them over HTTP).

Both are processor sharing: a server's uplink is split max-min fairly among the transfers
it serves, each capped by the worker's own limit (its downlink and the loss-bound TCP rate
of its path, ``links.mathis_cap``). Everyone starts at once with the whole version to get;
a relay forwards bytes as they arrive (pipelined), so a worker behind a relay completes no
sooner than the relay itself holds the last byte.
"""

from __future__ import annotations

import math
from itertools import groupby


def shared_finish_times(size: float, uplink: float, caps: list[float]) -> list[float]:
    """When each of ``len(caps)`` transfers of ``size`` bytes, started together and served
    max-min fairly from ``uplink`` bytes/s, each at most ``caps[i]`` bytes/s, completes.

    With ``L`` the water level of all of them (``sum(min(c, L)) == uplink``), each moves at
    ``min(c, L)`` until the ones at ``L`` finish together; the level only rises after, so
    a transfer held by its own cap stays held by it: each completes at ``size / min(c, L)``.
    """
    level = _water_level(sorted(caps), uplink)
    return [size / min(c, level) for c in caps]


def _water_level(caps: list[float], uplink: float) -> float:
    """The share ``L`` with ``sum(min(c, L)) == uplink`` (inf: every cap fits)."""
    if sum(caps) <= uplink:
        return math.inf
    left, n = uplink, len(caps)
    for i, c in enumerate(caps):  # caps ascending
        if c * (n - i) >= left:
            return left / (n - i)
        left -= c
    return math.inf


def single_origin(size: float, origin_up: float, caps: list[float]) -> list[float]:
    """Every worker downloads the whole version from the trainer."""
    return shared_finish_times(size, origin_up, caps)


def relay_tree(
    size: float, origin_up: float, relays: int, relay_up: float, caps: list[float]
) -> list[float]:
    """The trainer uploads to ``relays`` relay servers (its uplink split among them), and
    worker ``i`` downloads from relay ``i mod relays`` over HTTP."""
    relay_done = shared_finish_times(size, origin_up, [math.inf] * relays)[0]
    out = [0.0] * len(caps)
    groups = sorted(range(len(caps)), key=lambda i: i % relays)
    for _, members in groupby(groups, key=lambda i: i % relays):
        idx = list(members)
        times = shared_finish_times(size, relay_up, [caps[i] for i in idx])
        for i, t in zip(idx, times, strict=True):
            out[i] = max(t, relay_done)
    return out
