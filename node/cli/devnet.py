"""A local network on 127.0.0.1: one process per node, the real binary in each.

Starts the development chain with the ledger contract (``intellect-node chain``), makes a
ledger account for every worker (funded from the chain's development keys), gives each
validator one of the chain's appointed validator keys and the trainer the contract
owner's key, then starts a bootstrap node, the trainer (with ``--trainers K`` ≥ 2: a
DiLoCo group of K trainers, ``trainer`` its leader, SPEC §21), the validators and N inference
nodes that each know only the bootstrap (``run_devnet``'s ``launch`` may start some of them
from another module: the tests' misbehaving workers, ``tests/helpers/``).
Workers stake and register, generate a batch per trainer step with the newest policy they
hold, validators judge each on-chain, the trainer trains on the accepted ones with GRPO
and publishes every new policy over SHARDCAST. A live table shows the step, the policy
version each node holds, mean reward, held-out accuracy (sampled at the run's temperature,
the headline, then greedy), verdicts, slashes, rewards and bytes of weights moved. With
``--steps S`` it stops by itself once the trainer has taken S steps and every node holds the
final version; ``--report DIR`` gets ``metrics.jsonl`` and a PNG of reward and held-out
accuracy against step, and a line printed with it gives the held-out figures at the first
and the last evaluation. Every process it starts it also stops
(SIGTERM, then SIGKILL after a grace period); Ctrl-C stops it cleanly.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.cli.adminclient import admin_status
from node.cli.devnetpage import DevnetPage
from node.cli.progress import progress
from node.net.adminfile import ADMIN_FILE
from node.orphans import parent_death_signal
from node.tasks import RL_TASKSET

REPO_ROOT = Path(__file__).resolve().parents[2]  # node processes run from the checkout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class Launch:
    """How one devnet node starts: ``python -m MODULE start ...`` (the binary by default)
    with ``env`` added to its environment; ``label`` says how in the devnet's lines."""

    module: str = "node.cli"
    env: Mapping[str, str] = field(default_factory=dict)
    label: str = ""


@dataclass
class NodeProcess:
    name: str
    role: str
    data_dir: Path
    proc: subprocess.Popen[bytes]
    log_path: Path

    def status(self, timeout: float = 5) -> dict[str, Any] | None:
        """Its ``/status``, or None while it does not answer."""
        return admin_status(self.data_dir, timeout)

    def stop(self, sig: int = signal.SIGTERM, grace: float = 10) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def manifest_env(name: str, ledger_env: Mapping[str, str]) -> dict[str, str]:
    """The devnet trainer's settings that make it sign the run's manifest named ``name``,
    with the devnet chain's URL for a joiner that has none."""
    return {
        "INTELLECT_NODE_RUN__MANIFEST_NAME": name,
        "INTELLECT_NODE_CHAIN__PUBLIC_URL": ledger_env["INTELLECT_NODE_CHAIN__URL"],
    }


def signed_run_id(trainer_dir: Path, environ: Mapping[str, str]) -> str:
    """The run id the manifest of a trainer of ``trainer_dir`` started with ``environ`` names
    (its name and the hash of its terms), worked out here as the trainer works it out: the
    devnet starts every node with it. ``ManifestError`` (one line) if the settings make
    no manifest."""
    from node.cli.manifest import trainer_manifest
    from node.config import load_config
    from node.keystore import load_or_create_identity

    cfg = load_config(flags={"role": "trainer"}, environ=environ)
    cfg, _ = trainer_manifest(cfg, load_or_create_identity(trainer_dir))
    return cfg.run.id


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
    die_with_parent: bool = False,
) -> NodeProcess:
    """``intellect-node start`` as a process; ``die_with_parent``: it gets SIGTERM when this
    process dies, however (the devnet: killed outright, it left every node running), and
    runs in a session of its own: a terminal's Ctrl-C reaches the devnet alone, whose one
    SIGTERM then lets the node leave politely (the terminal's SIGINT and then the devnet's
    SIGTERM were two signals, and the second forces a node out at once)."""
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
            cwd=REPO_ROOT,
            preexec_fn=parent_death_signal() if die_with_parent else None,
            start_new_session=die_with_parent,
        )
    return NodeProcess(name, role, data_dir, proc, log_path)


