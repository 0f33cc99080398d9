"""Work flows and is judged: real node processes on 127.0.0.1, the served development chain,
the tiny model. A worker killed with SIGKILL after its batch was stored is restarted, and
the validator still fetches and judges that batch; a removed validator restarts and judges
only work from before its removal. ``Loop`` here runs the devnets of the other end-to-end
tests: honest and cheating work, its verdicts, slashing and rewards are
``tests/test_matrix.py``'s (every cheat of SPEC §12.1 beside two honest workers)."""

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from node.cli.devnet import (
    DEVNET_PASSWORD,
    fund,
    make_account,
    p2p_addr,
    spawn_node,
    start_chain,
    wait_ready,
)
from tests.helpers.net import wait_until

RUN = "loop-run"
FAST = ["--heartbeat-interval", "1", "--peer-ttl", "8", "--discovery-interval", "1"]


class Loop:
    def __init__(
        self, base: Path, model: Path, *, step_wait: float = 20, chain_args=None, fast=True
    ) -> None:
        """``fast``: the tests' heartbeats and discovery rounds (every second); otherwise
        the production defaults (every 5 s), as a benchmark of always-on cost wants."""
        from node.keystore import load_or_create_identity

        self.base = base
        self.fast = fast
        self.chain_proc, ledger_env = start_chain(base / "chain", extra=chain_args)
        self.chain_info = json.loads((base / "chain" / "chain.json").read_text())
        trainer_id = load_or_create_identity(base / "trainer").peer_id
        make_account(base / "trainer", self.chain_info["owner_key"])  # the contract's owner
        self.env = {
            **ledger_env,
            "INTELLECT_NODE_TRAINER_PEER_ID": trainer_id,
            "INTELLECT_NODE_PASSWORD": DEVNET_PASSWORD,
            "INTELLECT_NODE_STEP_WAIT": str(step_wait),
            "INTELLECT_NODE_MODEL": str(model),
            "INTELLECT_NODE_MAX_UNJUDGED": "1",
            "INTELLECT_NODE_TASKS_PER_BATCH": "2",
            "INTELLECT_NODE_GROUP_SIZE": "2",
            "INTELLECT_NODE_MAX_NEW_TOKENS": "24",
            "INTELLECT_NODE_VERIFY_PROFILE": "strict-fp32",
            "INTELLECT_NODE_TORCH_THREADS": "1",  # the nodes share the machine's cores
            "INTELLECT_NODE_ASYNC_LEVEL": "5",  # a loaded CI machine may generate slowly
        }
        self.nodes = {}
        self.addresses = {}
        try:
            self.boot = self.spawn("bootstrap", "bootstrap", listen=None)
            self.boot_addr = p2p_addr(wait_ready(self.boot))
        except BaseException:  # nothing it started outlives a failed start
            self.close()
            raise

    def spawn(self, name, role, *, listen="/ip4/127.0.0.1/tcp/0", env=None):
        from node.cli.devnet import free_port

        node = spawn_node(
            name,
            role,
            self.base,
            run_id=RUN,
            listen=listen or f"/ip4/127.0.0.1/tcp/{free_port()}",
            bootstrap=[] if role == "bootstrap" else [self.boot_addr],
            extra=FAST if self.fast else [],
            env_extra={**self.env, **(env or {})},
        )
        self.nodes[name] = node
        return node

    def worker(self, name, cheat=None):
        address = make_account(self.base / name)
        fund(self.base / "chain", address, "10")
        self.addresses[name] = address
        env = {"INTELLECT_NODE_CHEAT": cheat, "INTELLECT_NODE_DEV_CHEATS": "true"} if cheat else {}
        return self.spawn(name, "inference", env=env)

    def validator(self):
        self.addresses["validator"] = make_account(
            self.base / "validator", self.chain_info["validator_key"]
        )
        return self.spawn("validator", "validator")

    def client(self):
        from ledger.chain import connect
        from ledger.client import LedgerClient

        chain = connect(self.chain_info["url"], dev_keys=self.chain_info["dev_keys"])
        return LedgerClient(chain, self.chain_info["contract"])

    def section(self, name, key):
        st = self.nodes[name].status() or {}
        return st.get(key)

    def close(self):
        for node in reversed(list(self.nodes.values())):
            node.stop()
        if self.chain_proc.poll() is None:
            self.chain_proc.send_signal(signal.SIGTERM)
            try:  # a chain with --state writes it first: slow on a loaded machine
                self.chain_proc.wait(120)
            except subprocess.TimeoutExpired:
                self.chain_proc.kill()
                self.chain_proc.wait()


def submissions(client):
    """(worker, key) -> units of every WorkSubmitted event so far."""
    return {
        (str(e["args"]["worker"]).lower(), bytes(e["args"]["key"])): int(e["args"]["units"])
        for e in client.contract.events.WorkSubmitted.get_logs(from_block=0)
    }


