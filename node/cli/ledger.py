"""The ledger commands: ``chain [fund|deploy]``, ``rewards [claim]``,
``stake add|unbond|withdraw|revoke`` (``chain deploy``: ``node/cli/deploy.py``).

Where the chain and contract are: ``--chain`` / ``--contract`` flags, else the config
(``chain``, ``contract``, ``contract_block``), else the local development chain that
``intellect-node chain`` describes in ``~/.intellect-node/chain/chain.json``. Signing needs
a known chain id: the config's ``chain_id``, else the development chain's.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from node.cli.adminclient import devnet_chain_dir
from node.cli.flags import at_least
from node.cli.progress import progress
from node.config import NodeConfig, load_config

WEI = 10**18
# quorum 2: one validator alone can neither overturn nor be unchecked; new work needs
# quorum + 1 validators that can vote on it, so one of 4 can be removed and work goes on
DEV_VALIDATORS = 4
DEV_VALIDATOR_BOND = 100 * WEI
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
        "chain", help="run a local development chain (127.0.0.1) with the contract deployed"
    )
    chain.add_argument(
        "--chain",
        dest="backend",
        choices=["embedded", "anvil"],
        default="embedded",
        help="embedded: py-evm served over JSON-RPC (default; needs only pip); anvil: Foundry's dev node from npm",
    )
    chain.add_argument(
        "action",
        nargs="*",
        metavar="fund ADDRESS AMOUNT | deploy",
        help="fund: send AMOUNT (ETH, e.g. 10, or wei, e.g. 1000wei) to ADDRESS from a "
        "development key of the running development chain; deploy: deploy the contract on any "
        "chain (--rpc URL) from this node's account (see 'chain deploy' below)",
    )
    chain.add_argument("--port", type=int, default=8545, help="its JSON-RPC port (default 8545)")
    chain.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on (default 127.0.0.1); chain.json's URL names it. The "
        "chain holds unlocked development keys: give only a private test network's address",
    )
    chain.add_argument(
        "--data-dir",
        type=Path,
        help=f"where chain.json goes (default {DEV_CHAIN_DIR}); with deploy: the node's data "
        "dir, whose keystore account deploys (default: the config's)",
    )
    chain.add_argument(
        "--state",
        type=Path,
        metavar="FILE",
        help="keep the chain in FILE (embedded chain only): if FILE exists the chain resumes "
        "from it (same contract, blocks and balances; nothing is deployed), and it is written "
        "when the chain stops (Ctrl-C or SIGTERM; a SIGKILL loses what happened since the "
        "start). Restart on the same --port so running nodes find it again",
    )
    chain.add_argument(
        "--block-time",
        type=float,
        metavar="SECONDS",
        help="anvil only: mine a block every SECONDS, as a real chain does (default: a block "
        "for each transaction, at once)",
    )
    chain.add_argument(
        "--pool",
        default="1000",
        help="ETH the development chain puts in the reward pool (default 1000; deploy puts none)",
    )
    chain.add_argument(
        "--verdict-window", type=at_least(1), default=3600, help="seconds (default 3600)"
    )
    chain.add_argument(
        "--reward-lock",
        type=at_least(0),
        default=3600,
        help="seconds, the challenge period (default 3600, the least the contract allows)",
    )
    chain.add_argument(
        "--unbonding-delay",
        type=at_least(0),
        default=86400,
        help="seconds (default 86400; at least window + lock + 3600)",
    )
    chain.add_argument(
        "--max-staleness",
        type=at_least(0),
        default=2,
        help="policy versions a submission may lag the newest published one (the run's "
        "async_level; default 2)",
    )
    chain.add_argument(
        "--reward-per-unit",
        default="1000000000000wei",
        help="reward per unit, one generated token (default 1000000000000wei = 1e-6 ETH)",
    )
    deploy = chain.add_argument_group(
        "chain deploy",
        "intellect-node chain deploy --rpc URL: deploy the contract, with the run parameters "
        "above, from the node's keystore account; shows the gas and its cost at the current "
        "fees and asks before it sends; waits until the deployment is --confirmations blocks "
        "deep; writes the deployment to --out and prints the [chain] settings for the nodes",
    )
    deploy.add_argument("--rpc", metavar="URL", help="the chain's JSON-RPC URL (http or https)")
    deploy.add_argument(
        "--chain-id",
        type=int,
        help="refuse to deploy unless the chain at --rpc has this chain id",
    )
    deploy.add_argument(
        "--validator",
        action="append",
        default=[],
        metavar="ADDRESS",
        help="appoint ADDRESS as a validator at once; the contract needs quorum + 1 (3) at its "
        "deployment: repeat the flag for each (more later: the owner proposes them)",
    )
    deploy.add_argument(
        "--confirmations",
        type=at_least(0),
        default=2,
        help="blocks on top of the deployment's before it counts as done (default 2)",
    )
    deploy.add_argument(
        "--out",
        type=Path,
        default=Path(CHAIN_FILE),
        help=f"where the deployment's JSON goes (default ./{CHAIN_FILE}; chain.json's fields)",
    )
    deploy.add_argument("--yes", action="store_true", help="send without asking")
    deploy.add_argument(
        "--timeout",
        type=at_least(1),
        default=600,
        help="seconds to wait for the confirmations (default 600)",
    )
    deploy.add_argument(
        "--rpc-timeout",
        type=at_least(1),
        default=30,
        help="seconds to wait for each answer of the chain (default 30)",
    )
    deploy.add_argument("--config", type=Path, help="the node's TOML config file")
    deploy.add_argument("--name", help="the node's name (data dir ~/.intellect-node/<name>)")
    deploy.add_argument(
        "--password-file",
        type=Path,
        help="keystore password file (else INTELLECT_NODE_PASSWORD, else a prompt)",
    )

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--chain",
            dest="chain_url",
            help="JSON-RPC URL (default: config, else the local dev chain)",
        )
        p.add_argument(
            "--contract", help="contract address (default: config, else the local dev chain)"
        )
        p.add_argument(
            "--chain-id",
            type=int,
            help="expected chain id (default: config, else the local dev chain's)",
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
    rewards.add_argument(
        "action",
        nargs="?",
        choices=["claim", "history"],
        help="claim: pay out matured rewards; history ADDRESS: every submission, verdict, "
        "slash, claim and stake change of ADDRESS with totals per day (read-only, no keystore)",
    )
    rewards.add_argument("target", nargs="?", metavar="ADDRESS", help="the account for 'history'")
    rewards.add_argument("--address", help="account to inspect (default: this node's account)")
    rewards.add_argument("--json", action="store_true", help="print the figures as JSON")
    rewards.add_argument("--csv", action="store_true", help="'history' as CSV: rows, then days")
    common(rewards)

    stake = sub.add_parser(
        "stake",
        help="register/add stake, unbond, withdraw unbonded stake, or (a validator) revoke a squat",
    )
    stake.add_argument(
        "action",
        choices=["add", "unbond", "withdraw", "revoke"],
        help="add: register with AMOUNT, or add it; unbond: start AMOUNT's unbonding delay;"
        " withdraw: take back what finished unbonding; revoke [ADDRESS]: a validator's vote"
        " to revoke ADDRESS's registration, only if its signature is invalid (a squat; q votes"
        " free the key and burn min_stake of the squatter's stake, unbonding stake included);"
        " without ADDRESS, the account that holds this node's own peer key",
    )
    stake.add_argument(
        "amount",
        nargs="?",
        help="ETH (e.g. 2.5) or wei (e.g. 1000wei); not for withdraw; for revoke: an ADDRESS",
    )
    common(stake)


def _config(args: argparse.Namespace) -> NodeConfig:
    """The node's config (TOML file, environment, flags), for its data dir and ledger settings."""
    return load_config(file=args.config, flags={"name": args.name, "data_dir": args.data_dir})


