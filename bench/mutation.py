"""Mutation testing of ``crypto/`` and ``protocol/`` with mutmut 3: killed / total per package.

    .venv/bin/python bench/mutation.py [--per-file 60] [--budget-min 55] [--repo PATH] [--keep DIR] [--json]

mutmut changes one thing at a time in the source (an operator, a constant, an argument),
runs the tests that cover the changed function, and calls the mutant *killed* when a test
fails. A *survivor* is a change no test notices: either a missing test or an equivalent
mutant (one that cannot change observable behaviour, e.g. ``to_bytes(8, "big")`` ->
``to_bytes(8)``, whose default byte order is big). Every survivor is printed with its
file, line and change, so it can be killed by a test or listed as equivalent.

How it is bounded (within about 60 minutes on the project's 2-core machine, other work
running beside it):

- Mutants: a deterministic sample of at most ``--per-file`` (default 60) mutants of each
  file, those whose names hash lowest (BLAKE2b of mutmut's mutant name), so the same
  source always gives the same sample and a before/after comparison is like for like
  (659 of the ~2,550 mutants mutmut makes of today's source; ``--per-file 0`` tries them
  all, several times as long). Measured here with a SHARDCAST benchmark loading both cores
  (load average 12-14): 38 minutes for the sample before issue #14's tests, 26 after.
- Tests: only the fast tests that exercise ``crypto/`` and ``protocol/`` (``FAST_TESTS``
  below, ~25 s in all; no network, ledger or engine-heavy tests), and for each mutant only
  those of them that call the mutated function (mutmut's per-function coverage from one
  stats run), stopping at the first failure (``-x``). A killed mutant costs well under a
  second, a survivor the run time of its covering tests.
- One worker process (``--max-children 1``), torch / OpenMP at one thread, under
  ``nice -n 10``. Workers are forked from a fork server that never ran a test (mutmut's
  ``process_isolation = "forkserver"``): forking the process that had run the torch tests hung a worker here.
- Per mutant: a wall deadline of (its covering tests' time + 5 s) x 3, and twice that in
  CPU seconds (mutmut's ``timeout_constant`` / ``timeout_multiplier``); a mutant that runs
  past it (an endless loop) counts as killed, listed as ``timeout``.
- In all: ``--budget-min`` minutes (default 55) of wall time for mutmut. When it runs out
  mutmut is stopped; mutants not reached yet are counted as ``not_run`` and left out of
  killed / total (mutmut runs the cheapest first).

Mutants in functions that no selected test calls (``no tests``) count as survivors.

The working tree is never written to: the tracked and untracked-but-not-ignored files of
``--repo`` (default: this checkout) are copied to a temporary directory, mutmut's settings
are appended to the copy's ``pyproject.toml``, and mutmut runs there (its ``mutants/`` dir
included); the directory is deleted at the end unless ``--keep`` names where to leave it.
With ``--json`` the last line is one JSON object: ``killed``, ``total``, ``survivors``
(``{file, line, mutant, status, description}``), ``packages``, ``timeout``, ``no_tests``,
``not_run``, ``elapsed_s``.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("crypto", "protocol")
# The fast tests that exercise crypto/ and protocol/; globs pick up the ones added later.
FAST_TESTS = (
    "tests/test_crypto.py",
    "tests/test_toploc.py",
    "tests/test_sampling.py",
    "tests/test_verdict.py",
    "tests/test_framing.py",
    "tests/test_messages.py",
    "tests/test_admission.py",
    "tests/test_rollouts.py",
    "tests/test_vectors*.py",
    "tests/test_shardcast.py",  # not test_shardcast_network.py: real processes
    "tests/test_batch_messages_and_store.py",  # not test_batch_exchange.py: libp2p
    "tests/test_mutation_kills_*.py",
)
PER_FILE = 60  # the deterministic sample: at most this many mutants of each file
TIMEOUT_CONSTANT_S = 5.0
TIMEOUT_MULTIPLIER = 3.0
KILLED = {"killed", "timeout", "segfault"}  # segfault: the mutant crashed or was SIGKILLed
NOT_RUN = {"not checked", "check was interrupted by user"}


def repo_files(repo: Path) -> list[str]:
    """Tracked and untracked-but-not-ignored files of ``repo`` (what a commit could hold)."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo,
        check=True,
        capture_output=True,
    ).stdout
    return [name for name in out.decode().split("\0") if name and (repo / name).is_file()]


def selected_tests(repo: Path) -> list[str]:
    found: list[str] = []
    for pattern in FAST_TESTS:
        found += sorted(str(p.relative_to(repo)) for p in repo.glob(pattern))
    return found