def wait_ready(node: NodeProcess, timeout: float = 300) -> dict[str, Any]:
    """The node's status once its admin endpoint answers (a generous deadline: a node
    starting on a loaded machine imports torch and libp2p for minutes)."""
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


def start_chain(
    data_dir: Path,
    timeout: float = 300,
    extra: list[str] | None = None,
    port: int | None = None,
    prefix: list[str] | None = None,
    die_with_parent: bool = False,
) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    """``intellect-node chain`` as a process; returns it and the env that points nodes at it.
    ``port``: listen there (a chain restarted with ``--state`` where the nodes look for it),
    else on a free port. ``prefix`` runs the command under another one (the NAT tests: ``ip
    netns exec NS``, with ``--host`` in ``extra``). The chain's output is appended to
    ``chain.log`` beside ``data_dir``. ``die_with_parent``: as for ``spawn_node``."""
    data_dir.mkdir(parents=True, exist_ok=True)  # the log goes beside it
    info_path = data_dir / "chain.json"
    info_path.unlink(missing_ok=True)
    log = open(data_dir.parent / "chain.log", "ab")  # noqa: SIM115 - handed to the child
    cmd = [
        *(prefix or []),
        sys.executable,
        "-m",
        "node.cli",
        "chain",
        "--port",
        str(port or free_port()),
        "--data-dir",
        str(data_dir),
        *(extra or []),
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO_ROOT,
        preexec_fn=parent_death_signal() if die_with_parent else None,
        start_new_session=die_with_parent,  # as a node: the devnet alone signals it
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
        "INTELLECT_NODE_CHAIN__URL": info["url"],
        "INTELLECT_NODE_CHAIN__CONTRACT": info["contract"],
        "INTELLECT_NODE_CHAIN__CONTRACT_BLOCK": str(info["block"]),
        "INTELLECT_NODE_CHAIN__ID": str(info["chain_id"]),
    }
    return proc, env


MODEL_FAMILIES = ("llama", "qwen2")  # what ``--model-family`` builds (``prepare_model``)


def prepare_tasks(base_dir: Path, family: str) -> Path | None:
    """The run's task file: for the qwen2 family, the project's word problems
    (``node/tasks/problems.py``) under ``base_dir/tasks``; None for llama (the built-in
    arithmetic its base policy is built for)."""
    if family == "llama":
        return None
    from node.tasks.problems import write_problems

    return write_problems(base_dir / "tasks" / "problems.jsonl").resolve()


def prepare_model(out: Path, family: str = "llama", tasks: Path | None = None) -> Path:
    """The base policy for the run (``model init``): built once per machine, cached; the
    build's SFT steps show progress. ``family`` llama: the tiny Llama on the built-in
    arithmetic; qwen2: the Qwen2-family model with its byte-level BPE and chat template,
    trained on the task file ``tasks`` (``prepare_tasks``)."""
    from dataclasses import replace

    from node.engine.tinymodel import QWEN2, Recipe, build_tiny_model, default_cache_dir

    if family not in MODEL_FAMILIES:
        raise ValueError(f"model family {family!r}: one of {', '.join(MODEL_FAMILIES)}")
    if family == "qwen2" and tasks is None:
        raise ValueError("the qwen2 base model is built on its task file: give tasks")
    started = time.monotonic()
    print(
        f"devnet: preparing the {family} base model (built once per machine, then cached)",
        flush=True,
    )
    recipe = Recipe() if family == "llama" else replace(QWEN2, task=str(tasks))
    with progress("devnet: base model SFT", recipe.steps, unit="steps") as bar:
        path, built = build_tiny_model(
            out,
            recipe,
            cache_dir=default_cache_dir(),
            progress=lambda done, total, loss: bar.update(
                done, total=total, info=f"loss {loss:.3f}"
            ),
        )
    how = "built" if built else "reused from the cache"
    print(f"devnet: base model {path} ({how}, {time.monotonic() - started:.1f} s)", flush=True)
    return path


