"""Chain chaos: the devnet on a chain that behaves like a real one (issue #55).

    .venv/bin/python bench/chainchaos.py [--seed 1] [--steps 3] [--workers 2] [--json]

Real processes on 127.0.0.1 (``tests/test_loop.py``'s ``Loop``, on another chain): anvil
mining a block every ``--block-time`` seconds (``HostileAnvil``, default 2 s) with two
JSON-RPC proxies in front of it (``FaultProxy``); every node's ``[chain] url`` is one of the
two proxies (the trainer, the validator and the workers alternate). The contract is deployed,
the pool funded and the validators bonded directly on anvil, then a bootstrap, the trainer,
one validator and ``--workers`` honest inference workers on the tiny model start. Once the
first verdict is on-chain, ``ChaosSchedule`` (``tests/helpers/chainbooks.py``) sets the
proxies' fault rates (10 % of requests: 429, 500, timeouts past the client's 10 s, resets,
stale answers, another chain id) and injects reorgs of 1 to 3 blocks (their transactions
sent again), dropped pending transactions and a tenfold base fee spike, at seeded gaps.
When the trainer has taken ``--steps`` steps and every submitted batch has a verdict (or
``--timeout`` has passed), the chaos stops, the nodes get SIGTERM, and the chain's books
are reconciled (``chainbooks.reconcile``).

``--json``: the last line is one JSON object with ``reorgs``, ``dropped``, ``fee_spikes``,
``rpc_faults`` (and each kind), ``lost``, ``paid_twice``, ``slashed_twice``,
``honest_slashed``, ``stuck_nonces`` (the lines behind each nonzero figure in ``lines``),
``verdict_delay_s_p95`` (chain time from a submission's block to its first verdict's),
``steps``, ``settled`` (false: the run did not finish in time), ``error`` and ``seconds``.

Measured on 2026-12-05 (2 shared cores, 2 workers, 3 steps, 2 s blocks, 3 confirmations),
``--seed 1`` / ``--seed 2``:

- before the client knew about any of this: both runs ended with the trainer's node exiting
  1 (the chaos dropped its pending ``set_policy_version``, nothing sent it again, ``wait``
  raised ``LedgerPending`` after 60 s); seed 2 left 2 submissions without a verdict
  (``lost`` 2); verdict delay p95 35 s;
- with the client of SPEC section 19.2 (each node given both proxies): both settled, 3
  steps, 8 submissions, every loss and double figure 0; seed 1 in 203 s through 10 reorgs
  (9 transactions sent again), 3 drops, 1 spike and 157 RPC faults, verdict delay p95 12 s;
  seed 2 in 160 s through 7 reorgs, 3 drops, 1 spike and 122 RPC faults, p95 10 s.

A run that settles soon after the first verdict once met no drop (CI, 2 steps, seed 1: the
drop came third, waited its two blocks on an idle mempool, and the run settled before it
came again); the schedule's first drop now leads and waits up to a minute for the nodes'
next transaction.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers.chainbooks import ChaosSchedule, reconcile  # noqa: E402
from tests.helpers.hostilechain import FaultProxy, HostileAnvil  # noqa: E402
from tests.test_loop import Loop, submissions, verdict_events  # noqa: E402

ETH = 10**18
VALIDATORS = 4  # quorum 2: the contract wants 3 at its deployment; one spare
HOLD_S = 35.0  # a "timeout" fault holds the request past the nodes' RPC timeout (10 s)
CONFIRMATIONS = 3


def deploy_run(anvil: HostileAnvil) -> dict[str, Any]:
    """The contract on ``anvil`` with the development chain's parameters (``intellect-node
    chain``'s), the pool funded, the validators bonded; chain.json's record of it."""
    from eth_account import Account

    from ledger.client import LedgerClient, deploy
    from node.cli.ledger import DEV_VALIDATOR_BOND, dev_params

    args = argparse.Namespace(
        verdict_window=3600,
        reward_lock=3600,
        unbonding_delay=86400,
        max_staleness=2,
        reward_per_unit="1000000000000wei",
    )
    chain = anvil.chain(timeout=60)
    keys = anvil.keys
    owner = Account.from_key(keys[0])
    validators = [Account.from_key(k) for k in keys[1 : 1 + VALIDATORS]]
    address, block = deploy(
        chain, owner, dev_params(args), [v.address for v in validators], timeout=120
    )
    LedgerClient(chain, address, owner, timeout=120).fund(1000 * ETH)
    for v in validators:
        LedgerClient(chain, address, v, timeout=120).add_stake(DEV_VALIDATOR_BOND)
    return {
        "url": anvil.url,  # the setup's own way in (chain fund, reading the books): no faults
        "chain_id": chain.chain_id,
        "contract": address,
        "block": block,
        "owner_key": keys[0],
        "validator_keys": keys[1 : 1 + VALIDATORS],
        "funder_key": keys[-1],
        "dev_keys": keys,
    }


class HostileLoop(Loop):
    """``Loop``'s network on ``HostileAnvil``, each node through one of the proxies."""

    def __init__(self, base: Path, model: Path, *, seed: int, block_time: float) -> None:
        from node.cli.devnet import free_port

        self.anvil = HostileAnvil(free_port(), block_time=block_time)
        self.proxies: list[FaultProxy] = []
        self.spawned = 0
        try:
            self.proxies = [
                FaultProxy(self.anvil.url, rates={}, seed=seed + i, hold_s=HOLD_S).start()
                for i in range(2)
            ]
            info = deploy_run(self.anvil)
            (base / "chain").mkdir(parents=True, exist_ok=True)
            (base / "chain" / "chain.json").write_text(json.dumps(info))
            self._start(base, model, info)
        except BaseException:
            self.close()
            raise

    def _start(self, base: Path, model: Path, info: dict[str, Any]) -> None:
        """``Loop.__init__`` from its chain on: the trainer's account, the env, the bootstrap."""
        from node.cli.devnet import DEVNET_PASSWORD, make_account, p2p_addr, wait_ready
        from node.keystore import load_or_create_identity

        self.base, self.fast, self.chain_info = base, True, info
        self.nodes: dict[str, Any] = {}
        self.addresses: dict[str, str] = {}
        trainer_id = load_or_create_identity(base / "trainer").peer_id
        self.addresses["trainer"] = make_account(base / "trainer", info["owner_key"])
        self.env = {
            "INTELLECT_NODE_CHAIN__CONTRACT": info["contract"],
            "INTELLECT_NODE_CHAIN__CONTRACT_BLOCK": str(info["block"]),
            "INTELLECT_NODE_CHAIN__ID": str(info["chain_id"]),
            "INTELLECT_NODE_RUN__TRAINER_PEER_ID": trainer_id,
            "INTELLECT_NODE_PASSWORD": DEVNET_PASSWORD,
            "INTELLECT_NODE_TRAINER__STEP_WAIT": "8",
            "INTELLECT_NODE_RUN__MODEL": str(model),
            "INTELLECT_NODE_RUN__TASKS_PER_BATCH": "2",
            "INTELLECT_NODE_RUN__GROUP_SIZE": "2",
            "INTELLECT_NODE_RUN__MAX_NEW_TOKENS": "24",
            "INTELLECT_NODE_RUN__VERIFY_PROFILE": "strict-fp32",
            "INTELLECT_NODE_ENGINE__TORCH_THREADS": "1",
            "INTELLECT_NODE_RUN__ASYNC_LEVEL": "2",
            "INTELLECT_NODE_INFERENCE__MAX_UNJUDGED": "2",
            "INTELLECT_NODE_TRAINER__HELDOUT_PER_LEVEL": "2",
            # deeper than the deepest reorg injected (3 blocks): nothing acted on is taken back
            "INTELLECT_NODE_CHAIN__CONFIRMATIONS": str(CONFIRMATIONS),
            "INTELLECT_NODE_CHAIN__REPLACE_AFTER_S": "10",  # five blocks
        }
        self.boot = self.spawn("bootstrap", "bootstrap", listen=None)
        self.boot_addr = p2p_addr(wait_ready(self.boot))

    def spawn(self, name, role, *, listen="/ip4/127.0.0.1/tcp/0", env=None, module="node.cli"):
        """As ``Loop.spawn``, the node's chain URLs both proxies, a different one first in
        turn (each request goes to the next when one fails)."""
        first = self.spawned % len(self.proxies)
        urls = [p.url for p in self.proxies[first:] + self.proxies[:first]]
        self.spawned += 1
        env = {"INTELLECT_NODE_CHAIN__URL": ",".join(urls), **(env or {})}
        return super().spawn(name, role, listen=listen, env=env, module=module)

    def close(self) -> None:
        for node in reversed(list(getattr(self, "nodes", {}).values())):
            node.stop()
        for p in self.proxies:
            p.stop()
        self.anvil.stop()


