"""Benchmark: the network simulator (bench/simulation/) checked against the real SHARDCAST
swarm in the same run, then its predictions at scale.

    .venv/bin/python bench/sim.py [--json] [--full] [--out DIR] [--skip-real] [--sizes 1,62]

1. **Validation.** The swarm bench (``bench/shardcast.py``'s ``swarm``: one origin and N
   downloader node processes on 127.0.0.1, every node's upload capped at ``--cap`` MB/s)
   runs for N = 10 and 30 (and 50 with ``--full``); the simulator then predicts the same
   swarm: the same cap, shard size and checkpoint, each downloader starting when the real
   one's job started (``start_offsets``, measured). Calibrated only from figures measured
   apart from those predicted: the cap (configured), the per-piece verify-and-write cost
   (``piece_cost``: SHA-256 and a ``pwrite`` + ``fdatasync`` of one shard, in this run)
   and the job start times. Figures: the time until every downloader completes, the mean
   completion time, and the origin's egress in copies; ``ratio`` = predicted / measured.
2. **Predictions** for N = 100, 1,000, 10,000 home workers (bench/simulation/links.py:
   the distributions and their sources) and a datacenter trainer, versions of 1 GB and
   62 GB split into ``--pieces`` pieces (fewer, larger pieces than the node's 8 MiB: the
   time a version takes is set by the links, the piece count sets the pipeline's depth;
   ``pieces_sensitivity`` reruns N = 1,000 with twice the pieces), against a single origin
   and a relay tree on the same links and trainer uplink; announcement delivery over the
   gossip mesh, DHT lookup hops, presence pacing, and the async level, validators and
   chain load they imply.
   **Judging** (``bench/simulation/judging.py``): V validators, each running the node's
   ``JudgingQueue``, fed by N workers a batch every ``BATCH_S`` each; the backlog, the time
   from submission to verdict and the keys lost, per N, V and check cost, and the smallest
   V that keeps up as ``[validator] judge = "assigned"`` (``validators_needed``, ``JUDGES``
   a batch; the rate bound is ``validators_formula``; as ``judge = "all"``, none keeps up:
   ``validators_if_judging_all``), and assigned validators some of which are down, or all
   of which leave mid-run and come back (``validator_churn``). **Churn**: the N = 1,000, 1 GB swarm with downloaders leaving
   and coming back (``links.CHURN``) beside the same swarm without.
3. **The schedule fix**: the same N = 100 and 1,000 swarms with the plan's peer rules as
   they were (``bench/simulation/legacy.py``) and as they are.
PNG spread curves go to ``--out`` (default: a new temporary directory).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.simulation import links as L  # noqa: E402
from bench.simulation.baselines import relay_tree, single_origin  # noqa: E402
from bench.simulation.derived import (  # noqa: E402
    async_level_needed,
    chain_load,
    dht_lookup_hops,
    gossip_delivery,
    heartbeat_period,
    validators_needed,
)
from bench.simulation.judging import (  # noqa: E402
    BATCH_BYTES,
    BLOCK_S,
    CONFIRMATIONS,
    FETCH_DEADLINE,
    VERDICT_WINDOW,
    JudgingConfig,
    JudgingResult,
    keeps_up,
    run_judging,
)
from bench.simulation.judging import validators_needed as judged_needed  # noqa: E402
from bench.simulation.legacy import legacy_plan  # noqa: E402
from bench.simulation.swarm import SwarmConfig, SwarmResult, run_swarm  # noqa: E402

MiB = 1024 * 1024
GB = 1e9
# measured elsewhere, quoted (docs/benchmarks.md): gas per rollout batch is submit_work +
# accept + 1/256 of a 256-entry claim = 3,484 gas x 64 rollouts (bench/ledger.py,
# 2026-12-01); the check cost of a GPU validator per batch over a worker's generation of it:
# 0.46 on the devnet's tiny policy (the highest of three runs), 1.15 for a 1.1B model
# (bench/gpu_devnet.py --probe 1.1b)
GAS_PER_BATCH = 3484 * 64
TX_PER_BATCH = 2 + 1 / 256
CHECK_COST = {"tiny_policy": 0.46, "1.1b": 1.15}
# assumptions, stated: seconds a worker takes per rollout batch, and a trainer step
BATCH_S = 60.0
STEP_S = {1: 60.0, 62: 600.0}
RELAYS, RELAY_UP = 8, L.DC_RATE
# judging as [validator] judge = "assigned": quorum + 1 judges a batch, the development
# chain's quorum being 2 (node/cli/ledger.py dev_params)
JUDGES = 3
MAX_VALIDATORS = 65_000  # ledger/contracts/WorkLedger.vy MAX_VALIDATORS
ASSIGNED_HORIZON_S = 4 * 3600.0  # batches made for 4 h (one validator simulated: cheap)
# validators down: N = 20 workers (what 64 validators judge at the tiny policy's cost),
# 40 validators, of which none, a quarter and half never run
DOWN_WORKERS, DOWN_VALIDATORS, DOWN = 20, 40, (0, 10, 20)
CHECK_FAIL = (0.1, 0.3)  # and a share of the judgements that cannot finish, all running
# and all of them leaving and coming back (stated assumptions: a validator restarted about
# hourly, away ~5 minutes, exponential; and the file sharers' churn of links.CHURN, the
# pessimistic bound: away about half the time)
VALIDATOR_CHURN = {
    "restarts_1h_5min": L.Churn(1.0, 3600.0, 1.0, 300.0),
    "file_sharers": L.CHURN,
}
CHURN_UNTIL_S = (
    6 * 3600.0
)  # churn: the run stops here  # the relay tree: 8 datacenter relays at 10 Gbit/s


def piece_cost(shard: int) -> float:
    """Seconds to verify and store one shard as the downloader does (SHA-256, pwrite,
    fdatasync), the median of 5, in this run."""
    data = os.urandom(shard)
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        fd = os.open(Path(tmp) / "p", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            for i in range(5):
                t = time.perf_counter()
                hashlib.sha256(data).digest()
                os.pwrite(fd, data, i * shard)
                os.fdatasync(fd)
                times.append(time.perf_counter() - t)
        finally:
            os.close(fd)
    return statistics.median(times)


def predict_bench(
    n: int, cap: float, total: int, shard: int, starts: list[float], seeds: int
) -> dict[str, float]:
    """The simulator's figures for the swarm bench, the mean over ``seeds`` runs."""
    overhead = piece_cost(shard)
    shards = math.ceil(total / shard)
    runs = []
    for seed in range(seeds):
        cfg = SwarmConfig(shards=shards, shard_bytes=shard, seed=seed, piece_overhead=overhead)
        cfg.read_timeout = 20.0  # the bench's --net.read-timeout
        origin = L.Link(up=cap, down=1e12)
        downs = [L.Link(up=cap, down=1e12, start=s) for s in starts]
        runs.append(run_swarm(cfg, origin, downs))
    return {
        "swarm_seconds": statistics.mean(r.percentile(1.0) for r in runs),
        "mean_done_seconds": statistics.mean(statistics.mean(r.fraction_times()) for r in runs),
        "origin_egress_ratio": statistics.mean(r.origin_uploaded / total for r in runs),
        "piece_overhead_s": overhead,
    }


