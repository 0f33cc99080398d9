"""Benchmark: adversaries through the real network (issue 28): every cheat detected and
slashed, no honest slash, no lost or double-counted work.

    .venv/bin/python bench/adversarial.py [--trials 1] [--attacks a,b,...] [--honest 2]
        [--fuzz N] [--faults --seed S] [--json]

Real processes on 127.0.0.1 and the served development chain, the tiny base model
(``tests/helpers/matrix.py``): a bootstrap, the trainer, one validator (every rollout
recomputed, ``strict-fp32``), ``--honest`` honest workers and one cheating worker per group
of the catalogue (``tests/helpers/cheating/catalogue.py``, SPEC §19.1), each cycling through its
cheats one batch each until every attack was made ``--trials`` times. Then the clock stops,
every verdict lands, the chain's clock is moved past the challenge period and every worker
is settled. Printed, from the chain's events, the workers' records and the trainer's state:

attack -> trials, detected (rejected with the reason SPEC §19.1 gives), slashed (exactly its
collateral taken at settlement), trained (by the trainer; must be 0); then honest false
slashes (honest batches rejected or slashed), lost work (honest batches without an accept on
the chain: rejected, or never judged) and double-counted work (submissions with more than
one verdict event); for information, honest accepted batches the trainer had not trained on
when it was stopped (it stops as soon as the matrix is done). The comparison: detection rate of the network against the baseline of no
checking (every batch accepted: 0 of the attacks detected).

Two sections other modules fill when they are present (loaded from their files):
``fuzz`` (decoder -> {inputs, crashes}) from ``bench/fuzz.py``'s ``run(inputs) -> dict``
with ``--fuzz N``, and ``faults`` (kind -> injected) from a ``bench/chaos.py`` run
(``run(seed, ...) -> dict``, the same model, ``--fault-steps`` trainer steps) with
``--faults``, its books in ``fault_books``. Absent modules are reported as such. The
totals of honest false slashes, lost and double-counted work are the matrix's plus the
chaos run's (each part also on its own: ``matrix``, ``fault_books``).

``--json``: the last line is one JSON object with ``attacks`` (name -> {trials, detected,
slashed, trained}), ``honest_false_slashes``, ``lost_work``, ``double_counted_work``,
``honest_batches``, ``detection_rate``, ``untried_attacks``, ``matrix``, ``fuzz``, ``faults``, ``fault_books``
and ``seconds``. Exit status 1 unless every attack was tried on-chain and detected, nothing honest was
slashed, lost or counted twice, no fuzz input crashed and the chaos run's books are exact.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
BENCH = Path(__file__).resolve().parent


def cheater_groups(attacks: list[str]) -> dict[str, str]:
    """The default cheater processes, restricted to ``attacks``; groups left empty go."""
    from tests.helpers.matrix import CHEATERS

    groups = {}
    for name, spec in CHEATERS.items():
        kept = [c for c in spec.split(",") if c in attacks]
        if kept:
            groups[name] = ",".join(kept)
    return groups


def optional_section(module: str, call: Any) -> dict[str, Any]:
    """A section another module fills (``bench/fuzz.py``, ``bench/chaos.py``, loaded from
    its file: bench/ is not a package and holds names such as ``ledger.py``): its ``run``
    result, or why there is none."""
    path = BENCH / f"{module}.py"
    if not path.exists():
        return {"unavailable": f"bench/{module}.py is not in this checkout"}
    spec = importlib.util.spec_from_file_location(f"bench_{module}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while it executes
    spec.loader.exec_module(mod)
    return dict(call(mod))


def table(books: Any, attacks: dict[str, dict[str, int]]) -> list[str]:
    from tests.helpers.cheating.catalogue import CATALOGUE

    rows = [
        f"{'attack':<18} {'family':<12} {'reason':<11} {'trials':>6} {'detected':>8} "
        f"{'slashed':>7} {'trained':>7}"
    ]
    for name in CATALOGUE:
        if name not in attacks:
            continue
        a, c = attacks[name], CATALOGUE[name]
        rows.append(
            f"{name:<18} {c.family:<12} {c.reason:<11} {a['trials']:>6} {a['detected']:>8} "
            f"{a['slashed']:>7} {a['trained']:>7}"
        )
    return rows


def main() -> int:
    from tests.helpers.cheating.catalogue import CATALOGUE

    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--trials", type=int, default=1, help="times each attack is made (default 1)")
    ap.add_argument(
        "--attacks",
        default=",".join(CATALOGUE),
        help="the attacks to run, comma-separated (default: all of SPEC section 19.1)",
    )
    ap.add_argument("--honest", type=int, default=2, help="honest workers (default 2)")
    ap.add_argument("--timeout", type=float, default=1800, help="give up after this many s")
    ap.add_argument(
        "--fuzz", type=int, default=0, help="inputs per decoder for the fuzz section (0: skip)"
    )
    ap.add_argument("--faults", action="store_true", help="also run the chaos section")
    ap.add_argument("--seed", type=int, default=0, help="the chaos section's seed")
    ap.add_argument(
        "--fault-steps", type=int, default=3, help="trainer steps of the chaos run (default 3)"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    attacks_wanted = [a.strip() for a in args.attacks.split(",") if a.strip()]
    unknown = [a for a in attacks_wanted if a not in CATALOGUE]
    if unknown or not attacks_wanted:
        ap.error(f"unknown attack {unknown[0] if unknown else '(none given)'}")
    if args.trials < 1 or args.honest < 1:
        ap.error("--trials and --honest must be at least 1")

    from tests.helpers.matrix import CHAIN_ARGS, run_matrix
    from tests.test_loop import Loop

    started = time.monotonic()
    honest = tuple(f"honest-{i}" for i in range(args.honest))
    with tempfile.TemporaryDirectory(prefix="adversarial-") as tmp:
        base = Path(tmp)
        model = tiny_model(base)
        print(
            f"matrix: {len(attacks_wanted)} attacks x {args.trials}, {len(honest)} honest "
            "workers; starting the devnet (minutes on a loaded machine)",
            flush=True,
        )
        loop = Loop(base / "run", model, chain_args=CHAIN_ARGS)
        try:
            books = run_matrix(
                loop,
                cheater_groups(attacks_wanted),
                honest,
                trials=args.trials,
                timeout=args.timeout,
            )
        finally:
            loop.close()
        matrix_seconds = round(time.monotonic() - started, 1)
        attacks = books.per_attack()
        honest_subs = books.honest()
        accepted_honest = [s for s in honest_subs if books.status[s] == "accepted"]
        lost = len(honest_subs) - len(accepted_honest)
        untrained = sum(1 for s in accepted_honest if s not in books.consumed)
        double = sum(1 for n in books.verdicts.values() if n > 1)
        trials = sum(a["trials"] for a in attacks.values())
        detected = sum(a["detected"] for a in attacks.values())
        false_slashes = books.honest_false_slashes()
        rate = round(detected / trials, 4) if trials else 0.0
        # an attack the chain never saw (each submission refused) was not tried at all
        untried = [a for a in attacks_wanted if attacks.get(a, {}).get("trials", 0) < args.trials]
        for line in table(books, attacks):  # printed now: the sections below take minutes
            print(line)
        if untried:
            print(f"not tried {args.trials} time(s) on-chain: {', '.join(untried)}")
        print(
            f"honest batches {len(honest_subs)}: false slashes {false_slashes}, "
            f"lost {lost}, double-counted {double} (accepted, not trained when the trainer "
            f"stopped: {untrained})"
        )
        print(
            f"detected {detected} of {trials} attacks ({rate:.0%}) against 0% with no "
            f"checking; matrix {matrix_seconds:.0f} s",
            flush=True,
        )
        fuzz = (
            optional_section("fuzz", lambda m: m.run(args.fuzz)) if args.fuzz else {"skipped": True}
        )
        crashes = sum(int(v.get("crashes", 0)) for v in fuzz.values() if isinstance(v, dict))
        inputs = sum(int(v.get("inputs", 0)) for v in fuzz.values() if isinstance(v, dict))
        print(f"fuzz: {len(fuzz) if inputs else 0} decoders, {inputs} inputs, {crashes} crashes")
        chaos: dict[str, Any] = {"skipped": True}
        if args.faults:
            print(f"faults: the chaos run, seed {args.seed} (minutes)", flush=True)
            chaos = optional_section(
                "chaos",
                lambda m: m.run(
                    args.seed, steps=args.fault_steps, model=model, timeout=args.timeout
                ),
            )
        for line in fault_table(chaos):
            print(line)
    fault_books = {k: chaos.get(k) for k in FAULT_FIGURES if k in chaos}
    out: dict[str, Any] = {
        "attacks": attacks,
        # the matrix's and the chaos run's together (each also below on its own)
        "honest_false_slashes": false_slashes + int(chaos.get("honest_false_slashes") or 0),
        "lost_work": lost + int(chaos.get("lost_work") or 0),
        "double_counted_work": double + int(chaos.get("double_counted_work") or 0),
        "honest_batches": len(honest_subs),
        "untried_attacks": untried,
        "honest_not_trained_yet": untrained,
        "detection_rate": rate,
        "baseline_detection_rate": 0.0,  # no checking: every batch accepted
        "matrix": {
            "honest_false_slashes": false_slashes,
            "lost_work": lost,
            "double_counted_work": double,
            "seconds": matrix_seconds,
        },
        "fuzz": fuzz,
        # kind -> times injected (or why there is none)
        "faults": chaos.get("faults", chaos),
        "fault_books": fault_books,
        "seconds": round(time.monotonic() - started, 1),
    }
    print(
        f"total: false slashes {out['honest_false_slashes']}, lost {out['lost_work']}, "
        f"double-counted {out['double_counted_work']}; {out['seconds']:.0f} s"
    )
    if args.json:
        print(json.dumps(out))
    ok = (
        detected == trials
        and not untried
        and out["honest_false_slashes"] == out["lost_work"] == out["double_counted_work"] == 0
        and crashes == 0
        and not chaos.get("violations")
    )
    return 0 if ok else 1


FAULT_FIGURES = (
    "ok",
    "violations",
    "submitted",
    "accepted",
    "trained_on",
    "steps",
    "lost_work",
    "double_counted_work",
    "honest_false_slashes",
    "exits",
    "seconds",
)


def fault_table(chaos: dict[str, Any]) -> list[str]:
    """The chaos run's rows: fault -> injected; then its books."""
    if "faults" not in chaos:
        return [f"faults: {json.dumps(chaos)}"]
    rows = [f"{'fault':<18} {'injected':>8}"]
    rows += [f"{kind:<18} {n:>8}" for kind, n in chaos["faults"].items()]
    books = "exact" if chaos.get("ok") else f"{len(chaos.get('violations', []))} violations"
    rows.append(
        f"faults' books: {books}; submitted {chaos.get('submitted')}, accepted "
        f"{chaos.get('accepted')}, trained on {chaos.get('trained_on')}; false slashes "
        f"{chaos.get('honest_false_slashes')}, lost {chaos.get('lost_work')}, double-counted "
        f"{chaos.get('double_counted_work')}; {chaos.get('seconds')} s"
    )
    rows += [f"  {v}" for v in chaos.get("violations", [])]
    return rows


def tiny_model(base: Path) -> Path:
    """The tiny base model (built once per machine, cached under .cache/ as the tests do)."""
    from node.engine.tinymodel import Recipe, build_tiny_model

    cache = Path(__file__).resolve().parent.parent / ".cache" / "models"
    out, _ = build_tiny_model(base / "model", Recipe(), cache_dir=cache)
    return Path(out)


if __name__ == "__main__":
    sys.exit(main())
