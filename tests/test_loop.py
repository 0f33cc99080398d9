"""Work flows and is judged: real node processes on 127.0.0.1, the served development chain,
the tiny model. Two honest workers and one that cheats (other weights), one validator: every
batch gets exactly one verdict, honest ones are accepted, the cheater's are rejected and its
stake is slashed at settlement, honest rewards become claimable, and the chain's figures
equal the validator's and the workers' own counts. A worker killed with SIGKILL after its
batch was stored is restarted, and the validator still fetches and judges that batch."""

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
from tests.helpers.net import counter, metrics, wait_until

RUN = "loop-run"
FAST = ["--net.heartbeat-interval", "1", "--net.peer-ttl", "8", "--net.discovery-interval", "1"]


class Loop:
    def __init__(
        self,
        base: Path,
        model: Path,
        *,
        step_wait: float = 20,
        chain_args=None,
        fast=True,
        env=None,
    ) -> None:
        """``fast``: the tests' heartbeats and discovery rounds (every second); otherwise
        the production defaults (every 5 s), as a benchmark of always-on cost wants.
        ``env``: settings of every node over the ones here (the run's, as variables)."""
        from node.keystore import load_or_create_identity

        self.base = base
        self.fast = fast
        self.chain_proc, ledger_env = start_chain(base / "chain", extra=chain_args)
        self.chain_info = json.loads((base / "chain" / "chain.json").read_text())
        trainer_id = load_or_create_identity(base / "trainer").peer_id
        make_account(base / "trainer", self.chain_info["owner_key"])  # the contract's owner
        self.env = {
            **ledger_env,
            "INTELLECT_NODE_RUN__TRAINER_PEER_ID": trainer_id,
            "INTELLECT_NODE_PASSWORD": DEVNET_PASSWORD,
            "INTELLECT_NODE_TRAINER__STEP_WAIT": str(step_wait),
            "INTELLECT_NODE_RUN__MODEL": str(model),
            "INTELLECT_NODE_INFERENCE__MAX_UNJUDGED": "1",
            "INTELLECT_NODE_RUN__TASKS_PER_BATCH": "2",
            "INTELLECT_NODE_RUN__GROUP_SIZE": "2",
            "INTELLECT_NODE_RUN__MAX_NEW_TOKENS": "24",
            "INTELLECT_NODE_RUN__VERIFY_PROFILE": "strict-fp32",
            "INTELLECT_NODE_ENGINE__TORCH_THREADS": "1",  # the nodes share the machine's cores
            "INTELLECT_NODE_RUN__ASYNC_LEVEL": "5",  # a loaded CI machine may generate slowly
            **(env or {}),
        }
        self.nodes = {}
        self.addresses = {}
        try:
            self.boot = self.spawn("bootstrap", "bootstrap", listen=None)
            self.boot_addr = p2p_addr(wait_ready(self.boot))
        except BaseException:  # nothing it started outlives a failed start
            self.close()
            raise

    def spawn(self, name, role, *, listen="/ip4/127.0.0.1/tcp/0", env=None, module="node.cli"):
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
            module=module,
        )
        self.nodes[name] = node
        return node

    def worker(self, name, cheat=None, env=None):
        """An inference node; with ``cheat`` (names, comma-separated) a cheating worker
        (``tests/helpers/cheating/worker.py``) making them in turn; ``env``: its own settings."""
        address = make_account(self.base / name)
        fund(self.base / "chain", address, "10")
        self.addresses[name] = address
        if cheat:
            module = "tests.helpers.cheating.worker"
            return self.spawn(
                name, "inference", env={"CHEATS": cheat, **(env or {})}, module=module
            )
        return self.spawn(name, "inference", env=env)

    def validator(self, i=0):
        """The chain's ``i``-th appointed validator (``validator``, then ``validator-1``...)."""
        name = "validator" if i == 0 else f"validator-{i}"
        key = self.chain_info["validator_keys"][i]
        self.addresses[name] = make_account(self.base / name, key)
        return self.spawn(name, "validator")

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
def test_honest_work_is_accepted_and_cheating_work_rejected_and_slashed(loop):
    loop.spawn("trainer", "trainer")
    loop.validator()
    for name, cheat in (("honest-0", None), ("honest-1", None), ("cheater", "other_weights")):
        loop.worker(name, cheat)
    for node in loop.nodes.values():
        wait_ready(node, timeout=120)

    def judged_enough():
        counts = [loop.section(n, "inference") or {} for n in ("honest-0", "honest-1", "cheater")]
        return (
            all(c.get("accepted", 0) >= 1 for c in counts[:2]) and counts[2].get("rejected", 0) >= 1
        )

    wait_until(judged_enough, 600, "a verdict for every worker", interval=2)
    loop.nodes["trainer"].stop()  # the clock stops: no new steps, so no new batches
    client = loop.client()

    def all_judged():
        subs = submissions(client)
        workers = [loop.section(n, "inference") for n in ("honest-0", "honest-1", "cheater")]
        return (
            subs
            and all(client.submission(w, k).status != "pending" for w, k in subs)
            and all(w is not None and w["unjudged"] == 0 for w in workers)
        )

    wait_until(all_judged, 180, "every submitted batch to be judged", interval=2)
    subs = submissions(client)
    verdicts = verdict_events(client)
    assert set(verdicts) == set(subs) and all(len(v) == 1 for v in verdicts.values())
    by_worker = {name: loop.addresses[name] for name in ("honest-0", "honest-1", "cheater")}
    for name, address in by_worker.items():
        keys = [k for (w, k) in subs if w == address]
        statuses = {client.submission(address, k).status for k in keys}
        assert keys and statuses == ({"rejected"} if name == "cheater" else {"accepted"}), name
        own = loop.section(name, "inference")
        assert own["accepted"] == sum(
            1 for k in keys if client.submission(address, k).status == "accepted"
        )
        assert own["rejected"] == sum(
            1 for k in keys if client.submission(address, k).status == "rejected"
        )
        assert own["submitted"] == len(keys)
        for k in keys:  # the on-chain units are the batch's tokens
            assert subs[(address, k)] > 0
    v = loop.section("validator", "validator")
    assert v["judged"] == len(subs)
    # /metrics times each verdict (from the submission seen to the verdict posted) and each
    # generated batch's tokens/s: one observation per verdict, per batch generated
    for name, section, figure, histogram in (
        ("validator", "validator", "judged", "intellect_verdict_latency_seconds_count"),
        ("honest-0", "inference", "generated", "intellect_generation_tokens_per_second_count"),
    ):
        before = loop.section(name, section)[figure]
        observed = counter(metrics(loop.nodes[name]), histogram)
        assert before <= observed <= loop.section(name, section)[figure], (name, observed)
        assert observed >= 1
    assert v["accepted"] == sum(1 for s in verdicts.values() if s == ["WorkAccepted"])
    assert (
        v["rejected"]
        == v["rejected_by_reason"].get("invalid", 0)
        == sum(1 for (w, _) in subs if w == by_worker["cheater"])
    )
    # after the window and the lock: the cheater's stake is slashed, honest rewards claimable
    params = client.params()
    stake_before = client.worker(by_worker["cheater"]).stake
    client.chain.advance_time(params.verdict_window + params.reward_lock + 10)
    from eth_account import Account

    from ledger.client import LedgerClient

    anyone = LedgerClient(
        client.chain, client.contract.address, Account.from_key(loop.chain_info["funder_key"])
    )
    anyone.settle(by_worker["cheater"])
    assert client.worker(by_worker["cheater"]).stake < stake_before
    assert client.worker(by_worker["cheater"]).slashed >= 1
    for name in ("honest-0", "honest-1"):
        assert client.claimable(by_worker[name]) + client.matured(by_worker[name]) > 0, name