def validate(ns: list[int], cap_mb: float, mib: int, shard_mib: int, seeds: int) -> dict:  # type: ignore[type-arg]
    from bench import shardcast as sb

    sb.MEET_TIMEOUT = 400.0
    sb.SHARD[:] = ["--shardcast.shard-size", str(shard_mib * MiB)]
    out: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        total = sb.make_checkpoint(base / "ckpt", mib)
        for n in ns:
            load_before = os.getloadavg()[0]
            real = sb.swarm(base / f"swarm{n}", base / "ckpt", total, n, cap_mb)
            load = round(max(load_before, os.getloadavg()[0]), 1)
            starts = sorted(real["start_offsets"].values())  # type: ignore[attr-defined]
            done = list(real["done_offsets"].values())  # type: ignore[attr-defined]
            if len(starts) < n:
                out[f"n{n}"] = {"error": f"only {len(starts)} of {n} completed", "load": load}
                continue
            pred = predict_bench(n, cap_mb * 1e6, total, shard_mib * MiB, starts, seeds)
            measured = {
                "swarm_seconds": float(real["swarm_seconds"]),  # type: ignore[arg-type]
                "mean_done_seconds": statistics.mean(done),
                "origin_egress_ratio": float(real["origin_egress_ratio"]),  # type: ignore[arg-type]
            }
            # not a validated figure: the machine under the real swarm (no ratio)
            busy: dict[str, float] = real["busy_cores"]  # type: ignore[assignment]
            out[f"n{n}_busy_cores"] = {**busy, "cores": float(os.cpu_count() or 1)}
            for key, value in measured.items():
                out[f"n{n}_{key}"] = {
                    "predicted": round(pred[key], 3),
                    "measured": round(value, 3),
                    "ratio": round(pred[key] / value, 3),
                    "load": load,
                }
            print(
                f"  N={n}: spread {pred['swarm_seconds']:.1f} s predicted, "
                f"{measured['swarm_seconds']:.1f} measured; origin egress "
                f"{pred['origin_egress_ratio']:.2f} / {measured['origin_egress_ratio']:.2f} "
                f"(load {load}, piece cost {pred['piece_overhead_s'] * 1000:.1f} ms, busy "
                f"cores {busy['at_rest']} at rest, {busy['spreading']} spreading)",
                file=sys.stderr,
            )
    return out


