"""``intellect-node``: the one binary every participant runs.

Only argparse and the config module are imported at start, so ``--help`` is instant;
trio, py-libp2p (and later torch, web3) are imported inside the command that needs them.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from functools import partial
from pathlib import Path
from typing import Any

from node.cli.adminclient import admin_get, admin_post, data_dir
from node.cli.flags import add_config_flags, flags_given
from node.config import (
    ConfigError,
    NodeConfig,
    config_toml,
    load_config,
)

ROLE_NOTES = {
    "bootstrap": "entry point into the DHT: serves discovery, relays gossip.",
    "inference": "registers its stake, then for every step the trainer announces generates a "
    "proven rollout batch for its assigned tasks, stores, announces and serves it, and submits "
    "its work key on-chain; also pulls and relays weight versions (SHARDCAST).",
    "validator": "fetches every submitted batch, checks registration, step window, units, "
    "tasks, rewards and proofs, and posts accept or reject on-chain.",
    "trainer": "the run owner's node: takes the batches validators accepted on-chain, trains "
    "the policy with GRPO, publishes each new version over SHARDCAST and on-chain, announces "
    "the training step, evaluates held-out accuracy (metrics.jsonl in its data dir).",
    "pretrain": "a member of the run's DiLoCo trainer group pretraining on --trainer.data: next-token "
    "loss on its own shard of the text, averaging with the group every [diloco] inner_steps; "
    "the member [run] trainer_peer_id names leads and alone publishes each version (SHARDCAST).",
    "diloco": "a member of the run's DiLoCo trainer group: trains with GRPO on its share of "
    "the accepted batches and averages with the group every [diloco] inner_steps; the member "
    "trainer_peer_id names leads, announces steps and alone publishes each version.",
}

EPILOG = """\
examples:
  intellect-node start --role bootstrap --listen /ip4/0.0.0.0/tcp/4001
  intellect-node start --role inference --bootstrap /ip4/1.2.3.4/tcp/4001/p2p/12D3KooW...
  intellect-node status --name inference
  intellect-node devnet                      # a local network of five nodes
  intellect-node chain                       # a local development chain with the ledger contract
  intellect-node stake add 2                 # register this node with 2 ETH of stake
  intellect-node rewards                     # stake, pending/claimable rewards, verdicts
  intellect-node model init ./tiny           # build the tiny base policy (once; then cached)
  intellect-node model rollouts ./tiny --worker 0x...  # one step's proven, scored rollouts
  intellect-node weights publish ./ckpt --name trainer  # sign and serve a checkpoint version
  intellect-node weights pull --name inference          # fetch the newest version from peers

configuration (intellect-node start --help lists every setting):
  flag > INTELLECT_NODE_<SECTION>__<SETTING> environment variable > --config FILE (TOML) > default
"""


START_DESCRIPTION = """\
Run a node in one role until Ctrl-C / SIGTERM.

