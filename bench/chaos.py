"""Chaos run: the devnet keeps exact books while its nodes are killed and frozen.

    .venv/bin/python bench/chaos.py [--seed 1] [--steps 4] [--workers 2] [--json]

Real processes on 127.0.0.1 (tests/test_loop.py's ``Loop``): the served development
chain, a bootstrap, the trainer, one validator and ``--workers`` honest inference workers
on the tiny model. Once the first verdict is on-chain, faults are injected one after the
other at seeded random moments: SIGKILL (then a restart, same data dir and keys) and
SIGSTOP (then SIGCONT) of a random worker, the validator, the trainer and the bootstrap,
in a seeded order. The run goes on: restarted nodes rejoin, the trainer resumes from its
checkpoint and ``trainer-state.json``. When the trainer has taken ``--steps`` steps and
every submitted batch has a verdict, each node gets SIGTERM and must exit 0 within its
deadline, and the books are reconciled (``tests/helpers/books.py``: the chain's events,
the trainer's metrics.jsonl and state, each worker's store).

The served chain is restarted too (``restart_chain``): the development chain runs with
``--state``, so on SIGTERM it writes its whole state (blocks, logs, balances) to a file,
and it comes back on the same port from that file, same contract, while the nodes' chain
reads and transactions fail and are tried again (they ride through the outage). A SIGKILL
of the chain would lose what it did since its start: that is a lost chain, not a fault a
network rides through.

``--json``: the last line is one JSON object with ``faults`` (kind -> injected),
``violations`` (the reconciliation's lines; empty when the books add up), ``ok``,
``lost_work``, ``double_counted_work``, ``honest_false_slashes``, the counts
(submitted, accepted, rejected, trained_on, steps), ``schedule`` and ``seconds``.
``run(seed, ...)`` returns the same object (for ``bench/adversarial.py --faults``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.helpers.books import Outage, figures, read_books, reconcile  # noqa: E402

TARGETS = ("worker", "validator", "trainer", "bootstrap")
KINDS = (
    *(f"{how}_{target}" for target in TARGETS for how in ("sigkill", "sigstop")),
    "restart_chain",  # SIGTERM (the state is written), then the same port and state
)
# a node given SIGTERM must have exited 0 by then: its own stop takes a few seconds (at most
# 5 s to flush announcements, 3 s to say goodbye, then its role's teardown); this catches
# a hang with room for a loaded machine (at load 40 on 2 cores, nodes took 25-31 s)
EXIT_DEADLINE_S = 60.0
CHAIN_STATE = "chain-state.json"  # under the run's directory


@dataclass(frozen=True)
class Fault:
    """One injected fault: ``kind`` on node ``node``, ``after`` seconds after the previous
    one recovered, the node out for ``down`` seconds (frozen, or dead before its restart)."""

    kind: str
    node: str
    after: float
    down: float


def plan(seed: int, workers: list[str], kinds: tuple[str, ...] = KINDS) -> list[Fault]:
    """The seeded schedule: every kind once, in a random order, at random gaps."""
    rng = random.Random(seed)
    order = list(kinds)
    rng.shuffle(order)
    out = []
    for kind in order:
        target = kind.split("_", 1)[1]
        node = rng.choice(workers) if target == "worker" else target
        out.append(Fault(kind, node, round(rng.uniform(1, 4), 2), round(rng.uniform(1, 3), 2)))
    return out


class Chaos:
    """The network of ``Loop`` and what the run did to it."""

    def __init__(self, base: Path, model: Path, *, workers: int, steps: int, say: Any) -> None:
        from tests.test_loop import Loop

        self.say = say
        self.steps = steps
        self.state = base / CHAIN_STATE
        self.loop = Loop(base, model, step_wait=8, chain_args=["--state", str(self.state)])
        self.loop.env.update(
            {
                "INTELLECT_NODE_RUN__ASYNC_LEVEL": "2",
                "INTELLECT_NODE_INFERENCE__MAX_UNJUDGED": "2",
                "INTELLECT_NODE_TRAINER__BATCHES_PER_STEP": str(workers),
                "INTELLECT_NODE_TRAINER__HELDOUT_PER_LEVEL": "2",
            }
        )
        self.envs: dict[str, dict[str, str]] = {
            "trainer": {"INTELLECT_NODE_TRAINER__STEPS": str(steps)}
        }
        self.roles = {"bootstrap": "bootstrap", "trainer": "trainer", "validator": "validator"}
        self.workers = [f"worker-{i}" for i in range(workers)]
        self.outages: list[Outage] = []
        self.injected: dict[str, int] = dict.fromkeys(KINDS, 0)

    def start(self) -> None:
        from node.cli.devnet import wait_ready

        self.loop.spawn("trainer", "trainer", env=self.envs["trainer"])
        self.loop.validator()
        for name in self.workers:
            self.loop.worker(name)
            self.roles[name] = "inference"
        for node in self.loop.nodes.values():
            wait_ready(node, timeout=180)
        self.say(f"chaos: {len(self.loop.nodes)} nodes up")

    # ---- faults --------------------------------------------------------------------------

    def _restart(self, name: str) -> None:
        if name == "bootstrap":  # same port and key: the others' --bootstrap address holds
            old = self.loop.nodes["bootstrap"].proc.args
            listen = old[old.index("--listen") + 1]
            self.loop.spawn("bootstrap", "bootstrap", listen=listen)
        else:
            self.loop.spawn(name, self.roles[name], env=self.envs.get(name))

    def _role_up(self, name: str, timeout: float = 600) -> None:
        """Wait until ``name`` answers with its role's section (the bootstrap: answers)."""
        section = {"inference": "inference"}.get(self.roles[name], self.roles[name])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            node = self.loop.nodes[name]
            if node.proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {node.proc.returncode}: {node.log_path}")
            st = node.status(timeout=10) or {}  # a loaded machine answers slowly
            if st and (name == "bootstrap" or st.get(section) is not None):
                return
            time.sleep(0.2)
        raise TimeoutError(f"{name} did not come back within {timeout} s")

    def _restart_chain(self, down: float) -> None:
        """SIGTERM to the chain (it writes its state), ``down`` seconds without one, then the
        chain again on the same port from that state; back once it answers."""
        from node.cli.devnet import start_chain

        proc, url = self.loop.chain_proc, self.loop.chain_info["url"]
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)  # writing the state takes a moment on a loaded machine
        if code != 0 or not self.state.exists():
            raise RuntimeError(f"the chain exited {code} without its state: see chain.log")
        time.sleep(down)
        port = int(url.rsplit(":", 1)[1])
        self.loop.chain_proc, env = start_chain(
            self.loop.base / "chain", timeout=300, extra=["--state", str(self.state)], port=port
        )
        if env["INTELLECT_NODE_CHAIN__CONTRACT"] != self.loop.env["INTELLECT_NODE_CHAIN__CONTRACT"]:
            raise RuntimeError("the restarted chain has another contract: its state was lost")
        if self.loop.client().w3.eth.block_number == 0:  # chain.json is written once it serves
            raise RuntimeError("the restarted chain has no blocks: its state was lost")

    def inject(self, f: Fault) -> None:
        start = time.time()
        if f.kind == "restart_chain":
            self._restart_chain(f.down)
            self.outages.append(Outage("chain", f.kind, start, time.time()))
            self.injected[f.kind] += 1
            self.say(f"chaos: {f.kind}: out {time.time() - start:.1f} s, back")
            return
        node = self.loop.nodes[f.node]
        if f.kind.startswith("sigstop"):
            os.kill(node.proc.pid, signal.SIGSTOP)
            time.sleep(f.down)
            os.kill(node.proc.pid, signal.SIGCONT)
        else:
            node.proc.send_signal(signal.SIGKILL)
            node.proc.wait()
            time.sleep(f.down)
            self._restart(f.node)
        self._role_up(f.node)
        self.outages.append(Outage(f.node, f.kind, start, time.time()))
        self.injected[f.kind] += 1
        self.say(f"chaos: {f.kind} {f.node}: out {time.time() - start:.1f} s, back")

    # ---- progress ------------------------------------------------------------------------

    def first_verdict(self, client: Any, timeout: float) -> None:
        from tests.test_loop import verdict_events

        deadline = time.monotonic() + timeout
        while not verdict_events(client):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no verdict within {timeout} s: see the node logs")
            time.sleep(1)

    def settled(self, client: Any) -> bool:
        """The trainer is done, the workers made the last step's batches, and every
        submitted batch has its verdict."""
        from tests.test_loop import submissions

        for node in self.loop.nodes.values():
            if node.proc.poll() is not None:
                raise RuntimeError(f"{node.name} died: {node.log_path}")
        if not (self.loop.section("trainer", "trainer") or {}).get("done"):
            return False
        for name in self.workers:
            w = self.loop.section(name, "inference") or {}
            if w.get("last_batch_step") != self.steps or w.get("unjudged") != 0:
                return False
        return all(client.submission(w, k).status != "pending" for w, k in submissions(client))

    def stop_all(self) -> tuple[dict[str, int | None], dict[str, float]]:
        """SIGTERM to every node at once; the exit code of each (None: it had not exited
        within ``EXIT_DEADLINE_S`` of the signal and was killed) and how long it took."""
        exits: dict[str, int | None] = {}
        took: dict[str, float] = {}
        sent = time.monotonic()
        for node in self.loop.nodes.values():
            if node.proc.poll() is None:
                node.proc.send_signal(signal.SIGTERM)
        for name, node in self.loop.nodes.items():
            try:
                exits[name] = node.proc.wait(max(0.1, sent + EXIT_DEADLINE_S - time.monotonic()))
            except subprocess.TimeoutExpired:
                exits[name] = None
                node.proc.kill()
                node.proc.wait()
            took[name] = round(time.monotonic() - sent, 1)
        return exits, took


