"""The project's own checks: ruff (lint + format) on everything, mypy --strict on crypto/,
protocol/, ledger/ and node/."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def tool(name):
    path = BIN / name
    return str(path) if path.exists() else shutil.which(name)


def check(*cmd):
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr


def test_ruff_lint():
    check(tool("ruff"), "check", ".")


def test_ruff_format():
    check(tool("ruff"), "format", "--check", ".")


def test_mypy_strict_on_crypto_protocol_ledger_and_node():
    check(tool("mypy"))


# ---- the shape of the house (docs/ARCHITECTURE.md) -----------------------------------

# node's packages from the bottom up: a module may import only from its own package, from a
# lower rank, or from the base modules; crypto/, protocol/ and ledger/ never import node/.
NODE_RANKS = {
    "node.config": 0,
    "node.files": 0,
    "node.keystore": 0,
    "node.logs": 0,
    "node.orphans": 0,
    "node.tasks": 1,
    "node.net": 1,
    "node.engine": 2,
    "node.shardcast": 2,
    "node.rollouts": 3,
    "node.training": 4,
    "node.diloco": 4,
    "node.roles": 5,
    "node.cli": 6,
}
ROLES = ("inference", "validator", "trainer", "bootstrap")
# node/roles/ by kind, lowest first: a group imports only from its own or a lower one (and
# node/roles/given.py, what a role is given, from any)
ROLE_GROUPS = ("decisions", "children", "io", "services")
# a warning sign, not the design rule: a class this long most often holds two concerns
MAX_CLASS_LINES = 300


def imports_of(path):
    """Every module ``path`` imports (at the top or inside a function), resolved."""
    import ast

    out = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
            out.add(n.module)
            out.update(f"{n.module}.{a.name}" for a in n.names)
        elif isinstance(n, ast.Import):
            out.update(a.name for a in n.names)
    return out


def module_name(path):
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def project_modules():
    """{module name: path} of crypto/, protocol/, ledger/ and node/."""
    return {
        module_name(p): p
        for top in ("crypto", "protocol", "ledger", "node")
        for p in (ROOT / top).rglob("*.py")
    }


def import_graph():
    mods = project_modules()
    return {m: {i for i in imports_of(p) if i in mods and i != m} for m, p in mods.items()}


def rank_of(module):
    for prefix, rank in NODE_RANKS.items():
        if module == prefix or module.startswith(prefix + "."):
            return prefix, rank
    return None, None


def upward_imports(graph):
    out = []
    for mod, deps in graph.items():
        top = mod.split(".")[0]
        for dep in deps:
            if top in ("crypto", "protocol", "ledger") and dep.split(".")[0] == "node":
                out.append(f"{mod} -> {dep}")
            if top != "node" or dep.split(".")[0] != "node":
                continue
            (own, mine), (theirs, rank) = rank_of(mod), rank_of(dep)
            if own != theirs and (mine is None or rank is None or rank > mine or rank == mine):
                if rank != 0:
                    out.append(f"{mod} -> {dep}")
    return sorted(out)


def cycles(graph):
    """Each strongly connected component of more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def test_the_import_checks_catch_what_they_look_for():
    graph = {
        "node.training.ranks": {"node.roles.services.trainer", "node.config"},
        "node.cli.main": {"node.cli.weights", "node.net.runtime"},
        "node.cli.weights": {"node.cli.main"},
        "node.net.peers": {"node.net.host"},
        "protocol.ids": {"node.net.host"},
    }
    assert upward_imports(graph) == [
        "node.training.ranks -> node.roles.services.trainer",
        "protocol.ids -> node.net.host",
    ]
    assert cycles(graph) == [["node.cli.main", "node.cli.weights"]]


def test_no_arrows_up_between_layers_and_packages():
    assert upward_imports(import_graph()) == []


def test_no_import_circles():
    assert cycles(import_graph()) == []


def test_library_code_never_imports_a_command_module():
    graph = import_graph()
    bad = [
        f"{m} -> {d}"
        for m, deps in graph.items()
        if not m.startswith("node.cli")
        for d in deps
        if d.startswith("node.cli")
    ]
    assert bad == []


def test_no_role_imports_another_role():
    graph = import_graph()
    bad = [
        f"{m} -> {d}"
        for role in ROLES
        for m in [f"node.roles.services.{role}"]
        for d in graph.get(m, ())
        if d.startswith("node.roles.services.") and d.rsplit(".", 1)[1] in ROLES
    ]
    assert bad == []


def role_group(module):
    """The group of ``node/roles/`` a module is in (None: outside them, or given.py)."""
    parts = module.split(".")
    if parts[:2] == ["node", "roles"] and len(parts) > 2 and parts[2] in ROLE_GROUPS:
        return ROLE_GROUPS.index(parts[2])
    return None