def _locate(args: argparse.Namespace, cfg: NodeConfig) -> tuple[str, str, int, int | None]:
    """(chain URL, contract address, deployment block, chain id): flags, else config, else
    the dev chain."""
    url, contract, block, chain_id = (
        args.chain_url or cfg.chain.url,
        args.contract or cfg.chain.contract,
        cfg.chain.contract_block,
        args.chain_id or cfg.chain.id,
    )
    dev = devnet_chain_dir(DEV_CHAIN_DIR) / CHAIN_FILE
    if (not args.chain_url or not contract) and dev.exists():
        info = json.loads(dev.read_text())
        if not contract or contract == info["contract"]:
            url = args.chain_url or info["url"]
            contract = contract or info["contract"]
            block = info["block"]
    if chain_id is None and dev.exists():
        info = json.loads(dev.read_text())
        if url == info["url"] and contract == info["contract"]:
            chain_id = info["chain_id"]
    if not contract:
        raise RuntimeError(
            "no contract address: pass --contract, set [chain] contract in the config, or run 'intellect-node chain'"
        )
    return url, contract, block, chain_id


def _client(args: argparse.Namespace, *, signing: bool) -> tuple[Any, NodeConfig, int]:
    """A ledger client (with the node's account if ``signing``), the config, the start block."""
    from ledger.accounts import load_account, read_password
    from node.roles.io.chain import ledger_client

    cfg = _config(args)
    url, contract, block, chain_id = _locate(args, cfg)
    if signing and chain_id is None:
        raise RuntimeError(
            f"no chain id for {url}: pass --chain-id (or set [chain] id in the config, or "
            "INTELLECT_NODE_CHAIN__ID) so that nothing is ever signed for another chain"
        )
    data_dir = cfg.resolved_data_dir
    account = load_account(data_dir, read_password(args.password_file)) if signing else None
    client = ledger_client(cfg, url, contract, account, chain_id)
    return client, cfg, block


