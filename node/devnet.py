"""A local network on 127.0.0.1: one process per node, the real binary in each.

Starts the development chain with the ledger contract (``intellect-node chain``), makes a
ledger account for every worker (funded from the chain's development keys) and gives the
validator one of the chain's appointed validator keys, then starts a bootstrap node, the
trainer (the run's clock), the validator and N inference nodes (``--cheaters C`` of them
cheat: other weights) that each know only the bootstrap. Workers stake and register
themselves, generate a batch per trainer step, and the validator judges each one on-chain.
A live table shows per worker the batches generated, accepted, rejected and waiting, the
stake and the rewards pending and claimable, until Ctrl-C or ``duration`` seconds. Every
process it starts it also stops (SIGTERM, then SIGKILL after a grace period).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.admin import ADMIN_FILE


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class NodeProcess:
    name: str
    role: str
    data_dir: Path
    proc: subprocess.Popen[bytes]
    log_path: Path

    def admin(self) -> dict[str, Any] | None:
        try:
            info: dict[str, Any] = json.loads((self.data_dir / ADMIN_FILE).read_text())
            return info
        except (FileNotFoundError, ValueError):
            return None

    def status(self, timeout: float = 5) -> dict[str, Any] | None:
        info = self.admin()
        if info is None:
            return None
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{info['port']}/status", timeout=timeout
            ) as r:
                st: dict[str, Any] = json.loads(r.read())
                return st
        except OSError:
            return None

    def stop(self, sig: int = signal.SIGTERM, grace: float = 10) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def spawn_node(
    name: str,
    role: str,
    base_dir: Path,
    *,
    run_id: str,
    listen: str,
    bootstrap: list[str],
    extra: list[str] | None = None,
    env_extra: dict[str, str] | None = None,
    module: str = "node.cli",
) -> NodeProcess:
    data_dir = base_dir / name
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / ADMIN_FILE).unlink(missing_ok=True)
    log_path = data_dir / "node.log"
    cmd = [
        sys.executable,
        "-m",
        module,
        "start",
        "--role",
        role,
        "--data-dir",
        str(data_dir),
        "--run-id",
        run_id,
        "--listen",
        listen,
    ]
    for b in bootstrap:
        cmd += ["--bootstrap", b]
    cmd += extra or []
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env_extra or {}))
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=Path(__file__).resolve().parent.parent,
        )
    return NodeProcess(name, role, data_dir, proc, log_path)


def wait_ready(node: NodeProcess, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if node.proc.poll() is not None:
            raise RuntimeError(
                f"{node.name} exited with {node.proc.returncode}:\n{node.log_path.read_text()[-3000:]}"
            )
        st = node.status()
        if st is not None:
            return st
        time.sleep(0.1)
    raise TimeoutError(f"{node.name} did not come up within {timeout} s")


def p2p_addr(status: dict[str, Any]) -> str:
    addr = next(a for a in status["addrs"] if "/ip4/127.0.0.1/" in a)
    return f"{addr}/p2p/{status['peer_id']}"


def table(nodes: list[NodeProcess]) -> str:
    rows = [f"{'node':<12} {'role':<10} {'peer id':<54} {'peers':>5}  by role"]
    for n in nodes:
        st = n.status()
        if st is None:
            rows.append(f"{n.name:<12} {n.role:<10} {'(not answering)':<54}")
            continue
        by_role = ", ".join(f"{r}={c}" for r, c in sorted(st["peers_by_role"].items()))
        rows.append(
            f"{n.name:<12} {n.role:<10} {st['peer_id']:<54} {len(st['peers']):>5}  {by_role}"
        )
    return "\n".join(rows)


def start_chain(
    data_dir: Path, timeout: float = 60
) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    """``intellect-node chain`` as a process; returns it and the env that points nodes at it."""
    info_path = data_dir / "chain.json"
    info_path.unlink(missing_ok=True)
    log = open(data_dir.parent / "chain.log", "wb")  # noqa: SIM115 - handed to the child
    cmd = [
        sys.executable,
        "-m",
        "node.cli",
        "chain",
        "--port",
        str(free_port()),
        "--data-dir",
        str(data_dir),
    ]
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parent.parent
    )
    log.close()
    deadline = time.monotonic() + timeout
    while not info_path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(
                f"the development chain did not start; see {data_dir.parent / 'chain.log'}"
            )
        time.sleep(0.1)
    time.sleep(0.1)
    info = json.loads(info_path.read_text())
    print(
        f"devnet: chain at {info['url']} (chain id {info['chain_id']}), contract {info['contract']}",
        flush=True,
    )
    env = {
        "INTELLECT_NODE_CHAIN": info["url"],
        "INTELLECT_NODE_CONTRACT": info["contract"],
        "INTELLECT_NODE_CONTRACT_BLOCK": str(info["block"]),
        "INTELLECT_NODE_CHAIN_ID": str(info["chain_id"]),
    }
    return proc, env


def prepare_model(out: Path) -> Path:
    """The tiny base policy for the run (``model init``): built once per machine, cached."""
    from node.engine.tinymodel import Recipe, build_tiny_model
    from node.model_cli import default_cache_dir

    started = time.monotonic()
    print("devnet: preparing the base model (built once per machine, then cached)", flush=True)
    path, built = build_tiny_model(out, Recipe(), cache_dir=default_cache_dir())
    how = "built" if built else "reused from the cache"
    print(f"devnet: base model {path} ({how}, {time.monotonic() - started:.1f} s)", flush=True)
    return path


DEVNET_PASSWORD = "devnet"  # the development accounts' keystore password (local only)
WORKER_FUNDS = "10"  # ETH sent to each worker account


def make_account(data_dir: Path, private_key: str | None = None) -> str:
    """A keystore in ``data_dir`` (kept if there is one); returns its address."""
    from ledger.accounts import account_address, account_path, create_account

    if not account_path(data_dir).exists():
        create_account(data_dir, DEVNET_PASSWORD, private_key=private_key)
    return account_address(data_dir).lower()


def fund(chain_dir: Path, address: str, amount: str) -> None:
    """``intellect-node chain fund`` from the development chain's funder key."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "node.cli",
            "chain",
            "fund",
            address,
            amount,
            "--data-dir",
            str(chain_dir),
        ],
        check=True,
        capture_output=True,
        cwd=Path(__file__).resolve().parent.parent,
    )


