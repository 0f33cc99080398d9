"""The work loop through real NATs (issue #29 item 4), for tests/test_nat.py and bench/nat.py.

In a ``NatLab`` (routers dropping unsolicited connections): the development chain (on the
public address, ``chain --host``), the bootstrap, the validator (a second relay, ``--relay.enabled
true``) and the trainer in the public namespace; one honest worker in each home, with
tests/test_loop.py's small work settings on the tiny model. Every process and the lab are
stopped on exit, and each node's exit code kept in ``codes``."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.cli.devnet import DEVNET_PASSWORD, fund, make_account, start_chain, wait_ready
from tests.helpers.netns import PUBLIC_IP, NatLab, NsNode, joining

FAST = [
    "--net.heartbeat-interval",
    "1",
    "--net.peer-ttl",
    "8",
    "--net.discovery-interval",
    "1",
]  # test_loop's
# the tiny model's ~3 MB in 256 KiB shards, the trainer's uploads capped at 2 MB/s: the workers
# pulling a version together split its shards and trade them (SHARDCAST's origin shares)
TRAINER = ["--shardcast.shard-size", "262144", "--shardcast.upload-rate", "2"]


def work_env(base: Path, ledger_env: dict[str, str], model: Path) -> dict[str, str]:
    """The run's settings for every node of the work loop: test_loop's small work, the
    ledger in the public namespace, the trainer's id."""
    from node.keystore import load_or_create_identity

    return {
        **ledger_env,
        "INTELLECT_NODE_RUN__TRAINER_PEER_ID": load_or_create_identity(base / "trainer").peer_id,
        "INTELLECT_NODE_PASSWORD": DEVNET_PASSWORD,
        "INTELLECT_NODE_TRAINER__STEP_WAIT": "20",
        "INTELLECT_NODE_RUN__MODEL": str(model),
        "INTELLECT_NODE_INFERENCE__MAX_UNJUDGED": "1",
        "INTELLECT_NODE_RUN__TASKS_PER_BATCH": "2",
        "INTELLECT_NODE_RUN__GROUP_SIZE": "2",
        "INTELLECT_NODE_RUN__MAX_NEW_TOKENS": "24",
        "INTELLECT_NODE_RUN__VERIFY_PROFILE": "strict-fp32",
        "INTELLECT_NODE_ENGINE__TORCH_THREADS": "1",
        "INTELLECT_NODE_RUN__ASYNC_LEVEL": "5",
    }


def peer_bytes(node: NsNode) -> dict[str, int]:
    """Shard bytes ``node`` fetched from each peer, over every download (``GET /weights``)."""
    out: dict[str, int] = {}
    for job in ((node.get("/weights") or {}).get("downloads") or {}).values():
        for peer, p in job["peers"].items():
            out[peer] = out.get(peer, 0) + p["bytes"]
    return out


