"""Experiment: does the network learn? Held-out accuracy against trainer step, measured.

    .venv/bin/python bench/learning.py [--steps 80] [--seeds 2] [--first-seed 0] [--configs k2,k0,central]
                                       [--inner-steps 2] [--out DIR] [--json]

Three configurations by default (``diloco2`` and ``diloco2-sparse`` on demand: ``--configs
k2,diloco2,diloco2-sparse``), the same number of trainer steps, the same base policy (``model
init``), the same held-out set (seeded; disjoint from training), the same generation
settings (tasks x samples per step, token budget, temperature) and the same GRPO code:

- ``k2``: the devnet (``intellect-node devnet``: chain, bootstrap, trainer, one validator,
  two workers, separate processes on 127.0.0.1) with ``--async-level 2``;
- ``k0``: the same devnet with ``--async-level 0`` (synchronous, on-policy);
- ``diloco2``: the devnet with two trainers in one DiLoCo group (``--trainers 2``, SPEC
  §21; ``--inner-steps`` H, async level 2): each trains on its half of the accepted
  batches, one trainer step is one outer step; issue #31's target: within 3 points of k2;
- ``diloco2-sparse``: ``diloco2`` with the group's pseudo-gradients sparse (``[diloco] quant
  = "sparse"``: the top ``sparse_k`` = 384 of every 4096 values at 2 bits, with error
  feedback, the all-gather of SPEC §15) and the outer settings chosen for it on the
  pretraining bench (``bench/diloco.py``, docs/benchmarks.md: outer lr 1.5, no momentum);
- ``central``: the centralized baseline (``node.training.central``): one process, no
  network, no proofs, no chain.

Each step trains on ``--tasks`` tasks x ``--group`` samples (the devnet: two workers with
half the tasks each, ``batches_per_step`` 2). The held-out set is evaluated at every step
(``HeldOut.evaluate``): sampled accuracy, the mean reward of ``--heldout-draws`` seeded
draws per task at the training temperature (the headline figure, as RL papers report it),
greedy accuracy beside it, and pass@k with k = ``--heldout-draws``. "Final accuracy" is the
mean of the last 5 evaluations of a run, averaged over seeds (per-seed and per-level values
printed too). It also reports each devnet role's share of
wall-clock time spent idle (the trainer waiting for accepted batches, workers waiting for
a step, back-pressure or weights, the validator waiting for work), from the nodes' last
status. Targets (issue #27): k2 lifts final held-out sampled accuracy by >= 15 points over
the base policy (stretch: 20) without lowering greedy accuracy (final greedy >= base greedy
- 2 points); k2 within 3 points of k0 and of central.

The runs train on ``--taskset`` (default ``RL_TASKSET``, arithmetic levels 2-3: the task mix
the ``model init`` base policy is built for; level 1, which that base solves 96-100% of the
time, is left out, as INTELLECT-2 left out tasks its base solved more than 80% of the time;
levels 2-3 are two thirds of ``arithmetic``'s draws). The held-out set is drawn from the same
task set, disjoint from training.

Before the runs it samples the base policy on the held-out set (``--base-samples`` draws per
task at T = 1) and prints, per level, the sampled accuracy, pass@group (the chance that a
GRPO group holds a right answer), the pass@group the same accuracy would give if it were
spread evenly over the tasks, and the best task's share of right draws. Measured on the
``model init`` base: level 2 0.156 / 0.71 / 0.93 / 0.72, level 3 0.277 / 0.78 / 0.99 / 0.92:
the right answers are concentrated on tasks the policy nearly knows, which RL sharpens.

Measured on this 2-core machine, alone, at the default length (80 steps, 2 seeds, 32 tasks
x 16 samples a step, lr 1e-4, held-out 50 per level, 8 draws; 79 min 46 s in all: k2 973 s,
k0 953 s, central 449 s per run):

    config   sampled (vs base)   per seed         greedy (vs base)   pass@8   level 2   level 3
    base     0.210                                0.290              0.700
    k2       0.429 (+21.9)       0.435, 0.423     0.514 (+22.4)      0.794    0.409     0.448
    k0       0.434 (+22.4)       0.424, 0.444     0.541 (+25.1)      0.767    0.425     0.442
    central  0.451 (+24.1)       0.464, 0.438     0.540 (+25.0)      0.801    0.439     0.463

k2 - k0: -0.5 points, k2 - central: -2.2 points (sampled). Idle share with k = 2: inference
0.75, validator 0.67, trainer 0.02 (k = 0: 0.75, 0.68, 0.08). The devnet runs are not
repeatable to the point (the async timing differs run to run): seed 0 gave k2 0.419 and k0
0.464 in an earlier run of the same code, 0.435 and 0.424 in this one; central (one
process) gives 0.464 both times. With k = 2 the trainer trained on batches one version old
(``versions_used``) and clipped almost nothing (``clip_frac`` below 0.4% over 20 steps).

``diloco2`` against ``k2``, seed 0 each, one run after the other alone on the machine (a
later session: its base policy was built again on a fresh machine and samples 0.310 on the
held-out set, greedy 0.460): k2 0.471 (+16.1 points; greedy 0.594; 911 s), diloco2 0.442
(+13.2; greedy 0.508; 1857 s, H = 2, outer lr 0.7, Nesterov 0.9, int8), so diloco2 - k2 =
-2.9 points, inside the 3 points issue #31 asks for, by a hair and on one seed. Its curve is
the noisier: 0.40 at step 27, down to 0.32 at step 41, then up to 0.44; k2 rose steadily.
``diloco2-sparse`` against ``k2`` (issue #57's target: within 3 points), ``--configs
k2,diloco2-sparse``, 80 steps, 2 seeds, one run alone on the machine (2026-12-06; the same
base as the line above: 0.310, greedy 0.460): k2 0.483 (+17.3 points; per seed 0.477,
0.489; greedy 0.611; 549 s a run), diloco2-sparse 0.501 (+19.1; per seed 0.502, 0.500;
greedy 0.591; 1517 s a run), so diloco2-sparse - k2 = +1.8 points sampled, -2.0 greedy.
The sparse group's trainers idled 48 % of the time (k2's trainer 3 %): an outer step waits
for both members' inner steps and the exchange.
Before the base policy and the settings were chosen (issue #27; the old base answered
levels 2-3 like lucky guesses, lr 3e-5, levels 1-3, greedy figures, 2 seeds), every
configuration lost 3-6 points: base 0.313, k2 0.275, k0 0.280, central 0.257.

Writes ``learning.png`` and ``learning.json`` into ``--out`` (default
``bench-learning/``). ``--json``: the last line is one JSON object with ``base_accuracy``,
``accuracy`` (config -> mean over seeds per evaluated step), ``final`` (config -> final
accuracy: ``final.diloco2`` beside ``final.k2`` when both run, ``final.diloco2-sparse``
beside ``final.diloco2`` and ``final.k2``), ``final_per_seed``,
``steps``, ``seconds`` (config -> mean wall-clock per run), ``base_sampling`` (level ->
the figures above) and ``idle_share`` (role -> share, k2 runs; ``idle_share_k0`` for k0).
``base_accuracy``, ``accuracy``, ``final`` and ``final_per_seed`` are sampled accuracy;
``greedy`` has the greedy figure (``base`` and config -> final), ``pass_at_k`` pass@k
(``base`` and config -> final) and ``per_level`` (config -> level -> final sampled
accuracy).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

LAST = 5  # evaluations averaged into the final accuracy


# ``dilocoT-sparse``: the group's settings (the outer ones as bench/diloco.py chose them)
SPARSE_GROUP = {
    "INTELLECT_NODE_DILOCO__QUANT": "sparse",
    "INTELLECT_NODE_DILOCO__OUTER_LR": "1.5",
    "INTELLECT_NODE_DILOCO__MOMENTUM": "0",
}


def devnet_shape(config: str) -> tuple[int, int]:
    """(async level, trainers) of a devnet configuration: ``kN``, ``dilocoT`` (T trainers
    in one DiLoCo group, async level 2) or ``dilocoT-sparse`` (the same, sparse)."""
    if config.startswith("diloco"):
        return 2, int(config[len("diloco") :].removesuffix("-sparse"))
    return int(config[1:]), 1


def devnet_group_env(config: str) -> dict[str, str]:
    """The trainers' extra settings of a devnet configuration (``dilocoT-sparse``'s)."""
    return dict(SPARSE_GROUP) if config.endswith("-sparse") else {}


def run_devnet_config(
    config: str,
    seed: int,
    steps: int,
    tasks: int,
    group: int,
    tokens: int,
    per_level: int,
    draws: int,
    lr: float,
    taskset: str,
    inner_steps: int = 2,
) -> tuple[list[dict[str, Any]], dict[str, float], float]:
    """One devnet run: its metrics lines, the roles' idle shares, its wall-clock."""
    from node.cli.devnet import run_devnet

    k, trainers = devnet_shape(config)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"bench-learning-{config}-") as tmp:
        base = Path(tmp)
        rc = run_devnet(
            base / "net",
            run_id=f"learning-{config}-s{seed}",
            inference=2,
            duration=3600,
            steps=steps,
            async_level=k,
            report=base / "report",
            quiet=True,
            trainers=trainers,
            inner_steps=inner_steps,
            env_extra={
                "INTELLECT_NODE_RUN__TASKSET": taskset,
                "INTELLECT_NODE_RUN__TASKS_PER_BATCH": str(max(1, tasks // 2)),
                "INTELLECT_NODE_RUN__GROUP_SIZE": str(group),
                "INTELLECT_NODE_RUN__MAX_NEW_TOKENS": str(tokens),
                "INTELLECT_NODE_TRAINER__HELDOUT_PER_LEVEL": str(per_level),
                "INTELLECT_NODE_TRAINER__HELDOUT_DRAWS": str(draws),
                "INTELLECT_NODE_TRAINER__EVAL_EVERY": "1",
                "INTELLECT_NODE_TRAINER__SEED": str(seed),
                "INTELLECT_NODE_TRAINER__LEARNING_RATE": str(lr),
                "INTELLECT_NODE_INFERENCE__MAX_UNJUDGED": "2",
                **devnet_group_env(config),
            },
        )
        if rc != 0:
            raise RuntimeError(f"the devnet ({config}, seed {seed}) did not finish {steps} steps")
        lines = [
            json.loads(x)
            for x in (base / "report" / "metrics.jsonl").read_text().splitlines()
            if x.strip()
        ]
        statuses = json.loads((base / "report" / "statuses.json").read_text())
    idle: dict[str, list[float]] = {}
    for st in statuses.values():
        for role in ("trainer", "inference", "validator"):
            share = ((st or {}).get(role) or {}).get("idle_share")
            if share is not None:
                idle.setdefault(role, []).append(float(share))
    shares = {role: sum(v) / len(v) for role, v in idle.items()}
    return lines, shares, time.monotonic() - started


def run_central_config(
    seed: int,
    steps: int,
    tasks: int,
    group: int,
    tokens: int,
    per_level: int,
    draws: int,
    lr: float,
    taskset: str,
) -> tuple[list[dict[str, Any]], float]:
    from node.training.central import CentralConfig, GenerationConfig, run
    from node.training.grpo import GRPOConfig

    started = time.monotonic()
    cfg = CentralConfig(
        steps=steps,
        seed=seed,
        taskset=taskset,
        gen=GenerationConfig(tasks_per_step=tasks, group_size=group, max_new_tokens=tokens),
        grpo=GRPOConfig(lr=lr),
        eval_every=1,
        heldout_per_level=per_level,
        heldout_draws=draws,
        heldout_max_new_tokens=tokens,
    )
    return run(cfg), time.monotonic() - started


def base_sampling(model: Path, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """The base policy's sampled accuracy and pass@group per held-out level."""
    import torch

    from node.engine import open_engine
    from node.training.heldout import HeldOut

    torch.set_num_threads(2)
    engine, tokenizer = open_engine(str(model), backend="torch", max_batch=64)
    heldout = HeldOut(args.taskset, per_level=args.heldout_per_level)
    stats = heldout.sample_stats(
        engine,
        tokenizer,
        samples=args.base_samples,
        k=args.group,
        max_new_tokens=args.max_new_tokens,
    )
    return {lv: {k: round(v, 4) for k, v in st.items()} for lv, st in stats.items()}


def curve(lines: list[dict[str, Any]], key: str = "heldout_sampled") -> dict[int, float]:
    """A run's evaluations: step -> the figure of ``metrics.jsonl`` field ``key``."""
    return {int(m["step"]): float(m[key]) for m in lines if m.get(key) is not None}


def level_curves(lines: list[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """A run's sampled accuracy per level: level -> step -> accuracy."""
    out: dict[str, dict[int, float]] = {}
    for m in lines:
        for level, v in (m.get("heldout_by_level") or {}).items():
            out.setdefault(level, {})[int(m["step"])] = float(v["sampled"])
    return out


def final(c: dict[int, float]) -> float:
    last = [c[s] for s in sorted(c)][-LAST:]
    return sum(last) / len(last)


def main() -> None:
    from node.tasks import RL_TASKSET
    from node.training.central import GenerationConfig
    from node.training.grpo import GRPOConfig

    gen = GenerationConfig()
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--steps", type=int, default=80, help="trainer steps per run (default 80)")
    ap.add_argument("--seeds", type=int, default=2, help="runs per configuration (default 2)")
    ap.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="the first run's seed (default 0; the runs take seeds first .. first + seeds - 1)",
    )
    ap.add_argument(
        "--configs",
        default="k2,k0,central",
        help="comma-separated: kN (the devnet, async level N), dilocoT (the devnet with T "
        "trainers in one DiLoCo group, async level 2), dilocoT-sparse (the same with sparse "
        "pseudo-gradients, outer lr 1.5, no momentum), central (default k2,k0,central)",
    )
    ap.add_argument(
        "--inner-steps",
        type=int,
        default=2,
        help="dilocoT, dilocoT-sparse: inner steps per outer step (H)",
    )
    ap.add_argument("--tasks", type=int, default=gen.tasks_per_step, help="tasks per step")
    ap.add_argument("--group", type=int, default=gen.group_size, help="samples per task")
    ap.add_argument("--max-new-tokens", type=int, default=gen.max_new_tokens)
    ap.add_argument("--heldout-per-level", type=int, default=50)
    ap.add_argument(
        "--heldout-draws",
        type=int,
        default=8,
        help="draws per held-out task for sampled accuracy and pass@k (default 8)",
    )
    ap.add_argument("--lr", type=float, default=GRPOConfig().lr)
    ap.add_argument(
        "--taskset",
        default=RL_TASKSET,
        help=f"the runs' task set (default {RL_TASKSET}: what the base policy is built for)",
    )
    ap.add_argument(
        "--base-samples",
        type=int,
        default=64,
        help="draws per held-out task when sampling the base policy (default 64, at least --group)",
    )
    ap.add_argument("--out", type=Path, default=Path("bench-learning"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    args.base_samples = max(args.base_samples, args.group)  # pass@group needs that many

    from node.cli.devnet import prepare_model

    with tempfile.TemporaryDirectory() as tmp:
        model = prepare_model(Path(tmp) / "model")  # built once per machine, then cached
        sampling = base_sampling(model, args)
    print(
        f"task set {args.taskset}"
        + (
            " (arithmetic's levels 2-3, two thirds of its draws: level 1 is left out, as "
            "INTELLECT-2 left out tasks its base solved more than 80% of the time)"
            if args.taskset == "arithmetic:2-3"
            else ""
        )
    )
    print(
        f"base policy sampled at T = 1 ({args.base_samples} draws per held-out task), "
        f"pass@{args.group} = the chance a group of {args.group} holds a right answer:"
    )
    for level, st in sampling.items():
        print(
            f"  level {level}: sampled {st['sampled']:.3f}  pass@{args.group} "
            f"{st['pass_at_k']:.2f}  (if spread evenly: {st['pass_at_k_if_even']:.2f})  "
            f"best task {st['best_task']:.2f}"
        )

    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    for c in configs:
        try:
            ok = c == "central" or devnet_shape(c)[1] >= 1
        except ValueError:
            ok = False
        if not ok:
            ap.error(f"unknown configuration {c!r}: kN, dilocoT, dilocoT-sparse or central")
    runs: dict[str, list[list[dict[str, Any]]]] = {c: [] for c in configs}  # lines per seed
    seconds: dict[str, list[float]] = {c: [] for c in configs}
    idle: dict[str, list[dict[str, float]]] = {c: [] for c in configs}
    shape = (
        args.steps,
        args.tasks,
        args.group,
        args.max_new_tokens,
        args.heldout_per_level,
        args.heldout_draws,
        args.lr,
        args.taskset,
    )
    nan = float("nan")
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for c in configs:
            print(f"learning: {c} seed {seed} ({args.steps} steps) ...", flush=True)
            if c == "central":
                lines, secs = run_central_config(seed, *shape)
            else:
                lines, shares, secs = run_devnet_config(c, seed, *shape, args.inner_steps)
                idle[c].append(shares)
            runs[c].append(lines)
            seconds[c].append(secs)
            acc, greedy = curve(lines), curve(lines, "heldout_greedy")
            print(
                f"learning: {c} seed {seed}: sampled base {acc.get(0, nan):.3f}, final "
                f"{final(acc):.3f}; greedy base {greedy.get(0, nan):.3f}, final "
                f"{final(greedy):.3f} ({secs:.0f} s)",
                flush=True,
            )

    def figures(key: str) -> tuple[float, dict[str, float], dict[str, list[dict[int, float]]]]:
        """The base figure (step 0, every run), each config's final (mean over seeds), and
        the runs' curves of ``metrics.jsonl`` field ``key``."""
        curves = {c: [curve(r, key) for r in rs] for c, rs in runs.items()}
        base_values = [r[0] for rs in curves.values() for r in rs if 0 in r]
        finals = {c: sum(final(r) for r in rs) / len(rs) for c, rs in curves.items()}
        return sum(base_values) / len(base_values), finals, curves

    base, finals, curves = figures("heldout_sampled")
    base_greedy, finals_greedy, greedy_curves = figures("heldout_greedy")
    base_pass, finals_pass, _ = figures("heldout_pass_at_k")
    per_level: dict[str, dict[str, float]] = {}
    for c, rs in runs.items():
        by_level = [level_curves(r) for r in rs]
        levels = sorted(set.intersection(*(set(b) for b in by_level)))
        per_level[c] = {lv: sum(final(b[lv]) for b in by_level) / len(rs) for lv in levels}

    def mean_curve(cs: list[dict[int, float]]) -> tuple[list[int], list[float]]:
        steps = sorted(set.intersection(*(set(r) for r in cs)))
        return steps, [sum(r[s] for r in cs) / len(cs) for s in steps]

    mean_sampled = {c: mean_curve(curves[c]) for c in configs}
    mean_greedy = {c: mean_curve(greedy_curves[c]) for c in configs}
    per_seed = {c: [round(final(r), 4) for r in rs] for c, rs in curves.items()}

    def mean_shares(rows: list[dict[str, float]]) -> dict[str, float]:
        roles = {r for row in rows for r in row}
        return {r: round(sum(row.get(r, 0.0) for row in rows) / len(rows), 3) for r in roles}

    k = args.heldout_draws
    print()
    print(
        f"held-out accuracy ({args.taskset}), {args.steps} steps, {args.seeds} seeds: sampled "
        f"({k} draws per task at the training temperature; the headline), greedy beside it, "
        f"pass@{k}"
    )
    print(f"base policy: sampled {base:.3f}, greedy {base_greedy:.3f}, pass@{k} {base_pass:.3f}")
    print(
        f"{'config':<14} {'sampled':>7} {'vs base':>8}  {'greedy':>6} {'vs base':>8}  "
        f"{'pass@' + str(k):>7}  sampled per seed  s/run"
    )
    for c in configs:
        print(
            f"{c:<14} {finals[c]:>7.3f} {100 * (finals[c] - base):>+7.1f}pt  "
            f"{finals_greedy[c]:>6.3f} {100 * (finals_greedy[c] - base_greedy):>+7.1f}pt  "
            f"{finals_pass[c]:>7.3f}  {str(per_seed[c]):<17} "
            f"{sum(seconds[c]) / len(seconds[c]):>5.0f}"
        )
    print("final sampled accuracy per level:")
    for c in configs:
        print(f"  {c:<14} " + "  ".join(f"level {lv} {v:.3f}" for lv, v in per_level[c].items()))
    pairs = (
        ("k2", "k0"),
        ("diloco2", "k2"),
        ("diloco2-sparse", "diloco2"),
        ("diloco2-sparse", "k2"),  # issue #57's target: within 3 points
        ("k2", "central"),
    )
    for a, b in pairs:
        if a in finals and b in finals:
            print(f"{a} - {b}: {100 * (finals[a] - finals[b]):+.1f} points (sampled)")
    for c in configs:
        if idle[c]:
            print(f"idle share ({c}): {mean_shares(idle[c])}")
    print("sampled accuracy per step (mean over seeds):")
    for c in configs:
        print(f"  {c:<14} " + " ".join(f"{v:.2f}" for v in mean_sampled[c][1]))

    args.out.mkdir(parents=True, exist_ok=True)
    from node.cli.devnet import plot_curves

    png = plot_curves(
        {
            c: [
                {"step": s, "heldout_sampled": v, "heldout_greedy": g}
                for s, v, g in zip(*mean_sampled[c], mean_greedy[c][1], strict=True)
            ]
            for c in configs
        },
        args.out / "learning.png",
        title=f"held-out accuracy (sampled, greedy), mean of {args.seeds} seeds",
    )
    result = {
        "base_accuracy": round(base, 4),
        "accuracy": {c: [round(v, 4) for v in mean_sampled[c][1]] for c in configs},
        "final": {c: round(v, 4) for c, v in finals.items()},
        "final_per_seed": per_seed,
        "greedy": {"base": round(base_greedy, 4)}
        | {c: round(v, 4) for c, v in finals_greedy.items()},
        "pass_at_k": {"base": round(base_pass, 4)}
        | {c: round(v, 4) for c, v in finals_pass.items()},
        "per_level": {
            c: {lv: round(v, 4) for lv, v in levels.items()} for c, levels in per_level.items()
        },
        "steps": args.steps,
        "seeds": args.seeds,
        "first_seed": args.first_seed,
        "seconds": {c: round(sum(v) / len(v), 1) for c, v in seconds.items()},
        "base_sampling": sampling,
        "idle_share": mean_shares(idle.get("k2") or []),
        "idle_share_k0": mean_shares(idle.get("k0") or []),
        "settings": {
            "taskset": args.taskset,
            "tasks_per_step": args.tasks,
            "group_size": args.group,
            "max_new_tokens": args.max_new_tokens,
            "heldout_per_level": args.heldout_per_level,
            "heldout_draws": args.heldout_draws,
            "lr": args.lr,
        },
    }
    (args.out / "learning.json").write_text(json.dumps(result, indent=1))
    print(f"plot: {png}")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
