"""Announcement delivery over a gossipsub mesh, as the node runs it: who forwards what to
whom, and what each copy costs the processes that send and receive it.

- **Mesh** (``gossip_mesh``): gossipsub's, with the node's degrees (``node/net/host.py``:
  ``degree`` 6, ``degree_low`` 4, ``degree_high`` 12): each node grafts random peers until
  it holds ``degree``, a graft is taken by both ends, and a node above ``degree_high``
  prunes random links down to ``degree`` (its heartbeat's rules).
- **Forwarding**: the publisher sends the message to each of its mesh peers; a node that
  receives it for the first time checks it (the node's handler sees it then: delivery) and
  sends it on to each mesh peer but the one it came from and the publisher (py-libp2p's
  ``GossipSub._get_peers_to_send``). The node speaks gossipsub 1.1 (``protocol/ids.py``):
  no IDONTWANT, so every such copy is sent, and one a node already has is a duplicate.
- **Costs** (``GossipCost``): a node is one Python process on one thread: it does one
  thing at a time, in the order the work came: ``send_s`` for each copy it sends (protobuf,
  yamux, Noise, a socket write), ``recv_s`` for each copy it receives, a duplicate
  included (it is read, decrypted and parsed before pubsub sees its id). A copy is on the
  link for half the path's RTT.
- **Processors** (``GossipCost.cores``): the nodes share the machine's cores; while more
  nodes have work than there are cores (with ``background`` other runnable tasks), each
  runs at ``cores / (busy + background)`` of its speed: processor sharing. Tasks that
  keep running do not count as ``background`` against a node: Linux's scheduler runs a
  task woken from sleep (a node, to a message) ahead of them. For nodes each on its own
  machine, ``cores = inf``: a node's work waits only for its own earlier work.
- **Wire** (``GossipCost.wire_s``): what a copy waits that takes no processor (wake-ups,
  the loopback stack), beside half the path's RTT.

What it leaves out: the IHAVE/IWANT gossip of the heartbeat (1 s; it matters only for a
node the mesh did not reach), the sync repair (``node/net/announcements.py``), loss.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from bench.simulation.links import Link, path_rtt

MESH_DEGREE, MESH_LOW, MESH_HIGH = 6, 4, 12  # node/net/host.py: build_pubsub


@dataclass(frozen=True)
class GossipCost:
    """Seconds of one process's time per copy of a message, the processors shared, and
    the delay of a copy that takes no processor (``wire_s``, beside half the RTT)."""

    send_s: float
    recv_s: float
    cores: float = math.inf
    background: float = 0.0  # other runnable tasks on those cores
    wire_s: float = 0.0

    @classmethod
    def from_hop(cls, hop_s: float, cores: float = math.inf, background: float = 0.0) -> GossipCost:
        """From one hop's delay on an idle pair (one send, one receive, no wait), all of it
        processor time: each side's share taken as half (the same layers, run in opposite
        directions)."""
        return cls(hop_s / 2, hop_s / 2, cores, background)

    @classmethod
    def from_hop_and_cpu(cls, hop_s: float, copy_cpu_s: float, cores: float) -> GossipCost:
        """From one hop's delay on an idle pair and the processor time a copy costs (sent
        or received, measured): what of the hop the two copies' time does not account
        for is a delay on the wire (wake-ups, the loopback stack)."""
        return cls(copy_cpu_s, copy_cpu_s, cores, 0.0, max(0.0, hop_s - 2 * copy_cpu_s))


def copies(mesh: list[set[int]], origin: int = 0) -> int:
    """Copies of one message sent in ``mesh`` when every node gets it (as many received:
    each is read by its receiver): the publisher's to each mesh peer, and each other
    node's to each but the one it came from (a node next to the publisher taken to hear
    it from the publisher first, which it does unless that copy waits)."""
    return len(mesh[origin]) + sum(len(p) - 1 for i, p in enumerate(mesh) if i != origin)


def gossip_mesh(
    n: int,
    rng: random.Random,
    degree: int = MESH_DEGREE,
    low: int = MESH_LOW,
    high: int = MESH_HIGH,
) -> list[set[int]]:
    """A mesh as gossipsub's heartbeats leave it among ``n`` nodes that all know each other."""
    adj: list[set[int]] = [set() for _ in range(n)]
    for i in rng.sample(range(n), n):
        while len(adj[i]) < min(degree, n - 1):
            j = rng.randrange(n)
            if j != i:
                adj[i].add(j)
                adj[j].add(i)
    for i in range(n):
        if len(adj[i]) > high:
            for j in rng.sample(sorted(adj[i]), len(adj[i]) - degree):
                if len(adj[j]) > low:
                    adj[i].discard(j)
                    adj[j].discard(i)
    return adj


def deliver(
    mesh: list[set[int]],
    cost: GossipCost,
    rtt: Callable[[int, int], float] = lambda i, j: 0.0,
    origin: int = 0,
) -> list[float]:
    """Seconds from ``origin`` publishing until each node's handler has the message
    (``inf`` for a node the mesh does not reach); the origin's own entry is 0.

    Processor sharing gives every busy node the same speed, so work is counted in virtual
    seconds (``v``: each busy node's progress) and the jobs finish in the order of their
    virtual finishing times: one heap, whatever the speed does meanwhile."""
    n = len(mesh)
    got = [math.inf] * n
    got[origin] = 0.0
    work: list[deque[tuple[str, int]]] = [deque() for _ in range(n)]  # ("send"|"recv", peer)
    finishing: list[tuple[float, int]] = []  # (virtual time its head job ends, node)
    wires: list[tuple[float, int, int]] = []  # (arrives at, to, from)
    now = v = 0.0

    def begin(i: int) -> None:
        kind, _ = work[i][0]
        heapq.heappush(finishing, (v + (cost.send_s if kind == "send" else cost.recv_s), i))

    work[origin].extend(("send", j) for j in sorted(mesh[origin]))
    if work[origin]:
        begin(origin)
    while finishing or wires:
        busy = len(finishing)
        speed = min(1.0, cost.cores / (busy + cost.background)) if busy else 1.0
        ends = now + (finishing[0][0] - v) / speed if finishing else math.inf
        if wires and wires[0][0] <= ends:
            t, to, frm = heapq.heappop(wires)
            v, now = v + (t - now) * speed, t
            work[to].append(("recv", frm))
            if len(work[to]) == 1:
                begin(to)
            continue
        v, i = heapq.heappop(finishing)
        now = ends
        kind, peer = work[i].popleft()
        if kind == "send":
            heapq.heappush(wires, (now + rtt(i, peer) / 2 + cost.wire_s, peer, i))
        elif got[i] == math.inf:
            got[i] = now
            work[i].extend(("send", j) for j in sorted(mesh[i]) if j not in (peer, origin))
        if work[i]:
            begin(i)
    return got


def gossip_delivery(
    links: list[Link],
    rng: random.Random,
    cost: GossipCost,
    rtt: Callable[[Link, Link], float] = path_rtt,
    mesh: list[set[int]] | None = None,
) -> list[float]:
    """Seconds from node 0 publishing until each other node has the message, on
    ``links`` (their RTTs), a ``gossip_mesh`` drawn with ``rng`` unless ``mesh`` is given."""
    mesh = gossip_mesh(len(links), rng) if mesh is None else mesh
    return deliver(mesh, cost, lambda i, j: rtt(links[i], links[j]))[1:]
