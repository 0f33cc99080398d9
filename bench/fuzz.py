"""Benchmark: a long fuzzing campaign over every decoder that reads peer or disk bytes.

    .venv/bin/python bench/fuzz.py [--inputs 2000] [--seed 0] [--only NAME ...]
                                   [--engine atheris|mutate|both] [--jobs 1] [--json]

The decoders are ``tests/helpers/fuzz_targets.py``'s (the same ones ``tests/test_fuzz.py``
fuzzes in CI with hypothesis): the frame reader, the envelope, every message type, the
signed rollout-batch and manifest paths, announcement bodies, TOPLOC proofs, DiLoCo chunk
bytes, the batch store, the SHARDCAST journal and weight-store directory.

Engines:
- ``atheris``: coverage-guided (libFuzzer through atheris, the project's code instrumented
  at import), started from each decoder's valid seeds; ``--seed`` is libFuzzer's seed.
- ``mutate``: this file's own seeded mutator (byte flips, inserts, deletes, truncations,
  splices of the seeds, random bytes): deterministic, no coverage feedback. It is the
  fallback where atheris does not install (it ships wheels for Linux x86-64/aarch64 and
  CPython <= 3.12 only, and its source build needs clang with libFuzzer).
``both`` (the default where atheris imports) runs each decoder under both and prints, as
the comparison, the distinct outcomes each reached (accepted, or each rejection reason and
message with numbers stripped: a path count that needs no instrumentation), atheris over
mutate as a ratio.

Each decoder runs in its own forked process, ``--inputs`` inputs long. A crash is any
exception other than the decoder's documented one (``WireError``; ``BatchStoreError`` for a
damaged stored batch), a broken promise about an accepted input, an input that runs past
``--timeout`` seconds, or a process whose RSS grows past ``--rss-mb`` (memory bounded): it
is counted, the first few inputs are saved under ``--crash-dir``, and fuzzing goes on.
Issue #28 asks for >= 100,000 inputs per decoder in a long run: ``--inputs 100000`` (about
an hour per engine on one core; use ``--jobs`` on a machine with cores to spare).

``run(inputs_per_decoder, seed)`` is the entry ``bench/adversarial.py`` calls: decoder ->
{"inputs", "crashes"} with the atheris engine (mutate where atheris is missing).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_INPUTS = 2000
CRASHES_KEPT = 5  # inputs saved per decoder


def have_atheris() -> bool:
    try:
        import atheris  # noqa: F401
    except ImportError:
        return False
    return True


# ---- one decoder, in a child process -----------------------------------------------


class Tally:
    """What one decoder's run saw; written as JSON by the child, read by the parent."""

    def __init__(self, name: str, engine: str, out: Path, crash_dir: Path, rss_mb: int) -> None:
        self.name, self.engine, self.out, self.crash_dir = name, engine, out, crash_dir
        self.rss_mb = rss_mb
        self.inputs = self.crashes = 0
        self.outcomes: set[str] = set()
        self.kinds: dict[str, int] = {}
        self.started = time.monotonic()

    def feed(self, target, data: bytes) -> None:  # type: ignore[no-untyped-def]
        self.inputs += 1
        try:
            target.run(data)
            self.outcomes.add("accepted")
        except target.allowed as exc:
            self.outcomes.add(outcome(exc))
        except Exception as exc:  # a crash: counted, kept, and fuzzing goes on
            self.crash(f"{type(exc).__name__}: {str(exc)[:120]}", data)
        if self.inputs % 1000 == 0 and peak_rss_mb() > self.rss_mb:
            self.crash(f"RSS {peak_rss_mb():.0f} MB > {self.rss_mb} MB", data)
            self.rss_mb = 1 << 30  # counted once
        if self.inputs % 500 == 0:
            self.write()

    def crash(self, kind: str, data: bytes) -> None:
        self.crashes += 1
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        if self.crashes <= CRASHES_KEPT:
            self.crash_dir.mkdir(parents=True, exist_ok=True)
            safe = self.name.replace("/", "_")
            (self.crash_dir / f"{safe}-{self.engine}-{self.crashes}.bin").write_bytes(data)

    def write(self) -> None:
        self.out.write_text(
            json.dumps(
                {
                    "name": self.name,
                    "engine": self.engine,
                    "inputs": self.inputs,
                    "crashes": self.crashes,
                    "kinds": self.kinds,
                    "outcomes": len(self.outcomes),
                    "seconds": time.monotonic() - self.started,
                    "peak_rss_mb": peak_rss_mb(),
                }
            )
        )


def outcome(exc: BaseException) -> str:
    """A rejection's kind with numbers and quoted values stripped: distinct kinds ≈ paths."""
    text = re.sub(r"[0-9a-f]{8,}|\d+", "#", str(exc))
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", text)
    return f"{type(exc).__name__}: {text[:100]}"


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def mutate_loop(target, tally: Tally, inputs: int, seed: int) -> None:  # type: ignore[no-untyped-def]
    import random

    rng = random.Random(f"{seed}/{target.name}")
    seeds = target.seeds()
    for _ in range(inputs):
        tally.feed(target, mutated(rng, seeds))


