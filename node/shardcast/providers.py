"""DHT provider records of weight versions (key ``ids.weights_key(run_id, version)``):
say that we hold a version, find who else does. Each lookup is bounded by ``read_timeout``
and never raises: the DHT only adds candidate holders to what notices and peers tell us.
"""

from __future__ import annotations

import logging

import trio

from node.config import NodeConfig
from node.net.runtime import Node
from protocol import ids

log = logging.getLogger("intellect.shardcast")


async def provide(node: Node, cfg: NodeConfig, version: int) -> None:
    """Announce in the DHT that we hold (something of) ``version``."""
    with trio.move_on_after(cfg.net.read_timeout):
        try:
            await node.provide(ids.weights_key(cfg.run.id, version))
        except Exception as exc:
            log.debug("dht provide of version %d failed: %s", version, exc)


async def find_providers(node: Node, cfg: NodeConfig, version: int) -> set[str]:
    """Peers that say in the DHT that they hold ``version`` (empty on any failure)."""
    with trio.move_on_after(cfg.net.read_timeout):
        try:
            return await node.find_providers(ids.weights_key(cfg.run.id, version))
        except Exception as exc:
            log.debug("find_providers failed: %s", exc)
    return set()


async def keep_finding(
    node: Node, cfg: NodeConfig, version: int, into: set[str], every: float
) -> None:
    """Add the providers of ``version`` to ``into`` every ``every`` seconds, until
    cancelled (run beside what reads ``into``: a slow lookup delays nothing)."""
    while True:
        into.update(await find_providers(node, cfg, version))
        await trio.sleep(every)