@pytest.mark.timeout(900)
@pytest.mark.slow
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
@pytest.mark.slow
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


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_a_batch_nobody_serves_is_rejected_as_unavailable_after_the_fetch_deadline(
    tmp_path, tiny_model_dir
):
    """A worker that submits and announces but never serves: after the chain's fetch
    deadline (here 60 s // 6 = 10 s) the validator rejects it as unavailable, on-chain."""
    loop = Loop(tmp_path, tiny_model_dir, chain_args=["--verdict-window", "60"])
    try:
        loop.spawn("trainer", "trainer")
        loop.validator()
        loop.worker("withholder", cheat="withhold")
        for node in loop.nodes.values():
            wait_ready(node, timeout=120)
        client = loop.client()
        assert client.params().fetch_deadline == 10
        address = loop.addresses["withholder"]
        wait_until(lambda: submissions(client), 300, "the withholder's submission", interval=1)
        (worker, key), *_ = submissions(client)
        assert worker == address
        wait_until(
            lambda: client.submission(address, key).status != "pending",
            120,
            "the verdict on the withheld batch",
            interval=1,
        )
        assert client.submission(address, key).status == "rejected"
        (event,) = client.contract.events.WorkRejected.get_logs(from_block=0)
        assert event["args"]["reason"] == 2  # unavailable (SPEC section 19)
        v = loop.section("validator", "validator")
        assert v["rejected_by_reason"] == {"unavailable": 1} and v["fetch_failures"] >= 1
    finally:
        loop.close()


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_a_batch_served_to_one_validator_of_two_stands_accepted_and_is_trained_on(
    tmp_path, tiny_model_dir
):
    """Partial availability (SPEC section 19.1): a worker that serves each batch to the
    run's trainer and the first other peer that asks only. The validator that got it judges
    the real work and accepts it; the other one, refused, votes ``unavailable`` after the
    fetch deadline: an unbonded overturn vote, one of the quorum's two, so the accept stands
    and nothing is slashed; the trainer, served, trains on it."""
    loop = Loop(tmp_path, tiny_model_dir, chain_args=["--verdict-window", "60"])
    try:
        loop.spawn("trainer", "trainer")
        loop.validator(0)
        loop.validator(1)
        loop.worker("partial", cheat="serve_some")
        for node in loop.nodes.values():
            wait_ready(node, timeout=120)
        client = loop.client()
        address = loop.addresses["partial"]
        wait_until(lambda: submissions(client), 300, "the worker's submission", interval=1)
        (worker, key), *_ = sorted(submissions(client))
        assert worker == address

        def both_voted():
            sub = client.submission(address, key)
            return sub.accept_votes >= 1 and sub.reject_votes >= 1

        wait_until(both_voted, 180, "an accept and an unavailable vote", interval=1)
        sub = client.submission(address, key)
        assert sub.status == "accepted" and not sub.final, sub
        assert sub.accept_votes == 1 and sub.reject_votes == 1, sub
        (vote,) = [
            e
            for e in client.contract.events.WorkRejected.get_logs(from_block=0)
            if bytes(e["args"]["key"]) == key
        ]
        assert vote["args"]["reason"] == 2  # unavailable (SPEC section 19)
        (accept,) = [
            e
            for e in client.contract.events.WorkAccepted.get_logs(from_block=0)
            if bytes(e["args"]["key"]) == key
        ]
        voters = {str(accept["args"]["validator"]).lower(), str(vote["args"]["validator"]).lower()}
        assert voters == {
            loop.addresses["validator"].lower(),
            loop.addresses["validator-1"].lower(),
        }
        rejecter = str(vote["args"]["validator"])
        assert client.worker(rejecter).locked == 0  # the unavailable vote locked no bond
        assert client.worker(address).slashed == 0
        assert loop.section("partial", "cheating")["made"] == {key.hex(): "serve_some"}

        def trained():
            path = tmp_path / "trainer" / "metrics.jsonl"
            if not path.exists():
                return False
            used = (json.loads(x)["used"] for x in path.read_text().splitlines() if x.strip())
            return f"{address}:{key.hex()}".lower() in {u.lower() for us in used for u in us}

        wait_until(trained, 180, "the trainer to train on the batch", interval=1)
    finally:
        loop.close()
