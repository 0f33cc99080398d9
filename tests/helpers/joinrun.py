"""A running run with a manifest, for joiners: the served development chain, the trainer
that signs the manifest and serves the run's files, an appointed validator given the run's
settings by hand; ``joiner`` starts a worker with a fresh data dir, a funded account and
``--bootstrap`` only (the chain's URL it takes from the manifest) (``tests/test_join.py``, ``bench/join.py``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from node.cli.devnet import (
    DEVNET_PASSWORD,
    NodeProcess,
    fund,
    make_account,
    p2p_addr,
    spawn_node,
    start_chain,
    wait_ready,
)
from node.cli.manifest import trainer_manifest
from node.config import load_config
from node.keystore import load_or_create_identity
from tests.helpers.net import FAST, FAST_ENV

FAST_FLAGS = [x for kv in FAST.items() for x in kv]
LISTEN = "/ip4/127.0.0.1/tcp/0"
WORK: dict[str, Any] = {  # the run's work settings: the trainer's terms, the validator's flags
    "run.tasks_per_batch": 2,
    "run.group_size": 2,
    "run.max_new_tokens": 24,
    "run.verify_profile": "strict-fp32",
    "run.async_level": 5,  # a loaded machine may generate slowly
}


def flags_of(settings: dict[str, Any]) -> list[str]:
    return [x for k, v in settings.items() for x in (f"--{k.replace('_', '-')}", str(v))]


class ManifestRun:
    """The chain, the trainer of a manifest and a validator; every process it starts,
    ``close`` stops. ``taskset``: the run's task file (default the built-in arithmetic);
    ``validator_joins``: the validator starts as a joiner does, its appointed account and
    ``--bootstrap`` only, and pulls the run's files (default: given them by hand)."""

    def __init__(
        self,
        base: Path,
        model: Path,
        *,
        trainer_flags: list[str] | None = None,
        taskset: Path | None = None,
        validator_joins: bool = False,
    ):
        self.base = base
        self.nodes: list[NodeProcess] = []
        self.taskset, self.validator_joins = taskset, validator_joins
        self.chain_proc, ledger_env = start_chain(base / "chain")
        try:
            self._start(model, ledger_env, trainer_flags or [])
        except BaseException:
            self.close()
            raise

    def _start(self, model: Path, ledger_env: dict[str, str], trainer_flags: list[str]) -> None:
        base = self.base
        info = json.loads((base / "chain" / "chain.json").read_text())
        trainer_id = load_or_create_identity(base / "trainer")
        self.trainer_peer = trainer_id.peer_id
        make_account(base / "trainer", info["owner_key"])  # the contract's owner
        run = {
            "run.manifest_name": "loop",
            "chain.id": int(ledger_env["INTELLECT_NODE_CHAIN__ID"]),
            "chain.contract": ledger_env["INTELLECT_NODE_CHAIN__CONTRACT"],
            "chain.contract_block": int(ledger_env["INTELLECT_NODE_CHAIN__CONTRACT_BLOCK"]),
            "run.model": str(model),
            # what the manifest tells a joiner given no chain URL (it checks it first)
            "chain.public_url": ledger_env["INTELLECT_NODE_CHAIN__URL"],
            **({} if self.taskset is None else {"run.taskset": str(self.taskset)}),
            **WORK,
        }
        cfg, _env = trainer_manifest(load_config(flags={"role": "trainer", **run}), trainer_id)
        self.run_id = cfg.run.id
        self.env = {  # what every node of this machine is told: the chain's URL, no more
            "INTELLECT_NODE_CHAIN__URL": ledger_env["INTELLECT_NODE_CHAIN__URL"],
            "INTELLECT_NODE_PASSWORD": DEVNET_PASSWORD,
            "INTELLECT_NODE_ENGINE__TORCH_THREADS": "1",
            "INTELLECT_NODE_INFERENCE__MAX_UNJUDGED": "1",
            **FAST_ENV,
        }
        self.trainer = self._spawn(
            "trainer",
            "trainer",
            [],
            [*flags_of(run), *trainer_flags],
            {"INTELLECT_NODE_TRAINER__STEP_WAIT": "20"},
        )
        self.trainer_addr = p2p_addr(wait_ready(self.trainer, timeout=300))
        make_account(base / "validator", info["validator_keys"][0])
        if self.validator_joins:
            self.validator = self.joiner("validator", role="validator")
            wait_ready(self.validator, timeout=300)
            return
        by_hand = {k: v for k, v in ledger_env.items() if k != "INTELLECT_NODE_CHAIN__URL"}
        self.validator = self._spawn(
            "validator",
            "validator",
            [self.trainer_addr],
            [*flags_of(WORK), "--model", str(model)],
            {**by_hand, "INTELLECT_NODE_RUN__TRAINER_PEER_ID": trainer_id.peer_id},
        )
        wait_ready(self.validator, timeout=300)

    def _spawn(
        self, name: str, role: str, bootstrap: list[str], extra: list[str], env: dict[str, str]
    ) -> NodeProcess:
        node = spawn_node(
            name,
            role,
            self.base,
            run_id=self.run_id,
            listen=LISTEN,
            bootstrap=bootstrap,
            extra=[*FAST_FLAGS, *extra],
            env_extra={**self.env, **env},
        )
        self.nodes.append(node)
        return node

    def fund_joiner(self, name: str) -> Path:
        """A fresh data dir holding a funded account (10 ETH), nothing else."""
        fund(self.base / "chain", make_account(self.base / name), "10")
        return self.base / name

    def joiner(
        self, name: str, bootstrap: list[str] | None = None, role: str = "inference"
    ) -> NodeProcess:
        """``start --role inference`` (or ``role``) on ``fund_joiner``'s data dir (or the
        one holding an account), ``--bootstrap`` only: no chain URL in its environment
        either."""
        data_dir = self.base / name
        cmd = [sys.executable, "-m", "node.cli", "start", "--role", role]
        cmd += ["--data-dir", str(data_dir), "--listen", LISTEN, *FAST_FLAGS]
        for b in bootstrap or [self.trainer_addr]:
            cmd += ["--bootstrap", b]
        log_path = data_dir / "node.log"
        # no chain URL: the joiner takes the one the run manifest suggests, checked
        env = {**os.environ, **self.env}
        del env["INTELLECT_NODE_CHAIN__URL"]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        node = NodeProcess(name, role, data_dir, proc, log_path)
        self.nodes.append(node)
        return node

    def close(self) -> None:
        for n in reversed(self.nodes):
            n.stop(grace=10)
        if self.chain_proc.poll() is None:
            self.chain_proc.send_signal(signal.SIGTERM)
            try:
                self.chain_proc.wait(60)
            except subprocess.TimeoutExpired:
                self.chain_proc.kill()
                self.chain_proc.wait()
