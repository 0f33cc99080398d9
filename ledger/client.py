"""Typed client for the WorkLedger contract: local signing, raw transactions, clear errors.

Where the rollout comes from and goes: a validator's verdict on a batch (``crypto/verdict.py``)
becomes ``accept``/``reject`` here; the worker's ``submit_work`` and ``claim`` go the same way.

``LedgerClient`` is one name for three parts, each a class of its own:
- ``reads`` (``ledger/reads.py``): the contract's views and the chain's head and clock,
  and ``ChainGuard``, the chain id the client is pinned to;
- ``tx`` (``ledger/transactions.py``): the account's transactions, signed locally with its
  own nonce, fees and funds checked, sent raw and awaited (what every transaction does is
  said there);
- ``log`` (``ledger/events.py``): the contract's events, in a receipt or a span of blocks.
The contract's write calls (``register``, ``submit_work``, ``accept``, ``claim``, ...) are
the client's own methods, over ``tx``; its reads are ``reads``'s, passed through.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from eth_account.signers.local import LocalAccount
from web3.contract import Contract
from web3.types import EventData, TxReceipt

from ledger.build import load_artifact
from ledger.chain import RECEIPT_POLL_S, Chain, revert_reason
from ledger.codes import REASONS
from ledger.events import LedgerEvents
from ledger.nonces import NonceJournal
from ledger.reads import ChainGuard, LedgerReads
from ledger.records import (
    LedgerError,
    LedgerOutOfGas,
    LedgerPending,
    LedgerRevert,
    LedgerUnreachable,
    Params,
    SubmissionInfo,
    WorkerInfo,
    fmt_eth,
)
from ledger.records import retry as _retry  # tests/test_ledger*.py call it from here
from ledger.registration import registration_message
from ledger.transactions import (
    CLAIM_CHUNK,
    GAS_EXTRA,
    GAS_HEADROOM,
    MAX_TX_GAS,
    RECOUNT_CHUNK,
    Prepared,
    Transactions,
    block_fees,
)
from ledger.vouchers import sign_voucher

# what callers import from here, as before the client was split into its parts
__all__ = [
    "LedgerClient",
    "LedgerError",
    "LedgerOutOfGas",
    "LedgerPending",
    "LedgerRevert",
    "LedgerUnreachable",
    "Params",
    "SubmissionInfo",
    "WorkerInfo",
    "_retry",
    "deploy",
    "fmt_eth",
]


class PeerIdentity(Protocol):
    """A node's Ed25519 identity as registration needs it (``crypto.identity.Identity``)."""

    @property
    def public_bytes(self) -> bytes: ...

    def sign(self, message: bytes) -> bytes: ...


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
        block_fees(chain)
        | {
            "from": account.address,
            "nonce": chain.w3.eth.get_transaction_count(account.address),
            # 24.5 kB of code (200 gas a byte), its calldata, up to 16 validators (~90 k each)
            "gas": 10_000_000,
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
    if receipt["status"] != 1:
        raise LedgerError("contract deployment failed")
    return str(receipt["contractAddress"]), int(receipt["blockNumber"])


class LedgerClient:
    """The contract, for one account (``account`` None: reads only)."""

    def __init__(
        self,
        chain: Chain,
        address: str,
        account: LocalAccount | None = None,
        *,
        timeout: float = 60,
        expected_chain_id: int | None = None,
        journal: Path | None = None,
        confirmations: int = 0,
        replace_after: float | None = None,
        max_fee: int | None = None,
    ) -> None:
        """``journal``: the account's nonce journal file (``ledger/nonces.py``; None: kept
        in memory); ``confirmations``: blocks on top of a transaction's before it counts as
        done, and of an event's before the node acts on it (``confirmed_head``);
        ``replace_after``: seconds before a transaction not mined is replaced with higher
        fees, up to ``max_fee`` wei per gas."""
        self.expected_chain_id = expected_chain_id
        self.confirmations = confirmations
        self.chain = chain
        self.w3 = chain.w3
        self.account = account
        self.timeout = timeout
        self.contract: Contract = self.w3.eth.contract(
            address=self.w3.to_checksum_address(address), abi=load_artifact()["abi"]
        )
        guard = ChainGuard(chain, expected_chain_id)
        self.reads = LedgerReads(chain, self.contract, guard)
        self.tx = Transactions(
            chain,
            self.contract,
            account,
            guard,
            timeout=timeout,
            journal=NonceJournal(journal),
            confirmations=confirmations,
            replace_after=replace_after,
            max_fee=max_fee,
        )
        self.log = LedgerEvents(self.w3, self.contract)

    @property
    def address(self) -> str:
        return self.tx.address

    # ---- reads (``ledger/reads.py``) ----------------------------------------------------

    def require_contract(self) -> None:
        self.reads.require_contract()

    def params(self) -> Params:
        return self.reads.params()

    def proposed_params(self) -> tuple[Params, int]:
        return self.reads.proposed_params()

    def worker(self, account: str) -> WorkerInfo:
        return self.reads.worker(account)

    def registration(self, account: str) -> tuple[bytes, bytes]:
        return self.reads.registration(account)

    def registration_valid(self, account: str) -> bool:
        return self.reads.registration_valid(account)

    def peer_owner(self, peer_key: bytes) -> str:
        """The account that registered ``peer_key`` (the zero address: none)."""
        return str(self.reads.view("peer_owner", peer_key))

    def registration_status(self, account: str, block: int | None = None) -> tuple[bytes, bool]:
        return self.reads.registration_status(account, block)

    def submission(self, worker: str, key: bytes, block: int | None = None) -> SubmissionInfo:
        return self.reads.submission(worker, key, block)

    def head(self) -> int:
        return self.reads.head()

    def confirmed_head(self) -> int:
        """The newest block at least ``confirmations`` deep: what the node acts on (a
        reorg no deeper than that cannot remove it)."""
        return max(0, self.reads.head() - self.confirmations)

    def health(self) -> dict[str, Any]:
        """The JSON-RPC URLs' answers and faults, and this account's transactions so far
        (sent, confirmed, replaced, sent again, reorged, held at the fee cap, timed out)."""
        return {"rpc": self.chain.health(), "transactions": dict(self.tx.counts)}

    def chain_time(self) -> int:
        return self.reads.chain_time()

    def block_time(self, block: int) -> int:
        return self.reads.block_time(block)

    def claimable(self, account: str) -> int:
        return self.reads.claimable(account)

    def pending(self, account: str) -> int:
        return self.reads.pending(account)

    def matured(self, account: str) -> int:
        return self.reads.matured(account)

    def is_validator(self, account: str) -> bool:
        return self.reads.is_validator(account)

    def validator_bond(self) -> int:
        return self.reads.validator_bond()

    def validator_until(self, account: str) -> int:
        return self.reads.validator_until(account)

    def reward_pool(self) -> int:
        return self.reads.reward_pool()

    def total_burned(self) -> int:
        return self.reads.total_burned()

    def policy_version(self) -> int:
        return self.reads.policy_version()

    def owner(self) -> str:
        return self.reads.owner()

    # ---- events (``ledger/events.py``) --------------------------------------------------

    def events(self, name: str, receipt: TxReceipt) -> list[EventData]:
        """The contract's ``name`` events in a receipt (other logs skipped)."""
        return self.log.in_receipt(name, receipt)

    # ---- transactions (``ledger/transactions.py``) --------------------------------------

    def estimate(self, name: str, *args: Any, value: int = 0) -> int:
        return self.tx.estimate(name, *args, value=value)

    def prepare(
        self,
        name: str,
        *args: Any,
        value: int = 0,
        gas: int | None = None,
        fees: dict[str, int] | None = None,
        simulated: bool = False,
    ) -> Prepared:
        return self.tx.prepare(name, *args, value=value, gas=gas, fees=fees, simulated=simulated)

    def broadcast(self, p: Prepared) -> bytes:
        return self.tx.broadcast(p)

    def wait(self, p: Prepared) -> Any:
        return self.tx.wait(p)

    def send(
        self,
        name: str,
        *args: Any,
        value: int = 0,
        gas: int | None = None,
        fees: dict[str, int] | None = None,
        simulated: bool = False,
    ) -> Prepared:
        return self.tx.send(name, *args, value=value, gas=gas, fees=fees, simulated=simulated)

    def send_many(self, calls: list[tuple[str, tuple[Any, ...]]]) -> list[Any]:
        return self.tx.send_many(calls)

    def _transact(
        self, name: str, *args: Any, value: int = 0, gas: int | None = None, simulated: bool = False
    ) -> Any:
        return self.tx.transact(name, *args, value=value, gas=gas, simulated=simulated)

    # ---- calls ------------------------------------------------------------------------

    def sign_registration(self, identity: PeerIdentity) -> bytes:
        """The Ed25519 signature ``register`` stores, by the node's identity."""
        return bytes(identity.sign(registration_message(self.reads.guard.check(), self.address)))

    def voucher(self, peer: str) -> bytes:
        """This account's validator voucher for ``peer`` (``ledger/vouchers.py``)."""
        if self.account is None:
            raise LedgerError("no account to sign a voucher with")
        return sign_voucher(self.account, self.reads.guard.check(), self.contract.address, peer)

    def register(self, peer_key: bytes, signature: bytes, stake: int) -> Any:
        if len(peer_key) != 32:
            raise LedgerError("peer key must be the 32-byte Ed25519 public key")
        if len(signature) != 64:
            raise LedgerError("the registration signature must be 64 bytes")
        return self._transact("register", peer_key, signature, value=stake)

    def register_identity(self, identity: PeerIdentity, stake: int) -> Any:
        return self.register(identity.public_bytes, self.sign_registration(identity), stake)

    def change_peer_key(self, identity: PeerIdentity) -> Any:
        return self._transact(
            "change_peer_key", identity.public_bytes, self.sign_registration(identity)
        )

    def change_peer_key_signed(self, peer_key: bytes, signature: bytes) -> Any:
        """Rotate to ``peer_key`` with a signature made elsewhere (what the contract stores)."""
        return self._transact("change_peer_key", peer_key, signature)

    def revoke_registration(self, worker: str) -> Any:
        return self._transact("revoke_registration", self.reads.checksum(worker))

    def add_stake(self, amount: int) -> Any:
        return self._transact("add_stake", value=amount)

    def submit_work(self, key: bytes, units: int, policy_version: int) -> Any:
        """Submit a work key once: a key the chain holds already for this account (a retry
        whose first send was mined, a restart between sending and the receipt) is done,
        and returns None instead of a receipt."""
        try:
            return self._transact("submit_work", key, units, policy_version)
        except LedgerRevert:
            if self.reads.submission(self.address, key).status != "none":
                return None
            raise

    def submit_work_many(self, items: list[tuple[bytes, int, int]]) -> list[Any]:
        return self.send_many([("submit_work", item) for item in items])

    def send_vote(self, worker: str, key: bytes, accept: bool, reason: str = "invalid") -> Prepared:
        """Send an ``accept`` or a ``reject`` without waiting for it (``wait`` does): a
        validator sends its verdicts in nonce order and follows them to their confirmations
        side by side, instead of each waiting for the one before."""
        if accept:
            return self.send("accept", self.reads.checksum(worker), key)
        return self.send("reject", self.reads.checksum(worker), key, REASONS[reason])

    def accept(self, worker: str, key: bytes) -> Any:
        return self._transact("accept", self.reads.checksum(worker), key)

    def reject(self, worker: str, key: bytes, reason: str = "invalid") -> Any:
        return self._transact("reject", self.reads.checksum(worker), key, REASONS[reason])

    def _gas_for(self, name: str, *args: Any) -> int:
        return int(self.estimate(name, *args) * GAS_HEADROOM) + GAS_EXTRA

    def settle(self, worker: str, max_entries: int = CLAIM_CHUNK) -> Any:
        max_entries = min(max_entries, self.matured(worker))  # as in ``claim``
        args = (self.reads.checksum(worker), max_entries)
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
        return self._transact("propose_validator", self.reads.checksum(validator))

    def count_validator(self, validator: str) -> Any:
        return self._transact("count_validator", self.reads.checksum(validator))

    def remove_validator(self, validator: str) -> Any:
        return self._transact("remove_validator", self.reads.checksum(validator))

    def propose_params(self, p: Params) -> Any:
        return self._transact("propose_params", p.as_tuple())

    def apply_params(self) -> list[Any]:
        """Apply the due proposal, then count the validators again in as many transactions
        as that takes (``apply_params`` counts the first 64 of the list, ``recount_validators``
        the rest; the contract takes no work until the last is counted). The receipts."""
        receipts = [self._transact("apply_params")]
        while self.recount_left():
            receipts.append(self.recount_validators())
        return receipts

    def recount_left(self) -> int:
        """Validators the pending recount after ``apply_params`` has yet to count (0: none)."""
        return int(self.reads.view("recount_validators", 0))

    def recount_validators(self, max_entries: int = RECOUNT_CHUNK) -> Any:
        """One ``recount_validators`` of up to ``max_entries``, its gas estimated with headroom
        (fewer entries when the estimate is above MAX_TX_GAS), as in ``claim``."""
        gas = self._gas_for("recount_validators", max_entries)
        while gas > MAX_TX_GAS and max_entries > 1:
            max_entries //= 2
            gas = self._gas_for("recount_validators", max_entries)
        return self._transact("recount_validators", max_entries, gas=gas, simulated=True)

    def cancel_params(self) -> Any:
        return self._transact("cancel_params")

    def transfer_ownership(self, new_owner: str) -> Any:
        return self._transact("transfer_ownership", self.reads.checksum(new_owner))

    def accept_ownership(self) -> Any:
        return self._transact("accept_ownership")

    def set_policy_version(self, version: int) -> Any:
        return self._transact("set_policy_version", version)

    def fund(self, amount: int) -> Any:
        return self._transact("fund", value=amount)
