"""Benchmark: joiners of a running run, with ``--bootstrap`` only (issue #53).

    .venv/bin/python bench/join.py [--joiners 3] [--shard-size 65536] [--json]

Real processes on 127.0.0.1 and the served development chain, the tiny base model
(``tests/helpers/joinrun.py``): the trainer of a run manifest (it serves the run's files
over SHARDCAST) and an appointed validator; then ``--joiners`` workers start at once, each
with a fresh data dir, a funded account and ``--bootstrap`` (the trainer) only: the
chain's URL comes from the run manifest. Per joiner:

- ``join_s``: seconds from its ``start`` to holding the model (the end of its pull of the
  run's files, checked: the pull's ``ended_at``); of it, ``pull_s`` the pull alone (the
  rest: the process starting, the manifest found, the node of the run up);
- ``first_accept_s``: seconds from its ``start`` to its first batch accepted on-chain (its
  own ``/status``, polled every second);

and over all of them ``origin_share``: the bytes they pulled from the trainer over all the
bytes they pulled (the issue's bound: at most 0.5 with 3 joiners). The trainer publishes
with ``--shard-size`` (64 KiB by default: the tiny model is about 50 shards; at the default
8 MiB it would be one shard, which only the trainer has at first).

``--json``: the last line is one JSON object with ``join_s``, ``first_accept_s`` (medians),
``origin_share`` and the per-joiner details.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from node.cli.devnet import admin_status  # noqa: E402
from tests.helpers.joinrun import ManifestRun  # noqa: E402

DEADLINE_S = 1800  # a loaded machine: generous, never a figure of merit


def tiny_model(out: Path) -> Path:
    """The test suite's tiny base policy (``QUICK``), from its cache under .cache/."""
    from node.engine.tinymodel import QUICK, build_tiny_model

    cache = Path(__file__).resolve().parent.parent / ".cache" / "models"
    path, _built = build_tiny_model(out, QUICK, cache_dir=cache)
    return Path(path)


def measure(base: Path, joiners: int, shard_size: int) -> dict[str, object]:
    model = tiny_model(base / "model")
    run = ManifestRun(base, model, trainer_flags=["--shardcast.shard-size", str(shard_size)])
    try:
        names = [f"joiner-{i}" for i in range(joiners)]
        for name in names:
            run.fund_joiner(name)
        started = {}
        nodes = {}
        for name in names:  # at once
            started[name] = time.time()
            nodes[name] = run.joiner(name)
        join_s: dict[str, float] = {}
        pull_s: dict[str, float] = {}  # of join_s, the pull itself (the rest: start, manifest)
        accept_s: dict[str, float] = {}
        pulls: dict[str, dict[str, object]] = {}
        deadline = time.monotonic() + DEADLINE_S
        while len(accept_s) < joiners:
            if time.monotonic() > deadline:
                raise SystemExit(f"bench/join.py: no first accepted batch in {DEADLINE_S} s")
            for name, node in nodes.items():
                if node.proc.poll() is not None:
                    raise SystemExit(f"{name} exited:\n{node.log_path.read_text()[-3000:]}")
                st = admin_status(node.data_dir, 5) or {}
                pull = (st.get("run_files") or {}).get("pull") or {}
                if name not in join_s and pull.get("state") == "complete":
                    join_s[name] = round(float(pull["ended_at"]) - started[name], 2)
                    pull_s[name] = float(pull["elapsed_s"])
                    pulls[name] = pull
                accepted = (st.get("inference") or {}).get("accepted") or 0
                if name not in accept_s and accepted >= 1:
                    accept_s[name] = round(time.time() - started[name], 1)
            time.sleep(1.0)
        origin = sum(
            int(p["peers"].get(run.trainer_peer, {}).get("bytes", 0)) for p in pulls.values()
        )  # type: ignore[attr-defined]
        total = sum(sum(int(v["bytes"]) for v in p["peers"].values()) for p in pulls.values())  # type: ignore[attr-defined]
        return {
            "joiners": joiners,
            "shard_size": shard_size,
            "join_s": statistics.median(join_s.values()),
            "first_accept_s": statistics.median(accept_s.values()),
            "origin_share": round(origin / total, 3) if total else None,
            "join_s_each": join_s,
            "pull_s_each": pull_s,
            "first_accept_s_each": accept_s,
            "bytes_pulled": total,
            "bytes_from_trainer": origin,
            "model_bytes": int(next(iter(pulls.values()))["total_bytes"]),  # type: ignore[call-overload]
        }
    finally:
        run.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--joiners", type=int, default=3)
    ap.add_argument("--shard-size", type=int, default=65536)
    ap.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-join-") as tmp:
        out = measure(Path(tmp), args.joiners, args.shard_size)
    print(
        f"{out['joiners']} joiners at once, the tiny model ({out['model_bytes']} bytes, shards "
        f"of {out['shard_size']}): join_s {out['join_s']} (median), first_accept_s "
        f"{out['first_accept_s']} (median), origin_share {out['origin_share']} (each pulling "
        f"from the trainer alone: 1.0, {out['origin_share']:.3f}x of it; one copy between "
        f"them: {1 / out['joiners']:.3f}); the pulls alone took {out['pull_s_each']} s"
    )
    if args.json:
        print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
