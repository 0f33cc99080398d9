"""The ledger commands: ``chain``, ``rewards [claim]``, ``stake add|unbond|withdraw``.

Where the chain and contract are: ``--chain`` / ``--contract`` flags, else the config
(``chain``, ``contract``, ``contract_block``), else the local development chain that
``intellect-node chain`` describes in ``~/.intellect-node/chain/chain.json``.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from node.config import NodeConfig, load_config

WEI = 10**18
DEV_CHAIN_DIR = Path.home() / ".intellect-node" / "chain"
CHAIN_FILE = "chain.json"


def parse_eth(text: str) -> int:
    """'1.5' ETH (or '1500000000000000000wei') to wei."""
    try:
        if text.endswith("wei"):
            value = int(text[:-3])
        else:
            value = int(Decimal(text) * WEI)
    except (InvalidOperation, ValueError) as exc:
        raise ValueError(f"not an amount: {text!r} (ETH, e.g. 1.5, or wei, e.g. 1000wei)") from exc
    if value <= 0:
        raise ValueError("the amount must be positive")
    return value


def fmt_eth(wei: int) -> str:
    return f"{Decimal(wei) / WEI:f} ETH"


def add_ledger_parsers(sub: Any) -> None:
    chain = sub.add_parser(
        "chain", help="run a local development chain on 127.0.0.1 with the contract deployed"
    )
    chain.add_argument(
        "--chain",
        dest="backend",
        choices=["embedded", "anvil"],
        default="embedded",
        help="embedded: py-evm served over JSON-RPC (default; needs only pip); anvil: Foundry's dev node from npm",
    )
    chain.add_argument("--port", type=int, default=8545)
    chain.add_argument(
        "--data-dir",
        type=Path,
        default=DEV_CHAIN_DIR,
        help=f"where chain.json goes (default {DEV_CHAIN_DIR})",
    )
    chain.add_argument("--pool", default="1000", help="ETH put in the reward pool (default 1000)")
    chain.add_argument("--verdict-window", type=int, default=3600, help="seconds (default 3600)")
    chain.add_argument("--reward-lock", type=int, default=3600, help="seconds (default 3600)")
    chain.add_argument("--unbonding-delay", type=int, default=86400, help="seconds (default 86400)")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--chain",
            dest="chain_url",
            help="JSON-RPC URL (default: config, else the local dev chain)",
        )
        p.add_argument(
            "--contract", help="contract address (default: config, else the local dev chain)"
        )
        p.add_argument("--config", type=Path, help="the node's TOML config file")
        p.add_argument("--data-dir", type=Path, help="the node's data dir (keystore)")
        p.add_argument("--name", help="the node's name (data dir ~/.intellect-node/<name>)")
        p.add_argument(
            "--password-file",
            type=Path,
            help="keystore password file (else INTELLECT_NODE_PASSWORD, else a prompt)",
        )

    rewards = sub.add_parser(
        "rewards",
        help="show stake, rewards and verdicts for an account; 'rewards claim' pays them out",
    )
    rewards.add_argument("action", nargs="?", choices=["claim"], help="claim matured rewards")
    rewards.add_argument("--address", help="account to inspect (default: this node's account)")
    rewards.add_argument("--json", action="store_true")
    common(rewards)

    stake = sub.add_parser("stake", help="register/add stake, unbond, or withdraw unbonded stake")
    stake.add_argument("action", choices=["add", "unbond", "withdraw"])
    stake.add_argument(
        "amount", nargs="?", help="ETH (e.g. 2.5) or wei (e.g. 1000wei); not for withdraw"
    )
    common(stake)


def _config(args: argparse.Namespace) -> NodeConfig:
    """The node's config (TOML file, environment, flags), for its data dir and ledger settings."""
    return load_config(file=args.config, flags={"name": args.name, "data_dir": args.data_dir})


def _locate(args: argparse.Namespace, cfg: NodeConfig) -> tuple[str, str, int]:
    """(chain URL, contract address, deployment block): flags, else config, else the dev chain."""
    url, contract, block = (
        args.chain_url or cfg.chain,
        args.contract or cfg.contract,
        cfg.contract_block,
    )
    dev = DEV_CHAIN_DIR / CHAIN_FILE
    if (not args.chain_url or not contract) and dev.exists():
        info = json.loads(dev.read_text())
        if not contract or contract == info["contract"]:
            url = args.chain_url or info["url"]
            contract = contract or info["contract"]
            block = info["block"]
    if not contract:
        raise RuntimeError(
            "no contract address: pass --contract, set 'contract' in the config, or run 'intellect-node chain'"
        )
    return url, contract, block


def _client(args: argparse.Namespace, *, signing: bool) -> tuple[Any, NodeConfig, int]:
    """A ledger client (with the node's account if ``signing``), the config, the start block."""
    from ledger.accounts import load_account, read_password
    from ledger.chain import connect
    from ledger.client import LedgerClient

    cfg = _config(args)
    url, contract, block = _locate(args, cfg)
    data_dir = cfg.resolved_data_dir
    account = load_account(data_dir, read_password(args.password_file)) if signing else None
    client = LedgerClient(connect(url), contract, account, expected_chain_id=cfg.chain_id)
    return client, cfg, block


