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
  thing at a time, in the order the work came: ``publish_s`` once on the publisher
  (sealing, signing), ``send_s`` for each copy it sends (protobuf, yamux, Noise, a socket
  write), ``first_s`` for the first copy it receives (read and checked: two signature
  checks and the node's own, until its handler has it) and ``recv_s`` for each duplicate
  (read, decrypted and parsed before pubsub sees it has the message), and ``wake_s`` each
  time work comes to a node that had none (its event loop wakes from its wait: copies
  that come while it works, or waits for a processor, are read in the same turn). A copy
  is on the link for half the path's RTT.
- **Tasks** (``GossipCost.interleave``): a node takes its messages' work in turn, a job of
  each: trio's scheduler puts a task that awaits at the back of the line, py-libp2p's
  pubsub starts a task for each copy it reads, and a copy's sends on each await a write.
  So a copy that comes while a flood of other copies is being read waits through their
  reads between its sends (the tail of delivery on a busy machine).
- **Processors** (``GossipCost.cores``, ``slice_s``, ``tick_s``): the nodes share the
  machine's cores; a node with work waits for one in the order it became runnable and
  runs until it has no work, or until a scheduler tick after it has run its slice while
  another waits (Linux's EEVDF scheduler). A node's work on a message is a short burst
  after a sleep, so it mostly finishes before the next node starts. Other tasks on the machine are left out: the
  scheduler runs a task woken from sleep ahead of those that kept running. For nodes each
  on its own machine, ``cores = inf``: a node's work waits only for its own earlier work.
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.simulation.links import Link, path_rtt

MESH_DEGREE, MESH_LOW, MESH_HIGH = 6, 4, 12  # node/net/host.py: build_pubsub


@dataclass(frozen=True)
class GossipCost:
    """Seconds of one process's time per piece of its work on a message, the processors
    the processes share, and the delay of a copy that takes no processor (``wire_s``,
    beside half the RTT).

    - ``publish_s``: the publisher's own work before its first copy (sealing and signing);
    - ``send_s``: a copy sent (protobuf, yamux, Noise, a socket write);
    - ``first_s``: a copy received for the first time, read and checked until the node's
      handler has it (two signature checks, the node's own checks): delivery;
    - ``recv_s``: a duplicate received (read, decrypted and parsed before pubsub sees it
      has the message); ``first_s`` is ``recv_s`` unless given;
    - ``wake_s``: a node's event loop waking from its wait, charged when work comes to a
      node that had none (not to the publisher of the message whose delay is measured:
      its delay starts after it woke).

    ``cores``: the processors the nodes share (``inf``: each node on its own machine).
    ``slice_s`` and ``tick_s``: how long a node keeps a processor while others wait for
    one. Linux's scheduler (EEVDF, kernel 6.6 and later) lets a running task use its base
    slice (0.75 ms x (1 + log2 of the processors): 1.5 ms on 2) and preempts it at the
    first scheduler tick after that (``CONFIG_HZ`` 250 here: every 4 ms); a task that
    wakes does not cut a running one's slice short. A node's work on a message is a short
    burst after a sleep, so it mostly finishes what it has before the next one starts.

    ``interleave``: a node takes its tasks in turn, a job of each, rather than each
    task's jobs through before the next task's (trio's scheduler puts a task that awaits
    at the back of the line, and py-libp2p's pubsub starts a task for each copy it reads:
    a copy's sends on are spread among the reads of the copies that came meanwhile)."""

    send_s: float
    recv_s: float
    cores: float = math.inf
    wire_s: float = 0.0
    first_s: float | None = None
    publish_s: float = 0.0
    slice_s: float = 0.0015  # 0.75 ms x (1 + log2 of 2 cores): the kernel's default
    tick_s: float = 0.004  # CONFIG_HZ = 250 (this machine's kernel); 0: preempt at once
    tick_phase_s: float = 0.0  # when the first tick comes after the publish, less one tick
    wake_s: float = 0.0
    interleave: bool = True

    @property
    def first(self) -> float:
        return self.recv_s if self.first_s is None else self.first_s

    @classmethod
    def from_hop(cls, hop_s: float, cores: float = math.inf) -> GossipCost:
        """From one hop's delay on an idle pair (one send, one receive, no wait), all of it
        processor time: each side's share taken as half (the same layers, run in opposite
        directions)."""
        return cls(hop_s / 2, hop_s / 2, cores)


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


Message = tuple[float, int, list[set[int]]]  # (published at, by, on which mesh)
Burst = tuple[float, int, float]  # (at, by which node, processor seconds, its wake-up included)


def deliver(
    mesh: list[set[int]],
    cost: GossipCost,
    rtt: Callable[[int, int], float] = lambda i, j: 0.0,
    origin: int = 0,
    others: Sequence[Message] = (),
    busy: Sequence[Burst] = (),
) -> list[float]:
    """Seconds from ``origin`` publishing at 0 until each node's handler has the message
    (``inf`` for a node the mesh does not reach); the origin's own entry is 0. ``others``:
    other messages (say, presence heartbeats on their own topic's mesh) whose work shares
    the nodes' processors; they cost what this one does. ``busy``: the nodes' other work
    (say, their upkeep as measured), each burst a job of its own.

    A node does its work one job at a time (``publish``, a ``send`` to a peer, a ``recv``
    from a peer). Each message's work at a node is a task: a ``recv`` and, for a first
    copy, a ``send`` to each peer on; the ``publish`` and its sends; a burst of ``busy``.
    The node takes its tasks in turn, a job of each, new ones at the back of the line
    (``GossipCost.interleave``; off, each task's jobs run through, and a first copy's
    sends go behind the work that came meanwhile). A node with work waits for a free
    processor in the order it became runnable; on one, it runs its jobs until it has
    none, or until a tick came after it had run ``slice_s`` while another waits; it then
    goes to the back of the line once its job is done (a job is not split). Work that
    comes to a node with none starts with a ``wake`` (``wake_s``)."""
    n = len(mesh)
    messages: list[Message] = [(0.0, origin, mesh), *others]
    got = [[math.inf] * n for _ in messages]
    # each node's tasks, each its jobs: (kind, peer, msg)
    work: list[deque[deque[tuple[str, int, int]]]] = [deque() for _ in range(n)]
    ready: deque[int] = deque()  # runnable nodes waiting for a processor
    waiting = [False] * n  # in ``ready`` or on a processor
    events: list[tuple[float, int, int, int, int, int]] = []  # (at, seq, what, node, peer, msg)
    DONE, ARRIVAL, PUBLISH, BUSY = 0, 1, 2, 3
    seq = 0
    free = cost.cores
    began = [0.0] * n  # when the node took its processor

    def push(at: float, what: int, node: int, peer: int = -1, m: int = 0) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (at, seq, what, node, peer, m))

    def job_s(i: int) -> float:
        kind, _, m = work[i][0][0]
        if kind == "recv":
            return cost.first if got[m][i] == math.inf else cost.recv_s
        if kind == "busy":
            return busy[m][2]
        if kind == "wake":
            return cost.wake_s
        return cost.publish_s if kind == "publish" else cost.send_s

    def expired(start: float, now: float) -> bool:
        """A tick came after the slice that began at ``start`` ran out."""
        if cost.tick_s <= 0:
            return now >= start + cost.slice_s
        ticks = math.floor((now - cost.tick_phase_s) / cost.tick_s)
        return ticks * cost.tick_s + cost.tick_phase_s >= start + cost.slice_s

    def dispatch(now: float) -> None:
        nonlocal free
        while free >= 1 and ready:
            i = ready.popleft()
            free -= 1
            began[i] = now
            push(now + job_s(i), DONE, i)

    def runnable(i: int, now: float, wake: bool = True) -> None:
        if not waiting[i]:
            if wake and cost.wake_s > 0:
                work[i].appendleft(deque([("wake", -1, 0)]))
            waiting[i] = True
            ready.append(i)
            dispatch(now)

    for m, (at, by, _) in enumerate(messages):
        push(at, PUBLISH, by, m=m)
    for b, (at, by, _) in enumerate(busy):
        push(at, BUSY, by, m=b)
    while events:
        now, _, what, i, peer, m = heapq.heappop(events)
        if what == PUBLISH:
            got[m][i] = now
            sends = [("send", j, m) for j in sorted(messages[m][2][i])]
            work[i].append(deque([("publish", i, m), *sends]))
            runnable(i, now, wake=m > 0)
            continue
        if what == BUSY:
            work[i].append(deque([("busy", -1, m)]))
            runnable(i, now, wake=False)
            continue
        if what == ARRIVAL:
            work[i].append(deque([("recv", peer, m)]))
            runnable(i, now)
            continue
        task = work[i].popleft()
        kind, peer, m = task.popleft()
        if kind == "send":
            push(now + rtt(i, peer) / 2 + cost.wire_s, ARRIVAL, peer, i, m)
        if kind == "recv" and got[m][i] == math.inf:
            got[m][i] = now
            by, links = messages[m][1], messages[m][2]
            task.extend(("send", j, m) for j in sorted(links[i]) if j not in (peer, by))
            if task:  # its sends on: behind the work that came meanwhile
                work[i].append(task)
        elif task:  # in turn with the node's other tasks, or on at once
            (work[i].append if cost.interleave else work[i].appendleft)(task)
        if work[i] and (not ready or not expired(began[i], now)):
            push(now + job_s(i), DONE, i)  # it keeps its processor
            continue
        free += 1
        waiting[i] = False
        if work[i]:
            waiting[i] = True
            ready.append(i)
        dispatch(now)
    return got[0]


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