def mutmut_settings(tests: list[str], also_copy: list[str]) -> str:
    """The ``[tool.mutmut]`` table appended to the scratch copy's pyproject.toml."""
    return "\n".join(
        [
            "",
            "[tool.mutmut]",
            f"source_paths = {json.dumps(list(PACKAGES))}",
            f"also_copy = {json.dumps(also_copy)}",
            f"pytest_add_cli_args_test_selection = {json.dumps(tests)}",
            'pytest_add_cli_args = ["-p", "no:cacheprovider"]',
            'process_isolation = "forkserver"',
            f"timeout_constant = {TIMEOUT_CONSTANT_S}",
            f"timeout_multiplier = {TIMEOUT_MULTIPLIER}",
            "use_git_change_detection = false",
            "",
        ]
    )


def prepare(repo: Path, work: Path) -> list[str]:
    """Copy ``repo`` into ``work`` and configure mutmut there; returns the selected tests."""
    for name in repo_files(repo):
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / name, work / name)
    # The tests' tiny model (keyed by its recipe), so that it is not trained again.
    models = next(
        (m for m in (repo / ".cache" / "models", ROOT / ".cache" / "models") if m.is_dir()), None
    )
    if models is not None:
        shutil.copytree(models, work / ".cache" / "models")
    # mutmut copies the source packages, tests/ and pyproject.toml into mutants/; the tests
    # also need the rest (node/, SPEC.md, ...), or they would import the installed checkout.
    also_copy = sorted(
        {name.split("/")[0] for name in repo_files(repo)}
        | ({".cache"} if models is not None else set())
    )
    also_copy = [n for n in also_copy if n not in (*PACKAGES, "tests", "pyproject.toml")]
    tests = selected_tests(repo)
    with open(work / "pyproject.toml", "a") as f:
        f.write(mutmut_settings(tests, also_copy))
    return tests