Every setting has a flag below, --<section>.<setting> (a few also a short one); the same
setting can come from a TOML file (--config FILE: [section] tables of the setting names) or
the environment (INTELLECT_NODE_<SECTION>__<SETTING>, lists comma-separated); the top-level
keys (role, name, data_dir, log_level, network_only) have no section. Precedence: flag >
environment > TOML file > default. --print-config prints the resolved file.
"""


def _add_node_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config", type=Path, metavar="FILE", help="TOML file with any of the settings below"
    )
    p.add_argument(
        "--print-config", action="store_true", help="print the resolved configuration and exit"
    )
    add_config_flags(p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="intellect-node",
        description="A node of a permissionless network for decentralized RL training of language models.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    start = sub.add_parser(
        "start",
        help="run a node in one role until Ctrl-C / SIGTERM",
        description=START_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_node_flags(start)

    status = sub.add_parser(
        "status", help="show a running node's peer id, addresses, peers and traffic"
    )
    status.add_argument("--data-dir", type=Path, help="the node's data dir")
    status.add_argument("--name", help="the node's name (data dir ~/.intellect-node/<name>)")
    status.add_argument("--json", action="store_true", help="print the raw JSON")

    ping = sub.add_parser("ping", help="ask a running node to do a presence round trip with a peer")
    ping.add_argument("peer_id", help="the peer to reach (a 12D3KooW... peer id)")
    ping.add_argument("--data-dir", type=Path, help="the running node's data dir")
    ping.add_argument("--name", help="the node's name (data dir ~/.intellect-node/<name>)")
    ping.add_argument("--json", action="store_true", help="print the raw JSON reply")

    keys = sub.add_parser(
        "keys",
        help="create or show this node's identity (Ed25519 key) and EVM account (encrypted keystore)",
    )
    keys.add_argument(
        "action",
        choices=["new", "show", "import"],
        help="new: make the peer identity and the EVM account; show: print them; import: "
        "make the EVM account from a private key (hex) read from --key-file or stdin",
    )
    keys.add_argument(
        "--key-file",
        type=Path,
        metavar="FILE",
        help="with import: the file holding the private key, 64 hex digits (default, or -: "
        "stdin; a prompt that does not echo on a terminal)",
    )
    keys.add_argument("--data-dir", type=Path, help="the node's data dir")
    keys.add_argument("--name", help="the node's name (data dir ~/.intellect-node/<name>)")
    keys.add_argument("--force", action="store_true", help="with new: replace existing keys")
    keys.add_argument(
        "--password-file",
        type=Path,
        help="EVM keystore password file (else INTELLECT_NODE_PASSWORD, else a prompt)",
    )

    from node.cli.ledger import add_ledger_parsers

    add_ledger_parsers(sub)

    from node.cli.model import add_model_parsers

    add_model_parsers(sub)

    from node.cli.weights import add_weights_parsers

    add_weights_parsers(sub)

    from node.cli.dashboard import add_dashboard_parser

    add_dashboard_parser(sub)

    devnet = sub.add_parser(
        "devnet", help="run a local network (bootstrap, trainer, validator, inference) on 127.0.0.1"
    )
    devnet.add_argument(
        "--inference", type=int, default=2, help="number of inference nodes (default 2)"
    )
    devnet.add_argument(
        "--base-dir",
        type=Path,
        default=Path.home() / ".intellect-node" / "devnet",
        help="a data dir per node under it (default ~/.intellect-node/devnet)",
    )
    devnet.add_argument(
        "--run-id",
        default="devnet",
        help="the run's name (default devnet): the trainer signs the run's manifest under it, "
        "and the run id is the name and the manifest's hash (devnet-<32 hex>); a node started "
        "by hand joins with --bootstrap and the address the devnet prints",
    )
    devnet.add_argument(
        "--duration",
        type=float,
        default=0,
        help="stop after this many seconds at most (0: no limit)",
    )
    devnet.add_argument(
        "--validators",
        type=int,
        default=1,
        help="number of validators (1-4: the development chain appoints 4; default 1)",
    )
    devnet.add_argument(
        "--steps",
        type=int,
        default=10,
        help="trainer steps to run; the devnet exits once every node holds the final policy "
        "(0: run until Ctrl-C; default 10)",
    )
    devnet.add_argument(
        "--trainers",
        type=int,
        default=1,
        help="trainer nodes (1-8; default 1); 2 or more train as one DiLoCo group (SPEC "
        "§21): the first leads and publishes, each trains on its share of the accepted "
        "batches, the group averages every --diloco-inner-steps",
    )
    devnet.add_argument(
        "--diloco-inner-steps",
        type=int,
        default=2,
        help="with --trainers 2+: inner GRPO steps per outer step (default 2)",
    )
    devnet.add_argument(
        "--async-level",
        type=int,
        default=2,
        help="policy versions a worker may lag the trainer (0: synchronous, on-policy; default 2)",
    )
    devnet.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="where the nodes compute (default cpu: everyone in fp32 under the strict-fp32 "
        "profile); cuda: the workers generate with the CUDA-graph engine in bf16, the "
        "validators recompute on the GPU in bf16 and the trainer trains there, under the "
        "gpu-bf16 profile (SPEC section 18.1)",
    )
    devnet.add_argument(
        "--validator-devices",
        metavar="LIST",
        help="one device per validator, comma-separated (default: --device for each): "
        "--device cuda --validators 2 --validator-devices cuda,cpu has the second judge the "
        "GPU workers on the CPU in fp32",
    )
    devnet.add_argument(
        "--model",
        type=Path,
        metavar="DIR",
        help="the base policy, a model directory (default: the tiny base policy, built once "
        "per machine; `intellect-node model init --shape 1.1b` makes one of TinyLlama's shape)",
    )
    devnet.add_argument(
        "--model-family",
        choices=["llama", "qwen2"],
        default="llama",
        help="the base policy built when --model is not given (default llama: the tiny Llama "
        "with a character tokenizer, on the built-in arithmetic); qwen2: a small Qwen2-family "
        "model (grouped-query attention, q/k/v bias) with a byte-level BPE tokenizer and "
        "ChatML chat template trained here, whose tasks come from a math file the devnet "
        "writes (word problems, under BASE_DIR/tasks); built in about 30 s, then cached",
    )
    devnet.add_argument(
        "--report",
        type=Path,
        metavar="DIR",
        help="write metrics.jsonl (one line per trainer step) and learning.png there",
    )
    return parser


def _config_from_args(args: argparse.Namespace) -> NodeConfig:
    return load_config(file=args.config, flags=flags_given(args))


def cmd_start(args: argparse.Namespace) -> int:
    cfg = _config_from_args(args)
    if args.print_config:
        if cfg.role == "trainer" and cfg.run.manifest_name is not None:
            cfg = _with_manifest_run_id(cfg)
        print(config_toml(cfg), end="")
        return 0
    from node.keystore import claim_data_dir, ensure_data_dir, load_or_create_identity
    from node.logs import setup_logging

    if cfg.run.model is not None:
        from node.engine.modeldir import check_model_dir

        check_model_dir(cfg.run.model)  # a wrong path fails now, not when the role needs it
    if (cfg.role in ("inference", "validator") and cfg.engine.device == "cuda") or (
        cfg.role == "trainer" and cfg.trainer.device == "cuda"
    ):
        from node.engine.models import pick_device

        pick_device("cuda")  # so does a GPU asked for on a machine without one
    if cfg.trainer.data is not None and cfg.role == "trainer":
        from node.diloco.corpus import check_readable

        check_readable(cfg.trainer.data)  # so does a missing, unreadable or empty corpus
    data_dir = ensure_data_dir(cfg.resolved_data_dir)
    claim_data_dir(data_dir)  # held until this process exits
    identity = load_or_create_identity(data_dir)

    import trio

    from node.cli.manifest import join_run, take_run_files, trainer_manifest
    from node.cli.stopping import stop_on_signals
    from node.engine.modeldir import ModelError
    from node.net.admin import AdminServer
    from node.net.collector import freeze
    from node.net.dashboard import dashboard_routes
    from node.net.runs import RunManifests
    from node.net.runtime import Node
    from node.roles import role_service
    from node.roles.given import RoleRun
    from node.roles.io.chain import ChainSetupError
    from node.roles.io.submissions import local_record
    from node.shardcast.runfiles import RunFilesError
    from node.shardcast.service import WeightService

    # after py-libp2p's import-time logging setup; while a joining node asks its bootstrap
    # peers, errors only: what it finds or cannot find, it says in its own lines
    quiet = cfg.log_level if cfg.log_level in ("debug", "error") else "error"
    setup_logging(quiet, identity.peer_id[-8:])

    # the run manifest (SPEC §2): signed by the trainer, or found and checked before the
    # node of the run is built, so before a role locks any stake
    cfg, envelope = trainer_manifest(cfg, identity)
    refused: list[str] = []
    joined = False
    if envelope is None:
        cfg, envelope, refused = join_run(cfg, identity)
        joined = envelope is not None
    setup_logging(cfg.log_level, identity.peer_id[-8:])
    for line in refused:
        print(f"intellect-node: {line}", file=sys.stderr)
    if joined:
        print(f"intellect-node: joining run {cfg.run.id} by its manifest", flush=True)

    async def supervised(
        role: RoleRun,
        node: Node,
        weights: WeightService,
        task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """The role; once up, a failure of it (a full disk, a bug) stops the node the way
        Ctrl-C does (departure announced), with the error on one line and its traceback in
        the log, instead of a raw traceback of trio's exception group."""
        up = _Started(task_status)
        try:
            await role(node, cfg, weights, task_status=up)
        except Exception as exc:
            if not up.done:
                raise  # a failure to start: reported where the role is started
            logging.getLogger("intellect.node").error("the %s role failed", cfg.role, exc_info=exc)
            print(
                f"intellect-node: error: {cfg.role} role failed: {one_line(exc)}", file=sys.stderr
            )
            failed.append(exc)
            node.request_stop()

    async def main() -> None:
        nonlocal cfg
        node = Node(cfg, identity)

        async def run_node(task_status: trio.TaskStatus[Node] = trio.TASK_STATUS_IGNORED) -> None:
            await node.serve(task_status=task_status)
            nursery.cancel_scope.cancel()

        # signals are heard from the first moment (a role's start-up, a model loading or a
        # chain answering, may take minutes: Ctrl-C must stop it, a second one at once)
        with stop_on_signals(node.request_stop):
            async with trio.open_nursery() as nursery:
                await nursery.start(run_node)
                weights = await nursery.start(WeightService(node, cfg).serve)
                node.refuse_banned(weights.bans)  # one list: a liar we caught gets nothing
                await nursery.start(RunManifests(node, envelope).serve)
                if joined and envelope is not None:  # until its trainer signs a new run
                    await nursery.start(_run_watch(node, cfg, envelope, weights.bans).serve)
                admin = AdminServer(
                    node,
                    data_dir,
                    cfg.admin.port,
                    routes=weights.admin_routes(),
                    # the page at /, with the node's record of its work held against the chain
                    pages=dashboard_routes(
                        cfg, node.status, record=partial(local_record, cfg.resolved_data_dir)
                    ),
                )
                port = await nursery.start(admin.serve)
                try:  # the run's files: served by its trainer, pulled by a joiner (no stake)
                    cfg = await take_run_files(cfg, weights, envelope, joined)
                except RunFilesError as exc:
                    print(f"intellect-node: error: {exc}", file=sys.stderr)
                    failed.append(exc)
                    node.request_stop()
                    return
                # the role's module imports torch (seconds): in a thread, not on the loop
                role = (
                    None
                    if cfg.network_only
                    else await trio.to_thread.run_sync(
                        partial(
                            role_service,
                            cfg.role,
                            diloco=cfg.diloco.enabled,
                            objective=cfg.trainer.objective,
                        )
                    )
                )
                if role is not None:
                    try:
                        await nursery.start(supervised, role, node, weights)
                    except (ChainSetupError, ModelError, RuntimeError, ValueError, OSError) as exc:
                        print(f"intellect-node: error: {cfg.role} role: {exc}", file=sys.stderr)
                        failed.append(exc)
                        node.request_stop()
                        return
                # everything it keeps for its life is loaded: out of the collector's walks
                frozen = freeze()  # (node/net/collector.py: a full walk stalled the loop)
                logging.getLogger("intellect.node").debug("%d objects frozen", frozen)
                print(f"intellect-node {cfg.role} up", flush=True)
                print(f"  peer id : {node.peer_id}")
                if envelope is not None:
                    print(f"  run     : {cfg.run.id} (its manifest served to joining nodes)")
                for a in node.addrs:
                    print(f"  address : {a}/p2p/{node.peer_id}")
                print(f"  admin   : http://127.0.0.1:{port}/status (metrics at /metrics)")
                print(f"  page    : http://127.0.0.1:{port}/ (intellect-node dashboard)")
                note: str = cfg.role
                if cfg.role == "trainer" and cfg.diloco.enabled:
                    note = "pretrain" if cfg.trainer.objective == "pretrain" else "diloco"
                print(f"  role    : {ROLE_NOTES[note]}", flush=True)

    failed: list[BaseException] = []
    trio.run(main)
    return 1 if failed else 0