def mutated(rng, seeds: list[bytes]) -> bytes:  # type: ignore[no-untyped-def]
    """A seed with 1-6 byte-level edits, or (one time in five) random bytes."""
    if not seeds or rng.random() < 0.2:
        return rng.randbytes(rng.randint(0, 256))
    data = bytearray(rng.choice(seeds))
    for _ in range(rng.randint(1, 6)):
        op, at = rng.random(), rng.randint(0, len(data))
        if op < 0.3 and data:
            data[min(at, len(data) - 1)] ^= 1 << rng.randrange(8)
        elif op < 0.45 and data:
            data[min(at, len(data) - 1)] = rng.choice((0, 0x7F, 0x80, 0xC1, 0xFF))
        elif op < 0.6:
            data[at:at] = rng.randbytes(rng.randint(1, 9))
        elif op < 0.75:
            del data[at : at + rng.randint(1, 16)]
        elif op < 0.85:
            del data[at:]
        else:
            other = rng.choice(seeds)
            data[at:] = other[rng.randint(0, len(other)) :]
    return bytes(data)


def atheris_loop(target, tally: Tally, inputs: int, seed: int, timeout: int, work: Path) -> None:  # type: ignore[no-untyped-def]
    import atheris

    corpus = Path(tempfile.mkdtemp(prefix="corpus-", dir=work))
    for i, s in enumerate(target.seeds()):
        (corpus / f"seed-{i}").write_bytes(s)

    def one(data: bytes) -> None:
        tally.feed(target, data)
        if tally.inputs >= inputs:
            tally.write()
            os._exit(0)

    args = [
        sys.argv[0],
        f"-seed={seed + 1}",  # libFuzzer reads 0 as "pick one"
        f"-timeout={timeout}",  # an input that hangs aborts the child: a crash
        f"-rss_limit_mb={tally.rss_mb * 2}",  # libFuzzer's own backstop
        "-max_len=65536",
        "-print_final_stats=0",
        "-close_fd_mask=3",  # libFuzzer's chatter off; the parent reads the JSON
        str(corpus),
    ]
    atheris.Setup(args, one)
    atheris.Fuzz()


def worker(args: argparse.Namespace) -> None:
    """Import every decoder once (instrumented for atheris), then fork one child per
    decoder, ``--jobs`` at a time."""
    import torch  # noqa: F401  (imported uninstrumented: not ours)

    if args.engine == "atheris":
        import atheris

        with atheris.instrument_imports(include=["protocol", "crypto", "node", "tests"]):
            import crypto.toploc  # noqa: F401
            import node.diloco.codecs  # noqa: F401
            import node.diloco.quant  # noqa: F401
            import node.diloco.sparse  # noqa: F401
            import node.rollouts.store  # noqa: F401
            import node.shardcast.store  # noqa: F401
            from tests.helpers import fuzz_targets
    else:
        from tests.helpers import fuzz_targets
    out = Path(args.out)
    work = out / "work"  # removed with ``out`` by the parent
    work.mkdir(exist_ok=True)
    targets = fuzz_targets.targets(work / "unused")
    running: dict[int, str] = {}
    for name in args.names.split(","):
        while len(running) >= args.jobs:
            pid, _ = os.wait()
            running.pop(pid, None)
        pid = os.fork()
        if pid == 0:
            safe = name.replace("/", "_")
            tally = Tally(
                name, args.engine, out / f"{safe}.json", Path(args.crash_dir), args.rss_mb
            )
            tally.write()
            try:
                # each child its own disk directory: decoders may run side by side
                disk = Path(tempfile.mkdtemp(prefix="disk-", dir=work))
                target = fuzz_targets.targets(disk)[name]
                if args.engine == "atheris":
                    atheris_loop(target, tally, args.inputs, args.seed, args.timeout, work)
                else:
                    mutate_loop(target, tally, args.inputs, args.seed)
                tally.write()
            finally:
                os._exit(0)
        running[pid] = name
    del targets
    while running:
        pid, _ = os.wait()
        running.pop(pid, None)


# ---- the parent --------------------------------------------------------------------


def names() -> list[str]:
    from tests.helpers.fuzz_targets import targets

    return sorted(targets(Path(tempfile.gettempdir()) / "unused"))


