"""Finding a DiLoCo group through the DHT: provider records under ``group_key``.

Every member of a group (the leader at once, any other member once it took part in an outer
step) provides ``protocol.diloco.group_key(run_id,
leader)`` in the run's DHT, again every ``every`` seconds (sooner, every ``retry``, while
no peer has stored the record: at start-up the routing table may still be empty). A joiner
that knows only a bootstrap peer looks the key up (``find_leader``): the provider records
carry the providers' addresses, and ``Node.find_providers`` dials them, so once the leader
is among them it is linked and can be asked to admit us. Each DHT operation is bounded by
4 × the node's ``read_timeout`` (at least 20 s) and a failure only means another try later.
A joiner provides nothing before it joined: py-libp2p answers a lookup from its own provider
store alone when that holds any record of the key, and a joiner's own record would hide the
group's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from node.net.runtime import Node

log = logging.getLogger("intellect.diloco")
Active = Callable[[], bool]


def _bound(node: Node) -> float:
    """One provide or lookup (a walk, then a dial of each provider): a loaded node is slow."""
    return max(4 * node.cfg.net.read_timeout, 20.0)


async def advertise(
    node: Node, key: str, *, every: float, retry: float = 1.0, active: Active = lambda: True
) -> None:
    """Provide ``key`` while ``active()`` (a member of the group), until cancelled."""
    while True:
        ok = False
        if not active():
            await trio.sleep(retry)
            continue
        with trio.move_on_after(_bound(node)):
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
            with trio.move_on_after(_bound(node)):
                try:
                    found |= await node.find_providers(key)
                except Exception as exc:  # an empty routing table, a lost stream
                    log.debug("looking up %s failed: %r", key, exc)
            if leader not in found:
                await trio.sleep(poll)
    return found