def run(
    seed: int,
    *,
    steps: int = 4,
    workers: int = 2,
    kinds: tuple[str, ...] = KINDS,
    base: Path | None = None,
    model: Path | None = None,
    timeout: float = 900,
    quiet: bool = True,
) -> dict[str, Any]:
    """One chaos run (see the module docstring); returns its report, with ``violations``
    from ``tests.helpers.books.reconcile`` (empty: the books add up). ``base``: run under
    this directory (kept); ``model``: the tiny base model's directory (else built or taken
    from the cache)."""
    from node.cli.devnet import prepare_model

    say = (lambda *_a: None) if quiet else (lambda *a: print(*a, flush=True))
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        root = Path(base) if base is not None else Path(tmp)
        model = model or prepare_model(root / "model")
        chaos = Chaos(root, model, workers=workers, steps=steps, say=say)
        schedule = plan(seed, chaos.workers, kinds)
        exits: dict[str, int | None] = {}
        exit_seconds: dict[str, float] = {}
        try:
            chaos.start()
            client = chaos.loop.client()
            chaos.first_verdict(client, timeout=timeout)
            for fault in schedule:
                time.sleep(fault.after)
                chaos.inject(fault)
            deadline = time.monotonic() + timeout
            while not chaos.settled(client):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the run did not settle within {timeout} s")
                time.sleep(2)
            say("chaos: settled; SIGTERM to every node")
            exits, exit_seconds = chaos.stop_all()
            books = read_books(
                client,
                root,
                {n: chaos.loop.addresses[n] for n in chaos.workers},
                async_level=2,
                honest={chaos.loop.addresses[n] for n in chaos.workers},
                outages=chaos.outages,
                exits=exits,
            )
        finally:
            chaos.loop.close()
    violations = reconcile(books)
    return {
        "seed": seed,
        "faults": chaos.injected,
        "violations": violations,
        "ok": not violations,
        **figures(books),
        "exits": exits,
        "exit_seconds": exit_seconds,  # SIGTERM (to all at once) -> exit, per node
        "schedule": [asdict(f) for f in schedule],
        "seconds": round(time.monotonic() - began, 1),
    }


