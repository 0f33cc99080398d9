"""Announcement delivery over gossip: the simulator's model (``gossip.py``) checked against
real node processes on 127.0.0.1, in one run.

    .venv/bin/python -m bench.simulation.gossipcheck [--ns 10,30] [--count 20] [--json]

``measure(n)``: ``n`` node processes (``bench/workers/gossip_probe.py``: the real binary,
its gossipsub settings and paced publisher, with a probe in place of a role) meet through
the first one, settle into the announce topic's mesh, and then the first node announces
``count`` times, ``spacing`` seconds apart (far below its pacer's rate: none waits). Each
receiver stamps each arrival; a delay runs from ``Node.announce`` on the publisher to the
receiver's handler (pacing, signing, every hop's read, check and forward included).

``predict(n, cost)``: ``gossip.py``'s model of the same network (one machine's loopback:
no RTT; the node processes share its cores), calibrated only from figures measured apart
from the delays predicted: one hop's delay on a 2-node network of the same run
(``calibrate``), the cores of this machine, and the mesh the nodes had grafted (read from
each before publishing). ``validate_gossip`` also gives it on ``gossip_mesh``'s meshes
from the configured degrees, and with a copy's processor time from the nodes' CPU
counters (their CPU over the announcements, less their idle rate, per copy sent and
received on their mesh: ``copies``). The machine's run queue is sampled for the record
(``run_queue``).

``validate_gossip(ns)``: both, for each ``n``, as ``bench/sim.py``'s validation entries.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench.simulation.gossip import GossipCost, copies, deliver, gossip_mesh
from bench.workers.gossip_probe import TOPIC
from node.cli.adminclient import admin_post
from node.cli.devnet import NodeProcess, p2p_addr, spawn_node, stop_all, wait_ready
from node.net.convergence import problems

RUN = "gossipcheck"
BATCH = 5  # nodes started at once (bench/scale.py's rule: a loaded machine imports slowly)
NODE_ARGS = ["--net.connect-timeout", "10", "--net.read-timeout", "20"]
MESH_TIMEOUT = 240.0  # seconds the nodes get to meet and graft their meshes
SETTLE_S = 5.0  # seconds of each window that judges whether the nodes are settled
SETTLE_RATIO, SETTLE_LIMIT = 3.0, 180.0  # settled: no node above 3x the median's CPU
# after the last announcement: long enough for a presence heartbeat (5 s) and the sync
# repair it starts (2 s grace), so an announcement gossip lost still arrives, and counts
LINGER_S = 15.0
# seconds between announcements, per node in the network: one announcement's copies (each
# node sends one to each mesh peer) must be through before the next, or each waits behind
# the last one's; at N = 30 on 2 cores, 0.5 s apart, they piled up to seconds
SPACING_PER_NODE = 0.05


@dataclass
class Delivery:
    """What one real network did: a delay per (receiver, announcement) that arrived."""

    n: int
    count: int
    delays: list[float]
    missing: int  # (receiver, announcement) pairs that never arrived
    via: dict[str, int]  # how they arrived: "gossip" / "sync" (the nodes' own counters)
    mesh: list[list[int]]  # each node's mesh peers on the announce topic (node indices)
    # runnable tasks on the machine, sampled while the settled network sat idle before
    # publishing (``run_queue``): the nodes' own upkeep and whatever else the machine runs
    queue: list[int]
    load: float  # the 1-minute load average, the higher of before and after
    # "cpu": the nodes' CPU in cores (median and busiest node settled, all idle) and the
    # processor seconds a copy cost ("copy_s")
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def runnable(self) -> float:
        return statistics.mean(self.queue)

    @property
    def delivered(self) -> float:
        return len(self.delays) / (len(self.delays) + self.missing)

    def figures(self) -> dict[str, float]:
        return {
            "p50_s": quantile(self.delays, 0.5),
            "p99_s": quantile(self.delays, 0.99),
            "max_s": max(self.delays),
            "delivered": self.delivered,
        }


def quantile(xs: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (``bench/sim.py``'s ``pct``)."""
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, int(q * len(s) + 0.999999) - 1))]


