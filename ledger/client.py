"""Typed client for the WorkLedger contract: local signing, raw transactions, clear errors.

Where the rollout comes from and goes: a validator's verdict on a batch (``crypto/verdict.py``)
becomes ``accept``/``reject`` here; the worker's ``submit_work`` and ``claim`` go the same way.

Every transaction:
- is sent only after the chain id was checked (against the configured one, or the one the
  client first saw: a different chain behind the same URL is refused) and signed with it;
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
from collections.abc import Callable
from dataclasses import dataclass, fields
from decimal import Decimal
from typing import Any, TypeVar

from eth_account.signers.local import LocalAccount
from requests.exceptions import Timeout
from web3.contract import Contract
from web3.exceptions import BadFunctionCallOutput, TransactionNotFound

from ledger.build import load_artifact
from ledger.chain import RECEIPT_POLL_S, Chain, revert_reason
from ledger.codes import REASONS, STATUS
from ledger.registration import registration_message, verify_registration

T = TypeVar("T")
RETRIES = 3
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
    "propose_validator": 80_000,
    "remove_validator": 60_000,
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
WEI = 10**18


class LedgerError(RuntimeError):
    """A ledger operation that could not be done, with a message for the user."""


class LedgerUnreachable(LedgerError):
    """The chain did not answer (down, restarting): nothing was refused; try again later."""


class LedgerRevert(LedgerError):
    """The contract refused: ``reason`` is its revert reason."""

    def __init__(self, call: str, reason: str) -> None:
        super().__init__(f"{call} reverted: {reason}")
        self.call = call
        self.reason = reason


class LedgerOutOfGas(LedgerError):
    """A transaction used all the gas it was given."""


class LedgerPending(LedgerError):
    """Sent, but not mined within the timeout: it may still be; do not send it again."""

    def __init__(self, call: str, tx_hash: str, timeout: float) -> None:
        super().__init__(
            f"{call}: transaction {tx_hash} not mined within {timeout:.0f} s; it may still be "
            "mined, so do not send it again (check its hash, or the state, first)"
        )
        self.tx_hash = tx_hash


@dataclass(frozen=True)
class Params:
    """The run parameters (SPEC.md section 12); the contract bounds each one."""

    min_stake: int
    reward_per_unit: int
    max_units: int
    collateral_bps: int
    validator_share_bps: int
    verdict_window: int
    fetch_deadline: int
    reward_lock: int
    unbonding_delay: int
    max_staleness: int
    quorum: int

    def as_tuple(self) -> tuple[int, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))


@dataclass(frozen=True)
class WorkerInfo:
    peer_key: bytes
    stake: int  # bonded, including ``locked``
    locked: int  # collateral of unsettled work and bonds of standing rejects
    unbonding: int
    unbond_at: int
    accepted: int
    rejected: int
    slashed: int

    @property
    def registered(self) -> bool:
        return self.peer_key != bytes(32)

    @property
    def free(self) -> int:
        return self.stake - self.locked


@dataclass(frozen=True)
class SubmissionInfo:
    index: int
    units: int
    policy_version: int
    submitted_at: int
    fetch_after: int
    verdict_until: int
    unlock_at: int
    reward: int
    collateral: int
    validator_share_bps: int
    quorum: int
    status: str  # none, pending, accepted, rejected
    final: bool
    settled: bool
    reason: int
    rejecter: str
    accept_votes: int
    reject_votes: int


@dataclass
class Prepared:
    """A signed transaction and what is needed to replace or explain it."""

    name: str
    tx: dict[str, Any]
    hashes: list[bytes]
    raw: bytes


def _rpc_message(exc: Exception) -> str:
    """The message a JSON-RPC node gave, without web3's wrapping."""
    response = getattr(exc, "rpc_response", None)
    if isinstance(response, dict) and isinstance(response.get("error"), dict):
        return str(response["error"].get("message", exc))
    return str(getattr(exc, "message", None) or exc)


def _retry(fn: Callable[[], T]) -> T:
    """``fn`` again after a connection that failed (refused, reset: a node restarting), at
    most ``RETRIES`` times; not after one that timed out (a node that accepts and does not
    answer would hold the caller three times as long)."""
    delay = 0.2
    for attempt in range(RETRIES):
        try:
            return fn()
        except (ConnectionError, TimeoutError, OSError) as exc:
            if isinstance(exc, Timeout | TimeoutError):
                raise LedgerUnreachable(f"the chain did not answer in time: {exc}") from exc
            if attempt == RETRIES - 1:
                raise LedgerUnreachable(f"chain unreachable after {RETRIES} tries: {exc}") from exc
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