def _interrupted(_sig: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seed", type=int, default=1, help="the fault schedule's seed (default 1)")
    ap.add_argument("--steps", type=int, default=4, help="trainer steps (default 4)")
    ap.add_argument("--workers", type=int, default=2, help="inference workers (default 2)")
    ap.add_argument(
        "--kinds",
        default=",".join(KINDS),
        help=f"faults to inject, comma-separated (default all: {','.join(KINDS)})",
    )
    ap.add_argument("--keep", type=Path, help="run under this directory and keep it (logs)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, _interrupted)  # as Ctrl-C: every node is stopped
    kinds = tuple(k for k in args.kinds.split(",") if k)
    if unknown := set(kinds) - set(KINDS):
        ap.error(f"unknown fault kinds: {', '.join(sorted(unknown))}")
    out = run(
        args.seed,
        steps=args.steps,
        workers=args.workers,
        kinds=kinds,
        base=args.keep,
        quiet=False,
    )
    print(f"chaos run, seed {out['seed']}: {out['seconds']} s, {out['steps']} trainer steps")
    print(f"  {'fault':<20} injected")
    for kind, n in out["faults"].items():
        print(f"  {kind:<20} {n}")
    print(
        f"  submitted {out['submitted']}, accepted {out['accepted']}, rejected "
        f"{out['rejected']}, trained on {out['trained_on']}; lost {out['lost_work']}, "
        f"counted twice {out['double_counted_work']}, honest slashes {out['honest_false_slashes']}"
    )
    print("  books: " + ("exact" if out["ok"] else f"{len(out['violations'])} violations"))
    for line in out["violations"]:
        print(f"    {line}")
    if args.json:
        print(json.dumps(out))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
