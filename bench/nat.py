"""Homes behind real NATs: how often hole punching makes a direct path, how fast, and what
the direct path saves over the relay (issue #29). Root only (network namespaces).

    .venv/bin/python bench/nat.py [--tries 3] [--pings 20] [--json]

For each pair of home NATs (cone-cone, cone-random, random-random; tests/helpers/netns.py's
``NatLab``, routers dropping unsolicited connections as home routers do), ``--tries`` times
on a fresh lab: a bootstrap (the relay) and a validator in the public namespace (AutoNAT
needs two peers to call a home private) and one network-only node
(``--network-only``: discovery, gossip, relaying) in each home, all real processes. The
homes find they are private, reserve on the relay, meet through it and run DCUtR; a pair
counts as direct once each sees the other over a direct connection within ``--wait`` s.

Figures:
- ``direct_rate``: per pair, the share of tries that ended direct;
- ``punch_s_p50`` / ``punch_s_p95``: how long the successful hole punches took, from the
  first dial to a verified direct connection (each node's ``/status`` relay section);
- ``rtt_direct_ms`` / ``rtt_relayed_ms``: the median presence round trip (``POST /ping``)
  from one home to the other over the punched path (cone-cone) and over the relay
  (random-random), in the same run: the comparison, as ``relayed_over_direct``;
- ``relay_cpu_s_per_circuit``: the relay process's CPU seconds over the circuits it opened
  (its whole CPU: an upper bound, its idle work included), and
  ``relay_cpu_above_idle_s_per_circuit``: the same less its idle rate, measured for
  ``IDLE_S`` before the homes start (what remains also holds the homes' DHT, gossip,
  AutoNAT and reservations, not only the circuits);
- then one devnet step through NATs (``tests/helpers/natloop.py``, as tests/test_nat.py
  runs it: chain, bootstrap, validator-relay and trainer in public, a worker in two cone
  homes and a random one, the tiny model): ``accepted_from_nat``, accepted / judged
  batches of the NATed workers once each has one accepted and holds the trainer's new
  weights; ``relayed_bulk_bytes``, shard bytes a worker fetched from a peer only a relay
  joined it to (target 0), beside ``shard_bytes``, ``home_to_home_shard_bytes`` (what the
  two cone homes fetched from each other) and ``relay_bytes`` (all a relay copied:
  gossip, presence, DHT). ``--no-devnet`` skips it (both then null).
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node.cli.devnet import wait_ready  # noqa: E402
from tests.helpers.netns import PUBLIC_IP, NatLab, NsNode, joining, nat_reason  # noqa: E402

IDLE_S = 5.0  # seconds the relay's idle CPU is measured, per try
PAIRS = (("cone", "cone"), ("cone", "random"), ("random", "random"))
FLAGS = [
    "--net.heartbeat-interval",
    "0.5",
    "--net.peer-ttl",
    "6",
    "--net.discovery-interval",
    "0.5",
]
PING = (
    "import json,sys;from pathlib import Path;from node.cli.adminclient import admin_post;"
    "print(json.dumps(admin_post(Path(sys.argv[1]),'/ping',{'peer_id':sys.argv[2]})))"
)


def ping_ms(node: NsNode, peer: str) -> float | None:
    """One presence round trip from ``node`` (inside its namespace) to ``peer``."""
    res = subprocess.run(
        ["ip", "netns", "exec", node.ns, sys.executable, "-c", PING, str(node.data_dir), peer],
        capture_output=True,
        text=True,
        timeout=60,
    )
    try:
        reply = json.loads(res.stdout)
    except ValueError:
        return None
    ms = reply.get("rtt_ms") if isinstance(reply, dict) else None
    return float(ms) if isinstance(ms, (int, float)) else None


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (``ip netns exec`` execs the node: same pid)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0


def one_try(pair: tuple[str, str], wait: float, pings: int) -> dict:
    lab = NatLab(list(pair), drop_unsolicited=True)
    base = Path(tempfile.mkdtemp(prefix="natbench"))
    nodes: list[NsNode] = []
    try:
        boot = NsNode.start(lab.public, "relay", base, "bootstrap", PUBLIC_IP, FLAGS)
        nodes.append(boot)
        entry = joining(boot, FLAGS)
        # AutoNAT calls a node private once two peers failed to dial it back: a second
        # public node (the run's validator, say) besides the relay
        nodes.append(NsNode.start(lab.public, "public", base, "validator", PUBLIC_IP, entry))
        wait_ready(nodes[-1], 120)
        # the relay's idle cost (heartbeats, DHT, gossip with one peer), before any home
        idle_from, idle_cpu = time.monotonic(), cpu_seconds(boot.proc.pid)
        time.sleep(IDLE_S)
        homes_from, homes_cpu = time.monotonic(), cpu_seconds(boot.proc.pid)
        idle_rate = (homes_cpu - idle_cpu) / (homes_from - idle_from)
        homes = [
            NsNode.start(h.ns, f"home{i}", base, "inference", "0.0.0.0", entry)
            for i, h in enumerate(lab.homes, start=1)
        ]
        nodes += homes
        ids = [wait_ready(h, 120)["peer_id"] for h in homes]
        met = direct = None
        started = time.monotonic()
        while time.monotonic() - started < wait + 60:
            seen = [(h.status() or {}) for h in homes]
            links = [{p["peer_id"] for p in s.get("peers", []) if p.get("connected")} for s in seen]
            relayed = [set(s.get("relay", {}).get("relayed_peers", [])) for s in seen]
            joined = ids[1] in links[0] and ids[0] in links[1]
            if joined and met is None:
                met = time.monotonic()
            if joined and ids[1] not in relayed[0] and ids[0] not in relayed[1]:
                direct = True
                break
            if met is not None and time.monotonic() - met > wait:
                direct = False
                break
            time.sleep(0.5)
        seen = [(h.status() or {}) for h in homes]
        rtts = [ms for _ in range(pings) if (ms := ping_ms(homes[0], ids[1])) is not None]
        relay = (boot.status() or {}).get("relay", {})
        cpu_now = cpu_seconds(boot.proc.pid)
        above_idle = cpu_now - homes_cpu - idle_rate * (time.monotonic() - homes_from)
        return {
            "pair": "-".join(pair),
            "met": met is not None,
            "direct": bool(direct),
            "punch_s": [x for s in seen for x in s.get("relay", {}).get("punch_seconds", [])],
            "rtt_ms": statistics.median(rtts) if rtts else None,
            "relay_cpu_s": cpu_now,
            "relay_cpu_above_idle_s": max(0.0, above_idle),
            "circuits": relay.get("counts", {}).get("circuits opened", 0),
            "relayed_bytes": relay.get("counts", {}).get("relayed_bytes", 0),
        }
    finally:
        for n in nodes:
            n.stop(grace=20)
        lab.close()


def devnet_step() -> dict:
    """One trainer step of the work loop through NATs, and what it moved."""
    from node.cli.devnet import prepare_model
    from tests.helpers.natloop import nat_work_loop

    base = Path(tempfile.mkdtemp(prefix="natdevnet"))
    model = prepare_model(base / "model")
    started = time.monotonic()
    with nat_work_loop(base / "run", model) as loop:
        deadline = time.monotonic() + 900
        while loop.looped() is None and time.monotonic() < deadline:
            time.sleep(5)
        seen = {n.name: n.status() or {} for n in loop.nodes}
        work = [seen[w.name].get("inference") or {} for w in loop.workers]
        bulk = loop.bulk(seen)
        traded = loop.traded(loop.workers[0], loop.workers[1]) or {}
    accepted = sum(w.get("accepted", 0) for w in work)
    judged = accepted + sum(w.get("rejected", 0) + w.get("expired", 0) for w in work)
    return {
        "accepted_from_nat": round(accepted / judged, 3) if judged else None,
        "relayed_bulk_bytes": bulk["relayed_shard_bytes"],
        "shard_bytes": bulk["shard_bytes"],
        "relay_bytes": bulk["relay_bytes"],
        "home_to_home_shard_bytes": sum(traded.values()),
        "devnet_s": round(time.monotonic() - started, 1),
    }


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tries", type=int, default=3, help="fresh labs per NAT pair")
    ap.add_argument("--wait", type=float, default=30, help="seconds for a direct path once met")
    ap.add_argument("--pings", type=int, default=20, help="round trips timed per try")
    ap.add_argument("--no-devnet", action="store_true", help="skip the devnet step through NATs")
    ap.add_argument("--json", action="store_true", help="last line: one JSON object of figures")
    args = ap.parse_args()
    if (reason := nat_reason()) is not None:
        print(f"bench/nat.py cannot run here: {reason}", file=sys.stderr)
        return 2
    # a stop by signal still runs each try's finally: its nodes stopped, its lab removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    tries = []
    for pair in PAIRS:
        for n in range(args.tries):
            got = one_try(pair, args.wait, args.pings)
            tries.append(got)
            print(
                f"{got['pair']:>13} try {n + 1}: met={got['met']} direct={got['direct']} "
                f"punch_s={got['punch_s']} rtt_ms={got['rtt_ms']} "
                f"relay circuits={got['circuits']} relayed_bytes={got['relayed_bytes']}",
                flush=True,
            )
    rate = {
        "-".join(p): sum(t["direct"] for t in tries if t["pair"] == "-".join(p))
        / max(1, sum(1 for t in tries if t["pair"] == "-".join(p)))
        for p in PAIRS
    }
    punches = [x for t in tries for x in t["punch_s"]]
    direct_rtt = [t["rtt_ms"] for t in tries if t["direct"] and t["rtt_ms"] is not None]
    relayed_rtt = [t["rtt_ms"] for t in tries if not t["direct"] and t["rtt_ms"] is not None]
    rtt_d = statistics.median(direct_rtt) if direct_rtt else None
    rtt_r = statistics.median(relayed_rtt) if relayed_rtt else None
    circuits = sum(t["circuits"] for t in tries)
    out = {
        "direct_rate": rate,
        "punch_s_p50": percentile(punches, 0.5),
        "punch_s_p95": percentile(punches, 0.95),
        "rtt_direct_ms": rtt_d,
        "rtt_relayed_ms": rtt_r,
        "relayed_over_direct": round(rtt_r / rtt_d, 2) if rtt_d and rtt_r else None,
        "relay_cpu_s_per_circuit": (
            round(sum(t["relay_cpu_s"] for t in tries) / circuits, 3) if circuits else None
        ),
        "relay_cpu_above_idle_s_per_circuit": (
            round(sum(t["relay_cpu_above_idle_s"] for t in tries) / circuits, 3)
            if circuits
            else None
        ),
        "relayed_bulk_bytes": None,
        "accepted_from_nat": None,
        "tries": args.tries,
    }
    if not args.no_devnet:
        out.update(devnet_step())
    print(f"direct paths by NAT pair: {rate}")
    print(f"hole punch time: p50 {out['punch_s_p50']} s, p95 {out['punch_s_p95']} s")
    print(
        f"presence round trip home to home: direct {rtt_d} ms vs relayed {rtt_r} ms "
        f"(relayed / direct = {out['relayed_over_direct']})"
    )
    print(
        f"relay CPU per circuit: {out['relay_cpu_above_idle_s_per_circuit']} s above its idle "
        f"rate ({out['relay_cpu_s_per_circuit']} s with it: an upper bound)"
    )
    if not args.no_devnet:
        print(
            f"devnet step through NATs: accepted/judged batches of NATed workers "
            f"{out['accepted_from_nat']}; shard bytes from relayed peers "
            f"{out['relayed_bulk_bytes']} of {out['shard_bytes']} "
            f"({out['home_to_home_shard_bytes']} between the cone homes); relays copied "
            f"{out['relay_bytes']} B in all ({out['devnet_s']} s)"
        )
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