def cmd_rewards(args: argparse.Namespace) -> int:
    from ledger.accounts import account_address
    from ledger.history import EventIndex

    if args.action == "history":
        from node.cli.history import cmd_history

        return cmd_history(args, _client(args, signing=False))
    if args.action == "claim":
        client, _, _ = _client(args, signing=True)
        with progress("claim", unit="entries", out=sys.stderr if args.json else None) as bar:
            receipts = client.claim_all(progress=lambda done, total: bar.update(done, total=total))
        paid = sum(int(ev["args"]["total"]) for r in receipts for ev in client.events("Claimed", r))
        gas = sum(r.gasUsed for r in receipts)
        print(
            f"claimed {fmt_eth(paid)} in {len(receipts)} transaction(s), {gas:,} gas "
            f"(last block {receipts[-1].blockNumber}, tx {receipts[-1].transactionHash.hex()})"
        )
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
        confirmations=cfg.chain.confirmations,
    )
    recent = EventIndex.involving(index.update(), address)[-10:]
    report = {
        "address": address,
        "chain_id": client.chain.chain_id,
        "contract": client.contract.address,
        "registered": w.registered,
        "peer_key": "0x" + w.peer_key.hex(),
        "registration_valid": w.registered and client.registration_valid(address),
        "stake": w.stake,
        "locked": w.locked,
        "unbonding": w.unbonding,
        "unbond_at": w.unbond_at,
        "pending": client.pending(address),
        "claimable": client.claimable(address),
        "matured": client.matured(address),
        "accepted": w.accepted,
        "rejected": w.rejected,
        "slashed": w.slashed,
        "is_validator": client.is_validator(address),
        "history": recent,
    }
    if args.json:
        print(json.dumps(report))
        return 0
    from node.cli.tables import rewards_view, show

    show(*rewards_view(report))
    return 0


def cmd_stake(args: argparse.Namespace) -> int:
    client, cfg, _ = _client(args, signing=True)
    if args.action == "revoke":
        receipt = revoke_squat(client, cfg, args.amount)
    elif args.action == "withdraw":
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
            receipt = client.register_identity(identity, amount)
            print(f"registered {client.address} for peer {identity.peer_id}")
    print(
        f"stake {args.action}: done in block {receipt.blockNumber} (tx {receipt.transactionHash.hex()})"
    )
    return 0