def workers(n: int, seed: int) -> list[L.Link]:
    rng = random.Random(seed)
    return [L.home_link(rng) for _ in range(n)]


def scale_config(size: float, pieces: int, seed: int, plan=None) -> SwarmConfig:  # type: ignore[no-untyped-def]
    cfg = SwarmConfig(
        shards=pieces,
        shard_bytes=int(size / pieces),
        seed=seed,
        region_rtt_ms=L.REGION_RTT_MS,
        loss=L.LOSS,
        relay_rate=L.RELAY_RATE,
    )
    if plan is not None:
        cfg.plan_factory = plan
    return cfg


def path_caps(origin: L.Link, downs: list[L.Link], same_region: bool) -> list[float]:
    """Each worker's own limit on an HTTP download: its downlink and its path's TCP rate
    (from the trainer, or from a relay in its own region)."""
    caps = []
    for d in downs:
        src = L.Link(origin.up, origin.down, origin.rtt, d.region if same_region else 0)
        caps.append(min(d.down, L.mathis_cap(L.path_rtt(src, d), L.LOSS)))
    return caps


def pct(times: list[float], q: float) -> float:
    s = sorted(times)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def triple(times: list[float]) -> dict[str, float]:
    return {f"p{int(q * 100)}": round(pct(times, q), 1) for q in (0.5, 0.9, 1.0)}


