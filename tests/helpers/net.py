"""Helpers for tests that run real nodes as separate processes on 127.0.0.1."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from node.cli.adminclient import admin_post, admin_text
from node.cli.devnet import NodeProcess, p2p_addr, spawn_node, wait_ready

CLI = [sys.executable, "-m", "node.cli"]  # the binary, as a test runs it
FAST = {
    "--net.heartbeat-interval": "0.5",
    "--net.peer-ttl": "6",
    "--net.discovery-interval": "0.5",
    "--net.read-timeout": "2",
    "--net.connect-timeout": "2",
}
# as environment variables (inherited by every node of a test): heartbeats every 0.5 s
# whatever the network's size (the tests' networks are small)
FAST_ENV = {"INTELLECT_NODE_NET__PRESENCE_RATE": "1000"}


def one_clear_line(res: Any, *needles: str) -> None:
    """A CLI run that failed with one line on stderr (no traceback) naming each of ``needles``."""
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def setting_flag(key: str) -> str:
    """A keyword argument naming a setting as ``section__name`` (``net__read_timeout``, the
    environment's delimiter) -> its ``start`` flag (``--net.read-timeout``)."""
    return "--" + key.replace("__", ".").replace("_", "-")


class Cluster:
    """Starts node processes under ``base``; ``close`` stops every one of them."""

    def __init__(self, base: Path, run_id: str = "test-run") -> None:
        self.base = base
        self.run_id = run_id
        self.nodes: list[NodeProcess] = []

    def start(
        self,
        role: str,
        bootstrap: list[str] | None = None,
        *,
        name: str | None = None,
        module: str = "node.cli",
        env: dict[str, str] | None = None,
        **overrides: str,
    ) -> tuple[NodeProcess, dict[str, Any]]:
        """Start a node (``name``: reuse that data dir, e.g. to restart a killed node;
        ``module``: run another entry point with the same flags, e.g. a test's evil node)."""
        opts = dict(FAST)
        opts.update({setting_flag(k): str(v) for k, v in overrides.items()})
        extra = [x for kv in opts.items() for x in kv]
        name = name or f"n{len(self.nodes)}-{role}"
        node = spawn_node(
            name,
            role,
            self.base,
            run_id=self.run_id,
            listen="/ip4/127.0.0.1/tcp/0",
            bootstrap=bootstrap or [],
            extra=extra,
            # network nodes: the roles' work needs a model and a chain (tests/test_loop.py)
            env_extra={"INTELLECT_NODE_NETWORK_ONLY": "true", **FAST_ENV, **(env or {})},
            module=module,
        )
        self.nodes.append(node)
        return node, wait_ready(node)

    def start_many(
        self,
        role: str,
        count: int,
        bootstrap: list[str],
        *,
        env: dict[str, str] | None = None,
        **overrides: str,
    ) -> list[tuple[NodeProcess, dict[str, Any]]]:
        """Start ``count`` nodes at once (all spawned, then each waited for)."""
        opts = dict(FAST)
        opts.update({setting_flag(k): str(v) for k, v in overrides.items()})
        extra = [x for kv in opts.items() for x in kv]
        started = []
        for _ in range(count):
            node = spawn_node(
                f"n{len(self.nodes)}-{role}",
                role,
                self.base,
                run_id=self.run_id,
                listen="/ip4/127.0.0.1/tcp/0",
                bootstrap=bootstrap,
                extra=extra,
                env_extra={"INTELLECT_NODE_NETWORK_ONLY": "true", **FAST_ENV, **(env or {})},
            )
            self.nodes.append(node)
            started.append(node)
        return [(n, wait_ready(n, timeout=120)) for n in started]

    def close(self) -> None:
        for n in self.nodes:
            n.stop(grace=5)


def addr_of(status: dict[str, Any]) -> str:
    return p2p_addr(status)


def wait_until(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


def status(node: NodeProcess) -> dict[str, Any]:
    st = node.status()
    assert st is not None, f"{node.name} is not answering:\n{node.log_path.read_text()[-2000:]}"
    return st


def metrics(node: NodeProcess) -> str:
    return admin_text(node.data_dir, "/metrics")


def counter(text: str, name: str, **labels: str) -> int:
    """Sum of the series of ``name`` whose labels include ``labels``."""
    total = 0
    for line in text.splitlines():
        m = re.fullmatch(rf"{name}(\{{(.*)\}})? (\S+)", line)
        if not m:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += int(float(m.group(3)))
    return total


def post(node: NodeProcess, path: str, body: dict[str, Any], timeout: float = 30) -> Any:
    return admin_post(node.data_dir, path, body, timeout=timeout)


def peer_roles(node: NodeProcess) -> dict[str, str]:
    return {p["peer_id"]: p["role"] for p in status(node)["peers"]}


def dump_logs(nodes: list[NodeProcess]) -> str:
    return "\n".join(f"--- {n.name}\n{n.log_path.read_text()[-1500:]}" for n in nodes)


@asynccontextmanager
async def two_nodes(
    tmp_path: Path, names: tuple[str, str], **flags: Any
) -> AsyncIterator[tuple[Any, Any]]:
    """Two in-process nodes on 127.0.0.1 (data under ``tmp_path / name``, ``flags`` added to
    their settings, ``section__name`` for ``[section] name``: ``run__id="r"``), the second
    connected to the first; both stopped on exit."""
    async with some_nodes(tmp_path, names, **flags) as (first, second):
        yield first, second


@asynccontextmanager
async def some_nodes(
    tmp_path: Path, names: tuple[str, ...], **flags: Any
) -> AsyncIterator[tuple[Any, ...]]:
    """In-process nodes as ``two_nodes`` starts them, every one after the first connected
    to the first."""
    import trio
    from libp2p.peer.id import ID
    from libp2p.peer.peerinfo import PeerInfo

    from crypto.identity import Identity
    from node.config import load_config
    from node.net.host import parse_addrs
    from node.net.runtime import Node

    nodes = []
    async with trio.open_nursery() as nursery:
        for name in names:
            cfg = load_config(
                environ={},
                flags={
                    **{k.replace("__", "."): v for k, v in flags.items()},
                    "net.listen": ["/ip4/127.0.0.1/tcp/0"],
                    "data_dir": tmp_path / name,
                    "net.read_timeout": 3.0,
                    "net.discovery_interval": 600.0,
                },
            )
            nodes.append(await nursery.start(Node(cfg, Identity.generate()).serve))
        first = nodes[0]
        for other in nodes[1:]:
            await other.connect(PeerInfo(ID.from_base58(first.peer_id), parse_addrs(first.addrs)))
        try:
            yield tuple(nodes)
        finally:
            for n in nodes:
                n.request_stop()
            nursery.cancel_scope.cancel()