def work_table(nodes: list[NodeProcess]) -> str:
    """Per worker: batches and money; per validator: verdicts (from each node's status)."""
    rows = [
        f"{'node':<14} {'step':>5} {'gen':>4} {'acc':>4} {'rej':>4} {'wait':>4} "
        f"{'tok/s':>7} {'stake ETH':>10} {'pending':>9} {'claimable':>9}"
    ]
    for n in nodes:
        st = n.status() or {}
        w, v = st.get("inference"), st.get("validator")
        if w is not None:
            rows.append(
                f"{n.name:<14} {str(w['step']):>5} {w['generated']:>4} {w['accepted']:>4} "
                f"{w['rejected']:>4} {w['unjudged']:>4} {w['tokens_per_s']:>7} "
                f"{w.get('stake_wei', 0) / 1e18:>10.4f} {w.get('pending_wei', 0) / 1e18:>9.6f} "
                f"{w.get('claimable_wei', 0) / 1e18:>9.6f}"
                + ("  (cheats)" if w["cheat"] != "none" else "")
            )
        elif v is not None:
            reasons = ", ".join(f"{k} {c}" for k, c in v["rejected_by_reason"].items()) or "-"
            rows.append(
                f"{n.name:<14} {str(v['step']):>5} judged {v['judged']}: accepted "
                f"{v['accepted']}, rejected {v['rejected']} ({reasons}), waiting {v['waiting']}"
            )
    return "\n".join(rows)