def _run_watch(node: Any, cfg: NodeConfig, envelope: bytes, bans: Any) -> Any:
    """A joined node's ``RunWatch``: when its run's trainer signs a new run, the node
    keeps that manifest (a restart joins the new run), says so in one line and stops,
    taking no more of the old run's work."""
    from node.cli.manifest import keep_manifest
    from node.net.runs import RunWatch, new_run_line
    from protocol.manifest import open_run_manifest

    held = open_run_manifest(envelope)

    def new_run(manifest: Any, new_envelope: bytes) -> None:
        keep_manifest(cfg.resolved_data_dir, new_envelope)
        line = new_run_line(held, manifest)
        logging.getLogger("intellect.node").warning("%s", line)
        print(f"intellect-node: {line}", file=sys.stderr, flush=True)
        node.request_stop()

    return RunWatch(node, held, cfg.net.bootstrap, new_run, bans=bans)


def _with_manifest_run_id(cfg: NodeConfig) -> NodeConfig:
    """``--print-config`` of a trainer with ``manifest_name``: the run id its manifest
    names, once its identity exists (``keys new`` / ``keys import``), to give out before
    the trainer starts."""
    from node.cli.manifest import trainer_manifest
    from node.keystore import key_path, load_identity

    if not key_path(cfg.resolved_data_dir).exists():
        return cfg
    return trainer_manifest(cfg, load_identity(cfg.resolved_data_dir))[0]