def fmt_eth(wei: int) -> str:
    return f"{Decimal(wei) / WEI:f} ETH"


def deploy(
    chain: Chain,
    account: LocalAccount,
    params: Params,
    validators: list[str] | tuple[str, ...] = (),
    *,
    timeout: float = 60,
) -> tuple[str, int]:
    """Deploy the contract from ``account`` with ``validators`` active at once; returns
    (address, block number)."""
    art = load_artifact()
    factory = chain.w3.eth.contract(abi=art["abi"], bytecode=art["bytecode"])
    tx = factory.constructor(
        params.as_tuple(), [chain.w3.to_checksum_address(v) for v in validators]
    ).build_transaction(
        _fees(chain)
        | {
            "from": account.address,
            "nonce": chain.w3.eth.get_transaction_count(account.address),
            "gas": 6_000_000,
            "chainId": chain.chain_id,
        }
    )
    try:  # simulated first, so that a refused deployment says why
        chain.w3.eth.call({"from": account.address, "data": tx["data"]})
    except Exception as exc:
        reason = revert_reason(exc)
        if reason is not None:
            raise LedgerRevert("deploy", reason) from exc
        raise
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


def _is_transport_error(exc: BaseException) -> bool:
    return isinstance(exc, ConnectionError | TimeoutError | OSError)


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
        self._chain_id: int | None = None  # checked and pinned on the first transaction
        self._lock = threading.RLock()
        self._fees_at: tuple[float, dict[str, int]] | None = None  # (when read, fees)
        self._funds: int | None = None  # a lower bound of the balance (None: read it)

    @property
    def address(self) -> str:
        if self.account is None:
            raise LedgerError("no account configured: this operation needs a signing key")
        return str(self.account.address)

    # ---- views ------------------------------------------------------------------------

    def _view(self, name: str, *args: Any) -> Any:
        try:
            return _retry(lambda: getattr(self.contract.functions, name)(*args).call())
        except BadFunctionCallOutput:  # empty output: most likely no code there
            self.require_contract()
            raise

    def require_contract(self) -> None:
        """Raise ``LedgerError`` naming the address if no contract is deployed there (a
        reader of events alone would find none and report an empty history)."""
        if not _retry(lambda: self.w3.eth.get_code(self.contract.address)):
            raise LedgerError(
                f"no contract at {self.contract.address} on {self.chain.url}: check the"
                " contract address (--contract, or contract in the config)"
            )

    def _addr(self, account: str) -> str:
        return str(self.w3.to_checksum_address(account))

    def params(self) -> Params:
        return Params(*self._view("params"))

    def proposed_params(self) -> tuple[Params, int]:
        """The proposed parameters and when they may be applied (0: no proposal)."""
        return Params(*self._view("proposed_params")), int(self._view("params_eta"))

    def worker(self, account: str) -> WorkerInfo:
        r = self._view("workers", self._addr(account))
        return WorkerInfo(bytes(r[0]), *r[1:])

    def registration(self, account: str) -> tuple[bytes, bytes]:
        """(peer key, stored signature) of an account."""
        return self.worker(account).peer_key, bytes(self._view("signatures", self._addr(account)))

    def registration_valid(self, account: str) -> bool:
        """Whether the account's stored registration signature is valid (checked off-chain:
        the EVM cannot verify Ed25519)."""
        return self.registration_status(account)[1]

    def registration_status(self, account: str) -> tuple[bytes, bool]:
        """(peer key, whether its stored signature is valid for this chain and account)."""
        peer_key, signature = self.registration(account)
        return peer_key, verify_registration(peer_key, signature, self._check_chain(), account)

    def submission(self, worker: str, key: bytes) -> SubmissionInfo:
        r = list(self._view("submission", self._addr(worker), key))
        r[11] = STATUS[r[11]]
        r[15] = str(r[15])
        return SubmissionInfo(*r)

    def head(self) -> int:
        """The chain's newest block number."""
        return int(_retry(lambda: self.w3.eth.block_number))

    def chain_time(self) -> int:
        """The timestamp of the chain's newest block (the contract's clock)."""
        return int(_retry(lambda: self.w3.eth.get_block("latest")["timestamp"]))

    def claimable(self, account: str) -> int:
        return int(self._view("claimable", self._addr(account)))

    def pending(self, account: str) -> int:
        return int(self._view("pending", self._addr(account)))

    def matured(self, account: str) -> int:
        return int(self._view("matured", self._addr(account)))

    def is_validator(self, account: str) -> bool:
        return bool(self._view("is_validator", self._addr(account)))

    def validator_bond(self) -> int:
        """The stake a validator needs to vote: max(min_stake, the largest collateral)."""
        return int(self._view("validator_bond"))

    def validator_until(self, account: str) -> int:
        """When a validator was removed (it votes only on work submitted up to then); 0: not."""
        return int(self._view("validator_until", self._addr(account)))

    def reward_pool(self) -> int:
        return int(self._view("reward_pool"))

    def total_burned(self) -> int:
        return int(self._view("total_burned"))

    def policy_version(self) -> int:
        return int(self._view("policy_version"))

    def owner(self) -> str:
        return str(self._view("owner"))

    def events(self, name: str, receipt: Any) -> list[Any]:
        """The contract's ``name`` events in a receipt (other logs skipped)."""
        from web3.logs import DISCARD

        return list(getattr(self.contract.events, name)().process_receipt(receipt, errors=DISCARD))

    # ---- sending ----------------------------------------------------------------------

    def _check_chain(self) -> int:
        if self._chain_id is None:
            chain_id = _retry(lambda: self.chain.chain_id)
            expected = self.expected_chain_id
            if expected is not None and chain_id != expected:
                raise LedgerError(f"connected to chain {chain_id}, but the config says {expected}")
            self._chain_id = chain_id
        return self._chain_id

    def _recheck_chain(self) -> None:
        """After a transport error: the node behind the URL may have changed."""
        pinned, self._chain_id = self._chain_id, None
        now = self._check_chain()
        if pinned is not None and now != pinned:
            raise LedgerError(f"the chain changed from {pinned} to {now}: refusing to sign")

    def _next_nonce(self) -> int:
        if self._nonce is None:
            self._nonce = _retry(lambda: self.w3.eth.get_transaction_count(self.address, "pending"))
        nonce = self._nonce
        self._nonce += 1
        return nonce

    def _current_fees(self) -> dict[str, int]:
        """``_fees`` of the latest block, read again after ``FEES_TTL_S``: the max fee has
        twice the base fee of headroom, which a base fee rising 12.5 % a block needs six
        full blocks to use up (and a transaction stuck anyway is replaced, see ``wait``)."""
        now = time.monotonic()
        if self._fees_at is None or now - self._fees_at[0] > FEES_TTL_S:
            self._fees_at = (now, _fees(self.chain))
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
        balance = int(_retry(lambda: self.w3.eth.get_balance(self.address)))
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
            _retry(
                lambda: fn.call({"from": self.address, "value": value}, block_identifier="pending")
            )
        except LedgerError:
            raise
        except Exception as exc:
            reason = revert_reason(exc)
            if reason is not None:
                raise LedgerRevert(name, reason) from exc
            # not a revert: the node refused the call itself
            raise LedgerError(f"{name} refused by the chain: {_rpc_message(exc)}") from exc

    def estimate(self, name: str, *args: Any, value: int = 0) -> int:
        """Gas estimate (a revert raises ``LedgerRevert``)."""
        fn = getattr(self.contract.functions, name)(*args)
        try:
            return int(_retry(lambda: fn.estimate_gas({"from": self.address, "value": value})))
        except LedgerError:
            raise
        except Exception as exc:
            reason = revert_reason(exc)
            if reason is not None:
                raise LedgerRevert(name, reason) from exc
            raise LedgerError(f"{name} refused by the chain: {_rpc_message(exc)}") from exc

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
            chain_id = self._check_chain()
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
                    raise LedgerError(
                        f"{p.name} refused by the chain: {_rpc_message(exc)}"
                    ) from exc
                if attempt == RETRIES - 1:
                    raise LedgerError(f"{p.name}: chain unreachable: {exc}") from exc
                time.sleep(0.2 * 2**attempt)
                self._recheck_chain()
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

    def _transact(
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
        fees = _fees(self.chain)
        gas = sum(GAS[name] for name, _ in calls)
        self._check_funds(f"{len(calls)} x {calls[0][0]}", 0, gas, fees["maxFeePerGas"])
        sent = [self.send(name, *args, fees=fees) for name, args in calls]
        return [self.wait(p) for p in sent]

    # ---- calls ------------------------------------------------------------------------

    def sign_registration(self, identity: Any) -> bytes:
        """The Ed25519 signature ``register`` stores, by a ``crypto.identity.Identity``."""
        return bytes(identity.sign(registration_message(self._check_chain(), self.address)))

    def register(self, peer_key: bytes, signature: bytes, stake: int) -> Any:
        if len(peer_key) != 32:
            raise LedgerError("peer key must be the 32-byte Ed25519 public key")
        if len(signature) != 64:
            raise LedgerError("the registration signature must be 64 bytes")
        return self._transact("register", peer_key, signature, value=stake)

    def register_identity(self, identity: Any, stake: int) -> Any:
        return self.register(identity.public_bytes, self.sign_registration(identity), stake)

    def change_peer_key(self, identity: Any) -> Any:
        return self._transact(
            "change_peer_key", identity.public_bytes, self.sign_registration(identity)
        )

    def change_peer_key_signed(self, peer_key: bytes, signature: bytes) -> Any:
        """Rotate to ``peer_key`` with a signature made elsewhere (what the contract stores)."""
        return self._transact("change_peer_key", peer_key, signature)

    def revoke_registration(self, worker: str) -> Any:
        return self._transact("revoke_registration", self._addr(worker))

    def add_stake(self, amount: int) -> Any:
        return self._transact("add_stake", value=amount)

    def submit_work(self, key: bytes, units: int, policy_version: int) -> Any:
        return self._transact("submit_work", key, units, policy_version)

    def submit_work_many(self, items: list[tuple[bytes, int, int]]) -> list[Any]:
        return self.send_many([("submit_work", item) for item in items])

    def accept(self, worker: str, key: bytes) -> Any:
        return self._transact("accept", self._addr(worker), key)

    def reject(self, worker: str, key: bytes, reason: str = "invalid") -> Any:
        return self._transact("reject", self._addr(worker), key, REASONS[reason])

    def _gas_for(self, name: str, *args: Any) -> int:
        return int(self.estimate(name, *args) * GAS_HEADROOM) + GAS_EXTRA

    def settle(self, worker: str, max_entries: int = CLAIM_CHUNK) -> Any:
        max_entries = min(max_entries, self.matured(worker))  # as in ``claim``
        args = (self._addr(worker), max_entries)
        # the estimate simulated it (on the latest block: later, more entries have matured,
        # and ``max_entries`` is capped at what has matured now, so nothing new can revert)
        gas = self._gas_for("settle", *args)
        return self._transact("settle", *args, gas=gas, simulated=True)

    def claim(self, max_entries: int = CLAIM_CHUNK) -> Any:
        """One ``claim`` of up to ``max_entries`` matured submissions, its gas estimated with
        headroom (fewer entries when the estimate is above MAX_TX_GAS). It asks for no more
        entries than have matured now, so entries maturing before it is mined cannot make it
        settle more than its gas was estimated for."""
        max_entries = min(max_entries, self.matured(self.address))
        gas = self._gas_for("claim", max_entries)
        while gas > MAX_TX_GAS and max_entries > 1:
            max_entries //= 2
            gas = self._gas_for("claim", max_entries)
        return self._transact("claim", max_entries, gas=gas, simulated=True)  # by the estimate

    def claim_all(self, progress: Callable[[int, int], None] | None = None) -> list[Any]:
        """Claim until nothing matured is left (one transaction per 256 submissions);
        ``progress(settled, total)`` after each transaction. ``matured`` counts at most
        4096 ahead, so on a longer backlog ``total`` grows as the claims go."""
        before = self.matured(self.address)
        settled, receipts = 0, []
        while True:
            receipts.append(self.claim())
            after = self.matured(self.address)
            settled += max(before - after, 0)
            if progress is not None:
                progress(settled, settled + after)
            if after == 0:
                return receipts
            before = after

    def unbond(self, amount: int) -> Any:
        return self._transact("unbond", amount)

    def withdraw(self) -> Any:
        return self._transact("withdraw")

    def propose_validator(self, validator: str) -> Any:
        return self._transact("propose_validator", self._addr(validator))

    def remove_validator(self, validator: str) -> Any:
        return self._transact("remove_validator", self._addr(validator))

    def propose_params(self, p: Params) -> Any:
        return self._transact("propose_params", p.as_tuple())

    def apply_params(self) -> Any:
        return self._transact("apply_params")

    def cancel_params(self) -> Any:
        return self._transact("cancel_params")

    def transfer_ownership(self, new_owner: str) -> Any:
        return self._transact("transfer_ownership", self._addr(new_owner))

    def accept_ownership(self) -> Any:
        return self._transact("accept_ownership")

    def set_policy_version(self, version: int) -> Any:
        return self._transact("set_policy_version", version)

    def fund(self, amount: int) -> Any:
        return self._transact("fund", value=amount)
