"""``intellect-node chain deploy --rpc URL``: the ledger contract on any chain, from the
node's own keystore account.

What it does, in order (each failure one line, nothing sent before the question):
1. unlocks the node's keystore (``--password-file``, else ``INTELLECT_NODE_PASSWORD``, else
   a prompt) and connects to ``--rpc``; with ``--chain-id``, any other chain is refused;
2. estimates the deployment's gas (a revert says why), reads the latest block's fees and
   the account's balance, and shows what it costs now and at most (``gas limit x max
   fee``); an account that cannot pay the most is refused with what it has and needs;
3. asks before it sends (``--yes`` does not ask; no answer is a no);
4. signs locally and sends raw, then waits until the receipt is ``--confirmations`` blocks
   deep (``[chain] confirmations``' meaning: that many blocks on top of it). A reorg that
   takes the transaction out is waited through: the same signed bytes are sent again (same
   hash, same nonce, so the same contract address) while it is neither mined nor pending;
5. reads the deployed contract's parameters back, writes the deployment (``--out``, the
   fields of ``intellect-node chain``'s chain.json a node reads, no keys) and prints the
   ``[chain]`` settings a node's config needs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from decimal import Decimal
from typing import Any

from ledger.accounts import load_account, read_password
from ledger.build import load_artifact
from ledger.chain import connect, revert_reason
from ledger.client import LedgerClient
from ledger.records import LedgerError, LedgerRevert, fmt_eth, retry, rpc_message
from ledger.transactions import GAS_EXTRA, GAS_HEADROOM, block_fees
from node.config import load_config

GWEI = 10**9
POLL_S = 0.25


def gwei(wei: int) -> str:
    return f"{Decimal(wei) / GWEI:.3f} gwei"


def cmd_chain_deploy(args: argparse.Namespace, params: Any, validators: list[str]) -> int:
    if not args.rpc:
        raise ValueError("chain deploy needs --rpc URL, the chain's JSON-RPC endpoint")
    if len(validators) < params.quorum + 1:
        raise ValueError(
            f"the contract needs {params.quorum + 1} validators at its deployment (quorum + 1), "
            f"got {len(validators)}: pass --validator ADDRESS for each"
        )
    cfg = load_config(file=args.config, flags={"name": args.name, "data_dir": args.data_dir})
    account = load_account(cfg.resolved_data_dir, read_password(args.password_file))
    chain = connect(args.rpc, timeout=args.rpc_timeout)
    plan = Deployment(chain, account, params, validators, expected_chain_id=args.chain_id)
    plan.show()
    if not args.yes and not confirmed("send this deployment? [y/N] "):
        raise RuntimeError("nothing sent: the deployment was not confirmed (--yes skips asking)")
    receipt = plan.send_and_confirm(args.confirmations, timeout=args.timeout)
    info = plan.record(receipt, args.confirmations)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(info, indent=1) + "\n")
    print(f"deployed {info['contract']} in block {info['block']} ({args.confirmations} deep)")
    print(f"  written to {args.out}")
    print("  the nodes' config:\n")
    print(chain_settings(info))
    return 0


def confirmed(question: str) -> bool:
    print(question, end="", flush=True)
    answer = sys.stdin.readline()
    if not answer:
        print()  # no answer (end of input) is a no
    return answer.strip().lower() in ("y", "yes")


def chain_settings(info: dict[str, Any]) -> str:
    return (
        "[chain]\n"
        f'url = "{info["url"]}"\n'
        f'contract = "{info["contract"]}"\n'
        f"contract_block = {info['block']}\n"
        f"id = {info['chain_id']}\n"
        f"confirmations = {info['confirmations']}\n"
    )


class Deployment:
    """One deployment of the contract: its transaction built, priced and checked, then sent
    and awaited to a depth."""

    def __init__(
        self,
        chain: Any,
        account: Any,
        params: Any,
        validators: list[str],
        *,
        expected_chain_id: int | None,
    ) -> None:
        self.chain, self.account, self.params = chain, account, params
        self.w3 = chain.w3
        self.chain_id = int(retry(lambda: chain.chain_id))
        if expected_chain_id is not None and self.chain_id != expected_chain_id:
            raise LedgerError(
                f"{chain.url} is chain {self.chain_id}, not {expected_chain_id} (--chain-id): "
                "nothing sent"
            )
        art = load_artifact()
        factory = self.w3.eth.contract(abi=art["abi"], bytecode=art["bytecode"])
        self.validators = [self.w3.to_checksum_address(v) for v in validators]
        ctor = factory.constructor(params.as_tuple(), self.validators)
        self.data = ctor.data_in_transaction
        try:
            estimate = int(
                retry(
                    lambda: self.w3.eth.estimate_gas({"from": account.address, "data": self.data})
                )
            )
        except LedgerError:
            raise
        except Exception as exc:
            reason = revert_reason(exc)
            if reason is not None:
                raise LedgerRevert("deploy", reason) from exc
            raise LedgerError(f"deploy refused by the chain: {rpc_message(exc)}") from exc
        self.estimate = estimate
        self.gas = int(estimate * GAS_HEADROOM) + GAS_EXTRA
        self.fees = block_fees(chain)
        # block_fees pays twice the latest base fee plus the tip, as every transaction does
        self.base_fee = (self.fees["maxFeePerGas"] - self.fees["maxPriorityFeePerGas"]) // 2
        self.balance = int(retry(lambda: self.w3.eth.get_balance(account.address)))
        self.most = self.gas * self.fees["maxFeePerGas"]
        if self.balance < self.most:
            raise LedgerError(
                f"account {account.address} has {fmt_eth(self.balance)}, but the deployment "
                f"needs up to {fmt_eth(self.most)} (gas {self.gas:,} at {gwei(self.fees['maxFeePerGas'])}): "
                "send it ETH first"
            )

    def show(self) -> None:
        now = self.estimate * (self.base_fee + self.fees["maxPriorityFeePerGas"])
        print(f"deploy the ledger contract to chain {self.chain_id} at {self.chain.url}")
        print(f"  from       {self.account.address} (balance {fmt_eth(self.balance)})")
        print(f"  validators {', '.join(self.validators) or 'none yet'}")
        print(f"  gas        {self.estimate:,} estimated, limit {self.gas:,}")
        print(
            f"  fees now   base {gwei(self.base_fee)}, tip "
            f"{gwei(self.fees['maxPriorityFeePerGas'])}; max fee {gwei(self.fees['maxFeePerGas'])}"
        )
        print(f"  cost       about {fmt_eth(now)} at these fees, at most {fmt_eth(self.most)}")

    def send_and_confirm(self, confirmations: int, *, timeout: float) -> Any:
        """Send, then await a receipt ``confirmations`` blocks deep on the chain as it is
        then (a reorg that removed it is waited through, the same bytes sent again)."""
        nonce = int(retry(lambda: self.w3.eth.get_transaction_count(self.account.address)))
        tx = self.fees | {
            "data": self.data,
            "gas": self.gas,
            "nonce": nonce,
            "chainId": self.chain_id,
            "value": 0,
        }
        signed = self.account.sign_transaction(tx)
        raw, tx_hash = bytes(signed.raw_transaction), bytes(signed.hash)
        print(f"  sent       tx 0x{tx_hash.hex()}, waiting for {confirmations} confirmations")
        self._send(raw, tx_hash)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            receipt = self._receipt(tx_hash)
            if receipt is None:
                if not self._known(tx_hash):
                    self._send(raw, tx_hash)  # reorged out and forgotten: again
            elif self._deep(receipt, confirmations):
                if receipt["status"] != 1:
                    raise LedgerError(
                        f"the deployment failed on chain in block {receipt['blockNumber']} "
                        f"(gas used {receipt['gasUsed']:,} of {self.gas:,})"
                    )
                return receipt
            time.sleep(POLL_S)
        raise LedgerError(
            f"tx 0x{tx_hash.hex()} not {confirmations} blocks deep within {timeout:.0f} s; it "
            "may still be mined: look it up before deploying again"
        )

    def _send(self, raw: bytes, tx_hash: bytes) -> None:
        try:
            self.w3.eth.send_raw_transaction(raw)
        except Exception as exc:
            if self._known(tx_hash):  # it arrived, only the answer was lost; or mined
                return
            raise LedgerError(f"deploy refused by the chain: {rpc_message(exc)}") from exc

    def _known(self, tx_hash: bytes) -> bool:
        try:
            return self.w3.eth.get_transaction(tx_hash) is not None
        except Exception:  # not found, or no answer: unknown
            return False

    def _receipt(self, tx_hash: bytes) -> Any:
        try:
            return self.w3.eth.get_transaction_receipt(tx_hash)
        except Exception:  # not mined yet, or no answer this time
            return None

    def _deep(self, receipt: Any, confirmations: int) -> bool:
        """The receipt's block is ``confirmations`` deep and still the chain's."""
        try:
            if self.w3.eth.block_number - receipt["blockNumber"] < confirmations:
                return False
            block = self.w3.eth.get_block(receipt["blockNumber"])
        except Exception:  # no answer this time: not known to be deep
            return False
        return bool(block["hash"] == receipt["blockHash"])

    def record(self, receipt: Any, confirmations: int) -> dict[str, Any]:
        """What a run needs of the deployment (chain.json's fields, no keys), after reading
        the deployed contract's parameters back."""
        address = str(receipt["contractAddress"])
        on_chain = LedgerClient(self.chain, address, expected_chain_id=self.chain_id).params()
        if on_chain != self.params:
            raise LedgerError(f"the contract at {address} holds other parameters: {on_chain}")
        return {
            "url": self.chain.url,
            "chain_id": self.chain_id,
            "contract": address,
            "block": int(receipt["blockNumber"]),
            "block_hash": "0x" + bytes(receipt["blockHash"]).hex(),
            "tx": "0x" + bytes(receipt["transactionHash"]).hex(),
            "confirmations": confirmations,
            "owner_address": self.account.address,
            "validator_addresses": self.validators,
            "params": asdict(self.params),
        }