def verdict_delays(client: Any) -> list[float]:
    """Chain seconds from each submission's block to its first verdict's block."""
    times: dict[int, int] = {}

    def at(block: int) -> int:
        if block not in times:
            times[block] = int(client.w3.eth.get_block(block)["timestamp"])
        return times[block]

    submitted = {
        (str(e["args"]["worker"]).lower(), bytes(e["args"]["key"])): int(e["blockNumber"])
        for e in client.contract.events.WorkSubmitted.get_logs(from_block=0)
    }
    first: dict[tuple[str, bytes], int] = {}
    for name in ("WorkAccepted", "WorkRejected"):
        for e in getattr(client.contract.events, name).get_logs(from_block=0):
            key = (str(e["args"]["worker"]).lower(), bytes(e["args"]["key"]))
            first[key] = min(first.get(key, 1 << 62), int(e["blockNumber"]))
    return sorted(float(at(first[k]) - at(b)) for k, b in submitted.items() if k in first)


def p95(values: list[float]) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, int(0.95 * len(values)))]


def settled(loop: HostileLoop, client: Any, workers: list[str], steps: int) -> bool:
    for node in loop.nodes.values():
        if node.proc.poll() is not None:
            raise RuntimeError(f"{node.name} exited {node.proc.returncode}: {node.log_path}")
    if not (loop.section("trainer", "trainer") or {}).get("done"):
        return False
    for name in workers:
        w = loop.section(name, "inference") or {}
        if w.get("last_batch_step") != steps or w.get("unjudged") != 0:
            return False
    return all(client.submission(w, k).status != "pending" for w, k in submissions(client))