def run_queue(seconds: float, every: float = 0.05) -> list[int]:
    """Samples, every ``every`` s for ``seconds``, of the number of runnable tasks on this
    machine (the kernel's count in ``/proc/loadavg``) less this sampling process itself:
    the work that a node's own work shares the processors with."""
    samples = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        running = Path("/proc/loadavg").read_text().split()[3].split("/")[0]
        samples.append(max(0, int(running) - 1))
        time.sleep(every)
    return samples


def cpu_seconds(procs: list[psutil.Process]) -> float:
    """User and system CPU seconds of ``procs`` so far."""
    return sum(sum(p.cpu_times()[:2]) for p in procs)


def settle(nodes: list[NodeProcess]) -> dict[str, float]:
    """Wait until no node is still starting up (connecting, handshaking, filling its DHT
    table: a node at it took seconds to relay each announcement): the busiest node's CPU
    over ``SETTLE_S`` under ``SETTLE_RATIO`` x the median node's, or ``SETTLE_LIMIT`` s.
    Returns the last window's CPU, in cores: the median node's and the busiest's."""
    procs = [psutil.Process(x.proc.pid) for x in nodes]
    deadline = time.monotonic() + SETTLE_LIMIT
    while True:
        before = [sum(p.cpu_times()[:2]) for p in procs]
        time.sleep(SETTLE_S)
        used = sorted(
            (sum(p.cpu_times()[:2]) - b) / SETTLE_S for p, b in zip(procs, before, strict=True)
        )
        median, busiest = statistics.median(used), used[-1]
        if busiest <= SETTLE_RATIO * median + 0.02 or time.monotonic() > deadline:
            return {"median": round(median, 3), "busiest": round(busiest, 3)}


def spawn(base: Path, name: str, bootstrap: list[str]) -> NodeProcess:
    return spawn_node(
        name,
        "bootstrap",
        base,
        run_id=RUN,
        listen="/ip4/127.0.0.1/tcp/0",
        bootstrap=bootstrap,
        extra=NODE_ARGS,
        module="bench.workers.gossip_probe",
    )


def probe(node: NodeProcess) -> dict[str, Any]:
    st = node.status(timeout=30)
    if st is None:
        raise RuntimeError(f"{node.name} does not answer")
    return st