@dataclass
class NatLoop:
    lab: NatLab
    nodes: list[NsNode] = field(default_factory=list)
    workers: list[NsNode] = field(default_factory=list)
    ids: dict[str, str] = field(default_factory=dict)  # node name -> peer id
    codes: dict[str, int | None] = field(default_factory=dict)  # exit codes, once stopped

    def node(self, name: str) -> NsNode:
        return next(n for n in self.nodes if n.name == name)

    def looped(self) -> dict[str, Any] | None:
        """Every worker has a batch accepted and holds a version the trainer stepped to."""
        work = {w.name: (w.status() or {}).get("inference") or {} for w in self.workers}
        trainer = (self.node("trainer").status() or {}).get("trainer") or {}
        held = {
            w.name: ((w.status() or {}).get("weights") or {}).get("current") for w in self.workers
        }
        ok = (
            all(s.get("accepted", 0) >= 1 for s in work.values())
            and trainer.get("step", 0) >= 1
            and all((v or 0) >= 1 for v in held.values())
        )
        return {"work": work, "trainer": trainer, "held": held} if ok else None

    def joined_directly(self, a: NsNode, b: NsNode) -> bool:
        """``a`` and ``b`` hold a connection to each other, and not only through a relay."""
        sa, sb = a.status() or {}, b.status() or {}
        linked = any(
            p["peer_id"] == self.ids[b.name] and p["connected"] for p in sa.get("peers", [])
        )
        return (
            linked
            and self.ids[b.name] not in sa.get("relay", {}).get("relayed_peers", [None])
            and self.ids[a.name] not in sb.get("relay", {}).get("relayed_peers", [None])
        )

    def traded(self, a: NsNode, b: NsNode) -> dict[str, int] | None:
        """Shard bytes ``a`` fetched from ``b`` and ``b`` from ``a``, once either is > 0."""
        got = {
            a.name: peer_bytes(a).get(self.ids[b.name], 0),
            b.name: peer_bytes(b).get(self.ids[a.name], 0),
        }
        return got if any(got.values()) else None

    @property
    def relays(self) -> tuple[str, str]:
        """The two public nodes serving circuit relay v2."""
        at_home = any(h.ns == self.node("validator").ns for h in self.lab.homes)
        return ("bootstrap", "trainer") if at_home else ("bootstrap", "validator")

    def bulk(self, seen: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """Bytes moved, from the nodes' statuses ``seen``: shard bytes the workers fetched,
        those fetched from a peer only a relay joined them to, what the relays copied."""
        names = {i: n for n, i in self.ids.items()}
        fetched = {w.name: peer_bytes(w) for w in self.workers}
        relayed_shards = sum(
            b
            for w in self.workers
            for p, b in fetched[w.name].items()
            if p in seen[w.name]["relay"]["relayed_peers"]
        )
        return {
            "shard_bytes": sum(seen[w.name]["weights"]["downloaded_bytes"] for w in self.workers),
            "relayed_shard_bytes": relayed_shards,
            "relay_bytes": sum(
                seen[r]["relay"]["counts"].get("relayed_bytes", 0) for r in self.relays
            ),
            "by_source": {
                w: {names.get(p, p): b for p, b in f.items() if b} for w, f in fetched.items()
            },
        }


@contextmanager
def nat_work_loop(
    base: Path,
    model: Path,
    nats: tuple[str, ...] = ("cone", "cone", "random"),
    validator_at: str | None = None,
) -> Iterator[NatLoop]:
    """A worker in a home behind each NAT of ``nats``; the validator in public (and a relay),
    or, with ``validator_at`` ("cone" or "random"), in a home of its own behind that NAT,
    the trainer then the second relay."""
    lab = NatLab([*nats, *([validator_at] if validator_at else [])], drop_unsolicited=True)
    loop = NatLoop(lab)
    in_public = ["ip", "netns", "exec", lab.public]
    chain = None
    try:
        chain, ledger_env = start_chain(
            base / "chain", extra=["--host", PUBLIC_IP], prefix=in_public
        )
        info = json.loads((base / "chain" / "chain.json").read_text())
        env = work_env(base, ledger_env, model)
        make_account(base / "trainer", info["owner_key"])
        make_account(base / "validator", info["validator_key"])

        def start(ns: str, name: str, role: str, listen_ip: str, args: list[str]) -> NsNode:
            node = NsNode.start(ns, name, base, role, listen_ip, args, network_only=False, env=env)
            loop.nodes.append(node)
            return node

        boot = start(lab.public, "bootstrap", "bootstrap", PUBLIC_IP, FAST)
        entry = joining(boot, FAST)
        relay = ["--relay.enabled", "true"]
        trainer = [*entry, *TRAINER, *(relay if validator_at else [])]
        start(lab.public, "trainer", "trainer", PUBLIC_IP, trainer)
        if validator_at:
            start(lab.homes[-1].ns, "validator", "validator", "0.0.0.0", entry)
        else:
            start(lab.public, "validator", "validator", PUBLIC_IP, [*entry, *relay])
        for i, home in enumerate(lab.homes[: len(nats)], start=1):
            name = f"worker{i}"
            fund(base / "chain", make_account(base / name), "10", prefix=in_public)
            loop.workers.append(start(home.ns, name, "inference", "0.0.0.0", entry))
        loop.ids = {n.name: wait_ready(n, 180)["peer_id"] for n in loop.nodes}
        yield loop
    finally:
        loop.codes = {n.name: n.stop(grace=20) for n in loop.nodes}
        if chain is not None and chain.poll() is None:
            chain.terminate()
            try:
                chain.wait(60)
            except subprocess.TimeoutExpired:
                chain.kill()
                chain.wait()
        lab.close()
