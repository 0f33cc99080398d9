"""Finding a DiLoCo group through the DHT: provider records under ``group_key``.

Every member of a group (the leader too) provides ``protocol.diloco.group_key(run_id,
leader)`` in the run's DHT, again every ``every`` seconds (sooner, every ``retry``, while
no peer has stored the record: at start-up the routing table may still be empty). A joiner
that knows only a bootstrap peer looks the key up (``find_leader``): the provider records
carry the providers' addresses, and ``Node.find_providers`` dials them, so once the leader
is among them it is linked and can be asked to admit us. Each DHT operation is bounded by
the node's ``read_timeout`` and a failure only means another try later.
"""

from __future__ import annotations

import logging

import trio

from node.net.runtime import Node

log = logging.getLogger("intellect.diloco")


async def advertise(node: Node, key: str, *, every: float, retry: float = 1.0) -> None:
    """Provide ``key`` until cancelled."""
    while True:
        ok = False
        with trio.move_on_after(max(node.cfg.read_timeout, 5.0)):
            try:
                ok = await node.provide(key)
            except Exception as exc:  # py-libp2p raises many types on a failed store
                log.debug("providing %s failed: %r", key, exc)
        await trio.sleep(every if ok else retry)


async def find_leader(
    node: Node, key: str, leader: str, *, within: float, poll: float = 1.0
) -> set[str]:
    """The providers of ``key`` found in the DHT, once ``leader`` is among them (linked);
    what was found if ``within`` seconds pass first (perhaps without the leader)."""
    found: set[str] = set()
    with trio.move_on_after(within):
        while leader not in found:
            with trio.move_on_after(max(node.cfg.read_timeout, 5.0)):
                try:
                    found |= await node.find_providers(key)
                except Exception as exc:  # an empty routing table, a lost stream
                    log.debug("looking up %s failed: %r", key, exc)
            if leader not in found:
                await trio.sleep(poll)
    return found