def run_mutmut(work: Path, names: list[str], budget_s: float, niceness: int) -> bool:
    """Run ``mutmut run`` in ``work``; interrupt it when the budget runs out. True if it did."""
    mutmut = Path(sys.executable).parent / "mutmut"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    cmd = ["nice", "-n", str(niceness), str(mutmut), "run", "--max-children", "1", *names]
    with open(work / "mutmut.log", "w") as log:
        proc = subprocess.Popen(
            cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            proc.wait(timeout=budget_s)
            interrupted = False
        except subprocess.TimeoutExpired:
            interrupted = True  # results are saved per mutant: stopping loses only the current one
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    if proc.returncode not in (0, None) and not interrupted:
        tail = (work / "mutmut.log").read_text(errors="replace")[-4000:]
        sys.exit(f"mutmut failed (exit {proc.returncode}):\n{tail}")
    return interrupted


def sample_mutants(work: Path, per_file: int) -> list[str]:
    """Every mutant mutmut will generate, or at most ``per_file`` of each file: those whose
    names hash lowest (BLAKE2b), so the same source always gives the same sample."""
    from mutmut.mutation.file_mutation import mutate_file_contents
    from mutmut.utils.format_utils import get_mutant_name

    os.chdir(work)
    names: list[str] = []
    for package in PACKAGES:
        for path in sorted(Path(package).rglob("*.py")):
            made = mutate_file_contents(str(path), path.read_text()).mutant_names
            mine = [get_mutant_name(path, m) for m in made]
            if per_file:
                mine = sorted(mine, key=lambda n: hashlib.blake2b(n.encode()).digest())[:per_file]
            names += sorted(mine)
    return names


def changed_line(source: Path, function: str, cls: str | None, diff: str) -> int:
    """Line number in ``source`` of the first line the mutant removes (or of the def)."""
    tree = ast.parse(source.read_text())
    scope: list[ast.stmt] = tree.body
    if cls is not None:
        scope = next(n.body for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    node = next(
        n
        for n in scope
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == function
    )
    # The diff is of the function alone: its hunk header counts from the function's first
    # line (its first decorator); the first removed line lies that many lines further on.
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    lines = source.read_text().splitlines()
    offset, removed = 0, ""
    for line in diff.splitlines():
        if line.startswith("@@"):
            offset = int(line.split()[1].lstrip("-").split(",")[0]) - 1
        elif line.startswith("-") and not line.startswith("---"):
            removed = line[1:].strip()
            break
        elif not line.startswith(("+", "---", "+++")):
            offset += 1
    guess = first + offset
    if not removed or (0 < guess <= len(lines) and lines[guess - 1].strip() == removed):
        return guess if removed else node.lineno
    matches = [
        n
        for n in range(first, (node.end_lineno or len(lines)) + 1)
        if lines[n - 1].strip() == removed
    ]
    return min(matches, key=lambda n: abs(n - guess), default=node.lineno)


def describe(diff: str) -> str:
    """The change as ``old -> new`` (only the lines that differ)."""
    minus = [
        ln[1:].strip()
        for ln in diff.splitlines()
        if ln.startswith("-") and not ln.startswith("---")
    ]
    plus = [
        ln[1:].strip()
        for ln in diff.splitlines()
        if ln.startswith("+") and not ln.startswith("+++")
    ]
    return f"{' / '.join(minus)}  ->  {' / '.join(plus)}"


def collect(work: Path, names: list[str]) -> dict[str, object]:
    """Read mutmut's results for the mutants ``names`` from ``work/mutants``."""
    wanted = set(names)
    os.chdir(work)  # mutmut reads its config and mutants/ relative to the working directory
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code
    from mutmut.utils.format_utils import parse_mutant_key

    packages: dict[str, Counter[str]] = {p: Counter() for p in PACKAGES}
    survivors: list[dict[str, object]] = []
    for package in PACKAGES:
        for path in sorted(Path(package).rglob("*.py")):
            data = SourceFileMutationData(path=path)
            data.load()
            for key, code in sorted(data.exit_code_by_key.items()):
                if key not in wanted:
                    continue
                status = status_by_exit_code[code]
                packages[package][status] += 1
                if status in KILLED or status in NOT_RUN:
                    continue
                function, cls = parse_mutant_key(key.rpartition(".")[2].rpartition("__mutmut_")[0])
                diff = get_diff_for_mutant(key, path=path)
                survivors.append(
                    {
                        "file": str(path),
                        "line": changed_line(path, function, cls, diff),
                        "mutant": key,
                        "status": status,
                        "description": describe(diff),
                    }
                )
    per_package = {}
    for package, counts in packages.items():
        run = sum(n for s, n in counts.items() if s not in NOT_RUN)
        per_package[package] = {
            "killed": sum(counts[s] for s in KILLED),
            "total": run,
            "timeout": counts["timeout"],
            "no_tests": counts["no tests"],
            "not_run": sum(counts[s] for s in NOT_RUN),
        }
    return {
        "killed": sum(p["killed"] for p in per_package.values()),
        "total": sum(p["total"] for p in per_package.values()),
        "timeout": sum(p["timeout"] for p in per_package.values()),
        "no_tests": sum(p["no_tests"] for p in per_package.values()),
        "not_run": sum(p["not_run"] for p in per_package.values()),
        "packages": per_package,
        "survivors": survivors,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, default=ROOT, help="checkout to measure (default: this)")
    ap.add_argument("--budget-min", type=float, default=55.0, help="wall minutes for mutmut")
    ap.add_argument(
        "--per-file",
        type=int,
        default=PER_FILE,
        help="mutants per file, 0 = all (default %(default)s)",
    )
    ap.add_argument("--nice", type=int, default=10, help="niceness of the mutmut processes")
    ap.add_argument("--keep", type=Path, help="leave the scratch copy (with mutants/) here")
    ap.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = ap.parse_args()
    repo = args.repo.resolve()

    start = time.monotonic()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=False)
        work = args.keep.resolve()
    else:
        work = Path(tempfile.mkdtemp(prefix="mutation-"))
    here = Path.cwd()
    try:
        tests = prepare(repo, work)
        names = sample_mutants(work, args.per_file)
        print(
            f"mutmut over {', '.join(PACKAGES)} of {repo}: {len(names)} mutants"
            f" ({f'at most {args.per_file} per file' if args.per_file else 'all'}),"
            f" {len(tests)} test files:"
        )
        print("  " + " ".join(tests), flush=True)
        interrupted = run_mutmut(work, names, args.budget_min * 60, args.nice)
        result = collect(work, names)
    finally:
        os.chdir(here)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    result["elapsed_s"] = round(time.monotonic() - start)
    result["budget_exhausted"] = interrupted
    result["tests"] = tests

    for package, p in result["packages"].items():  # type: ignore[union-attr]
        pct = 100 * p["killed"] / p["total"] if p["total"] else 0.0
        print(
            f"{package:9s} killed {p['killed']:5d} / {p['total']:5d}  ({pct:5.1f}%)"
            f"  timeout {p['timeout']}  no tests {p['no_tests']}  not run {p['not_run']}"
        )
    killed, total = result["killed"], result["total"]
    print(f"{'all':9s} killed {killed:5d} / {total:5d}  ({100 * killed / max(total, 1):5.1f}%)")  # type: ignore[operator]
    print(f"{len(result['survivors'])} survivors:")  # type: ignore[arg-type]
    for s in result["survivors"]:  # type: ignore[union-attr]
        print(f"  {s['file']}:{s['line']}  [{s['status']}]  {s['description']}  ({s['mutant']})")
    if interrupted:
        print(f"budget of {args.budget_min} min exhausted: {result['not_run']} mutants not run")
    print(f"elapsed {result['elapsed_s']} s")
    if args.json:
        print(json.dumps(result, ensure_ascii=False))


if __name__ == "__main__":
    main()
