"""SHARDCAST's parts (node/shardcast/*.py) ask the node for nothing beyond its public API,
and the ``/weights`` and ``/status`` views they build keep their exact shape. That no part
reads another's private attributes and no class passes 300 lines is checked for all of
``node/`` in tests/test_quality.py."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "node" / "shardcast"
# the runtime's public API for services (node/net/runtime.py)
NODE_API = {
    "serve_requests",
    "request",
    "open_request",
    "subscribe",
    "announce",
    "add_status",
    "header",
    "reject",
    "known_peers",
    "connected_peers",
    "provide",
    "find_providers",
    "relayed",
    "direct_path",
    "disconnect",
    "connect",
    "metrics",
    "identity",
    "cfg",
    "peer_id",
}


def _is_self(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"
    )


def node_calls(source: str) -> list[str]:
    """Every attribute asked of the node (``self.node.X`` or ``node.X``) outside its API."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        value = node.value
        is_node = (isinstance(value, ast.Name) and value.id == "node") or (
            isinstance(value, ast.Attribute) and value.attr == "node" and _is_self(value.value)
        )
        if is_node and node.attr not in NODE_API:
            out.append(f"{node.lineno}: {ast.unparse(node)}")
    return out


def parts() -> list[Path]:
    found = sorted(PACKAGE.glob("*.py"))
    assert len(found) > 5, found
    return found


def test_the_checks_catch_what_they_look_for():
    src = (
        "class A:\n"
        "    def f(self, other):\n"
        "        self._mine = super()._base + self.__class__.__name__.__len__()\n"
        "        return self.book._manifests, other._jobs, self.node.dht, node.peers\n"
    )
    assert node_calls(src) == ["4: self.node.dht", "4: node.peers"]


@pytest.mark.parametrize("path", parts(), ids=lambda p: p.name)
def test_parts_use_only_the_nodes_public_api(path):
    assert node_calls(path.read_text()) == [], path


def test_weights_status_and_summary_keep_their_exact_shape(tmp_path):
    """``GET /weights`` and the ``/status`` section, built from the parts' typed status,
    are the dicts the CLI, the devnet and the tests read (keys in this order)."""
    import json
    from types import SimpleNamespace

    import trio

    from node.config import NodeConfig
    from node.shardcast.service import WeightService
    from node.shardcast.store import publish
    from tests.test_shardcast import TRAINER, checkpoint, make_store

    cfg = NodeConfig(
        data_dir=tmp_path / "node", run={"id": "run-1", "trainer_peer_id": TRAINER.peer_id}
    )
    svc = WeightService(SimpleNamespace(peer_id="me"), cfg)  # type: ignore[arg-type]
    src = checkpoint(tmp_path, {"w.bin": 200 * 1024})
    kw = dict(identity=TRAINER, shard_size=64 * 1024, ts_ms=1)
    publish(svc.store, src, version=3, step=30, seq=3, **kw)
    later = publish(make_store(tmp_path, "origin"), src, version=4, step=40, seq=4, **kw)
    svc.store.begin(later.manifest, later.envelope).close()  # a download cut short
    assert trio.run(svc.book.load) == [4]

    path = str(tmp_path / "node" / "weights" / "v00000003" / "files")
    row = {"version": 3, "step": 30, "bytes": 204800, "shards": 4, "held": 4}
    expected = {
        "trainer": TRAINER.peer_id,
        "current": 3,
        "newest_known": 4,
        "keep": cfg.run.async_level + 2,
        "versions": [
            {**row, "complete": True, "files": 1, "path": path},
            {**row, "version": 4, "step": 40, "held": 0, "complete": False, "files": 1}
            | {"path": None},
        ],
        "downloads": {},
        "uploads": {"active": 0, "bytes": 0},
    }
    assert json.dumps(svc.status()) == json.dumps(expected)
    assert svc.summary() == {
        "current": 3,
        "newest_known": 4,
        "held": [3],
        "downloading": {},
        "uploads_active": 0,
        "uploaded_bytes": 0,
        "downloaded_bytes": 0,
    }
    assert list(svc.summary()) == [
        "current",
        "newest_known",
        "held",
        "downloading",
        "uploads_active",
        "uploaded_bytes",
        "downloaded_bytes",
    ]
    assert svc.model_dir(3) == Path(path) and svc.model_dir(4) is None