def predictions(  # type: ignore[type-arg]
    ns: list[int], sizes: list[float], pieces: int, seed: int, exact_up_to: int
) -> dict:
    out: dict[str, dict[str, object]] = {
        k: {}
        for k in (
            "spread_s",
            "origin_upload_gb",
            "relay_tree_spread_s",
            "single_origin_spread_s",
            "curves",
            "sim_wall_s",
            "wasted_copies",
        )
    }
    trainer = L.trainer_link()
    for n in ns:
        downs = workers(n, seed)
        for gb in sizes:
            key = f"n{n}_{gb:g}gb"
            p = pieces if n <= 1000 else max(8, pieces // 4)
            base = f"n{n}_{sizes[0]:g}gb"
            if gb != sizes[0] and n > exact_up_to:
                # the first size's run, times and bytes scaled by the size ratio: with the
                # same piece count a version's times are those of its links (checked at
                # N <= exact_up_to, where both sizes run: "size_scaling" in the JSON)
                k = gb / sizes[0]
                times = [t * k for t in out["curves"][base]["swarm"]]  # type: ignore[index]
                out["origin_upload_gb"][key] = round(out["origin_upload_gb"][base] * k, 2)  # type: ignore[operator]
                out["spread_s"][key] = triple(times) | {"pieces": p, "scaled_from": base}
                out["wasted_copies"][key] = out["wasted_copies"][base]
                out["sim_wall_s"][key] = 0.0
            else:
                t = time.perf_counter()
                r = run_swarm(scale_config(gb * GB, p, seed), trainer, downs)
                out["sim_wall_s"][key] = round(time.perf_counter() - t, 1)
                times = r.fraction_times()
                out["spread_s"][key] = triple(times) | {"pieces": p}
                out["origin_upload_gb"][key] = round(r.origin_uploaded / GB, 2)
                out["wasted_copies"][key] = round(r.wasted / r.total_bytes, 2)
            single = single_origin(gb * GB, trainer.up, path_caps(trainer, downs, False))
            tree = relay_tree(
                gb * GB, trainer.up, RELAYS, RELAY_UP, path_caps(trainer, downs, True)
            )
            out["single_origin_spread_s"][key] = triple(single)
            out["relay_tree_spread_s"][key] = triple(tree)
            out["curves"][key] = {"swarm": times, "relay_tree": tree, "single_origin": single}
            print(
                f"  {key}: p50/p90/p100 {triple(times)} (relay tree {triple(tree)}, single "
                f"origin {triple(single)}); origin {out['origin_upload_gb'][key]} GB; "
                f"{out['sim_wall_s'][key]} s",
                file=sys.stderr,
            )
    for n in ns:
        if n <= exact_up_to and len(sizes) > 1:
            a, b = out["spread_s"][f"n{n}_{sizes[0]:g}gb"], out["spread_s"][f"n{n}_{sizes[1]:g}gb"]
            k = sizes[1] / sizes[0]
            out.setdefault("size_scaling", {})[f"n{n}"] = {  # simulated / scaled
                q: round(b[q] / (a[q] * k), 3)  # type: ignore[index]
                for q in ("p50", "p90", "p100")
            }
    return out


def sensitivity(size: float, pieces: int, seed: int) -> dict[str, object]:
    downs = workers(1000, seed)
    out: dict[str, object] = {}
    for p in (pieces, 2 * pieces):
        r = run_swarm(scale_config(size, p, seed), L.trainer_link(), downs)
        out[f"pieces_{p}"] = triple(r.fraction_times())
    return out


def fix_comparison(ns: list[int], size: float, pieces: int, seed: int) -> dict[str, object]:
    out: dict[str, object] = {}
    for n in ns:
        downs = workers(n, seed)
        after = run_swarm(scale_config(size, pieces, seed), L.trainer_link(), downs)
        limit = 5 * after.percentile(1.0)
        cfg = scale_config(size, pieces, seed, plan=legacy_plan)
        cfg.until = limit
        before = run_swarm(cfg, L.trainer_link(), downs)
        out[f"n{n}_{size / GB:g}gb"] = {
            "before": describe(before, limit),
            "after": describe(after, limit),
        }
    return out


def describe(r: SwarmResult, limit: float) -> dict[str, object]:
    times = r.fraction_times()
    return {
        **{k: (v if v != math.inf else f"> {limit:.0f}") for k, v in triple(times).items()},
        "never_completed": sum(1 for t in times if t == math.inf),
        "stalled_fetches": r.stalled,
        "wasted_copies": round(r.wasted / r.total_bytes, 2),
    }


def judging(ns: list[int], seed: int) -> dict[str, object]:
    """The judging queue simulated (bench/simulation/judging.py), per N and check cost: as
    ``[validator] judge = "all"`` (every validator judges every batch: V = 1, 3, 10 as N
    allows, since more validators that each judge everything cannot keep up where one does
    not), and as ``judge = "assigned"`` (``JUDGES`` a batch), its smallest V searched; then
    assigned validators some of which never run (``down``)."""
    out: dict[str, object] = {}
    for n in ns:
        horizon = min(600.0, max(30.0, 100_000 / n))  # real mode: its walks are O(backlog)
        most = 10 if n <= 100 else 3 if n <= 1000 else 1
        row: dict[str, object] = {}
        for name, cost in CHECK_COST.items():
            t = time.perf_counter()
            v_all, every = judged_needed(
                n, cost, judges=None, most=most, horizon_s=horizon, seed=seed
            )
            v_assigned, assigned = judged_needed(
                n, cost, judges=JUDGES, most=60 * n, horizon_s=ASSIGNED_HORIZON_S, seed=seed
            )
            row[name] = {
                "validators_needed": v_assigned,
                "within_contract": v_assigned is not None and v_assigned <= MAX_VALIDATORS,
                "assigned_at_needed": (
                    None if v_assigned is None else assigned[v_assigned].summary()
                ),
                "judging_all_validators_needed": v_all,
                "every_validator_judges_all": {
                    f"v{v}": r.summary() | {"horizon_s": horizon} for v, r in every.items()
                },
                "validators_formula": validators_needed(n, cost, JUDGES),
                "sim_wall_s": round(time.perf_counter() - t, 1),
            }
            r1 = every[1].summary()
            print(
                f"  judging n{n} {name}: judging all: V=1..{max(every)} "
                f"p99 {r1['p99_s']} s, bounded {r1['bounded']}, lost {every[1].lost()} of "
                f"{r1['batches']} -> needed {v_all}; assigned ({JUDGES} a batch): "
                f"{v_assigned} (formula {validators_needed(n, cost, JUDGES)}); "
                f"{row[name]['sim_wall_s']} s",  # type: ignore[index]
                file=sys.stderr,
            )
        out[f"n{n}"] = row
    out["validators_down"] = validators_down(seed)
    out["check_failures"] = check_failures(seed)
    out["validator_churn"] = validator_churn(seed)
    out["assumptions"] = {
        "batch_bytes": BATCH_BYTES,
        "block_s": BLOCK_S,
        "confirmations": CONFIRMATIONS,
        "verdict_window_s": VERDICT_WINDOW,
        "fetch_deadline_s": FETCH_DEADLINE,
        "batch_s": BATCH_S,
        "judges": JUDGES,
        "max_validators": MAX_VALIDATORS,
        "assigned_horizon_s": ASSIGNED_HORIZON_S,
        "validator_link": "10 Gbit/s datacenter, region 0",
    }
    return out


def assigned_with(seed: int, **fault: object) -> tuple[JudgingResult, dict[str, object]]:
    """``DOWN_VALIDATORS`` assigned validators (each simulated, the node's ranking and
    backups), ``DOWN_WORKERS`` workers at the tiny policy's check cost, with ``fault``
    (``down``, ``check_fail`` or ``churn``): the run and its summary."""
    cfg = JudgingConfig(
        DOWN_WORKERS,
        DOWN_VALIDATORS,
        CHECK_COST["tiny_policy"],
        judges=JUDGES,
        horizon_s=ASSIGNED_HORIZON_S,
        seed=seed,
        **fault,
    )
    r = run_judging(cfg)
    return r, r.summary() | {"keeps_up": keeps_up(r)}


def check_failures(seed: int) -> dict[str, object]:
    """All running, with a share ``CHECK_FAIL`` of the judgements unable to finish (the
    weights never came, the checker failed): the real queue fetches and judges them again
    after its back-off, or gives them up."""
    out: dict[str, object] = {}
    for fail in CHECK_FAIL:
        r, row = assigned_with(seed, check_fail=fail)
        out[f"fail{fail:g}"] = row
        print(
            f"  judging: {fail:.0%} of judgements fail: p50 {row['p50_s']} s, p99 "
            f"{row['p99_s']} s, {r.check_failures} failed, {r.given_up} given up, "
            f"backups took {r.backups_taken}, lost {r.lost()} of {len(r.batches)}",
            file=sys.stderr,
        )
    return out


def validator_churn(seed: int) -> dict[str, object]:
    """The validators leaving mid-run and coming back as restarted nodes
    (``JudgingConfig.churn``): what is lost and how late the verdicts come."""
    out: dict[str, object] = {}
    for name, churn in VALIDATOR_CHURN.items():
        r, row = assigned_with(seed, churn=churn)  # type: ignore[arg-type]
        out[name] = row
        print(
            f"  judging: {DOWN_VALIDATORS} validators churning ({name}), {DOWN_WORKERS} "
            f"workers: p50 {row['p50_s']} s, p99 {row['p99_s']} s, {r.departures} departures, "
            f"backups took {r.backups_taken}, {r.fetch_failures} fetches failed, lost "
            f"{r.lost()} of {len(r.batches)}",
            file=sys.stderr,
        )
    return out


def validators_down(seed: int) -> dict[str, object]:
    """Some of the validators never running (``DOWN``): what the backups take and what it
    costs in time."""
    out: dict[str, object] = {}
    for down in DOWN:
        r, row = assigned_with(seed, down=down)
        out[f"down{down}"] = row
        print(
            f"  judging: {down} of {DOWN_VALIDATORS} validators down, {DOWN_WORKERS} workers: "
            f"p50 {row['p50_s']} s, p99 {row['p99_s']} s, backups took {r.backups_taken} of "
            f"{len(r.batches)}, lost {r.lost()}",
            file=sys.stderr,
        )
    return out


def churn(n: int, size: float, pieces: int, seed: int, plain: dict[str, float]) -> dict:  # type: ignore[type-arg]
    """The swarm of ``n`` workers with churn (links.CHURN), beside ``plain`` (without)."""
    t = time.perf_counter()
    cfg = scale_config(size, pieces, seed)
    cfg.churn, cfg.until = L.CHURN, CHURN_UNTIL_S
    r = run_swarm(cfg, L.trainer_link(), workers(n, seed))
    online = {
        f"p{int(q * 100)}": (round(x, 1) if math.isfinite(x := r.online_spread(q)) else "none")
        for q in (0.5, 0.9, 1.0)
    }
    out = {
        "online_spread_s": online,
        "no_churn_spread_s": plain,
        "all_workers_s": {
            k: (v if math.isfinite(v) else "none") for k, v in triple(r.fraction_times()).items()
        },
        "never_completed": sum(1 for x in r.done_at if x is None),
        "departures": r.departures,
        "fetches_failed_by_churn": r.churn_failed,
        "origin_upload_gb": round(r.origin_uploaded / GB, 2),
        "until_s": CHURN_UNTIL_S,
        "churn": {
            "session_weibull_k_scale_s": [L.CHURN.session_shape, L.CHURN.session_scale],
            "down_weibull_k_scale_s": [L.CHURN.down_shape, L.CHURN.down_scale],
        },
        "sim_wall_s": round(time.perf_counter() - t, 1),
    }
    print(
        f"  churn n{n}_{size / GB:g}gb: online p50/p90/p100 {online} (no churn {plain}); "
        f"{r.departures} departures, {r.churn_failed} fetches failed by it, "
        f"{out['never_completed']} never completed; {out['sim_wall_s']} s",
        file=sys.stderr,
    )
    return out


# why the swarm trails the relay tree (docs/simulation.md, "The swarm against the relay
# tree"): measured by the simulator, not assumed
RELAY_TREE_WHY = (
    "the relay tree's 8 datacenter relays at 10 Gbit/s are uplink the swarm does not have: "
    "it moves a version over home uplinks, each split among 4 uploads and held to its "
    "path's loss-bound TCP rate; coarse pieces (32 a version, 8 at N = 10,000, to keep the "
    "run short) widen the gap: with the node's own 8 MiB shards it is 1.18x at N = 1,000, "
    "not 1.48x (docs/simulation.md)"
)


def versus(result: dict) -> dict:  # type: ignore[type-arg]
    """p90 of the swarm against the relay tree and the single origin, per N and size: the
    ratios (above 1: the baseline is faster) and one line that says which is faster, by how
    much and why."""
    out: dict[str, object] = {}
    for key, swarm in result["spread_s"].items():
        tree = result["relay_tree_spread_s"][key]["p90"]
        single = result["single_origin_spread_s"][key]["p90"]
        ratio_tree, ratio_single = swarm["p90"] / tree, swarm["p90"] / single
        line = (
            f"{key}: 90% of workers in {swarm['p90'] / 3600:.2f} h by the swarm, "
            f"{tree / 3600:.2f} h by the relay tree, {single / 3600:.2f} h by a single origin"
        )
        if ratio_tree > 1:
            line += f"; the swarm is {ratio_tree:.2f}x slower than the relay tree: {RELAY_TREE_WHY}"
        out[key] = {
            "swarm_over_relay_tree_p90": round(ratio_tree, 3),
            "swarm_over_single_origin_p90": round(ratio_single, 3),
            "says": line,
        }
        print(f"  {line}", file=sys.stderr)
    return out


def derived(
    ns: list[int],
    spread: dict[str, dict[str, float]],
    sizes: list[float],
    seed: int,
    judged: dict[str, object] | None = None,
) -> dict:  # type: ignore[type-arg]
    rng = random.Random(seed)
    out: dict[str, dict[str, object]] = {
        k: {}
        for k in (
            "announcement_p99_s",
            "dht_hops",
            "heartbeat_period_s",
            "async_level_needed",
            "validators_needed",
            "validators_formula",
            "validators_if_judging_all",
            "chain_tx_per_s",
            "gas_per_day",
        )
    }
    for n in ns:
        downs = [L.trainer_link(), *workers(n, seed)]
        delivery = gossip_delivery(downs, rng)
        out["announcement_p99_s"][f"n{n}"] = round(pct(delivery, 0.99), 3)
        hops = dht_lookup_hops(n, rng, lookups=100)
        out["dht_hops"][f"n{n}"] = {"mean": round(statistics.mean(hops), 2), "max": max(hops)}
        out["heartbeat_period_s"][f"n{n}"] = heartbeat_period(n)
        for gb in sizes:
            s = spread[f"n{n}_{gb:g}gb"]
            out["async_level_needed"][f"n{n}_{gb:g}gb"] = {
                "p90": async_level_needed(s["p90"], STEP_S[int(gb)]),
                "p100": async_level_needed(s["p100"], STEP_S[int(gb)]),
                "step_s": STEP_S[int(gb)],
            }
        out["validators_formula"][f"n{n}"] = {
            k: validators_needed(n, v, JUDGES) for k, v in CHECK_COST.items()
        }
        if judged is not None and f"n{n}" in judged:  # simulated (None: no V keeps up)
            row = judged[f"n{n}"]
            out["validators_needed"][f"n{n}"] = {
                k: row[k]["validators_needed"]  # type: ignore[index]
                for k in CHECK_COST
            }
            out["validators_if_judging_all"][f"n{n}"] = {
                k: row[k]["judging_all_validators_needed"]  # type: ignore[index]
                for k in CHECK_COST
            }
        load = chain_load(n, BATCH_S, GAS_PER_BATCH, TX_PER_BATCH)
        out["chain_tx_per_s"][f"n{n}"] = round(load["tx_per_s"], 2)
        out["gas_per_day"][f"n{n}"] = round(load["gas_per_day"])
    return out


def plot(curves: dict[str, dict[str, list[float]]], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for size in sorted({k.split("_")[1] for k in curves}):
        fig, ax = plt.subplots(figsize=(7, 4), dpi=80)
        for key, designs in sorted(curves.items()):
            if key.split("_")[1] != size:
                continue
            for name, style in (("swarm", "-"), ("relay_tree", "--"), ("single_origin", ":")):
                times = sorted(t for t in designs[name] if t != math.inf)
                n = len(designs[name])
                ax.plot(
                    [t / 3600 for t in times],
                    [(i + 1) / n for i in range(len(times))],
                    style,
                    label=f"{key.split('_')[0]} {name}",
                )
        ax.set_xscale("log")
        ax.set_xlabel("hours after publish")
        ax.set_ylabel("fraction of workers holding the version")
        ax.set_title(f"A {size} version reaching home workers")
        ax.legend(fontsize=6)
        path = out / f"spread_{size}.png"
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        written.append(str(path))
    return written


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    ap.add_argument("--full", action="store_true", help="validate at 50 nodes too")
    ap.add_argument("--skip-real", action="store_true", help="no real swarm: predictions only")
    ap.add_argument("--out", default=None, help="where the PNGs go (default: a temp dir)")
    ap.add_argument("--cap", type=float, default=1.0, help="validation: upload cap, MB/s")
    ap.add_argument("--mib", type=int, default=32, help="validation: checkpoint MiB")
    ap.add_argument("--shard-mib", type=int, default=1, help="validation: shard MiB")
    ap.add_argument("--seeds", type=int, default=5, help="validation: simulated runs averaged")
    ap.add_argument("--nodes", default="100,1000,10000", help="predictions: worker counts")
    ap.add_argument("--sizes", default="1,62", help="predictions: version sizes, GB")
    ap.add_argument("--pieces", type=int, default=32, help="predictions: pieces a version")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--exact-up-to",
        type=int,
        default=100,
        help="simulate every size up to this N; above it, scale the first size's times",
    )
    ap.add_argument(
        "--thorough",
        action="store_true",
        help="also: N=1,000 with twice the pieces, and the schedule fix at N=1,000",
    )
    ap.add_argument(
        "--real-nodes", default="10,30", help="validation: swarm and gossip network sizes to run"
    )
    ap.add_argument(
        "--save-gossip",
        default=None,
        help="validation: write the measured gossip networks to this file "
        "(python -m bench.simulation.gossipcheck --load FILE predicts them again)",
    )
    ap.add_argument(
        "--skip-gossip",
        action="store_true",
        help="validation: the swarm only, not announcement delivery (gossipcheck.py)",
    )
    args = ap.parse_args()
    ns = [int(x) for x in args.nodes.split(",")]
    sizes = [float(x) for x in args.sizes.split(",")]
    out_dir = Path(args.out or tempfile.mkdtemp(prefix="sim-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, object] = {}
    if not args.skip_real:
        print(f"validation (uptime load {os.getloadavg()[0]:.1f}):", file=sys.stderr)
        real = [int(x) for x in args.real_nodes.split(",")] + ([50] if args.full else [])
        result["validation"] = validate(real, args.cap, args.mib, args.shard_mib, args.seeds)
        if not args.skip_gossip:
            from bench.simulation.gossipcheck import validate_gossip

            print("gossip validation:", file=sys.stderr)
            gossip = validate_gossip(
                [int(x) for x in args.real_nodes.split(",")],
                save=Path(args.save_gossip) if args.save_gossip else None,
            )
            result["validation"].update(gossip)  # type: ignore[attr-defined]
            for key, entry in gossip.items():
                if "ratio" in entry:
                    print(
                        f"  {key}: {entry['predicted'] * 1000:.1f} ms predicted, "
                        f"{entry['measured'] * 1000:.1f} measured (ratio {entry['ratio']}, "
                        f"load {entry['load']})",
                        file=sys.stderr,
                    )
    print("predictions:", file=sys.stderr)
    pred = predictions(ns, sizes, args.pieces, args.seed, args.exact_up_to)
    curves = pred.pop("curves")
    result.update(pred)
    if 1000 in ns and args.thorough:
        result["pieces_sensitivity"] = sensitivity(sizes[0] * GB, args.pieces, args.seed)
    result["schedule_fix"] = fix_comparison(
        [n for n in ns if n <= (1000 if args.thorough else 100)],
        sizes[0] * GB,
        args.pieces,
        args.seed,
    )
    print("judging:", file=sys.stderr)
    result["judging"] = judging(ns, args.seed)
    if 1000 in ns:
        print("churn:", file=sys.stderr)
        key = f"n1000_{sizes[0]:g}gb"
        result["churn"] = {
            key: churn(1000, sizes[0] * GB, args.pieces, args.seed, result["spread_s"][key])  # type: ignore[index]
        }
    result["swarm_vs_baselines"] = versus(result)  # type: ignore[arg-type]
    judged = result["judging"]
    result.update(derived(ns, result["spread_s"], sizes, args.seed, judged))  # type: ignore[arg-type]
    result["pngs"] = plot(curves, out_dir)
    result["assumptions"] = {
        "trainer_up_MBps": L.TRAINER_UP / 1e6,
        "home_tiers_share_down_up_Mbit": L.HOME_TIERS,
        "nat_share": L.NAT_SHARE,
        "loss": L.LOSS,
        "relay_MBps": L.RELAY_RATE / 1e6,
        "relay_tree": {"relays": RELAYS, "relay_up_MBps": RELAY_UP / 1e6},
        "batch_s": BATCH_S,
        "step_s": STEP_S,
    }
    print(json.dumps(result, indent=1), file=sys.stderr)
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
