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
  ``FEES_TTL_S``; one the chain refuses because the base fee has since risen past its max
  fee (a spike inside ``FEES_TTL_S``) is signed again once with the fees read at once;
- is signed locally with an explicit gas limit (``claim``'s is estimated, with headroom)
  and a nonce from the account's journal (``ledger/nonces.py``: one place per account,
  shared with every process on the same data directory, kept across restarts), and sent
  raw; the journal keeps it until it is confirmed;
- is idempotent: a send that failed in transit is looked up by its hash before it is sent
  again, and a wait that timed out looks the receipt up once more instead of calling a
  mined transaction failed;
- is followed until it is ``confirmations`` blocks deep in the canonical chain: one that a
  mempool dropped or a reorg removed is sent again (the same signed bytes); one not mined
  within ``replace_after`` seconds is replaced (same nonce) with the fees the latest block
  asks, at least ``REPLACE_BUMP`` over the last, never above ``max_fee`` (the operator's
  cap: above it, it waits); a replaced one counts as done only by the receipt of whichever
  of its versions the chain mined;
- on-chain failure is reported as out of gas (gas used = the limit) or with the revert
  reason replayed against the state before its block.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Any

from eth_account.signers.local import LocalAccount
from eth_typing import ChecksumAddress
from web3.contract import Contract
from web3.exceptions import TransactionNotFound

from ledger.chain import RECEIPT_POLL_S, Chain, revert_reason
from ledger.nonces import NonceJournal
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
    "remove_validator": 150_000,
    "propose_params": 350_000,
    "apply_params": 1_200_000,  # 64 validators counted again: 562 k, more as counts change
    "count_validator": 80_000,
    "cancel_params": 60_000,
    "transfer_ownership": 80_000,
    "accept_ownership": 80_000,
    "set_policy_version": 80_000,
    "fund": 80_000,
}
CLAIM_CHUNK = 256  # the contract settles at most 256 submissions per call
RECOUNT_CHUNK = 512  # validators a recount_validators counts again (fewer if over MAX_TX_GAS)
GAS_HEADROOM = 1.25
GAS_EXTRA = 30_000
MAX_TX_GAS = 12_000_000  # a claim whose estimate exceeds this is split
REPLACE_BUMP = 1.125  # replacements need at least +10 % on both fees (geth, anvil)
FEES_TTL_S = 5.0  # the latest block's fees are read again after this long
DROPPED_CHECK_S = 2.0  # how often a waiting transaction not mined is looked up in the mempool
POLL_MAX_S = 0.25  # the receipt poll starts at RECEIPT_POLL_S and grows to this
DEFAULT_TIP = 1_000_000_000  # wei per gas, where the chain suggests no tip


# how a node says a transaction's fees are under what it takes now (geth, anvil, reth,
# Erigon): the base fee rose past the max fee the client read a moment before
FEES_TOO_LOW = re.compile(
    r"max fee per gas less than block base fee|fee cap less than block base fee|underpriced",
    re.IGNORECASE,
)


class FeesTooLow(LedgerError):
    """The chain refused a transaction whose max fee is under the current base fee."""


class NonceTaken(LedgerError):
    """The chain refused a transaction whose nonce another signer of the account used."""

    def __init__(self, call: str, nonce: int, count: int) -> None:
        super().__init__(f"{call}: nonce {nonce} was used already (the chain has {count})")


@dataclass
class Prepared:
    """A signed transaction and what is needed to replace or explain it."""

    name: str
    tx: dict[str, Any]
    hashes: list[bytes]
    raw: bytes

    @property
    def nonce(self) -> int:
        return int(self.tx["nonce"])