def wait_for(pred: Any, timeout: float, what: str, interval: float = 1.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(interval)
    raise RuntimeError(f"timed out waiting for {what}")


def measure(
    n: int, count: int = 20, spacing: float | None = None, base: Path | None = None
) -> Delivery:
    """Start ``n`` real nodes, let them settle, have the first announce ``count`` times
    ``spacing`` s apart (default ``SPACING_PER_NODE * n``, at least 0.5 s), and collect
    every receiver's arrival times. Every process started here is stopped here, on error
    and Ctrl-C too."""
    spacing = max(0.5, SPACING_PER_NODE * n) if spacing is None else spacing
    own = base is None
    base = Path(tempfile.mkdtemp(prefix=f"gossipcheck-{n}-")) if base is None else base
    load0 = os.getloadavg()[0]
    nodes: list[NodeProcess] = []
    try:
        nodes.append(spawn(base, "n0", []))
        addr = p2p_addr(wait_ready(nodes[0], timeout=300))
        for first in range(1, n, BATCH):
            batch = [spawn(base, f"n{i}", [addr]) for i in range(first, min(n, first + BATCH))]
            nodes += batch
            for node in batch:
                wait_ready(node, timeout=300)
        low = min(4, n - 1)  # gossipsub's degree_low (node/net/host.py)

        left: list[str] = []

        def meshed() -> bool:
            sts = [probe(x) for x in nodes]
            left[:] = problems(sts) + [
                f"{x.name} knows {len(st['peers'])} peers, {len(st['gossip_probe']['mesh'])} "
                "in its mesh"
                for x, st in zip(nodes, sts, strict=True)
                if len(st["peers"]) < n - 1 or len(st["gossip_probe"]["mesh"]) < low
            ]
            return not left

        try:
            wait_for(meshed, MESH_TIMEOUT, f"{n} nodes to meet and graft")
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}: {len(left)} left, e.g. {'; '.join(left[:5])}") from None
        cpu = settle(nodes)
        sts = [probe(x) for x in nodes]
        index = {st["peer_id"]: i for i, st in enumerate(sts)}
        mesh = [sorted(index[p] for p in st["gossip_probe"]["mesh"] if p in index) for st in sts]
        publisher = sts[0]["peer_id"]
        procs = [psutil.Process(x.proc.pid) for x in nodes]
        idle0, t0 = cpu_seconds(procs), time.monotonic()
        queue = run_queue(SETTLE_S)
        idle1 = busy0 = cpu_seconds(procs)
        t1 = time.monotonic()
        bodies = [f"a{k}-0" for k in range(count)]
        for k in range(count):
            admin_post(nodes[0].data_dir, "/announce", {"topic": TOPIC, "body": f"a{k}-"})
            time.sleep(spacing)
        busy = cpu_seconds(procs) - busy0 - (idle1 - idle0) / (t1 - t0) * (time.monotonic() - t1)
        sent = copies([set(m) for m in mesh])
        cpu |= {
            "idle": round((idle1 - idle0) / (t1 - t0), 3),
            "copy_s": round(max(busy, 0.0) / (count * 2 * sent), 6),
        }

        def arrivals() -> list[dict[str, Any]]:
            return [probe(x) for x in nodes]

        def complete(sts: list[dict[str, Any]]) -> bool:
            return all(
                f"{publisher} {b}" in st["gossip_probe"]["arrived"]
                for st in sts[1:]
                for b in bodies
            )

        deadline = time.monotonic() + LINGER_S
        sts = arrivals()
        while not complete(sts) and time.monotonic() < deadline:
            time.sleep(1.0)
            sts = arrivals()
        published = sts[0]["gossip_probe"]["published"]
        delays, missing = [], 0
        via: dict[str, int] = {}
        for st in sts[1:]:
            got = st["gossip_probe"]["arrived"]
            for b in bodies:
                t = got.get(f"{publisher} {b}")
                if t is None:
                    missing += 1
                else:
                    delays.append(t - published[b])
            for path, c in st["announcements"]["delivered_via"].items():
                via[path] = via.get(path, 0) + c
        load = round(max(load0, os.getloadavg()[0]), 2)
        return Delivery(n, count, delays, missing, via, mesh, queue, load, {"cpu": cpu})
    finally:
        stop_all(nodes, grace=20)
        if own:
            import shutil

            shutil.rmtree(base, ignore_errors=True)


def predict(
    n: int, cost: GossipCost, seeds: int = 20, seed: int = 0, mesh: list[list[int]] | None = None
) -> list[float]:
    """The simulator's delays for a network of ``n`` nodes on one machine's loopback (no
    RTT), node 0 publishing: every receiver's delivery time on ``mesh`` (a real network's,
    as ``Delivery.mesh`` records it) or, without one, in each of ``seeds`` random meshes
    (``gossip_mesh``: the node's configured degrees), pooled."""
    if mesh is not None:
        return deliver([set(peers) for peers in mesh], cost)[1:]
    out: list[float] = []
    for s in range(seeds):
        out += deliver(gossip_mesh(n, random.Random(seed * 1000 + s)), cost)[1:]
    return out


def calibrate(pair: Delivery) -> float:
    """One hop's delay (a send, a receive and the wire between, nothing waiting): a
    2-node network's median. The other work on the machine is left out of it, as out of
    the prediction: Linux's scheduler runs a task woken from sleep ahead of those that
    kept running (it may preempt them), and a node's work on a message is a short burst
    after a sleep; the nodes share the cores among themselves (``GossipCost.cores``)."""
    return quantile(pair.delays, 0.5)


