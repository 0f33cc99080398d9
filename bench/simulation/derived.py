"""Figures beside the swarm: announcement delivery over the gossip mesh, DHT lookup hops,
presence pacing, and what follows from measured costs (async level, validators, chain
transactions). Each function names where its inputs come from.

- **Gossip**: ``gossip.py``'s model (gossipsub's mesh with the node's degrees; every copy
  a node sends or receives costs its process time, one thing at a time; a copy is on the
  link for half the path's RTT), each node on its own machine, its work costing what it
  cost on this machine (``MEASURED``; the model checked against real nodes:
  ``gossipcheck.py``).
- **DHT**: Kademlia with ``k = 20`` and ``alpha = 3`` (py-libp2p's kad-dht), node ids
  random: the rounds of an iterative lookup until the ``k`` nodes nearest the key are known.
- **Presence**: ``max(heartbeat_interval, (known + 1) / presence_rate)`` seconds between a
  node's heartbeats (``node/net/presence.py``), with the config's defaults.
"""

from __future__ import annotations

import bisect
import math
import random

from bench.simulation import gossip
from bench.simulation.gossip import GossipCost
from bench.simulation.links import Link
from node.config import NodeConfig

# what a node's work on an announcement cost on this machine, measured apart in-process
# (``gossipcheck.costs``: the medians of five calibrations, 2026-12-06): a home node's
# processor is taken to be as fast
MEASURED = GossipCost(
    send_s=0.00012, recv_s=0.0003, first_s=0.0012, publish_s=0.0014, wake_s=0.00013
)


def gossip_delivery(
    links: list[Link], rng: random.Random, cost: GossipCost = MEASURED
) -> list[float]:
    """Seconds from node 0 publishing until each other node has the message, every node
    on its own machine (no processors shared), its work costing ``cost``, beside the RTT."""
    return gossip.gossip_delivery(links, rng, cost)


def dht_lookup_hops(n: int, rng: random.Random, lookups: int = 200, k: int = 20) -> list[int]:
    """Rounds of iterative Kademlia lookups (``alpha`` = 3) among ``n`` nodes with 32-bit
    ids, each node's buckets holding up to ``k`` random nodes of their distance range."""
    alpha = 3
    ids = sorted(rng.sample(range(1 << 32), n))
    tables: dict[int, list[int]] = {}

    def table(x: int) -> list[int]:
        if x not in tables:
            out: list[int] = []
            for bit in range(32):
                lo = ((x >> bit) ^ 1) << bit
                a, b = bisect.bisect_left(ids, lo), bisect.bisect_left(ids, lo + (1 << bit))
                pick = random.Random(x * 64 + bit)
                span = ids[a:b]
                out.extend(span if len(span) <= k else pick.sample(span, k))
            tables[x] = out
        return tables[x]

    hops = []
    for _ in range(lookups):
        start, key = rng.choice(ids), rng.getrandbits(32)
        goal = set(sorted(ids, key=lambda y: y ^ key)[:k])
        known = set(sorted(table(start), key=lambda y: y ^ key)[:k])
        asked: set[int] = set()
        rounds = 0
        while not goal <= known and rounds < 64:
            todo = sorted(known - asked, key=lambda y: y ^ key)[:alpha]
            if not todo:
                break
            rounds += 1
            for y in todo:
                asked.add(y)
                known |= set(sorted(table(y), key=lambda z: z ^ key)[:k])
            known = set(sorted(known, key=lambda y: y ^ key)[:k])
        hops.append(rounds)
    return hops


def heartbeat_period(n: int, cfg: NodeConfig | None = None) -> float:
    """A node's heartbeat period in a network of ``n`` known peers (presence.py's rule)."""
    net = (cfg or NodeConfig()).net  # type: ignore[call-arg]
    return max(net.heartbeat_interval, (n + 1) / net.presence_rate)


def async_level_needed(spread_s: float, step_s: float) -> int:
    """The async level at which a worker never waits for weights: a version must reach
    it within ``level`` trainer steps of being published."""
    return max(1, math.ceil(spread_s / step_s))


def validators_needed(workers: int, validator_per_worker: float, judges: int = 1) -> int:
    """Validators to judge every batch ``judges`` times, a validator's check costing
    ``validator_per_worker`` times a worker's generation of the same batch."""
    return math.ceil(judges * workers * validator_per_worker)


def chain_load(
    workers: int, batch_s: float, gas_per_batch: float, tx_per_batch: float
) -> dict[str, float]:
    """Transactions per second and gas per day when every worker submits a batch every
    ``batch_s`` seconds."""
    batches = workers / batch_s
    return {"tx_per_s": batches * tx_per_batch, "gas_per_day": batches * gas_per_batch * 86400}
