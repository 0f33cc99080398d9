"""What ``bench/mutation.py`` mutates: its ``MODULES`` cover every file of ``crypto/`` and
``protocol/`` and the decisions issue #59 names (the validator's checks, the substitution
test, SHARDCAST's plan, DiLoCo's membership and ring), each with fast tests that exist and
exercise it. mutmut itself is not run here (minutes; the bench runs it).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from bench.mutation import EQUIVALENT, MODULES, Module, function_of, selected_tests

ROOT = Path(__file__).resolve().parent.parent
# issue #59: the validator's cheap checks and recheck, its verdict schedule, the
# substitution test, SHARDCAST's download plan, DiLoCo's membership and ring
NAMED = (
    "node/roles/services/validator.py",
    "node/rollouts/recheck.py",
    "node/roles/decisions/judging.py",
    "crypto/substitution.py",
    "node/shardcast/schedule.py",
    "node/diloco/membership.py",
    "node/diloco/ring.py",
)
# tests that start processes or networks, or take tens of seconds: never in the bench
SLOW = ("test_shardcast_network.py", "test_batch_exchange.py", "test_top_p.py", "_network")


def test_modules_cover_crypto_protocol_and_the_named_decisions():
    paths = [m.path for m in MODULES]
    assert len(paths) == len(set(paths)), "a module listed twice"
    whole = {
        str(p.relative_to(ROOT))
        for package in ("crypto", "protocol")
        for p in (ROOT / package).glob("*.py")
        if p.name != "__init__.py"
    }
    assert whole <= set(paths), f"not mutated: {sorted(whole - set(paths))}"
    assert set(NAMED) <= set(paths), f"not mutated: {sorted(set(NAMED) - set(paths))}"


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.path)
def test_each_module_has_fast_tests_that_import_it(module: Module):
    tests = selected_tests(ROOT, (module,))
    assert tests, f"{module.path}: no test file matches {module.tests}"
    assert not [t for t in tests if any(s in t for s in SLOW)], f"slow tests in {tests}"
    package, _, name = module.path.removesuffix(".py").replace("/", ".").rpartition(".")
    imports = re.compile(
        rf"\b{re.escape(package)}\.{name}\b|from {re.escape(package)} import .*\b{name}\b"
    )
    texts = [(ROOT / t.split("::")[0]).read_text() for t in tests]
    assert any(imports.search(text) for text in texts), f"no test of {tests} imports {module.path}"


@pytest.mark.parametrize("module", [m for m in MODULES if m.functions], ids=lambda m: m.path)
def test_the_functions_a_module_names_exist(module: Module):
    tree = ast.parse((ROOT / module.path).read_text())
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    defined |= {
        f"{c.name}.{n.name}"
        for c in tree.body
        if isinstance(c, ast.ClassDef)
        for n in c.body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    assert set(module.functions) <= defined, sorted(set(module.functions) - defined)


def test_a_mutant_is_placed_in_its_function_or_method():
    assert function_of("node.diloco.ring.x_norm_limits__mutmut_12") == "norm_limits"
    assert function_of("crypto.toploc.xǁProofǁencode__mutmut_3") == "Proof.encode"


def test_listed_equivalents_are_of_mutated_modules_and_say_why():
    dotted = {m.path.removesuffix(".py").replace("/", ".") for m in MODULES}
    for name, (change, why) in EQUIVALENT.items():
        assert name.rpartition(".")[0] in dotted, name
        assert "->" in change and why, name
