"""Mutation testing of ``crypto/``, ``protocol/`` and the validator's, SHARDCAST's and DiLoCo's decisions with mutmut 3: killed / total per module.

    .venv/bin/python bench/mutation.py [--per-file 40] [--only PATH ...] [--budget-min 55]
                                       [--repo PATH] [--keep DIR] [--json]

mutmut changes one thing at a time in the source (an operator, a constant, an argument),
runs the tests that cover the changed function, and calls the mutant *killed* when a test
fails. A *survivor* is a change no test notices: either a missing test or an equivalent
mutant (one that cannot change observable behaviour, e.g. ``to_bytes(8, "big")`` ->
``to_bytes(8)``, whose default byte order is big). Every survivor is printed with its
file, line and change, so it can be killed by a test or listed in ``EQUIVALENT`` with the
reason it is equivalent; listed ones are left out of killed / total (and counted as
``equivalent``). Every module is held to ``MIN_SHARE`` (90%) killed; a module below it is
flagged ``< 90%``.

What it mutates (``MODULES``, one entry per file, with the fast tests that exercise it):
every file of ``crypto/`` (proofs, sampling, verdicts, the substitution test) and of
``protocol/`` (the wire), and the decisions that judge what peers send (issue #59): the
validator's cheap checks (``cheap_checks`` of ``node/roles/services/validator.py``, the
only function of that file mutated: the rest is the role's I/O) and its recheck
(``node/rollouts/recheck.py``), its fetch / retry / unavailable / re-post schedule
(``node/roles/decisions/judging.py``), SHARDCAST's download plan
(``node/shardcast/schedule.py``), DiLoCo's membership and ring all-reduce
(``node/diloco/membership.py``, ``ring.py``). ``--only`` narrows a run to the modules
whose paths start with the given prefixes (a rerun after new tests).

How it is bounded (the project's 2-core machine, other work running beside it):

- Mutants: a deterministic sample of at most ``--per-file`` (default 40) mutants of each
  file, those whose names hash lowest (BLAKE2b of mutmut's mutant name), so the same
  source always gives the same sample and a before/after comparison is like for like
  (797 of the ~5,000 mutants mutmut makes of today's 24 modules; a smaller sample is a
  subset of a larger one; ``--per-file 0`` tries them all, several times as long). The
  default was 60 while only crypto/ and protocol/ were covered (659 mutants, 26-38 min);
  with the new modules 60 would be 1,122 mutants, an estimated 50-60 min, so it is 40.
  Measured here (other work beside it, load average 4-8): a full run of the default
  sample, 29 min (1,721 s; 770 of 773 killed, 24 listed equivalents); before issue #59's
  tests, which left over 80 survivors, 773 of the 797 in 41 min (stopped there).
- Tests: only the fast tests of ``MODULES`` (~1 min in all; no network processes, no
  ledger, no test that takes tens of seconds), and for each mutant only those of them that
  call the mutated function (mutmut's per-function coverage from one stats run), stopping
  at the first failure (``-x``). A killed mutant costs well under a second, a survivor the
  run time of its covering tests.
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
are appended to the copy's ``pyproject.toml`` (the packages of ``MODULES`` as
``source_paths``, their files as ``only_mutate``), and mutmut runs there (its ``mutants/``
dir included); the directory is deleted at the end unless ``--keep`` names where to leave
it. With ``--json`` the last line is one JSON object: ``killed``, ``total``, ``share``,
``per_module`` (module path -> ``{killed, total, share, timeout, no_tests, not_run,
equivalent}``), ``packages`` (the same per top-level package), ``survivors`` (``{file,
line, mutant, status, description}``), ``equivalents`` (the same plus ``why``),
``timeout``, ``no_tests``, ``not_run``, ``equivalent``, ``elapsed_s``,
``budget_exhausted``, ``per_file``, ``tests``.
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
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Module:
    """One source file under mutation and the fast tests that exercise it (paths, globs or
    pytest node ids under tests/). ``functions``: only the mutants of these functions
    (``name`` or ``Class.method``) are sampled; empty: every function of the file."""

    path: str
    tests: tuple[str, ...]
    functions: tuple[str, ...] = ()


# The fast tests: no network, ledger or engine-heavy tests, no processes; globs pick up the
# ones added later.
CRYPTO_TESTS = (
    "tests/test_crypto.py",
    "tests/test_toploc.py",
    "tests/test_sampling.py",
    "tests/test_verdict.py",
    "tests/test_vectors*.py",
    "tests/test_mutation_kills_crypto.py",
)
PROTOCOL_TESTS = (
    "tests/test_framing.py",
    "tests/test_messages.py",
    "tests/test_admission.py",
    "tests/test_rollouts.py",
    "tests/test_shardcast.py",  # not test_shardcast_network.py: real processes
    "tests/test_batch_messages_and_store.py",  # not test_batch_exchange.py: libp2p
    "tests/test_mutation_kills_protocol.py",
)
SUBSTITUTION_TESTS = ("tests/test_substitution.py",)  # ~10 s, the H200 fixture's two
DILOCO_TESTS = ("tests/test_diloco.py", "tests/test_diloco_sparse.py")  # in-process rings
# What the bench mutates: every file of crypto/ and protocol/ (the wire and the proofs),
# and the decisions a validator, SHARDCAST and DiLoCo take on what peers send (issue #59):
# the validator's cheap checks (1-3) and its recheck (proofs, then the substitution test),
# its fetch / retry / unavailable / re-post schedule, SHARDCAST's download plan, DiLoCo's
# membership and its ring all-reduce.
MODULES: tuple[Module, ...] = (
    Module("crypto/envelope.py", CRYPTO_TESTS),
    Module("crypto/hashing.py", CRYPTO_TESTS),
    Module("crypto/identity.py", CRYPTO_TESTS),
    Module("crypto/sampling.py", CRYPTO_TESTS),
    Module("crypto/substitution.py", SUBSTITUTION_TESTS + CRYPTO_TESTS),
    Module("crypto/toploc.py", CRYPTO_TESTS),
    Module("crypto/verdict.py", CRYPTO_TESTS),
    Module("protocol/admission.py", PROTOCOL_TESTS),
    Module("protocol/batches.py", PROTOCOL_TESTS),
    Module("protocol/diloco.py", DILOCO_TESTS + PROTOCOL_TESTS),
    Module("protocol/errors.py", PROTOCOL_TESTS),
    Module("protocol/framing.py", PROTOCOL_TESTS),
    Module("protocol/ids.py", PROTOCOL_TESTS),
    Module("protocol/manifest.py", ("tests/test_manifest.py", *PROTOCOL_TESTS)),
    Module("protocol/messages.py", PROTOCOL_TESTS),
    Module("protocol/rollouts.py", PROTOCOL_TESTS),
    Module("protocol/schema.py", PROTOCOL_TESTS),
    Module("protocol/shardcast.py", PROTOCOL_TESTS),
    Module("protocol/wire.py", PROTOCOL_TESTS),
    Module(
        "node/roles/services/validator.py",
        ("tests/test_validator_checks.py",),
        functions=("cheap_checks",),  # the rest is the role's I/O: no fast test runs it
    ),
    Module("node/rollouts/recheck.py", SUBSTITUTION_TESTS),  # not test_top_p.py: ~25 s
    Module(
        "node/roles/decisions/judging.py",
        ("tests/test_judging.py", "tests/test_role_decisions.py"),
    ),
    Module("node/shardcast/schedule.py", ("tests/test_shardcast.py",)),
    Module("node/diloco/membership.py", DILOCO_TESTS),
    Module("node/diloco/ring.py", DILOCO_TESTS),
)
# Survivors that cannot change observable behaviour, left out of killed / total (and
# printed as left out): mutant name -> (its change as printed, why it is equivalent). A
# listed name whose change differs (the source moved) is a survivor again.
EQUIVALENT: dict[str, tuple[str, str]] = {
    "crypto.envelope.x_signing_bytes__mutmut_4": (
        'd = domain.encode("ascii")  ->  d = domain.encode("ASCII")',
        "codec names are case-insensitive",
    ),
    "crypto.hashing.x_bulk_digest__mutmut_4": (
        "return blake3.blake3(data, max_threads=1).digest()  ->  return blake3.blake3(data, ).digest()",
        "BLAKE3's digest does not depend on the thread count (and 1 is blake3-py's default)",
    ),
    "crypto.hashing.x_bulk_digest__mutmut_5": (
        "return blake3.blake3(data, max_threads=1).digest()  ->  return blake3.blake3(data, max_threads=2).digest()",
        "BLAKE3's digest does not depend on the thread count, only the cores it uses",
    ),
    "crypto.hashing.x_bulk_hasher__mutmut_2": (
        "return blake3.blake3(max_threads=1)  ->  return blake3.blake3(max_threads=2)",
        "BLAKE3's digest does not depend on the thread count, only the cores it uses",
    ),
    "crypto.hashing.x_digest_parts__mutmut_7": (
        'h.update(len(part).to_bytes(8, "big"))  ->  h.update(len(part).to_bytes(8, ))',
        "int.to_bytes' default byte order is big (Python >= 3.11)",
    ),
    "crypto.sampling.x_gumbel_noise_from_keys__mutmut_8": (
        "t = torch.arange(1, vocab_size + 1, dtype=torch.int64, device=keys.device)[None]  ->  t = torch.arange(1, vocab_size + 1, device=keys.device)[None]",
        "torch.arange of Python ints is int64 already",
    ),
    "crypto.sampling.x__judge_positions__mutmut_97": (
        "best = scores.masked_fill(~surely, -torch.inf).max(dim=-1).values  ->  best = scores.masked_fill(~surely, -torch.inf).max(dim=+1).values",
        "scores is [positions, vocabulary]: dim 1 is dim -1",
    ),
    "crypto.sampling.x__judge_positions__mutmut_190": (
        "for i, n in zip(chunk, lengths, strict=True):  ->  for i, n in zip(chunk, lengths, strict=None):",
        "lengths is built from chunk, one entry per index: same lengths",
    ),
    "crypto.substitution.x_position_keys__mutmut_6": (
        'h = hashlib.blake2b(b"intellect-node/position", digest_size=16)  ->  h = hashlib.blake2b(b"intellect-node/position", )',
        "the keys only tell a test's positions apart (dict keys, never stored or sent): 16 or"
        " 64 bytes of BLAKE2b tell them apart alike",
    ),
    "crypto.substitution.x_substitution_test__mutmut_34": (
        "nearer = sum(d > 0 for d in differing)  ->  nearer = sum(d >= 0 for d in differing)",
        "differing holds no zero (d != 0 just above): d >= 0 is d > 0 there",
    ),
    "crypto.substitution.x_position_keys__mutmut_8": (
        'h = hashlib.blake2b(b"intellect-node/position", digest_size=16)  ->  h = hashlib.blake2b(b"INTELLECT-NODE/POSITION", digest_size=16)',
        "the keys only tell a test's positions apart: another prefix tells them apart alike",
    ),
    "crypto.substitution.x_position_keys__mutmut_18": (
        'h.update(int(t).to_bytes(4, "little"))  ->  h.update(int(t).to_bytes(5, "little"))',
        "the keys only tell a test's positions apart: 5 bytes a token encode tokens as"
        " injectively as 4",
    ),
    "crypto.verdict.x__sampling__mutmut_22": (
        "out.update(zip(members, results, strict=True))  ->  out.update(zip(members, results, strict=None))",
        "check_sampling_many returns one result per row, built from members: same lengths",
    ),
    "crypto.verdict.x_check_batch__mutmut_15": (
        "for c, (_, logits) in zip(claims, recomputed, strict=True):  ->  for c, (_, logits) in zip(claims, recomputed, strict=False):",
        "the lengths were checked equal two lines above",
    ),
    "crypto.identity.x_peer_id_of__mutmut_5": (
        'return base58.b58encode(peer_id_bytes(public_key)).decode("ascii")  ->  return base58.b58encode(peer_id_bytes(public_key)).decode("ASCII")',
        "codec names are case-insensitive",
    ),
    "crypto.identity.x_verify__mutmut_1": (
        "if len(public_key) != PUBLIC_KEY_SIZE or len(signature) != SIGNATURE_SIZE:  ->  if len(public_key) != PUBLIC_KEY_SIZE and len(signature) != SIGNATURE_SIZE:",
        "a key or signature of the wrong length alone raises ValueError / InvalidSignature in"
        " cryptography, caught just below: False either way",
    ),
    "protocol.admission.xǁReplayWindowǁaccept__mutmut_25": (
        "((w.mask << shift) | 1) & ((1 << self.window) - 1) if shift < self.window else 1  ->  ((w.mask << shift) | 1) & ((1 << self.window) - 1) if shift <= self.window else 1",
        "at shift == window the masked shift leaves exactly the new bit: 1, the else branch",
    ),
    "protocol.admission.xǁReplayWindowǁaccept__mutmut_7": (
        "self._keys.popitem(last=False)  ->  self._keys.popitem(last=None)",
        "OrderedDict.popitem takes last as a truth value: None is False",
    ),
    "protocol.framing.xǁFrameReaderǁ_take__mutmut_4": (
        "if len(piece) <= n:  ->  if len(piece) < n:",
        "a piece taken whole by the slice branch leaves an empty view, popped by the next take:"
        " the same bytes come out",
    ),
    "protocol.schema.x_read_fields__mutmut_18": (
        "strict_map_key=True,  ->  ",
        "strict_map_key=True is msgpack 1.x's default (pyproject: msgpack>=1.0)",
    ),
    "protocol.schema.xǁMessageǁencode__mutmut_8": (
        "data: bytes = msgpack.packb(body, use_bin_type=True)  ->  data: bytes = msgpack.packb(body, )",
        "use_bin_type=True is msgpack 1.x's default (pyproject: msgpack>=1.0)",
    ),
    "protocol.shardcast.x_encode_notice__mutmut_5": (
        "data: bytes = msgpack.packb(notice.to_obj(), use_bin_type=True)  ->  data: bytes = msgpack.packb(notice.to_obj(), )",
        "use_bin_type=True is msgpack 1.x's default (pyproject: msgpack>=1.0)",
    ),
    "protocol.manifest.xǁRunTermsǁcanonical__mutmut_5": (
        "data: bytes = msgpack.packb(self.to_obj(), use_bin_type=True)  ->  data: bytes = msgpack.packb(self.to_obj(), )",
        "use_bin_type=True is msgpack 1.x's default (pyproject: msgpack>=1.0)",
    ),
    "node.roles.decisions.judging.xǁJudgingQueueǁfetched__mutmut_2": (
        "entry.in_flight = False  ->  entry.in_flight = None",
        "in_flight is only ever read as a truth value",
    ),
    "node.diloco.ring.x_all_reduce__mutmut_124": (
        'lo, hi = spans[chunk_of("ag", (rank - 1) % n, r, n)]  ->  lo, hi = spans[chunk_of(None, (rank - 1) % n, r, n)]',
        'chunk_of tells only "rs" from any other phase',
    ),
}
PER_FILE = 40  # the deterministic sample: at most this many mutants of each file
MIN_SHARE = 0.9  # the killed share every module is held to (issue #59), flagged below it
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


def selected_tests(repo: Path, modules: tuple[Module, ...]) -> list[str]:
    """The tests of ``modules``, globs expanded (a pytest node id is kept as it is)."""
    found: list[str] = []
    for pattern in (t for m in modules for t in m.tests):
        if "::" in pattern:
            found.append(pattern)
        else:
            found += sorted(str(p.relative_to(repo)) for p in repo.glob(pattern))
    return list(dict.fromkeys(found))


def roots(modules: tuple[Module, ...]) -> list[str]:
    """The top-level packages of ``modules`` (mutmut's ``source_paths``)."""
    return list(dict.fromkeys(m.path.split("/")[0] for m in modules))


def mutmut_settings(modules: tuple[Module, ...], tests: list[str], also_copy: list[str]) -> str:
    """The ``[tool.mutmut]`` table appended to the scratch copy's pyproject.toml: the
    packages of ``modules`` are copied, only the files of ``modules`` mutated."""
    return "\n".join(
        [
            "",
            "[tool.mutmut]",
            f"source_paths = {json.dumps(roots(modules))}",
            f"only_mutate = {json.dumps([m.path for m in modules])}",
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


def prepare(repo: Path, work: Path, modules: tuple[Module, ...]) -> list[str]:
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
    also_copy = [n for n in also_copy if n not in (*roots(modules), "tests", "pyproject.toml")]
    tests = selected_tests(repo, modules)
    with open(work / "pyproject.toml", "a") as f:
        f.write(mutmut_settings(modules, tests, also_copy))
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


def function_of(name: str) -> str:
    """``function`` or ``Class.method`` of a mutant's name."""
    from mutmut.utils.format_utils import parse_mutant_key

    function, cls = parse_mutant_key(name.rpartition(".")[2].rpartition("__mutmut_")[0])
    return function if cls is None else f"{cls}.{function}"


def sample_mutants(work: Path, per_file: int, modules: tuple[Module, ...]) -> dict[str, str]:
    """Every mutant mutmut will generate of ``modules`` (of their ``functions`` where they
    name some), or at most ``per_file`` of each file: those whose names hash lowest
    (BLAKE2b), so the same source always gives the same sample. Name -> module path."""
    from mutmut.mutation.file_mutation import mutate_file_contents
    from mutmut.utils.format_utils import get_mutant_name

    os.chdir(work)
    names: dict[str, str] = {}
    for module in modules:
        path = Path(module.path)
        made = mutate_file_contents(str(path), path.read_text()).mutant_names
        mine = [get_mutant_name(path, m) for m in made]
        if module.functions:
            mine = [n for n in mine if function_of(n) in module.functions]
        if per_file:
            mine = sorted(mine, key=lambda n: hashlib.blake2b(n.encode()).digest())[:per_file]
        names.update((n, module.path) for n in sorted(mine))
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


def collect(work: Path, names: dict[str, str]) -> dict[str, object]:
    """Read mutmut's results for the mutants ``names`` (name -> module path) from
    ``work/mutants``: counts per module and per package, and every survivor."""
    os.chdir(work)  # mutmut reads its config and mutants/ relative to the working directory
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code
    from mutmut.utils.format_utils import parse_mutant_key

    modules: dict[str, Counter[str]] = {path: Counter() for path in names.values()}
    survivors: list[dict[str, object]] = []
    equivalents: list[dict[str, object]] = []
    for module, counts in modules.items():
        path = Path(module)
        data = SourceFileMutationData(path=path)
        data.load()
        for key, code in sorted(data.exit_code_by_key.items()):
            if names.get(key) != module:
                continue
            status = status_by_exit_code[code]
            if status in KILLED or status in NOT_RUN:
                counts[status] += 1
                continue
            function, cls = parse_mutant_key(key.rpartition(".")[2].rpartition("__mutmut_")[0])
            diff = get_diff_for_mutant(key, path=path)
            survivor: dict[str, object] = {
                "file": module,
                "line": changed_line(path, function, cls, diff),
                "mutant": key,
                "status": status,
                "description": describe(diff),
            }
            listed = EQUIVALENT.get(key)
            if listed is not None and listed[0] == survivor["description"]:
                counts["equivalent"] += 1
                equivalents.append(survivor | {"why": listed[1]})
                continue
            counts[status] += 1
            survivors.append(survivor)
    per_module = {name: tally(counts) for name, counts in modules.items()}
    packages: dict[str, Counter[str]] = {}
    for name, counts in modules.items():
        packages.setdefault(name.split("/")[0], Counter()).update(counts)
    per_package = {package: tally(counts) for package, counts in packages.items()}
    totals = tally(sum(modules.values(), Counter()))
    return totals | {
        "per_module": per_module,
        "packages": per_package,
        "survivors": survivors,
        "equivalents": equivalents,
    }


def tally(counts: Counter[str]) -> dict[str, object]:
    """killed / total (run, listed equivalents left out) and the share killed."""
    total = sum(n for s, n in counts.items() if s not in NOT_RUN and s != "equivalent")
    killed = sum(counts[s] for s in KILLED)
    return {
        "killed": killed,
        "total": total,
        "share": round(killed / total, 4) if total else None,
        "timeout": counts["timeout"],
        "no_tests": counts["no tests"],
        "not_run": sum(counts[s] for s in NOT_RUN),
        "equivalent": counts["equivalent"],
    }


def line(label: str, p: dict[str, object], width: int) -> str:
    share = p["share"]
    pct = f"{100 * share:5.1f}%" if isinstance(share, float) else "  -  "
    low = "  < 90%" if isinstance(share, float) and share < MIN_SHARE else ""
    return (
        f"{label:{width}s} killed {p['killed']:4d} / {p['total']:4d}  ({pct})  timeout"
        f" {p['timeout']}  no tests {p['no_tests']}  not run {p['not_run']}"
        f"  equivalent {p['equivalent']}{low}"
    )


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
    ap.add_argument(
        "--only",
        nargs="+",
        metavar="PATH",
        help="only the MODULES whose paths start with one of these (default: all)",
    )
    ap.add_argument("--nice", type=int, default=10, help="niceness of the mutmut processes")
    ap.add_argument("--keep", type=Path, help="leave the scratch copy (with mutants/) here")
    ap.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = ap.parse_args()
    repo = args.repo.resolve()
    modules = tuple(m for m in MODULES if not args.only or m.path.startswith(tuple(args.only)))
    if not modules:
        sys.exit(f"no module of MODULES starts with {' or '.join(args.only)}")

    start = time.monotonic()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=False)
        work = args.keep.resolve()
    else:
        work = Path(tempfile.mkdtemp(prefix="mutation-"))
    here = Path.cwd()
    try:
        tests = prepare(repo, work, modules)
        names = sample_mutants(work, args.per_file, modules)
        print(
            f"mutmut over {len(modules)} modules of {repo}: {len(names)} mutants"
            f" ({f'at most {args.per_file} per file' if args.per_file else 'all'}),"
            f" {len(tests)} test files:"
        )
        print("  " + " ".join(tests), flush=True)
        interrupted = run_mutmut(work, list(names), args.budget_min * 60, args.nice)
        result = collect(work, names)
    finally:
        os.chdir(here)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    result["elapsed_s"] = round(time.monotonic() - start)
    result["budget_exhausted"] = interrupted
    result["per_file"] = args.per_file
    result["tests"] = tests

    per_module: dict[str, dict[str, object]] = result["per_module"]  # type: ignore[assignment]
    width = max(len(path) for path in per_module)
    for path, p in per_module.items():
        print(line(path, p, width))
    for package, p in result["packages"].items():  # type: ignore[attr-defined]
        print(line(f"{package}/", p, width))
    print(line("all", result, width))
    equivalents: list[dict[str, object]] = result["equivalents"]  # type: ignore[assignment]
    if equivalents:
        print(f"{len(equivalents)} listed equivalent mutants left out of killed / total:")
        for s in equivalents:
            print(f"  {s['file']}:{s['line']}  {s['description']}  ({s['why']})")
    print(f"{len(result['survivors'])} survivors:")  # type: ignore[arg-type]
    for s in result["survivors"]:  # type: ignore[attr-defined]
        print(f"  {s['file']}:{s['line']}  [{s['status']}]  {s['description']}  ({s['mutant']})")
    if interrupted:
        print(f"budget of {args.budget_min} min exhausted: {result['not_run']} mutants not run")
    print(f"elapsed {result['elapsed_s']} s")
    if args.json:
        print(json.dumps(result, ensure_ascii=False))


if __name__ == "__main__":
    main()