def run_devnet(
    base_dir: Path,
    *,
    run_id: str,
    inference: int,
    duration: float,
    cheaters: int = 0,
    step_interval: float = 15.0,
) -> int:
    if not 0 <= cheaters <= inference:
        raise ValueError("--cheaters must be between 0 and --inference")
    base_dir.mkdir(parents=True, exist_ok=True)
    fast = ["--heartbeat-interval", "2", "--peer-ttl", "10", "--discovery-interval", "1"]
    nodes: list[NodeProcess] = []
    stopping = False

    def on_signal(_sig: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True

    old = signal.signal(signal.SIGINT, on_signal), signal.signal(signal.SIGTERM, on_signal)
    chain: subprocess.Popen[bytes] | None = None
    try:
        chain, ledger_env = start_chain(base_dir / "chain")
        chain_info = json.loads((base_dir / "chain" / "chain.json").read_text())
        # the trainer's key is the run's trust root for weights and steps: make it first
        from node.keystore import load_or_create_identity

        trainer_id = load_or_create_identity(base_dir / "trainer").peer_id
        ledger_env = {
            **ledger_env,
            "INTELLECT_NODE_TRAINER_PEER_ID": trainer_id,
            "INTELLECT_NODE_PASSWORD": DEVNET_PASSWORD,
            "INTELLECT_NODE_STEP_INTERVAL": str(step_interval),
            # every node computes in fp32 on a CPU: the exact profile (SPEC section 11.1)
            "INTELLECT_NODE_VERIFY_PROFILE": "strict-fp32",
        }
        print(f"devnet: trainer (weights and steps trust root) {trainer_id}", flush=True)
        validator_addr = make_account(base_dir / "validator", chain_info["validator_key"])
        print(f"devnet: validator account {validator_addr} (appointed by the chain)", flush=True)
        workers = [f"inference-{i}" for i in range(inference)]
        for i, name in enumerate(workers):
            address = make_account(base_dir / name)
            fund(base_dir / "chain", address, WORKER_FUNDS)
            how = "cheats: other weights" if i >= inference - cheaters else "honest"
            print(
                f"devnet: {name} account {address}, funded {WORKER_FUNDS} ETH ({how})", flush=True
            )
        model_env = {"INTELLECT_NODE_MODEL": str(prepare_model(base_dir / "model"))}
        boot = spawn_node(
            "bootstrap",
            "bootstrap",
            base_dir,
            run_id=run_id,
            listen=f"/ip4/127.0.0.1/tcp/{free_port()}",
            bootstrap=[],
            extra=fast,
            env_extra=ledger_env,
        )
        nodes.append(boot)
        boot_addr = p2p_addr(wait_ready(boot))
        print(f"devnet: bootstrap at {boot_addr}", flush=True)
        roles = [("trainer", "trainer", {}), ("validator", "validator", {})] + [
            (
                name,
                "inference",
                {"INTELLECT_NODE_CHEAT": "other_weights", "INTELLECT_NODE_DEV_CHEATS": "true"}
                if i >= inference - cheaters
                else {},
            )
            for i, name in enumerate(workers)
        ]
        for name, role, extra_env in roles:
            nodes.append(
                spawn_node(
                    name,
                    role,
                    base_dir,
                    run_id=run_id,
                    listen="/ip4/127.0.0.1/tcp/0",
                    bootstrap=[boot_addr],
                    extra=fast,
                    env_extra={**ledger_env, **model_env, **extra_env},
                )
            )
        for n in nodes[1:]:
            wait_ready(n)
        started = time.monotonic()
        want = len(nodes) - 1
        while not stopping and time.monotonic() - started < 60:
            sts = [n.status() for n in nodes]
            if all(st is not None and len(st["peers"]) == want for st in sts):
                break
            time.sleep(0.5)
        print(
            f"devnet: {len(nodes)} nodes, discovery took {time.monotonic() - started:.1f} s",
            flush=True,
        )
        print(table(nodes), flush=True)
        print(f"devnet: logs and keys under {base_dir}; Ctrl-C stops every node", flush=True)
        last = 0.0
        while not stopping and (duration <= 0 or time.monotonic() - started < duration):
            time.sleep(0.2)
            for n in nodes:
                if n.proc.poll() is not None:
                    raise RuntimeError(
                        f"{n.name} exited with {n.proc.returncode}; its log: {n.log_path}"
                    )
            if time.monotonic() - last > 10:
                print(work_table(nodes), flush=True)
                last = time.monotonic()
    finally:
        for n in reversed(nodes):
            n.stop()
        if chain is not None and chain.poll() is None:
            chain.send_signal(signal.SIGTERM)
            try:
                chain.wait(10)
            except subprocess.TimeoutExpired:
                chain.kill()
                chain.wait()
        signal.signal(signal.SIGINT, old[0])
        signal.signal(signal.SIGTERM, old[1])
        print("devnet: all nodes and the chain stopped", flush=True)
    return 0