def validate_gossip(ns: list[int], count: int = 20, seeds: int = 20) -> dict[str, dict[str, Any]]:
    """Measure a 2-node network (the calibration) and then each network of ``ns``; for
    each ``n``: ``{f"n{n}_announcement_{q}_s": {"predicted", "measured", "ratio", "load"}}``
    for q in p50, p99 and max (``ratio`` = predicted / measured), and
    ``f"n{n}_announcement_delivered"`` (the fraction that arrived: measured only, the
    model assumes 1), as ``bench/sim.py``'s validation entries.

    ``predicted``: the whole hop taken as processor time, half to each copy sent and half
    to each copy received (``GossipCost.from_hop``), on the nodes' own mesh; beside it
    ``predicted_on_model_mesh`` (on ``gossip_mesh``'s) and ``predicted_cpu_split`` (a
    copy's processor time as the nodes' CPU counters gave it, the rest of the hop on the
    wire: ``GossipCost.from_hop_and_cpu``; the counters are noisy beyond ~10 nodes, whose
    idle upkeep outweighs the gossip)."""
    out: dict[str, dict[str, Any]] = {}
    cores = float(os.cpu_count() or 1)
    pair = measure(2, count)
    hop = calibrate(pair)
    out["announcement_hop_s"] = {
        "measured": round(hop, 5),
        "pair_p50_s": round(quantile(pair.delays, 0.5), 5),
        "runnable": round(pair.runnable, 2),
        "load": pair.load,
    }
    for n in ns:
        real = measure(n, count)
        cost = GossipCost.from_hop(hop, cores)
        pred = predict(n, cost, mesh=real.mesh)
        model_mesh = predict(n, cost, seeds)
        split = GossipCost.from_hop_and_cpu(hop, real.extra["cpu"]["copy_s"], cores)
        cpu_split = predict(n, split, mesh=real.mesh)
        got = real.figures()
        for q, key in ((0.5, "p50"), (0.99, "p99"), (1.0, "max")):
            p, m = quantile(pred, q), got[f"{key}_s"]
            out[f"n{n}_announcement_{key}_s"] = {
                "predicted": round(p, 4),
                "measured": round(m, 4),
                "ratio": round(p / m, 3),
                "load": real.load,
                "predicted_on_model_mesh": round(quantile(model_mesh, q), 4),
                "predicted_cpu_split": round(quantile(cpu_split, q), 4),
            }
        out[f"n{n}_announcement_delivered"] = {
            "measured": round(real.delivered, 4),
            "via": real.via,
            "mesh_degree_mean": round(statistics.mean(len(m) for m in real.mesh), 2),
            "model_mesh_degree_mean": round(
                statistics.mean(len(m) for m in gossip_mesh(n, random.Random(0))), 2
            ),
            "runnable": round(real.runnable, 2),
            "cpu": real.extra.get("cpu"),  # cores: median and busiest node, all idle; copy_s
            "load": real.load,
        }
        print(
            f"  N={n}: p50 {out[f'n{n}_announcement_p50_s']}, p99 "
            f"{out[f'n{n}_announcement_p99_s']}, delivered {real.delivered:.3f} {real.via}",
            file=sys.stderr,
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ns", default="10,30", help="network sizes to run (default 10,30)")
    ap.add_argument("--count", type=int, default=20, help="announcements per network")
    ap.add_argument("--seeds", type=int, default=20, help="simulated meshes per prediction")
    ap.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    args = ap.parse_args()
    print(f"gossip validation (load {os.getloadavg()[0]:.1f}):", file=sys.stderr)
    result = validate_gossip([int(x) for x in args.ns.split(",")], args.count, args.seeds)
    print(json.dumps(result, indent=1), file=sys.stderr)
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
