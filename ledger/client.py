"""Typed client for the WorkLedger contract: local signing, raw transactions, clear errors.

Every transaction is first simulated with ``eth_call`` (a revert raises ``LedgerRevert``
with the contract's reason and sends nothing), then signed locally with an explicit gas
limit and a locally managed nonce, sent raw, and awaited with a timeout. This works the
same on the embedded chain, anvil and a real network. Transient RPC failures (connection
errors, timeouts) are retried with backoff.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from eth_account.signers.local import LocalAccount
from web3.contract import Contract

from ledger.build import load_artifact
from ledger.chain import RECEIPT_POLL_S, Chain, revert_reason

T = TypeVar("T")
RETRIES = 3
# Gas limits per call with headroom over what bench/ledger.py measures; explicit, so a
# hot path never pays for eth_estimateGas.
GAS = {
    "register": 250_000,
    "add_stake": 80_000,
    "submit_work": 200_000,
    "accept": 250_000,
    "reject": 250_000,
    "settle": 250_000,
    "claim": 400_000,
    "unbond": 120_000,
    "withdraw": 100_000,
    "set_validator": 80_000,
    "set_params": 150_000,
    "fund": 80_000,
}


class LedgerError(RuntimeError):
    """A ledger operation that could not be done, with a message for the user."""


class LedgerRevert(LedgerError):
    """The contract refused: ``reason`` is its revert reason."""

    def __init__(self, call: str, reason: str) -> None:
        super().__init__(f"{call} reverted: {reason}")
        self.call = call
        self.reason = reason


@dataclass(frozen=True)
class Params:
    min_stake: int
    reward_per_unit: int
    slash_bps: int
    validator_share_bps: int
    verdict_window: int
    unbonding_delay: int
    reward_lock: int


@dataclass(frozen=True)
class WorkerInfo:
    registered: bool
    peer_key: bytes
    stake: int
    unbonding: int
    unbond_at: int
    accepted: int
    rejected: int
    slashed: int


@dataclass(frozen=True)
class SubmissionInfo:
    worker: str
    units: int
    policy_version: int
    submitted_at: int
    status: str  # none, pending, accepted, rejected
    reward: int


STATUS = {0: "none", 1: "pending", 2: "accepted", 3: "rejected"}


def _rpc_message(exc: Exception) -> str:
    """The message a JSON-RPC node gave, without web3's wrapping."""
    response = getattr(exc, "rpc_response", None)
    if isinstance(response, dict) and isinstance(response.get("error"), dict):
        return str(response["error"].get("message", exc))
    return str(getattr(exc, "message", None) or exc)


def _retry(fn: Callable[[], T]) -> T:
    delay = 0.2
    for attempt in range(RETRIES):
        try:
            return fn()
        except (ConnectionError, TimeoutError, OSError) as exc:
            if attempt == RETRIES - 1:
                raise LedgerError(f"chain unreachable after {RETRIES} tries: {exc}") from exc
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


def deploy(
    chain: Chain, account: LocalAccount, params: Params, *, timeout: float = 60
) -> tuple[str, int]:
    """Deploy the contract from ``account``; returns (address, block number)."""
    art = load_artifact()
    factory = chain.w3.eth.contract(abi=art["abi"], bytecode=art["bytecode"])
    tx = factory.constructor(
        params.min_stake,
        params.reward_per_unit,
        params.slash_bps,
        params.validator_share_bps,
        params.verdict_window,
        params.unbonding_delay,
        params.reward_lock,
    ).build_transaction(
        _fees(chain)
        | {
            "from": account.address,
            "nonce": chain.w3.eth.get_transaction_count(account.address),
            "gas": 3_000_000,
            "chainId": chain.chain_id,
        }
    )
    signed = account.sign_transaction(tx)
    tx_hash = chain.w3.eth.send_raw_transaction(signed.raw_transaction)
    receipt = chain.w3.eth.wait_for_transaction_receipt(
        tx_hash, timeout=timeout, poll_latency=RECEIPT_POLL_S
    )
    if receipt.status != 1:
        raise LedgerError("contract deployment failed")
    return str(receipt.contractAddress), int(receipt.blockNumber)


def _fees(chain: Chain) -> dict[str, int]:
    base = int(chain.w3.eth.get_block("latest").get("baseFeePerGas", 0) or 0)
    tip = 1_000_000_000
    return {"maxFeePerGas": 2 * base + tip, "maxPriorityFeePerGas": tip}