def revoke_squat(client: Any, cfg: NodeConfig, target: str | None) -> Any:
    """Vote to revoke ``target``'s registration (default: whoever holds this node's peer
    key), only if its stored signature is invalid: a valid one is never voted on."""
    if target is None:
        from node.keystore import load_identity

        target = str(client.peer_owner(load_identity(cfg.resolved_data_dir).public_bytes))
        if int(target, 16) == 0:
            raise ValueError("no account holds this node's peer key: nothing to revoke")
    if not client.worker(target).registered:
        raise ValueError(f"{target} is not registered: nothing to revoke")
    if client.registration_valid(target):
        raise ValueError(f"{target}'s registration signature is valid: not a squat, no vote")
    receipt = client.revoke_registration(target)
    print(f"voted to revoke the registration of {target}")
    return receipt


def dev_params(args: argparse.Namespace) -> Any:
    """The development chain's run parameters (SPEC.md section 12)."""
    from ledger.client import Params

    return Params(
        min_stake=WEI,
        reward_per_unit=parse_eth(args.reward_per_unit),
        max_units=2**20,  # tokens per work key
        collateral_bps=20000,  # a caught fraud loses twice its reward
        validator_share_bps=2500,
        verdict_window=args.verdict_window,
        fetch_deadline=max(1, args.verdict_window // 6),
        reward_lock=args.reward_lock,
        unbonding_delay=args.unbonding_delay,
        max_staleness=args.max_staleness,
        quorum=2,
    )


def cmd_chain(args: argparse.Namespace) -> int:
    if args.action == ["deploy"]:
        from node.cli.deploy import cmd_chain_deploy

        return cmd_chain_deploy(args, dev_params(args), args.validator)
    if args.rpc:
        raise ValueError("--rpc is for 'chain deploy': the development chain is local")
    if args.action and args.data_dir is None:  # fund: a running devnet's chain too
        args.data_dir = devnet_chain_dir(DEV_CHAIN_DIR)
    args.data_dir = args.data_dir or DEV_CHAIN_DIR
    if args.action:
        if len(args.action) != 3 or args.action[0] != "fund":
            raise ValueError(
                "usage: intellect-node chain fund ADDRESS AMOUNT, or intellect-node chain "
                "deploy --rpc URL"
            )
        return cmd_chain_fund(args, args.action[1], args.action[2])
    if args.state is not None and args.backend != "embedded":
        raise ValueError("--state keeps the embedded chain only (anvil has its own --state)")
    params = dev_params(args)
    if args.block_time is not None and args.backend != "anvil":
        raise ValueError("--block-time needs --chain anvil (the embedded chain mines at once)")
    stop_chain, url, keys, kind, saved = _start_dev_chain(
        args.backend, args.host, args.port, args.state, args.block_time
    )
    info_path = args.data_dir / CHAIN_FILE
    info: dict[str, Any] | None = None
    try:
        if saved is not None:  # resumed: the deployment is the saved one
            info = {**saved, "url": url}
            print(f"development chain at {url} (chain id {info['chain_id']}), {kind}")
            print(f"  resumed from {args.state}: contract {info['contract']}")
        else:
            info = _deploy_dev(url, keys, params, args)
            info_path_note = "" if args.state is None else f"; kept in {args.state}"
            print(f"development chain at {url} (chain id {info['chain_id']}), {kind}")
            print(
                f"  contract   {info['contract']} (block {info['block']}), reward pool "
                f"{args.pool} ETH{info_path_note}"
            )
            print(f"  owner      {info['owner_address']}")
            for v in info["validator_addresses"]:
                print(f"  validator  {v} (bond {fmt_eth(info['validator_bond'])})")
        args.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        info_path.write_text(json.dumps(info, indent=1))
        info_path.chmod(0o600)
        print(f"  details and development keys: {info_path}")
        print("  fund an account: intellect-node chain fund ADDRESS AMOUNT")
        kept = "its state is not kept" if args.state is None else f"its state goes to {args.state}"
        print(f"Ctrl-C stops the chain ({kept})", flush=True)
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        stop.wait()
        info_path.unlink(missing_ok=True)
    finally:
        stop_chain(info)
    print("chain stopped" + ("" if args.state is None else f"; state saved to {args.state}"))
    return 0


def _deploy_dev(url: str, keys: list[str], params: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Deploy the contract on a new development chain, fund its pool, appoint and bond its
    validators; the chain.json record of it."""
    from eth_account import Account

    from ledger.chain import connect
    from ledger.client import LedgerClient, deploy

    chain = connect(url, dev_keys=keys)
    owner = Account.from_key(keys[0])
    validators = [Account.from_key(k) for k in keys[1 : 1 + DEV_VALIDATORS]]
    address, block = deploy(chain, owner, params, [v.address for v in validators])
    as_owner = LedgerClient(chain, address, owner)
    as_owner.fund(parse_eth(args.pool))
    # a validator's bond is its stake (at least the largest collateral, to vote at all);
    # each reject that is a first verdict locks part of it
    bond = max(DEV_VALIDATOR_BOND, as_owner.validator_bond())
    for v in validators:
        LedgerClient(chain, address, v).add_stake(bond)
    return {
        "url": url,
        "chain_id": chain.chain_id,
        "contract": address,
        "block": block,
        "owner_key": keys[0],
        "validator_key": keys[1],
        "validator_keys": keys[1 : 1 + DEV_VALIDATORS],
        "funder_key": keys[-1],
        "dev_keys": keys,
        "owner_address": owner.address,
        "validator_addresses": [v.address for v in validators],
        "validator_bond": bond,
    }


def cmd_chain_fund(args: argparse.Namespace, address: str, amount_text: str) -> int:
    """Send ETH from the running development chain's funder key to ADDRESS."""
    from eth_account import Account
    from web3 import Web3

    from ledger.chain import connect
    from ledger.transactions import block_fees

    if not Web3.is_address(address):
        raise ValueError(f"not an address: {address!r}")
    amount = parse_eth(amount_text)
    info_path = args.data_dir / CHAIN_FILE
    if not info_path.exists():
        raise RuntimeError(
            f"no development chain is running ({info_path} not found): start one with "
            "'intellect-node chain' (on a real network, send ETH from a wallet instead)"
        )
    info = json.loads(info_path.read_text())
    chain = connect(info["url"], dev_keys=info["dev_keys"])
    funder = Account.from_key(info.get("funder_key") or info["dev_keys"][-1])
    to = Web3.to_checksum_address(address)
    tx = block_fees(chain) | {
        "to": to,
        "value": amount,
        "gas": 21000,
        "nonce": chain.w3.eth.get_transaction_count(funder.address, "pending"),
        "chainId": chain.chain_id,
    }
    tx_hash = chain.w3.eth.send_raw_transaction(funder.sign_transaction(tx).raw_transaction)
    receipt = chain.w3.eth.wait_for_transaction_receipt(tx_hash, timeout=60)
    if receipt["status"] != 1:
        raise RuntimeError(f"the transfer failed (tx {tx_hash.hex()})")
    print(f"sent {fmt_eth(amount)} to {to}; balance now {fmt_eth(chain.w3.eth.get_balance(to))}")
    return 0


def _start_dev_chain(
    backend: str, host: str, port: int, state: Path | None = None, block_time: float | None = None
) -> tuple[Any, str, list[str], str, dict[str, Any] | None]:
    """(stop function, URL, prefunded keys, description, the saved chain.json record when
    the chain resumed from ``state``) of a development chain. The stop function takes the
    chain.json record to save with the state."""
    if backend == "anvil":
        from ledger.chain import start_anvil

        node = start_anvil(port, host=host, block_time=block_time)
        kind = "anvil" if block_time is None else f"anvil, a block every {block_time:g} s"
        return lambda _info: node.stop(), node.url, node.keys, kind, None
    from eth_tester.backends.pyevm.main import get_default_account_keys

    from ledger.devchain import DevChain, serve

    saved = None
    if state is not None and state.exists():
        chain, saved = DevChain.load(state)
    else:
        chain = DevChain()
    server = serve(chain, port, host)

    def stop(info: dict[str, Any] | None) -> None:
        server.shutdown()
        server.server_close()
        if state is not None and info is not None:
            chain.save(state, info)

    url = f"http://{host}:{server.server_address[1]}"
    keys = [k.to_hex() for k in get_default_account_keys()]
    return stop, url, keys, "embedded py-evm", saved