DEVNET_PASSWORD = "devnet"  # the development accounts' keystore password (local only)
WORKER_FUNDS = "10"  # ETH sent to each worker account


def make_account(data_dir: Path, private_key: str | None = None) -> str:
    """A keystore in ``data_dir`` (kept if there is one); returns its address. Its password
    is public, so its scrypt is geth's light one: the full work factor would only cost each
    node a second at every start."""
    from ledger.accounts import LIGHT_SCRYPT_N, account_address, account_path, create_account

    if not account_path(data_dir).exists():
        create_account(data_dir, DEVNET_PASSWORD, private_key=private_key, scrypt_n=LIGHT_SCRYPT_N)
    return account_address(data_dir).lower()


def fund(chain_dir: Path, address: str, amount: str, prefix: list[str] | None = None) -> None:
    """``intellect-node chain fund`` from the development chain's funder key; ``prefix`` runs
    it where the chain can be reached (``start_chain``'s)."""
    subprocess.run(
        [
            *(prefix or []),
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
        cwd=REPO_ROOT,
    )


def group_env(trainers: int, inner_steps: int, admit: list[str]) -> dict[str, str]:
    """The settings of every trainer of a devnet DiLoCo group (SPEC §21); the leader
    admits only the ``admit`` peer ids."""
    return {
        "INTELLECT_NODE_DILOCO__ENABLED": "true",
        "INTELLECT_NODE_DILOCO__ADMIT": ",".join(admit),
        "INTELLECT_NODE_DILOCO__MEMBERS": str(trainers),
        "INTELLECT_NODE_DILOCO__INNER_STEPS": str(inner_steps),
        # a member whose share of a step's batches is short goes on after this long
        "INTELLECT_NODE_TRAINER__STEP_WAIT": "30",
    }


# the run's work settings on the devnet (one CPU machine): small batches, short answers
DEVNET_WORK = {
    "INTELLECT_NODE_RUN__TASKSET": RL_TASKSET,  # what the base policy is built for
    # a step trains on two batches: 32 tasks x 16 samples, the central baseline's settings
    # (node/training/central.py; at 8 x 8 a batch, 20 steps lifted held-out accuracy 1.5 points)
    "INTELLECT_NODE_RUN__TASKS_PER_BATCH": "16",
    "INTELLECT_NODE_RUN__GROUP_SIZE": "16",
    "INTELLECT_NODE_RUN__MAX_NEW_TOKENS": "40",  # level 3's worked answers take up to ~35
    "INTELLECT_NODE_RUN__TEMPERATURE": "1.0",
    "INTELLECT_NODE_ENGINE__BATCH": "64",
    # every node shares this machine's cores: one torch thread per engine and checker
    # (measured: a batch checked on 2 threads took twice the CPU of 1, in the same time)
    "INTELLECT_NODE_ENGINE__TORCH_THREADS": "1",
    # every node computes in fp32 on a CPU: the exact profile (SPEC section 18.1)
    "INTELLECT_NODE_RUN__VERIFY_PROFILE": "strict-fp32",
}


DEVICES = ("cpu", "cuda")


def devices_env(
    device: str, validator_devices: list[str], names: list[str]
) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """The settings ``--device`` and ``--validator-devices`` give: those of every node, and
    each validator's own (by name). Any GPU in the run makes it a ``gpu-bf16`` run (SPEC
    section 18.1: workers in bf16, validators in bf16 or fp32); all on the CPU, it stays
    ``strict-fp32``. A validator on the CPU beside nodes on the GPU (``device`` cuda) gets
    torch's threads (one per core): the others leave the cores to it."""
    for d in (device, *validator_devices):
        if d not in DEVICES:
            raise ValueError(f"device {d!r}: one of {', '.join(DEVICES)}")
    if len(validator_devices) != len(names):
        raise ValueError(
            f"--validator-devices names {len(validator_devices)} devices for {len(names)} "
            "validators: one each"
        )
    gpu = "cuda" in (device, *validator_devices)
    common = {"INTELLECT_NODE_ENGINE__DEVICE": device, "INTELLECT_NODE_TRAINER__DEVICE": device}
    if gpu:
        common["INTELLECT_NODE_RUN__VERIFY_PROFILE"] = "gpu-bf16"
    own = {}
    for name, d in zip(names, validator_devices, strict=True):
        own[name] = {"INTELLECT_NODE_ENGINE__DEVICE": d}
        if device == "cuda" and d == "cpu":
            own[name]["INTELLECT_NODE_ENGINE__TORCH_THREADS"] = "0"
    return common, own


def check_devices(devices: list[str]) -> None:
    """A GPU asked for on a machine whose torch sees none fails before anything starts,
    in the words a node uses for it (``pick_device``), with the flags that asked."""
    if "cuda" in devices:
        from node.engine.modeldir import ModelError
        from node.engine.models import pick_device

        try:
            pick_device("cuda")
        except ModelError as exc:
            raise ValueError(f"{exc} (--device or --validator-devices cuda)") from None


def work_settings(
    on_device: dict[str, str], environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The run's work settings: ``DEVNET_WORK``, then what the devices ask for
    (``devices_env``), then each of ``DEVNET_WORK``'s variables set in the environment
    (``INTELLECT_NODE_RUN__TASKS_PER_BATCH=8 intellect-node devnet``: smaller batches)."""
    env = os.environ if environ is None else environ
    return {**DEVNET_WORK, **on_device, **{k: env[k] for k in DEVNET_WORK if k in env}}


@contextmanager
def live_work_table(
    quiet: bool = False,
) -> Iterator[tuple[float, Callable[[list[NodeProcess]], None]]]:
    """The live table (``node/cli/tables.py``): the trainer's step and metrics; per worker
    batches and money; per validator verdicts; per node the policy version held and weight
    bytes moved. On a terminal one table redrawn in place (every 2 s); elsewhere the
    table printed every 10 s, as plain text. Yields (seconds between refreshes, refresh)."""
    from node.cli.tables import console, show, work_view

    def view(nodes: list[NodeProcess]) -> list[Any]:
        return work_view([(n.name, n.status() or {}) for n in nodes])

    con = console()
    if quiet:
        yield 10.0, lambda nodes: None
    elif not con.is_terminal:
        yield 10.0, lambda nodes: show(*view(nodes), con=con)
    else:
        from rich.console import Group
        from rich.live import Live

        with Live(console=con, auto_refresh=False) as live:
            yield 2.0, lambda nodes: live.update(Group(*view(nodes)), refresh=True)


def final_versions(nodes: list[NodeProcess]) -> dict[str, int | None]:
    """The newest complete policy version each following node holds (bootstrap excluded)."""
    out: dict[str, int | None] = {}
    for n in nodes:
        if n.role == "bootstrap":
            continue
        st = n.status() or {}
        out[n.name] = (st.get("weights") or {}).get("current")
    return out


def write_report(
    report: Path, metrics: Path, statuses: dict[str, Any] | None = None
) -> Path | None:
    """``metrics.jsonl`` copied into ``report``, every node's last status
    (``statuses.json``), and a PNG of reward and held-out accuracy against step; returns
    the PNG's path (None without metrics)."""
    report.mkdir(parents=True, exist_ok=True)
    if statuses is not None:
        (report / "statuses.json").write_text(json.dumps(statuses, indent=1, default=str))
    if not metrics.exists():
        return None
    text = metrics.read_text()
    (report / "metrics.jsonl").write_text(text)
    lines = [json.loads(x) for x in text.splitlines() if x.strip()]
    return plot_curves(
        {"devnet": lines}, report / "learning.png", title="intellect-node devnet: GRPO"
    )


def heldout_summary(metrics: Path) -> str | None:
    """Held-out accuracy at the first and the last evaluation in ``metrics``, the sampled
    figure (the headline) first; None before any evaluation."""
    if not metrics.exists():
        return None
    lines = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    evals = [m for m in lines if m.get("heldout_sampled") is not None]
    if not evals:
        return None
    first, last = evals[0], evals[-1]
    return (
        f"held-out accuracy, step {first['step']} -> {last['step']}: "
        f"sampled ({last['heldout_draws']} draws per task) "
        f"{first['heldout_sampled']:.3f} -> {last['heldout_sampled']:.3f}, "
        f"greedy {first['heldout_greedy']:.3f} -> {last['heldout_greedy']:.3f}, "
        f"pass@{last['heldout_draws']} "
        f"{first['heldout_pass_at_k']:.3f} -> {last['heldout_pass_at_k']:.3f}"
    )


CURVES: list[tuple[str, dict[str, Any], str]] = [  # metrics.jsonl key, line style, label
    ("heldout_sampled", {"marker": "o", "ms": 3}, "held-out accuracy, sampled"),
    ("heldout_greedy", {"ls": ":", "marker": "x", "ms": 3}, "held-out accuracy, greedy"),
    ("reward_mean", {"ls": "--", "alpha": 0.7}, "mean reward"),
]


def plot_curves(runs: dict[str, list[dict[str, Any]]], out: Path, *, title: str) -> Path:
    """Reward (dashed), held-out sampled accuracy (solid: the headline) and held-out greedy
    accuracy (dotted) against step, one colour per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for i, (name, lines) in enumerate(runs.items()):
        colour = f"C{i}"
        for key, style, label in CURVES:
            points = [(m["step"], m[key]) for m in lines if m.get(key) is not None]
            if points:
                ax.plot(*zip(*points, strict=True), color=colour, label=f"{name}: {label}", **style)
    ax.set_xlabel("trainer step")
    ax.set_ylabel("accuracy / reward")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


class Stopper:
    """The devnet's SIGINT and SIGTERM handler. While it starts (the chain, the accounts,
    the base model's build of minutes, the nodes) a signal stops it at once: it was only
    noted, and start-up went on to start every node before it stopped them. Once running
    (``running``), the first ends the run loop and the nodes are stopped; a second,
    while they stop, does not wait for them (each still gets SIGTERM)."""

    def __init__(self) -> None:
        self.running = False
        self.asked = False

    def __call__(self, _sig: int, _frame: Any) -> None:
        again, self.asked = self.asked, True
        if again or not self.running:
            raise KeyboardInterrupt


def stop_all(nodes: list[NodeProcess], grace: float = 10) -> None:
    """SIGTERM to every node at once, then wait for them together (one by one, each with
    its own 10 s, a devnet of many nodes took minutes); kill those still up after ``grace``."""
    for n in nodes:
        if n.proc.poll() is None:
            n.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for n in nodes:
        try:
            n.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            n.proc.kill()
            n.proc.wait()


PREVIOUS_RUN = "previous-run"
DEVNET_LOCK = "devnet.lock"  # held for a devnet's life, kept where it is between runs


def claim_base_dir(base_dir: Path) -> int:
    """Hold ``base_dir`` for this devnet (``hold_lock``); the descriptor to close at its
    end. A second devnet there set the running one's files aside and both terminals showed
    the second's figures: it is refused, naming the running one."""
    from node.keystore import LockHeld, hold_lock

    try:
        return hold_lock(base_dir / DEVNET_LOCK)
    except LockHeld as held:
        raise RuntimeError(
            f"another devnet (pid {held.holder}) runs in {base_dir}: stop it first, or give"
            " this one another --base-dir"
        ) from None


def set_aside_earlier_run(base_dir: Path) -> Path | None:
    """Move what an earlier devnet left in ``base_dir`` to ``base_dir/previous-run`` (an
    older one there goes) and return that; None when there was nothing. Each devnet run
    deploys a new chain: its nodes must start afresh (a trainer resumed at its old step on
    the new chain finished "2 steps done" without training, or had every batch refused)."""
    earlier = [p for p in base_dir.iterdir() if p.name not in (PREVIOUS_RUN, DEVNET_LOCK)]
    if not earlier:
        return None
    target = base_dir / PREVIOUS_RUN
    if target.exists():
        shutil.rmtree(target)
    target.mkdir()
    for p in earlier:
        p.rename(target / p.name)
    return target


def run_devnet(
    base_dir: Path,
    *,
    run_id: str,
    inference: int,
    duration: float,
    validators: int = 1,
    steps: int = 10,
    async_level: int = 2,
    report: Path | None = None,
    env_extra: dict[str, str] | None = None,
    quiet: bool = False,
    trainers: int = 1,
    inner_steps: int = 2,
    device: str = "cpu",
    validator_devices: str | None = None,
    model: Path | None = None,
    launch: Callable[[int], Launch] | None = None,
    batches_per_step: int | None = None,
    model_family: str = "llama",
) -> int:
    """Run the devnet; 0 when it finished (``steps`` reached and every node holds the
    final version, or Ctrl-C / ``duration``). ``trainers`` ≥ 2: a DiLoCo group of that
    many trainers (``trainer`` leads, ``trainer-1`` … follow), ``inner_steps`` each.
    ``device``, ``validator_devices`` (comma-separated, one per validator): where the
    nodes compute (``devices_env``); ``model``: the base policy (default: the tiny one).
    ``launch``: how inference node ``i`` starts (default: the binary, ``Launch()``);
    ``batches_per_step``: accepted batches each trainer step takes (default: one per
    inference node). ``model_family``: the base policy built when ``model`` is not given
    (``prepare_model``): llama on the built-in arithmetic, or qwen2 on a task file the
    devnet writes (``prepare_tasks``), which becomes the run's task set."""
    if not 1 <= trainers <= 8:
        raise ValueError("--trainers must be between 1 and 8")
    from node.cli.ledger import DEV_VALIDATORS

    if not 1 <= validators <= DEV_VALIDATORS:
        raise ValueError(
            f"--validators must be 1 to {DEV_VALIDATORS} (the development chain appoints"
            f" {DEV_VALIDATORS})"
        )
    if inference < 1:
        raise ValueError("--inference must be at least 1")
    if model_family not in MODEL_FAMILIES:
        raise ValueError(f"--model-family {model_family}: one of {', '.join(MODEL_FAMILIES)}")
    if model is not None and model_family != "llama":
        raise ValueError(
            f"--model-family {model_family} builds the base model and --model gives one: not both"
        )
    vnames = ["validator"] if validators == 1 else [f"validator-{i}" for i in range(validators)]
    listed = validator_devices.split(",") if validator_devices else [device] * validators
    listed = [d.strip() for d in listed]
    on_device, validator_env = devices_env(device, listed, vnames)
    check_devices([device, *listed])
    if model is not None:
        from node.engine.modeldir import check_model_dir

        model = check_model_dir(model).resolve()
    base_dir.mkdir(parents=True, exist_ok=True)
    lock = claim_base_dir(base_dir)  # before anything there is moved or written
    fast = [
        "--net.heartbeat-interval",
        "2",
        "--net.peer-ttl",
        "10",
        "--net.discovery-interval",
        "1",
    ]
    nodes: list[NodeProcess] = []
    say = (lambda *_a, **_k: None) if quiet else print

    stop = Stopper()
    old = signal.signal(signal.SIGINT, stop), signal.signal(signal.SIGTERM, stop)
    chain: subprocess.Popen[bytes] | None = None
    page: DevnetPage | None = None
    try:
        if moved := set_aside_earlier_run(base_dir):
            say(f"devnet: the earlier run's files are in {moved} (this run is a new chain)")
        chain, ledger_env = start_chain(
            base_dir / "chain", extra=["--max-staleness", str(async_level)], die_with_parent=True
        )
        chain_info = json.loads((base_dir / "chain" / "chain.json").read_text())
        tasks = prepare_tasks(base_dir, model_family)
        tasks_env = {} if tasks is None else {"INTELLECT_NODE_RUN__TASKSET": str(tasks)}
        # the trainer's key is the run's trust root for weights and steps: make it first
        from node.keystore import load_or_create_identity

        trainer_id = load_or_create_identity(base_dir / "trainer").peer_id
        ledger_env = {
            **ledger_env,
            **work_settings({**on_device, **tasks_env}),
            "INTELLECT_NODE_RUN__TRAINER_PEER_ID": trainer_id,
            "INTELLECT_NODE_PASSWORD": DEVNET_PASSWORD,
            "INTELLECT_NODE_RUN__ASYNC_LEVEL": str(async_level),
            **(env_extra or {}),
        }
        say(f"devnet: trainer (weights and steps trust root) {trainer_id}", flush=True)
        if tasks is not None:
            say(f"devnet: the run's tasks come from {tasks}", flush=True)
        owner = make_account(base_dir / "trainer", chain_info["owner_key"])
        say(f"devnet: trainer account {owner} (the contract's owner)", flush=True)
        for name, key in zip(vnames, chain_info["validator_keys"], strict=False):
            address = make_account(base_dir / name, key)
            say(f"devnet: {name} account {address} (appointed by the chain)", flush=True)
        workers = [f"inference-{i}" for i in range(inference)]
        launches = [launch(i) if launch else Launch() for i in range(inference)]
        for name, how in zip(workers, launches, strict=True):
            address = make_account(base_dir / name)
            fund(base_dir / "chain", address, WORKER_FUNDS)
            label = f" ({how.label})" if how.label else ""
            say(f"devnet: {name} account {address}, funded {WORKER_FUNDS} ETH{label}", flush=True)
        base = model or prepare_model(base_dir / "model", model_family, tasks)
        model_env = {"INTELLECT_NODE_RUN__MODEL": str(base)}
        trainer_env = {
            "INTELLECT_NODE_TRAINER__STEPS": str(steps),
            "INTELLECT_NODE_TRAINER__BATCHES_PER_STEP": str(batches_per_step or inference),
        }
        members: list[tuple[str, str, Mapping[str, str]]] = [("trainer", "trainer", trainer_env)]
        if trainers > 1:  # a DiLoCo group: the others skip the held-out evaluation
            others = [f"trainer-{i}" for i in range(1, trainers)]
            admit = [load_or_create_identity(base_dir / name).peer_id for name in others]
            trainer_env.update(group_env(trainers, inner_steps, admit))
            members += [
                (
                    f"trainer-{i}",
                    "trainer",
                    {**trainer_env, "INTELLECT_NODE_TRAINER__EVAL_EVERY": "0"},
                )
                for i in range(1, trainers)
            ]
            say(f"devnet: {trainers} trainers in one DiLoCo group, H = {inner_steps}", flush=True)
        # the trainer signs the run's manifest (SPEC §2): a node started by hand joins it with
        # --bootstrap alone, checked against it; every node here is given its run id
        members[0] = ("trainer", "trainer", {**trainer_env, **manifest_env(run_id, ledger_env)})
        run_id = signed_run_id(
            base_dir / "trainer", {**os.environ, **ledger_env, **model_env, **members[0][2]}
        )
        boot = spawn_node(
            "bootstrap",
            "bootstrap",
            base_dir,
            run_id=run_id,
            listen=f"/ip4/127.0.0.1/tcp/{free_port()}",
            bootstrap=[],
            extra=fast,
            env_extra=ledger_env,
            die_with_parent=True,
        )
        nodes.append(boot)
        boot_addr = p2p_addr(wait_ready(boot))
        say(f"devnet: bootstrap at {boot_addr}", flush=True)
        say(
            f"devnet: run {run_id}: its manifest, model and tasks are served to a node started "
            f"with --bootstrap {boot_addr} alone",
            flush=True,
        )
        roles = (
            [(name, role, env, "node.cli") for name, role, env in members]
            + [(name, "validator", validator_env[name], "node.cli") for name in vnames]
            + [
                (name, "inference", how.env, how.module)
                for name, how in zip(workers, launches, strict=True)
            ]
        )
        for name, role, extra_env, module in roles:
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
                    module=module,
                    die_with_parent=True,
                )
            )
        with progress("devnet: nodes up", len(nodes), unit="nodes", enabled=not quiet) as bar:
            for i, n in enumerate(nodes):  # the bootstrap answers already
                wait_ready(n, timeout=180)
                bar.update(i + 1, info=n.name)
        started = time.monotonic()
        say(
            f"devnet: {len(nodes)} nodes up; logs and keys under {base_dir}; Ctrl-C stops every node",
            flush=True,
        )
        page = DevnetPage({n.name: n.data_dir for n in nodes}, title=run_id).start()
        say(f"devnet: dashboard of every node at {page.url}", flush=True)
        trainer = next(n for n in nodes if n.role == "trainer")
        finished = False
        stop.running = True  # from now on a first Ctrl-C ends the run loop, a second at once
        with live_work_table(quiet) as (every, refresh):
            last = 0.0
            while not stop.asked and (duration <= 0 or time.monotonic() - started < duration):
                time.sleep(0.5)
                for n in nodes:
                    if n.proc.poll() is not None:
                        raise RuntimeError(
                            f"{n.name} exited with {n.proc.returncode}; its log: {n.log_path}"
                        )
                if time.monotonic() - last > every:
                    refresh(nodes)
                    last = time.monotonic()
                if steps and ((trainer.status() or {}).get("trainer") or {}).get("done"):
                    held = final_versions(nodes)
                    if all(v is not None and v >= steps for v in held.values()):
                        finished = True
                        refresh(nodes)
                        break
        if finished:
            say(
                f"devnet: {steps} steps done, every node holds version {steps} "
                f"({time.monotonic() - started:.0f} s)",
                flush=True,
            )
        if report is not None:
            statuses = {n.name: n.status() for n in nodes}
            metrics = base_dir / "trainer" / "metrics.jsonl"
            png = write_report(report, metrics, statuses)
            say(f"devnet: report in {report}" + (f" ({png.name})" if png else ""), flush=True)
            if (line := heldout_summary(metrics)) is not None:
                say(f"devnet: {line}", flush=True)
        if steps and not finished and not stop.asked:
            say(f"devnet: stopped after {duration:.0f} s before step {steps}", flush=True)
            return 1
    finally:
        if page is not None:
            page.close()
        stop_all(nodes)
        if chain is not None and chain.poll() is None:
            chain.send_signal(signal.SIGTERM)
            try:
                chain.wait(10)
            except subprocess.TimeoutExpired:
                chain.kill()
                chain.wait()
        signal.signal(signal.SIGINT, old[0])
        signal.signal(signal.SIGTERM, old[1])
        say("devnet: all nodes and the chain stopped", flush=True)
        os.close(lock)
    return 0