def cmd_rewards(args: argparse.Namespace) -> int:
    from ledger.accounts import account_address
    from ledger.history import EventIndex

    if args.action == "claim":
        client, _, _ = _client(args, signing=True)
        receipt = client.claim()
        print(f"claimed in block {receipt.blockNumber} (tx {receipt.transactionHash.hex()})")
        return 0
    client, cfg, start_block = _client(args, signing=False)
    data_dir = cfg.resolved_data_dir
    address = client.w3.to_checksum_address(args.address or account_address(data_dir))
    w = client.worker(address)
    index = EventIndex(
        client.w3,
        client.contract.address,
        start_block,
        data_dir / "ledger-events.json",
    )
    recent = EventIndex.involving(index.update(), address)[-10:]
    report = {
        "address": address,
        "chain_id": client.chain.chain_id,
        "contract": client.contract.address,
        "registered": w.registered,
        "stake": w.stake,
        "unbonding": w.unbonding,
        "unbond_at": w.unbond_at,
        "pending": client.pending(address),
        "claimable": client.claimable(address),
        "accepted": w.accepted,
        "rejected": w.rejected,
        "slashed": w.slashed,
        "is_validator": client.is_validator(address),
        "history": recent,
    }
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"account    {address}{'  (validator)' if report['is_validator'] else ''}")
    print(f"contract   {report['contract']} on chain {report['chain_id']}")
    if not w.registered:
        print("stake      not registered (intellect-node stake add AMOUNT registers this node)")
    else:
        print(f"stake      {fmt_eth(w.stake)}   unbonding {fmt_eth(w.unbonding)}")
    print(
        f"rewards    pending {fmt_eth(report['pending'])}   claimable {fmt_eth(report['claimable'])}"
    )
    print(
        f"work       accepted {w.accepted}   rejected {w.rejected}   slashed {fmt_eth(w.slashed)}"
    )
    if recent:
        print("recent")
        for e in recent:
            detail = ", ".join(
                f"{k}={v}" for k, v in e["args"].items() if k not in ("worker", "account")
            )
            print(f"  block {e['block']:>6}  {e['event']:<14} {detail}")
    return 0


def cmd_stake(args: argparse.Namespace) -> int:
    client, cfg, _ = _client(args, signing=True)
    if args.action == "withdraw":
        receipt = client.withdraw()
    else:
        if not args.amount:
            raise ValueError(f"stake {args.action} needs an AMOUNT")
        amount = parse_eth(args.amount)
        if args.action == "unbond":
            receipt = client.unbond(amount)
        elif client.worker(client.address).registered:
            receipt = client.add_stake(amount)
        else:
            from node.keystore import load_identity

            identity = load_identity(cfg.resolved_data_dir)
            receipt = client.register(identity.public_bytes, amount)
            print(f"registered {client.address} for peer {identity.peer_id}")
    print(
        f"stake {args.action}: done in block {receipt.blockNumber} (tx {receipt.transactionHash.hex()})"
    )
    return 0


def cmd_chain(args: argparse.Namespace) -> int:
    from eth_account import Account

    from ledger.chain import connect
    from ledger.client import LedgerClient, Params, deploy

    stop_chain, url, keys, kind = _start_dev_chain(args.backend, args.port)
    try:
        chain = connect(url, dev_keys=keys)
        owner, validator = Account.from_key(keys[0]), Account.from_key(keys[1])
        params = Params(
            WEI, 10**15, 2000, 5000, args.verdict_window, args.unbonding_delay, args.reward_lock
        )
        address, block = deploy(chain, owner, params)
        as_owner = LedgerClient(chain, address, owner)
        as_owner.fund(parse_eth(args.pool))
        as_owner.set_validator(validator.address, True)
        args.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        info_path = args.data_dir / CHAIN_FILE
        info = {
            "url": url,
            "chain_id": chain.chain_id,
            "contract": address,
            "block": block,
            "owner_key": keys[0],
            "validator_key": keys[1],
            "dev_keys": keys,
        }
        info_path.write_text(json.dumps(info, indent=1))
        info_path.chmod(0o600)
        print(f"development chain at {url} (chain id {chain.chain_id}), {kind}")
        print(f"  contract  {address} (block {block}), reward pool {args.pool} ETH")
        print(f"  owner     {owner.address}")
        print(f"  validator {validator.address}")
        print(f"  details and development keys: {info_path}")
        print("Ctrl-C stops the chain (its state is not kept)", flush=True)
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        stop.wait()
        info_path.unlink(missing_ok=True)
    finally:
        stop_chain()
    print("chain stopped")
    return 0


def _start_dev_chain(backend: str, port: int) -> tuple[Any, str, list[str], str]:
    """(stop function, URL, prefunded keys, description) of a new development chain."""
    if backend == "anvil":
        from ledger.chain import start_anvil

        node = start_anvil(port)
        return node.stop, node.url, node.keys, "anvil"
    from eth_tester.backends.pyevm.main import get_default_account_keys

    from ledger.devchain import DevChain, serve

    server = serve(DevChain(), port)

    def stop() -> None:
        server.shutdown()
        server.server_close()

    url = f"http://127.0.0.1:{server.server_address[1]}"
    return stop, url, [k.to_hex() for k in get_default_account_keys()], "embedded py-evm"
