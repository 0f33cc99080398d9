"""One admin client: the commands, the devnet, the tests' helpers and the benches reach a
node's admin endpoint only through ``node/cli/adminclient.py`` (the adversarial tests, which
send malformed requests on purpose, are the exception)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLIENT = ROOT / "node" / "cli" / "adminclient.py"
HTTP_MODULES = {"urllib.request", "http.client", "requests", "httpx", "urllib3"}


def http_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in HTTP_MODULES}
        elif isinstance(node, ast.ImportFrom) and node.module in HTTP_MODULES:
            found.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.module == "urllib":
            found |= {f"urllib.{a.name}" for a in node.names} & HTTP_MODULES
    return found


def test_only_the_admin_client_speaks_http_to_a_node() -> None:
    files = [*(ROOT / "node" / "cli").glob("*.py"), *(ROOT / "tests" / "helpers").glob("*.py")]
    files += [ROOT / "bench" / "shardcast.py", ROOT / "bench" / "scale.py"]
    # the hostile chain's RPC proxy speaks JSON-RPC to a chain (anvil), never to a node
    files.remove(ROOT / "tests" / "helpers" / "hostilechain.py")
    offenders = {
        str(f.relative_to(ROOT)): sorted(found)
        for f in files
        if f != CLIENT and (found := http_imports(f))
    }
    assert offenders == {}, f"use node.cli.adminclient instead: {offenders}"
    assert "urllib.request" in http_imports(CLIENT)  # the check can see an import