class _Started:
    """A role's ``task_status`` that remembers whether the role came up."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.done = inner, False

    def started(self, value: Any = None) -> None:
        self.done = True
        self.inner.started(value)


def leaves(exc: BaseException) -> list[BaseException]:
    """The errors in ``exc``: itself, or a group's innermost ones."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in leaves(e)]
    return [exc]


def one_line(exc: BaseException) -> str:
    """An error as ``Type: message``; a group as its innermost errors, joined."""
    return "; ".join(
        f"{type(e).__name__}: {e}" if str(e) else type(e).__name__ for e in leaves(exc)
    )


def cmd_status(args: argparse.Namespace) -> int:
    st = admin_get(data_dir(args), "/status")
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    from node.cli.tables import show, status_view

    show(*status_view(st))
    return 0


def ping_target(text: str) -> str:
    """The peer id ``ping`` was given, checked before any node is asked: a ``ConfigError``
    (one line, status 2) for anything else, a multiaddr answered with its /p2p/ part."""
    from crypto.identity import IdentityError, public_key_of_peer_id

    if text.startswith("/"):
        parts = text.split("/")
        hint = parts[parts.index("p2p") + 1] if "p2p" in parts[:-1] else "12D3KooW..."
        raise ConfigError(f"ping takes a peer id, not a multiaddr: intellect-node ping {hint}")
    try:
        public_key_of_peer_id(text)
    except IdentityError:
        raise ConfigError(f"ping: {text!r} is not a peer id (12D3KooW...)") from None
    return text