class LedgerClient:
    def __init__(
        self,
        chain: Chain,
        address: str,
        account: LocalAccount | None = None,
        *,
        timeout: float = 60,
        expected_chain_id: int | None = None,
    ) -> None:
        self.expected_chain_id = expected_chain_id
        self.chain = chain
        self.w3 = chain.w3
        self.account = account
        self.timeout = timeout
        self.contract: Contract = self.w3.eth.contract(
            address=self.w3.to_checksum_address(address), abi=load_artifact()["abi"]
        )
        self._nonce: int | None = None
        self._chain_id: int | None = None

    @property
    def address(self) -> str:
        if self.account is None:
            raise LedgerError("no account configured: this operation needs a signing key")
        return str(self.account.address)

    # ---- views ------------------------------------------------------------------------

    def _view(self, name: str, *args: Any) -> Any:
        return _retry(lambda: getattr(self.contract.functions, name)(*args).call())

    def params(self) -> Params:
        return Params(*(self._view(f) for f in Params.__dataclass_fields__))

    def worker(self, account: str) -> WorkerInfo:
        r = self._view("workers", self.w3.to_checksum_address(account))
        return WorkerInfo(*r[:1], bytes(r[1]), *r[2:])

    def submission(self, key: bytes) -> SubmissionInfo:
        r = self._view("submissions", key)
        return SubmissionInfo(str(r[0]), r[1], r[2], r[3], STATUS[r[4]], r[5])

    def claimable(self, account: str) -> int:
        return int(self._view("claimable", self.w3.to_checksum_address(account)))

    def pending(self, account: str) -> int:
        return int(self._view("pending", self.w3.to_checksum_address(account)))

    def is_validator(self, account: str) -> bool:
        return bool(self._view("is_validator", self.w3.to_checksum_address(account)))

    def reward_pool(self) -> int:
        return int(self._view("reward_pool"))

    def owner(self) -> str:
        return str(self._view("owner"))

    # ---- transactions -----------------------------------------------------------------

    def _next_nonce(self) -> int:
        if self._nonce is None:
            self._nonce = _retry(lambda: self.w3.eth.get_transaction_count(self.address, "pending"))
        nonce = self._nonce
        self._nonce += 1
        return nonce

    def _transact(self, name: str, *args: Any, value: int = 0) -> Any:
        """Simulate, sign, send and await one contract call; returns the receipt."""
        return self._await(name, self._send(name, *args, value=value))

    def _send(self, name: str, *args: Any, value: int = 0) -> Any:
        """Simulate, then sign and send with the next local nonce; returns the tx hash."""
        if self.account is None:
            raise LedgerError(f"{name} needs a signing account")
        if self._chain_id is None:
            chain_id = self.chain.chain_id
            if self.expected_chain_id is not None and chain_id != self.expected_chain_id:
                raise LedgerError(
                    f"connected to chain {chain_id}, but the config says {self.expected_chain_id}"
                )
            self._chain_id = chain_id
        fn = getattr(self.contract.functions, name)(*args)
        sender = {"from": self.address, "value": value}
        try:
            _retry(lambda: fn.call(sender))
        except LedgerError:
            raise
        except Exception as exc:
            reason = revert_reason(exc)
            if reason is not None:
                raise LedgerRevert(name, reason) from exc
            # not a revert: the node refused the call itself (e.g. insufficient funds)
            raise LedgerError(f"{name} refused by the chain: {_rpc_message(exc)}") from exc
        tx = fn.build_transaction(
            _fees(self.chain)
            | {
                "from": self.address,
                "value": value,
                "nonce": self._next_nonce(),
                "gas": GAS[name],
                "chainId": self._chain_id,
            }
        )
        signed = self.account.sign_transaction(tx)
        try:
            return _retry(lambda: self.w3.eth.send_raw_transaction(signed.raw_transaction))
        except Exception:
            self._nonce = None  # unknown whether it was taken: ask the chain next time
            raise

    def _await(self, name: str, tx_hash: Any) -> Any:
        try:
            receipt = self.w3.eth.wait_for_transaction_receipt(
                tx_hash, timeout=self.timeout, poll_latency=RECEIPT_POLL_S
            )
        except Exception as exc:
            self._nonce = None
            raise LedgerError(f"{name}: no receipt within {self.timeout} s ({exc})") from exc
        if receipt.status != 1:
            raise LedgerRevert(name, "reverted on chain (state changed since the simulation)")
        return receipt

    def register(self, peer_key: bytes, stake: int) -> Any:
        if len(peer_key) != 32:
            raise LedgerError("peer key must be the 32-byte Ed25519 public key")
        return self._transact("register", peer_key, value=stake)

    def add_stake(self, amount: int) -> Any:
        return self._transact("add_stake", value=amount)

    def submit_work(self, key: bytes, units: int, policy_version: int) -> Any:
        return self._transact("submit_work", key, units, policy_version)

    def submit_work_many(self, items: list[tuple[bytes, int, int]]) -> list[Any]:
        """Send several submissions back to back (consecutive nonces, all in flight at
        once), then await every receipt."""
        hashes = [self._send("submit_work", key, units, version) for key, units, version in items]
        return [self._await("submit_work", h) for h in hashes]

    def accept(self, key: bytes) -> Any:
        return self._transact("accept", key)

    def reject(self, key: bytes) -> Any:
        return self._transact("reject", key)

    def settle(self, key: bytes) -> Any:
        return self._transact("settle", key)

    def claim(self) -> Any:
        return self._transact("claim")

    def unbond(self, amount: int) -> Any:
        return self._transact("unbond", amount)

    def withdraw(self) -> Any:
        return self._transact("withdraw")

    def set_validator(self, validator: str, active: bool) -> Any:
        return self._transact("set_validator", self.w3.to_checksum_address(validator), active)

    def set_params(self, p: Params) -> Any:
        return self._transact(
            "set_params",
            p.min_stake,
            p.reward_per_unit,
            p.slash_bps,
            p.validator_share_bps,
            p.verdict_window,
            p.unbonding_delay,
            p.reward_lock,
        )

    def fund(self, amount: int) -> Any:
        return self._transact("fund", value=amount)
