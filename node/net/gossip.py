"""Gossip topics as inputs: every message is checked before gossipsub relays it.

``topic_validator`` wraps a service's handler (verify, admit, act) as a gossipsub topic
validator: a message the handler rejects is counted, dropped and never relayed to our
peers (py-libp2p also caches the verdict and scores the peer that sent it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from libp2p.peer.id import ID

from node.net.network import Network
from node.net.requests import Requests
from protocol.errors import Reason, WireError

log = logging.getLogger("intellect.node")


def topic_validator(
    requests: Requests, own_id: bytes, protocol: str, handle: Callable[[bytes], None]
) -> Callable[[ID, Any], bool]:
    """A pubsub topic validator running ``handle`` on each message not from ``own_id``,
    counted under ``protocol``; any exception means "drop" and never escapes into pubsub."""

    def validate(_forwarder: ID, msg: Any) -> bool:
        if msg.from_id == own_id:
            return True
        data = bytes(msg.data)
        requests.count_in(protocol, data)
        origin = ID(msg.from_id).to_base58() if msg.from_id else "?"
        try:
            handle(data)
        except WireError as err:
            requests.reject(protocol, origin, err)
            return False
        except Exception as exc:  # never let a bug here escape into pubsub
            requests.metrics.inc("rejected", reason=Reason.INTERNAL.value, protocol=protocol)
            log.exception(
                "gossip handler failed protocol=%s origin=%s: %s", protocol, origin[-8:], exc
            )
            return False
        return True

    return validate


async def subscribe(network: Network, topic: str, validator: Callable[[ID, Any], bool]) -> Any:
    """Validate ``topic`` with ``validator`` (synchronously) and subscribe to it."""
    network.pubsub.set_topic_validator(topic, validator, False)
    return await network.pubsub.subscribe(topic)


async def drain(sub: Any) -> None:
    """Empty a subscription: its messages were already handled by the topic validator."""
    while True:
        await sub.get()