def cmd_ping(args: argparse.Namespace) -> int:
    peer = ping_target(args.peer_id)
    result = admin_post(data_dir(args), "/ping", {"peer_id": peer})
    if args.json:
        print(json.dumps(result))
    elif result.get("ok"):
        print(f"{peer}: {result.get('role')}, {result.get('rtt_ms')} ms")
    else:
        reason = " ".join(str(result.get("error", "no answer")).split())  # one line
        print(f"intellect-node: error: no answer from {peer}: {reason[:300]}", file=sys.stderr)
    return 0 if result.get("ok") else 1


def cmd_keys(args: argparse.Namespace) -> int:
    from ledger.accounts import (
        AccountError,
        account_address,
        account_path,
        create_account,
        read_password,
    )
    from node.keystore import create_identity, key_path, load_identity

    directory = data_dir(args)
    if args.action == "import":
        key = _read_key(args.key_file)  # garbage is refused before a password is asked
        if account_path(directory).exists() and not args.force:
            raise AccountError(
                f"{account_path(directory)} already exists (use --force to replace it)"
            )
        password = read_password(args.password_file, confirm=True)
        if not password:
            raise AccountError("refusing an empty keystore password")
        ident = (
            load_identity(directory) if key_path(directory).exists() else create_identity(directory)
        )
        address: str = create_account(
            directory, password, force=args.force, private_key=key
        ).address
    elif args.action == "new":
        password = read_password(args.password_file, confirm=True)  # before anything is written
        if not password:
            raise AccountError("refusing an empty keystore password")
        half_made = key_path(directory).exists() and not account_path(directory).exists()
        if half_made and not args.force:  # by `start`, or a `keys new` cut short: keep its
            ident = load_identity(directory)  # peer id (other nodes may know it already)
        else:
            ident = create_identity(directory, force=args.force)
        address = create_account(directory, password, force=args.force).address
    else:
        ident = load_identity(directory)
        address = "(none: intellect-node keys new creates one)"
        if account_path(directory).exists():  # a damaged one is an error, not "none"
            address = account_address(directory)
    print(f"peer id    {ident.peer_id}")
    print(f"public key {ident.public_bytes.hex()}")
    print(f"key file   {key_path(directory)}")
    print(f"account    {address}")
    print(f"keystore   {account_path(directory)}")
    return 0


