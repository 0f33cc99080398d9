"""The real node binary with a probe in place of a role, for ``bench/simulation/gossipcheck.py``
(not a benchmark):

    python -m bench.workers.gossip_probe start ...   (the same flags as ``intellect-node start``)

The node is ``intellect-node start`` unchanged (its network, gossipsub settings, paced
publisher, admin endpoint); instead of a role it runs ``probe``, which only watches:

- every announcement on ``TOPIC`` that the node delivers (``Node.subscribe``: gossip's topic
  validator, or a sync repair) is stamped with ``time.time()`` when its handler runs;
- every ``Node.announce`` on ``TOPIC`` (the admin endpoint's ``POST /announce`` calls it) is
  stamped when it is called, before the paced publisher takes it: a delay measured from
  there is what a role announcing something sees, pacing and signing included;
- the node's gossipsub mesh on the announce topic (peer ids), read from the router.

All three appear in ``/status`` under ``gossip_probe``. Every process runs on one machine,
so the publisher's and the receivers' ``time.time()`` share one clock.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import trio

import node.roles
from node.cli.main import main
from protocol import ids
from protocol.messages import Announcement

TOPIC = "bench-gossip"


async def probe(
    node: Any, cfg: Any, weights: Any, *, task_status: Any = trio.TASK_STATUS_IGNORED
) -> None:
    published: dict[str, float] = {}  # body -> when Node.announce was called
    arrived: dict[str, float] = {}  # "sender body" -> when the handler ran

    def heard(msg: Announcement) -> None:
        arrived[f"{msg.sender} {msg.body.decode()}"] = time.time()

    announce = node.announce

    def timed_announce(topic: str, body: bytes) -> None:
        if topic == TOPIC:
            published[body.decode()] = time.time()
        announce(topic, body)

    def mesh() -> list[str]:
        router = node.network.pubsub.router
        return sorted(p.to_base58() for p in router.mesh.get(ids.announce_topic(cfg.run.id), ()))

    node.subscribe(TOPIC, heard)
    node.announce = timed_announce  # the admin endpoint calls node.announce at request time
    node.add_status(
        "gossip_probe", lambda: {"published": published, "arrived": arrived, "mesh": mesh()}
    )
    task_status.started(None)
    await trio.sleep_forever()


node.roles.role_service = lambda *args, **kw: probe  # type: ignore[assignment]

if __name__ == "__main__":
    sys.exit(main())