def run(
    seed: int,
    *,
    steps: int,
    workers: int,
    block_time: float,
    timeout: float,
    base: Path | None,
    model: Path | None,
    say: Any,
) -> dict[str, Any]:
    from node.engine.tinymodel import Recipe, build_tiny_model

    began = time.monotonic()
    out: dict[str, Any] = {"seed": seed, "settled": False, "error": None}
    with tempfile.TemporaryDirectory(prefix="chainchaos-") as tmp:
        root = Path(base) if base is not None else Path(tmp)
        if model is None:  # the suite's cache (scripts/setup.sh builds it there)
            model, _ = build_tiny_model(
                root / "model", Recipe(), cache_dir=ROOT / ".cache" / "models"
            )
        loop = HostileLoop(root, model, seed=seed, block_time=block_time)
        names = [f"worker-{i}" for i in range(workers)]
        schedule = ChaosSchedule(loop.anvil, loop.proxies, seed=seed)
        try:
            loop.env["INTELLECT_NODE_TRAINER__BATCHES_PER_STEP"] = str(workers)
            loop.spawn("trainer", "trainer", env={"INTELLECT_NODE_TRAINER__STEPS": str(steps)})
            loop.validator()
            for name in names:
                loop.worker(name)
            from node.cli.devnet import wait_ready

            for node in loop.nodes.values():
                wait_ready(node, timeout=300)
            say(f"chainchaos: {len(loop.nodes)} nodes up; chain {loop.anvil.url}")
            client = loop.client()
            deadline = time.monotonic() + timeout
            while not verdict_events(client):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no verdict within {timeout} s: see the node logs")
                time.sleep(1)
            say("chainchaos: first verdict on-chain; chaos starts")
            schedule.start()
            while not settled(loop, client, names, steps):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the run did not settle within {timeout} s")
                time.sleep(2)
            out["settled"] = True
        except Exception as exc:  # reported, with the books as they are
            out["error"] = f"{type(exc).__name__}: {exc}"
            say(f"chainchaos: {out['error']}")
        finally:
            out.update(schedule.stop())
            out["schedule"] = schedule.log
            out["injection_errors"] = schedule.errors
            trainer = loop.section("trainer", "trainer") if "trainer" in loop.nodes else None
            out["steps"] = int((trainer or {}).get("step") or 0)
            for node in loop.nodes.values():
                if node.proc.poll() is None:
                    node.proc.send_signal(signal.SIGTERM)
            time.sleep(2)
            try:
                client = loop.client()
                time.sleep(2 * block_time)  # what is in flight is mined or not
                accounts = [loop.addresses[n] for n in loop.addresses]
                figures, lines = reconcile(
                    client,
                    workers=[loop.addresses[n] for n in names if n in loop.addresses],
                    accounts=accounts,
                    from_block=int(loop.chain_info["block"]),
                )
                out.update(figures)
                out["lines"] = {k: v for k, v in lines.items() if v}
                out["verdict_delay_s_p95"] = p95(verdict_delays(client))
                out["steps"] = max(out["steps"], client.policy_version())  # a dead trainer too
                out["submitted"] = len(submissions(client))
            finally:
                loop.close()
    out["seconds"] = round(time.monotonic() - began, 1)
    return out


def _interrupted(_sig: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seed", type=int, default=1, help="the chaos schedule's seed (default 1)")
    ap.add_argument("--steps", type=int, default=3, help="trainer steps (default 3)")
    ap.add_argument("--workers", type=int, default=2, help="inference workers (default 2)")
    ap.add_argument("--block-time", type=float, default=2.0, help="seconds a block (default 2)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds for the run (900)")
    ap.add_argument("--keep", type=Path, help="run under this directory and keep it (logs)")
    ap.add_argument("--model", type=Path, help="the tiny base model (default: built/cached)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, _interrupted)  # as Ctrl-C: every process is stopped
    out = run(
        args.seed,
        steps=args.steps,
        workers=args.workers,
        block_time=args.block_time,
        timeout=args.timeout,
        base=args.keep,
        model=args.model,
        say=lambda *a: print(*a, flush=True),
    )
    print(f"chain chaos, seed {out['seed']}: {out['seconds']} s, {out['steps']} trainer steps")
    for k in ("reorgs", "reorged_txs", "dropped", "fee_spikes", "rpc_faults"):
        print(f"  {k:<14} {out.get(k)}")
    for k in ("lost", "paid_twice", "slashed_twice", "honest_slashed", "stuck_nonces"):
        print(f"  {k:<14} {out.get(k)}")
        for line in out.get("lines", {}).get(k, []):
            print(f"    {line}")
    print(f"  verdict delay p95 {out.get('verdict_delay_s_p95')} s; error: {out['error']}")
    if args.json:
        print(json.dumps(out, default=str))
    ok = out["settled"] and not any(out.get(k) for k in ("lost", "paid_twice", "slashed_twice"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