def after_removal(client, removed_at):
    """(worker, key) of the submissions in blocks later than ``removed_at`` (a timestamp):
    those a validator removed then leaves to the others."""
    return {
        (str(e["args"]["worker"]).lower(), bytes(e["args"]["key"]))
        for e in client.contract.events.WorkSubmitted.get_logs(from_block=0)
        if int(client.w3.eth.get_block(e["blockNumber"])["timestamp"]) > removed_at
    }


def verdict_events(client):
    out = {}
    for name in ("WorkAccepted", "WorkRejected"):
        for e in getattr(client.contract.events, name).get_logs(from_block=0):
            key = (str(e["args"]["worker"]).lower(), bytes(e["args"]["key"]))
            out.setdefault(key, []).append(name)
    return out


@pytest.fixture
def loop(tmp_path, tiny_model_dir):
    lp = Loop(tmp_path, tiny_model_dir)
    try:
        yield lp
    finally:
        lp.close()


@pytest.mark.timeout(900)
def test_a_worker_killed_after_storing_its_batch_still_gets_it_judged(loop):
    loop.spawn("trainer", "trainer")
    validator = loop.validator()
    worker = loop.worker("w")
    for node in loop.nodes.values():
        wait_ready(node, timeout=120)
    store = loop.base / "w" / "batches"
    wait_until(
        lambda: loop.section("validator", "validator") is not None, 120, "the validator role"
    )
    os.kill(validator.proc.pid, signal.SIGSTOP)  # the validator looks away...
    try:
        wait_until(
            lambda: any(store.glob("*.batch")), 300, "the worker to store a batch", interval=0.05
        )
        worker.proc.send_signal(signal.SIGKILL)  # ...while the worker dies after storing it
        worker.proc.wait()
        key = bytes.fromhex(next(store.glob("*.batch")).name.removesuffix(".batch"))
    finally:
        os.kill(validator.proc.pid, signal.SIGCONT)
    wait_until(lambda: validator.status() is not None, 60, "the validator, running again")
    loop.spawn("w", "inference")  # restarted: same data dir, same keys
    client = loop.client()
    address = loop.addresses["w"]
    wait_until(
        lambda: client.submission(address, key).status in ("accepted", "rejected"),
        300,
        "the stored batch to be judged",
        interval=2,
    )
    assert client.submission(address, key).status == "accepted"


@pytest.mark.timeout(900)
def test_a_removed_validator_restarts_and_judges_only_work_from_before_its_removal(loop):
    loop.spawn("trainer", "trainer")
    loop.validator()
    loop.worker("w")
    for node in loop.nodes.values():
        wait_ready(node, timeout=120)
    client = loop.client()
    address = loop.addresses["w"]
    wait_until(
        lambda: any(client.submission(w, k).status == "accepted" for w, k in submissions(client)),
        400,
        "a first verdict",
        interval=2,
    )
    loop.nodes["validator"].stop()
    from eth_account import Account

    from ledger.client import LedgerClient

    owner = LedgerClient(
        client.chain, client.contract.address, Account.from_key(loop.chain_info["owner_key"])
    )
    owner.remove_validator(loop.addresses["validator"])
    removed_at = client.validator_until(loop.addresses["validator"])
    now = client.chain.w3.eth.get_block("latest")["timestamp"]
    assert removed_at > now  # behind the timelock: workers and validators see it coming
    client.chain.advance_time(removed_at - now + 1)  # ... and then it takes effect
    before = set(submissions(client))
    loop.spawn("validator", "validator")  # refused to start before: "not a validator"
    wait_ready(loop.nodes["validator"], timeout=120)
    wait_until(
        lambda: (loop.section("validator", "validator") or {}).get("removed_at") == removed_at,
        120,
        "the validator role, aware of its removal",
    )
    wait_until(lambda: set(submissions(client)) - before, 300, "work submitted after the removal")
    wait_until(
        lambda: (loop.section("validator", "validator") or {}).get("not_ours", 0) >= 1,
        120,
        "the validator to see it and leave it",
    )
    # the validator reads submissions in block order and counts each one after its removal
    # once: when it has counted all of them, it has left every one of them (none is judged)
    late = after_removal(client, removed_at)
    wait_until(
        lambda: (loop.section("validator", "validator") or {}).get("not_ours", 0) >= len(late),
        120,
        f"the validator to read and leave all {len(late)} submissions after its removal",
    )
    assert late >= set(submissions(client)) - before
    for w, k in late:
        assert w == address and client.submission(w, k).status == "pending"
    assert loop.nodes["validator"].proc.poll() is None
    v = loop.section("validator", "validator")
    assert v["judged"] == 0 and v["unposted"] == 0, v  # it did not even try
