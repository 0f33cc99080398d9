"""The ledger's transactions: sign locally, send raw, await the receipt.

Every transaction:
- is sent only after the chain id was checked (``ChainGuard``, ``ledger/reads.py``) and
  signed with it;
- first checks the balance (an unfunded account gets one line saying what it has, what
  it needs and how to fund it; read again only when what was read last, less the most
  that each transaction sent since may cost, does not cover it), then is simulated with
  ``eth_call`` (a revert raises ``LedgerRevert`` with the contract's reason and sends
  nothing; ``claim`` and ``settle`` are simulated by their gas estimate instead);
- pays the latest block's fees (twice the base fee plus a tip), read at most every
  ``FEES_TTL_S``;
- is signed locally with an explicit gas limit (``claim``'s is estimated, with headroom)
  and a nonce from a thread-safe local counter, and sent raw;
- is idempotent: a send that failed in transit is looked up by its hash before it is sent
  again, and a wait that timed out looks the receipt up once more instead of calling a
  mined transaction failed; a transaction stuck in the mempool is replaced with higher
  fees (same nonce) half-way through the wait;
- on-chain failure is reported as out of gas (gas used = the limit) or with the revert
  reason replayed against the state before its block.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from eth_account.signers.local import LocalAccount
from eth_typing import ChecksumAddress
from web3.contract import Contract
from web3.exceptions import TransactionNotFound

from ledger.chain import RECEIPT_POLL_S, Chain, revert_reason
from ledger.reads import ChainGuard
from ledger.records import (
    RETRIES,
    LedgerError,
    LedgerOutOfGas,
    LedgerPending,
    LedgerRevert,
    fmt_eth,
    retry,
    rpc_message,
)

# Gas limits per call, with headroom over what bench/ledger.py measures; explicit, so a
# hot path never pays for eth_estimateGas. ``claim`` and ``settle`` are estimated.
GAS = {
    "register": 250_000,
    "change_peer_key": 200_000,
    "revoke_registration": 200_000,
    "add_stake": 80_000,
    "submit_work": 300_000,  # bench/ledger.py: 108 k (a worker's first), 91 k after
    "accept": 250_000,
    "reject": 250_000,
    "unbond": 120_000,
    "withdraw": 100_000,
    "propose_validator": 150_000,
    "remove_validator": 300_000,  # up to 64 list entries read
    "propose_params": 350_000,
    "apply_params": 350_000,
    "cancel_params": 60_000,
    "transfer_ownership": 80_000,
    "accept_ownership": 80_000,
    "set_policy_version": 80_000,
    "fund": 80_000,
}
CLAIM_CHUNK = 256  # the contract settles at most 256 submissions per call
GAS_HEADROOM = 1.25
GAS_EXTRA = 30_000
MAX_TX_GAS = 12_000_000  # a claim whose estimate exceeds this is split
FEE_BUMP = 1.25  # replacements need at least +10 % on both fees (geth, anvil)
FEES_TTL_S = 5.0  # the latest block's fees are read again after this long


@dataclass
class Prepared:
    """A signed transaction and what is needed to replace or explain it."""

    name: str
    tx: dict[str, Any]
    hashes: list[bytes]
    raw: bytes


def block_fees(chain: Chain) -> dict[str, int]:
    base = int(chain.w3.eth.get_block("latest").get("baseFeePerGas", 0) or 0)
    tip = 1_000_000_000
    return {"maxFeePerGas": 2 * base + tip, "maxPriorityFeePerGas": tip}


def _is_transport_error(exc: BaseException) -> bool:
    return isinstance(exc, ConnectionError | TimeoutError | OSError)


class Transactions:
    """One account's transactions to the contract: its nonce, the fees, its funds."""

    def __init__(
        self,
        chain: Chain,
        contract: Contract,
        account: LocalAccount | None,
        guard: ChainGuard,
        *,
        timeout: float = 60,
    ) -> None:
        self.chain = chain
        self.w3 = chain.w3
        self.contract = contract
        self.account = account
        self.guard = guard
        self.timeout = timeout
        self._nonce: int | None = None
        self._lock = threading.RLock()
        self._fees_at: tuple[float, dict[str, int]] | None = None  # (when read, fees)
        self._funds: int | None = None  # a lower bound of the balance (None: read it)

    @property
    def address(self) -> str:
        if self.account is None:
            raise LedgerError("no account configured: this operation needs a signing key")
        return str(self.account.address)

    @property
    def checksum(self) -> ChecksumAddress:
        """The account's address as web3 takes it."""
        return self.w3.to_checksum_address(self.address)

    def _next_nonce(self) -> int:
        if self._nonce is None:
            self._nonce = retry(lambda: self.w3.eth.get_transaction_count(self.checksum, "pending"))
        nonce = self._nonce
        self._nonce += 1
        return nonce

    def _current_fees(self) -> dict[str, int]:
        """``block_fees`` of the latest block, read again after ``FEES_TTL_S``: the max fee has
        twice the base fee of headroom, which a base fee rising 12.5 % a block needs six
        full blocks to use up (and a transaction stuck anyway is replaced, see ``wait``)."""
        now = time.monotonic()
        if self._fees_at is None or now - self._fees_at[0] > FEES_TTL_S:
            self._fees_at = (now, block_fees(self.chain))
        return dict(self._fees_at[1])

    def _check_funds(self, name: str, value: int, gas: int, max_fee: int) -> None:
        """Refuse to send what the balance cannot pay for. The balance is read when the
        lower bound kept since the last read (that balance, less the most that every
        transaction sent since may cost) does not cover ``value + gas * max_fee``; only
        what this client signs can lower it, so one read serves many transactions."""
        need = value + gas * max_fee
        if self._funds is not None and self._funds >= need:
            self._funds -= need
            return
        balance = int(retry(lambda: self.w3.eth.get_balance(self.checksum)))
        self._funds = balance - need
        if balance < need:
            self._funds = None
            what = f"{fmt_eth(value)} + gas" if value else "gas"
            raise LedgerError(
                f"account {self.address} has {fmt_eth(balance)}, but {name} needs up to "
                f"{fmt_eth(need)} ({what}): send it ETH first "
                f"(development chain: intellect-node chain fund {self.address} 10)"
            )

    def _simulate(self, name: str, fn: Any, value: int) -> None:
        try:
            # against the pending block: the one the transaction goes into (its timestamp,
            # not the last mined block's, decides deadlines)
            retry(
                lambda: fn.call({"from": self.address, "value": value}, block_identifier="pending")
            )
        except LedgerError:
            raise
        except Exception as exc:
            reason = revert_reason(exc)
            if reason is not None:
                raise LedgerRevert(name, reason) from exc
            # not a revert: the node refused the call itself
            raise LedgerError(f"{name} refused by the chain: {rpc_message(exc)}") from exc

    def estimate(self, name: str, *args: Any, value: int = 0) -> int:
        """Gas estimate (a revert raises ``LedgerRevert``)."""
        fn = getattr(self.contract.functions, name)(*args)
        try:
            return int(retry(lambda: fn.estimate_gas({"from": self.address, "value": value})))
        except LedgerError:
            raise
        except Exception as exc:
            reason = revert_reason(exc)
            if reason is not None:
                raise LedgerRevert(name, reason) from exc
            raise LedgerError(f"{name} refused by the chain: {rpc_message(exc)}") from exc

    def prepare(
        self,
        name: str,
        *args: Any,
        value: int = 0,
        gas: int | None = None,
        fees: dict[str, int] | None = None,
        simulated: bool = False,
    ) -> Prepared:
        """Check the chain and the balance, simulate, then sign with the next nonce (with
        ``fees`` given, the caller has checked the balance for them; ``simulated``: the
        caller's gas estimate ran the call just now, and a revert there raised already)."""
        if self.account is None:
            raise LedgerError(f"{name} needs a signing account")
        with self._lock:
            chain_id = self.guard.check()
            fn = getattr(self.contract.functions, name)(*args)
            limit = gas if gas is not None else GAS[name]
            if fees is None:
                fees = self._current_fees()
                self._check_funds(name, value, limit, fees["maxFeePerGas"])
            if not simulated:
                self._simulate(name, fn, value)
            tx = fn.build_transaction(
                fees
                | {
                    "from": self.address,
                    "value": value,
                    "nonce": self._next_nonce(),
                    "gas": limit,
                    "chainId": chain_id,
                }
            )
            signed = self.account.sign_transaction(tx)
            return Prepared(name, tx, [bytes(signed.hash)], bytes(signed.raw_transaction))

    def _known(self, tx_hash: bytes) -> bool:
        try:
            self.w3.eth.get_transaction(tx_hash)  # type: ignore[arg-type]
            return True
        except TransactionNotFound:
            return False

    def broadcast(self, p: Prepared) -> bytes:
        """Send a signed transaction once: a send that failed in transit is looked up by hash
        before it is sent again, so a retry never pays twice."""
        tx_hash = p.hashes[-1]
        for attempt in range(RETRIES):
            try:
                self.w3.eth.send_raw_transaction(p.raw)
                return tx_hash
            except Exception as exc:
                try:
                    if self._known(tx_hash):
                        return tx_hash  # it arrived; only the answer was lost
                except Exception as lookup:  # still unreachable
                    if not _is_transport_error(lookup) or attempt == RETRIES - 1:
                        raise LedgerError(f"{p.name}: chain unreachable: {lookup}") from exc
                    time.sleep(0.2 * 2**attempt)
                    continue
                if not _is_transport_error(exc):
                    with self._lock:
                        self._nonce = None  # unknown whether it was taken: ask the chain next
                        self._funds = None
                    raise LedgerError(f"{p.name} refused by the chain: {rpc_message(exc)}") from exc
                if attempt == RETRIES - 1:
                    raise LedgerError(f"{p.name}: chain unreachable: {exc}") from exc
                time.sleep(0.2 * 2**attempt)
                self.guard.recheck()
        raise AssertionError("unreachable")

    def _bump(self, p: Prepared) -> None:
        """Replace a stuck transaction: same nonce, fees raised by FEE_BUMP."""
        assert self.account is not None
        tx = dict(p.tx)
        tx["maxFeePerGas"] = int(tx["maxFeePerGas"] * FEE_BUMP) + 1
        tx["maxPriorityFeePerGas"] = int(tx["maxPriorityFeePerGas"] * FEE_BUMP) + 1
        signed = self.account.sign_transaction(tx)
        replacement = Prepared(
            p.name, tx, [*p.hashes, bytes(signed.hash)], bytes(signed.raw_transaction)
        )
        try:
            self.broadcast(replacement)
        except LedgerError:
            return  # the original was mined meanwhile, or the node refused: keep waiting
        p.tx, p.hashes, p.raw = replacement.tx, replacement.hashes, replacement.raw

    def _receipt(self, p: Prepared) -> Any:
        for h in reversed(p.hashes):
            try:
                receipt = self.w3.eth.get_transaction_receipt(h)  # type: ignore[arg-type]
            except TransactionNotFound:
                continue
            if receipt is not None:
                return receipt
        return None

    def wait(self, p: Prepared) -> Any:
        """Await the receipt of ``p`` (or of its replacement); raises on on-chain failure."""
        deadline = time.monotonic() + self.timeout
        bump_at = time.monotonic() + self.timeout / 2
        while True:
            try:
                receipt = self._receipt(p)
            except Exception as exc:
                if not _is_transport_error(exc):
                    raise
                receipt = None
            if receipt is not None:
                break
            now = time.monotonic()
            if now >= deadline:
                with self._lock:
                    self._nonce = None
                    self._funds = None
                raise LedgerPending(p.name, "0x" + p.hashes[-1].hex(), self.timeout)
            if bump_at and now >= bump_at:
                bump_at = 0
                self._bump(p)
            time.sleep(RECEIPT_POLL_S)
        if receipt.status != 1:
            self._explain_failure(p, receipt)
        return receipt

    def _explain_failure(self, p: Prepared, receipt: Any) -> None:
        if receipt.gasUsed >= p.tx["gas"]:
            raise LedgerOutOfGas(
                f"{p.name} ran out of gas on chain (used all {p.tx['gas']:,}) in block "
                f"{receipt.blockNumber}; nothing changed but the fee"
            )
        call = {k: p.tx[k] for k in ("from", "to", "value", "data")}
        reason = "state changed since the simulation"
        try:
            self.w3.eth.call(call, receipt.blockNumber - 1)  # type: ignore[arg-type]
        except Exception as exc:
            reason = revert_reason(exc) or reason
        raise LedgerRevert(p.name, f"reverted on chain in block {receipt.blockNumber}: {reason}")

    def transact(
        self,
        name: str,
        *args: Any,
        value: int = 0,
        gas: int | None = None,
        simulated: bool = False,
    ) -> Any:
        """Check, simulate, sign, send and await one contract call; returns the receipt."""
        return self.wait(self.send(name, *args, value=value, gas=gas, simulated=simulated))

    def send(
        self,
        name: str,
        *args: Any,
        value: int = 0,
        gas: int | None = None,
        fees: dict[str, int] | None = None,
        simulated: bool = False,
    ) -> Prepared:
        """Prepare and broadcast under one lock, so nonces reach the node in order."""
        with self._lock:
            p = self.prepare(name, *args, value=value, gas=gas, fees=fees, simulated=simulated)
            self.broadcast(p)
        return p

    def send_many(self, calls: list[tuple[str, tuple[Any, ...]]]) -> list[Any]:
        """Send several calls back to back (consecutive nonces, all in flight at once), then
        await every receipt. Each is simulated when it is sent; the fees and the balance for
        all of them are checked once."""
        if not calls:
            return []
        fees = block_fees(self.chain)
        gas = sum(GAS[name] for name, _ in calls)
        self._check_funds(f"{len(calls)} x {calls[0][0]}", 0, gas, fees["maxFeePerGas"])
        sent = [self.send(name, *args, fees=fees) for name, args in calls]
        return [self.wait(p) for p in sent]