def upward_role_imports(graph):
    return sorted(
        f"{m} -> {d}"
        for m, deps in graph.items()
        for d in deps
        if (mine := role_group(m)) is not None
        and (theirs := role_group(d)) is not None
        and theirs > mine
    )


def test_the_role_group_check_catches_what_it_looks_for():
    graph = {
        "node.roles.decisions.work": {"node.roles.io.chain", "node.roles.decisions.busy"},
        "node.roles.io.chain": {"node.roles.decisions.work", "node.roles.given"},
        "node.roles.given": {"node.roles.children.checking"},
    }
    assert upward_role_imports(graph) == ["node.roles.decisions.work -> node.roles.io.chain"]


def test_every_role_module_is_in_a_group_and_imports_only_downward():
    mods = [m for m in project_modules() if m.startswith("node.roles.")]
    assert [m for m in mods if role_group(m) is None] == ["node.roles.given"]
    assert {m.split(".")[2] for m in mods} == {*ROLE_GROUPS, "given"}
    assert upward_role_imports(import_graph()) == []


def private_reads(source):
    """Every ``<obj>._name`` where ``<obj>`` is not ``self``/``cls``/``super()`` (dunders
    aside), as ``line: expression``: a service reaching into another's internals."""
    import ast

    def is_self(node):
        if isinstance(node, ast.Name):
            return node.id in ("self", "cls")
        return isinstance(node, ast.Call) and getattr(node.func, "id", None) == "super"

    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            name = node.attr
            if name.startswith("_") and not name.startswith("__") and not is_self(node.value):
                out.append(f"{node.lineno}: {ast.unparse(node)}")
    return out


def test_the_private_read_check_catches_what_it_looks_for():
    src = (
        "class A:\n"
        "    def f(self, other):\n"
        "        self._mine = super()._base + self.__class__.__name__.__len__()\n"
        "        return self.book._manifests, other._jobs\n"
    )
    assert private_reads(src) == ["4: self.book._manifests", "4: other._jobs"]


SERVICE_PACKAGES = ("net", "shardcast", "roles")
# node/net/host.py is where py-libp2p is tuned and patched (each patch says why), and
# node/net/circuits.py where its relay and DCUtR are adapted: the modules that reach into
# another library's internals, never into ours
PATCHES_LIBP2P = {"host.py", "circuits.py"}


@pytest.mark.parametrize("package", SERVICE_PACKAGES)
def test_no_service_reads_another_objects_private_attributes(package):
    files = sorted((ROOT / "node" / package).rglob("*.py"))
    assert len(files) > 3
    files = [p for p in files if p.name not in PATCHES_LIBP2P]
    found = {p.name: private_reads(p.read_text()) for p in files}
    assert {name: reads for name, reads in found.items() if reads} == {}


def test_a_class_past_a_few_hundred_lines_is_looked_at_for_two_concerns():
    """A warning sign, not the design rule (docs/ARCHITECTURE.md, "Concerns, not line
    counts"): a class past ``MAX_CLASS_LINES`` most often holds two concerns. Split it where
    they part (a role's chain bookkeeping from its work loop, say), or, if it holds one,
    say so and raise the bound; never move code out only to get under it."""
    import ast

    too_long = []
    for path in (ROOT / "node").rglob("*.py"):
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.ClassDef) and n.end_lineno - n.lineno + 1 > MAX_CLASS_LINES:
                too_long.append(f"{module_name(path)}.{n.name}: {n.end_lineno - n.lineno + 1}")
    assert too_long == [], (
        f"past {MAX_CLASS_LINES} lines: which concerns do these hold? (split where they part; "
        "not where the count falls)"
    )


# ---- commit messages (scripts/hooks/commit-msg, installed by scripts/setup.sh) ----------


@pytest.mark.parametrize(
    ("message", "refused"),
    [
        ("x" * 72 + "\n\nbody\n", False),
        ("§" * 72 + "\n", False),  # characters, not bytes
        ("x" * 73 + "\n\nbody\n", "73 characters"),
        ("subject\nbody without a blank line\n", "blank line"),
        ("# only a comment\n\n", "empty"),
        ("subject\n# a comment git strips\n", False),
    ],
)
def test_the_commit_hook_keeps_subjects_short(tmp_path, message, refused):
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message)
    hook = ROOT / "scripts" / "hooks" / "commit-msg"
    res = subprocess.run([str(hook), str(path)], capture_output=True, text=True, timeout=30)
    assert (res.returncode != 0) == bool(refused), res.stderr
    if refused:
        assert refused in res.stderr


def test_setup_installs_the_commit_hook():
    assert "core.hooksPath scripts/hooks" in (ROOT / "scripts" / "setup.sh").read_text()