def _read_key(key_file: Path | None) -> str:
    """The private key of ``keys import``: from ``key_file``, else stdin (a prompt that does
    not echo on a terminal); refused in one line, never printed, if it is not one."""
    import getpass

    from node.keystore import KeystoreError, parse_private_key

    if key_file is not None and str(key_file) != "-":
        try:
            return parse_private_key(key_file.read_text(), str(key_file))
        except (OSError, UnicodeDecodeError) as exc:
            raise KeystoreError(f"cannot read the key file {key_file}: {exc}") from exc
    try:
        text = getpass.getpass("private key (hex): ") if sys.stdin.isatty() else sys.stdin.read()
    except (EOFError, UnicodeDecodeError):
        text = ""
    return parse_private_key(text, "stdin")


def cmd_devnet(args: argparse.Namespace) -> int:
    from node.cli.devnet import run_devnet

    return run_devnet(
        args.base_dir,
        run_id=args.run_id,
        inference=args.inference,
        duration=args.duration,
        validators=args.validators,
        steps=args.steps,
        async_level=args.async_level,
        report=args.report,
        trainers=args.trainers,
        inner_steps=args.diloco_inner_steps,
        device=args.device,
        validator_devices=args.validator_devices,
        model=args.model,
        model_family=args.model_family,
    )


def cmd_model(args: argparse.Namespace) -> int:
    from node.cli.model import cmd_model as run

    return run(args)


def cmd_weights(args: argparse.Namespace) -> int:
    from node.cli.weights import cmd_weights as run

    return run(args)


def cmd_dashboard(args: argparse.Namespace) -> int:
    from node.cli.dashboard import cmd_dashboard as run

    return run(args)


def cmd_ledger(args: argparse.Namespace) -> int:
    from node.cli.ledger import cmd_chain, cmd_rewards, cmd_stake

    commands = {
        "chain": cmd_chain,
        "rewards": cmd_rewards,
        "stake": cmd_stake,
    }
    return commands[args.command](args)


COMMANDS = {
    "start": cmd_start,
    "status": cmd_status,
    "ping": cmd_ping,
    "keys": cmd_keys,
    "devnet": cmd_devnet,
    "chain": cmd_ledger,
    "rewards": cmd_ledger,
    "stake": cmd_ledger,
    "model": cmd_model,
    "weights": cmd_weights,
    "dashboard": cmd_dashboard,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except ConfigError as exc:
        print(f"intellect-node: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        from node.keystore import KeystoreError

        errors = leaves(exc)  # a node's start fails inside trio: in an exception group
        if all(isinstance(e, KeystoreError | RuntimeError | OSError | ValueError) for e in errors):
            print(f"intellect-node: error: {'; '.join(map(str, errors))}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