def block_fees(chain: Chain) -> dict[str, int]:
    """Twice the latest block's base fee plus the tip the chain suggests
    (``eth_maxPriorityFeePerGas``: on an OP-stack L2 a thousandth of a gwei, where a fixed
    1 gwei tip was 500 times the base fee); DEFAULT_TIP on a chain that suggests none."""
    base = int(chain.w3.eth.get_block("latest").get("baseFeePerGas", 0) or 0)
    try:
        tip = int(chain.w3.eth.max_priority_fee)
    except Exception as exc:  # the method is not served: its refusal, whatever its class
        if _is_transport_error(exc):
            raise
        tip = DEFAULT_TIP
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
        journal: NonceJournal | None = None,
        confirmations: int = 0,
        replace_after: float | None = None,
        max_fee: int | None = None,
    ) -> None:
        self.chain = chain
        self.w3 = chain.w3
        self.contract = contract
        self.account = account
        self.guard = guard
        self.timeout = timeout
        self.journal = journal or NonceJournal(None)
        self.confirmations = confirmations
        self.replace_after = replace_after if replace_after is not None else timeout / 2
        self.max_fee = max_fee  # wei per gas; None: no cap
        self._lock = threading.RLock()
        self._fees_at: tuple[float, dict[str, int]] | None = None  # (when read, fees)
        self._funds: int | None = None  # a lower bound of the balance (None: read it)
        self._recovered = False  # the journal's unfinished transactions sent again
        self._waiting: set[int] = set()  # nonces a thread of this process follows
        self.counts: dict[str, int] = dict.fromkeys(
            ("sent", "confirmed", "replaced", "resent", "reorged", "fee_capped", "pending"), 0
        )

    @property
    def address(self) -> str:
        if self.account is None:
            raise LedgerError("no account configured: this operation needs a signing key")
        return str(self.account.address)

    @property
    def checksum(self) -> ChecksumAddress:
        """The account's address as web3 takes it."""
        return self.w3.to_checksum_address(self.address)

    def _chain_count(self, block: str = "pending") -> int:
        return int(retry(lambda: self.w3.eth.get_transaction_count(self.checksum, block)))  # type: ignore[arg-type]

    def _next_nonce(self) -> int:
        if not self._recovered:  # first use, or a wait timed out since
            self._recovered = True
            self.recover()
        return self.journal.reserve(self._chain_count)

    def recover(self) -> int:
        """Send again what the journal holds as sent and not confirmed, and not followed
        by a thread here (a process that died before its receipt, a wait that timed out);
        forget what the chain has mined since. Returns how many were sent again."""
        if self.account is None:
            return 0
        # another signer of the account (a wallet, a process before the journal) may have
        # used nonces the journal has not handed out: never hand those out again
        self.journal.forget_next(self._chain_count("pending"))
        mined = self._chain_count("latest")
        resent = 0
        for nonce, _name, hashes, raw in self.journal.unfinished():
            if nonce < mined:
                self.journal.done(nonce)  # one of its versions was mined (or another took it)
            elif nonce not in self._waiting:
                self._send_raw(raw, hashes[-1])
                resent += 1
        self.counts["resent"] += resent
        return resent

    def _current_fees(self) -> dict[str, int]:
        """``block_fees`` of the latest block, read again after ``FEES_TTL_S``: the max fee has
        twice the base fee of headroom, which a base fee rising 12.5 % a block needs six
        full blocks to use up (and a transaction stuck anyway is replaced, see ``wait``)."""
        now = time.monotonic()
        if self._fees_at is None or now - self._fees_at[0] > FEES_TTL_S:
            self._fees_at = (now, block_fees(self.chain))
        return dict(self._fees_at[1])

    def _capped(self, fees: dict[str, int]) -> dict[str, int]:
        """Fees never above the operator's cap (a base fee above it: the transaction waits)."""
        if self.max_fee is None or fees["maxFeePerGas"] <= self.max_fee:
            return fees
        tip = min(fees["maxPriorityFeePerGas"], self.max_fee)
        return {"maxFeePerGas": self.max_fee, "maxPriorityFeePerGas": tip}

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
                fees = self._capped(self._current_fees())
                self._check_funds(name, value, limit, fees["maxFeePerGas"])
            if not simulated:
                self._simulate(name, fn, value)
            nonce = self._next_nonce()
            try:
                tx = fn.build_transaction(
                    fees
                    | {
                        "from": self.address,
                        "value": value,
                        "nonce": nonce,
                        "gas": limit,
                        "chainId": chain_id,
                    }
                )
                signed = self.account.sign_transaction(tx)
            except BaseException:
                self.journal.release(nonce)  # never sent: no gap
                raise
            return Prepared(name, tx, [bytes(signed.hash)], bytes(signed.raw_transaction))

    def _known(self, tx_hash: bytes) -> bool:
        try:
            self.w3.eth.get_transaction(tx_hash)  # type: ignore[arg-type]
            return True
        except TransactionNotFound:
            return False

    def broadcast(self, p: Prepared) -> bytes:
        """Send a signed transaction once: a send that failed in transit is looked up by hash
        before it is sent again, so a retry never pays twice. The journal keeps it from the
        moment it may have reached the chain."""
        tx_hash = p.hashes[-1]
        self.journal.sent(p.nonce, p.name, p.hashes, p.raw)
        for attempt in range(RETRIES):
            try:
                self.w3.eth.send_raw_transaction(p.raw)
                self.counts["sent"] += 1
                return tx_hash
            except Exception as exc:
                try:
                    if self._known(tx_hash):
                        self.counts["sent"] += 1
                        return tx_hash  # it arrived; only the answer was lost
                except Exception as lookup:  # still unreachable
                    if not _is_transport_error(lookup) or attempt == RETRIES - 1:
                        raise LedgerError(f"{p.name}: chain unreachable: {lookup}") from exc
                    time.sleep(0.2 * 2**attempt)
                    continue
                if not _is_transport_error(exc):
                    self._refused(p)  # raises NonceTaken when the chain has used its nonce
                    said = rpc_message(exc)
                    kind = FeesTooLow if FEES_TOO_LOW.search(said) else LedgerError
                    raise kind(f"{p.name} refused by the chain: {said}") from exc
                if attempt == RETRIES - 1:
                    raise LedgerError(f"{p.name}: chain unreachable: {exc}") from exc
                time.sleep(0.2 * 2**attempt)
                self.guard.recheck()
        raise AssertionError("unreachable")

    def _refused(self, p: Prepared) -> None:
        """The chain refused ``p`` itself: its nonce is handed out again, unless the chain
        has seen that nonce already (then the journal continues from the chain's count)."""
        self.journal.done(p.nonce)
        with self._lock:
            self._funds = None
        try:
            count = self._chain_count()
        except LedgerError:
            count = None
        if count is not None and count > p.nonce:
            self.journal.forget_next(count)
            raise NonceTaken(p.name, p.nonce, count)
        self.journal.release(p.nonce)

    def _send_raw(self, raw: bytes, tx_hash: bytes) -> bool:
        """Send signed bytes again (a dropped or reorged transaction); whether the chain
        has them now. Refusals are not errors here: the receipt decides."""
        try:
            self.w3.eth.send_raw_transaction(raw)
            return True
        except Exception:
            try:
                return self._known(tx_hash)
            except Exception:
                return False

    def _replace(self, p: Prepared) -> bool:
        """Replace a transaction not mined in time: same nonce, the latest block's fees,
        at least REPLACE_BUMP over the last, capped at ``max_fee`` (at the cap: not
        replaced, it waits). Whether a replacement was sent."""
        assert self.account is not None
        try:
            now = block_fees(self.chain)
        except Exception:
            return False
        tx = dict(p.tx)
        old_max, old_tip = int(tx["maxFeePerGas"]), int(tx["maxPriorityFeePerGas"])
        tip = max(int(old_tip * REPLACE_BUMP) + 1, now["maxPriorityFeePerGas"])
        max_fee = max(int(old_max * REPLACE_BUMP) + 1, now["maxFeePerGas"], tip)
        if self.max_fee is not None and max_fee > self.max_fee:
            if self.max_fee < int(old_max * REPLACE_BUMP) + 1:
                self.counts["fee_capped"] += 1
                return False  # a replacement at the cap would be refused as underpriced
            max_fee = self.max_fee
            tip = min(tip, max_fee)
        tx["maxFeePerGas"], tx["maxPriorityFeePerGas"] = max_fee, tip
        signed = self.account.sign_transaction(tx)
        replacement = Prepared(
            p.name, tx, [*p.hashes, bytes(signed.hash)], bytes(signed.raw_transaction)
        )
        self.journal.sent(p.nonce, p.name, replacement.hashes, replacement.raw)
        if not self._send_raw(replacement.raw, replacement.hashes[-1]):
            self.journal.sent(p.nonce, p.name, p.hashes, p.raw)
            return False  # the original was mined meanwhile, or the node refused: keep waiting
        p.tx, p.hashes, p.raw = replacement.tx, replacement.hashes, replacement.raw
        self.counts["replaced"] += 1
        return True

    def _receipt(self, p: Prepared) -> Any:
        for h in reversed(p.hashes):
            try:
                receipt = self.w3.eth.get_transaction_receipt(h)  # type: ignore[arg-type]
            except TransactionNotFound:
                continue
            if receipt is not None:
                return receipt
        return None

    def _in_pool(self, p: Prepared) -> bool:
        return any(self._known(h) for h in reversed(p.hashes))

    def _confirmed(self, receipt: Any) -> bool | None:
        """True: ``confirmations`` deep in the canonical chain; False: not deep enough yet;
        None: its block is no longer canonical (a reorg)."""
        head = int(self.w3.eth.block_number)
        if head - int(receipt.blockNumber) < self.confirmations:
            return False
        if self.confirmations == 0:
            return True
        block = self.w3.eth.get_block(receipt.blockNumber)
        return True if bytes(block["hash"]) == bytes(receipt.blockHash) else None

    def wait(self, p: Prepared) -> Any:
        """Await ``p`` (or a replacement) ``confirmations`` deep; raises on on-chain
        failure, and ``LedgerPending`` when it is not confirmed within the timeout (it stays
        in the journal: it is sent again before this account's next transaction)."""
        start = time.monotonic()
        deadline, replace_at = start + self.timeout, start + self.replace_after
        check_at = start + DROPPED_CHECK_S
        poll = RECEIPT_POLL_S
        seen = False  # a receipt was read (its disappearing is a reorg)
        self._waiting.add(p.nonce)
        try:
            while True:
                receipt, read = None, False
                try:
                    receipt = self._receipt(p)
                    read = True  # (a read that failed in transit says nothing of a reorg)
                    state = self._confirmed(receipt) if receipt is not None else False
                except Exception as exc:
                    if not _is_transport_error(exc):
                        raise
                    state = False
                if state:
                    break
                now = time.monotonic()
                if receipt is not None:
                    seen = True
                if state is None or (seen and read and receipt is None):
                    # mined in a block a reorg removed: sent again (a chain that put it back
                    # in its mempool answers that it has it)
                    seen = False
                    self.counts["reorged"] += 1
                    self._send_raw(p.raw, p.hashes[-1])
                    replace_at = now + self.replace_after
                elif receipt is None and now >= replace_at:
                    self._replace(p)
                    replace_at = now + self.replace_after
                elif receipt is None and now >= check_at:
                    check_at = now + DROPPED_CHECK_S
                    try:
                        if not self._in_pool(p):  # dropped, or removed by a reorg
                            self.counts["resent"] += 1
                            self._send_raw(p.raw, p.hashes[-1])
                    except Exception as exc:
                        if not _is_transport_error(exc):
                            raise
                if now >= deadline:
                    with self._lock:
                        self._funds = None
                    self.counts["pending"] += 1
                    self._recovered = False  # sent again before this account's next one
                    raise LedgerPending(p.name, "0x" + p.hashes[-1].hex(), self.timeout)
                time.sleep(poll)
                poll = min(POLL_MAX_S, poll * 1.5)
        finally:
            self._waiting.discard(p.nonce)
        self.journal.done(p.nonce)
        self.counts["confirmed"] += 1
        assert receipt is not None  # confirmed
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
            try:
                self.broadcast(p)
            except NonceTaken:  # another signer took it: once more, with the chain's next
                p = self.prepare(name, *args, value=value, gas=gas, fees=fees, simulated=True)
                self.broadcast(p)
            except FeesTooLow:  # the base fee jumped past the fees read: once more, read now
                self._fees_at = None
                p = self.prepare(name, *args, value=value, gas=gas, simulated=True)
                self.broadcast(p)
        return p

    def send_many(self, calls: list[tuple[str, tuple[Any, ...]]]) -> list[Any]:
        """Send several calls back to back (consecutive nonces, all in flight at once), then
        await every receipt. Each is simulated when it is sent; the fees and the balance for
        all of them are checked once."""
        if not calls:
            return []
        fees = self._capped(block_fees(self.chain))
        gas = sum(GAS[name] for name, _ in calls)
        self._check_funds(f"{len(calls)} x {calls[0][0]}", 0, gas, fees["maxFeePerGas"])
        sent = [self.send(name, *args, fees=fees) for name, args in calls]
        return [self.wait(p) for p in sent]