def campaign(
    inputs: int,
    seed: int,
    engine: str,
    only: list[str] | None = None,
    jobs: int = 1,
    rss_mb: int = 1024,
    timeout: int = 20,
    crash_dir: Path | None = None,
    progress: bool = False,
) -> dict[str, dict]:
    """Run ``engine`` over the decoders; name -> the child's tally (inputs, crashes, ...).
    A child that died without accounting for all its inputs (killed by libFuzzer for a
    timeout or its RSS limit, or by a signal) counts one crash more."""
    chosen = only or names()
    unknown = set(chosen) - set(names())
    if unknown:
        raise SystemExit(f"unknown decoders {sorted(unknown)}; known: {names()}")
    crash_dir = crash_dir or Path(tempfile.gettempdir()) / "fuzz-crashes"  # made on a crash
    with tempfile.TemporaryDirectory(prefix="fuzz-out-") as out:
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            f"--engine={engine}",
            f"--names={','.join(chosen)}",
            f"--inputs={inputs}",
            f"--seed={seed}",
            f"--jobs={jobs}",
            f"--rss-mb={rss_mb}",
            f"--timeout={timeout}",
            f"--out={out}",
            f"--crash-dir={crash_dir}",
        ]
        started = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            _, err = proc.communicate()
        except KeyboardInterrupt:  # Ctrl-C: stop the children, report what was done
            proc.terminate()
            proc.wait()
            err = b""
        results: dict[str, dict] = {}
        for name in chosen:
            path = Path(out) / f"{name.replace('/', '_')}.json"
            tally = json.loads(path.read_text()) if path.exists() else None
            if tally is None:
                tally = {"inputs": 0, "crashes": 1, "kinds": {"no result": 1}, "outcomes": 0}
            elif tally["inputs"] < inputs:
                tally["crashes"] += 1
                tally["kinds"]["died (timeout, RSS limit or signal)"] = 1
            tally["crash_dir"] = str(crash_dir)
            results[name] = tally
        if proc.returncode not in (0, None) and progress:
            print(err.decode(errors="replace")[-2000:], file=sys.stderr)
        if progress:
            print(f"{engine}: {len(chosen)} decoders in {time.monotonic() - started:.0f} s")
    return results


def run(inputs_per_decoder: int, seed: int = 0) -> dict[str, dict[str, int]]:
    """Decoder -> {"inputs": n, "crashes": n}: atheris where it imports, else mutate."""
    engine = "atheris" if have_atheris() else "mutate"
    return {
        name: {"inputs": t["inputs"], "crashes": t["crashes"]}
        for name, t in campaign(inputs_per_decoder, seed, engine).items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--inputs", type=int, default=DEFAULT_INPUTS, help="inputs per decoder")
    ap.add_argument("--seed", type=int, default=0, help="seed of both engines")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="these decoders only")
    ap.add_argument(
        "--engine",
        choices=("atheris", "mutate", "both"),
        default=None,
        help="default: both where atheris imports, else mutate",
    )
    ap.add_argument("--jobs", type=int, default=1, help="decoders fuzzed at once")
    ap.add_argument("--rss-mb", type=int, default=1024, help="memory ceiling per decoder")
    ap.add_argument("--timeout", type=int, default=20, help="seconds one input may take")
    ap.add_argument("--crash-dir", type=Path, help="where crashing inputs are saved")
    ap.add_argument("--list", action="store_true", help="list the decoders and exit")
    ap.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    # the child side (internal)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--names", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    if args.list:
        print("\n".join(names()))
        return
    engine = args.engine or ("both" if have_atheris() else "mutate")
    if engine in ("atheris", "both") and not have_atheris():
        raise SystemExit("atheris is not installed: pip install 'atheris>=2.3' or --engine mutate")
    engines = ["atheris", "mutate"] if engine == "both" else [engine]
    common = dict(
        only=args.only,
        jobs=args.jobs,
        rss_mb=args.rss_mb,
        timeout=args.timeout,
        crash_dir=args.crash_dir,
        progress=True,
    )
    by_engine = {e: campaign(args.inputs, args.seed, e, **common) for e in engines}
    first = by_engine[engines[0]]
    print(f"{'decoder':28s} " + " ".join(f"{e + ' in/crash/paths':>26s}" for e in engines), end="")
    print("  paths ratio" if len(engines) == 2 else "")
    for name in first:
        cells = [
            f"{t['inputs']:>10d} {t['crashes']:>6d} {t['outcomes']:>8d}"
            for t in (by_engine[e][name] for e in engines)
        ]
        line = f"{name:28s} " + " ".join(f"{c:>26s}" for c in cells)
        if len(engines) == 2:
            a, b = (by_engine[e][name]["outcomes"] for e in engines)
            line += f"  {a / max(b, 1):10.2f}"
        print(line)
        for e in engines:
            for kind, n in by_engine[e][name].get("kinds", {}).items():
                print(f"    {e} crash x{n}: {kind}")
    crashes = {e: sum(t["crashes"] for t in by_engine[e].values()) for e in engines}
    print(f"crashes: {crashes}; crashing inputs under {first[next(iter(first))]['crash_dir']}")
    if args.json:
        figures = {
            "engine": engines[0],
            "fuzz": {n: {"inputs": t["inputs"], "crashes": t["crashes"]} for n, t in first.items()},
            "by_engine": {
                e: {
                    n: {k: t[k] for k in ("inputs", "crashes", "outcomes", "seconds") if k in t}
                    for n, t in r.items()
                }
                for e, r in by_engine.items()
            },
            "crashes": crashes,
        }
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
