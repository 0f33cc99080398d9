"""The ledger's reads: the contract's views and the chain's head, each retried while the
node restarts (``retry``), and the chain id a client is pinned to (``ChainGuard``).

Reads need no account; ``LedgerClient`` (``ledger/client.py``) composes them with its
transactions and events.
"""

from __future__ import annotations

from typing import Any

from web3 import Web3
from web3.contract import Contract
from web3.exceptions import BadFunctionCallOutput

from ledger.chain import Chain
from ledger.codes import STATUS
from ledger.records import LedgerError, Params, SubmissionInfo, WorkerInfo, retry
from ledger.registration import verify_registration


class ChainGuard:
    """The chain id this client signs for: checked against the configured one (or pinned
    to the first one seen) before the first transaction, and checked again after a transport
    error (a different chain behind the same URL is refused)."""

    def __init__(self, chain: Chain, expected: int | None) -> None:
        self.chain = chain
        self.expected = expected
        self.pinned: int | None = None

    def check(self) -> int:
        if self.pinned is None:
            chain_id = retry(lambda: self.chain.chain_id)
            if self.expected is not None and chain_id != self.expected:
                raise LedgerError(
                    f"connected to chain {chain_id}, but the config says {self.expected}"
                )
            self.pinned = chain_id
        return self.pinned

    def recheck(self) -> None:
        """After a transport error: the node behind the URL may have changed."""
        pinned, self.pinned = self.pinned, None
        now = self.check()
        if pinned is not None and now != pinned:
            raise LedgerError(f"the chain changed from {pinned} to {now}: refusing to sign")


class LedgerReads:
    """The contract's views (``eth_call``, no account) and the chain's head and clock."""

    def __init__(self, chain: Chain, contract: Contract, guard: ChainGuard) -> None:
        self.chain = chain
        self.w3: Web3 = chain.w3
        self.contract = contract
        self.guard = guard

    def view(self, name: str, *args: Any, block: int | None = None) -> Any:
        """The contract's view ``name`` (web3 decodes its ABI types: the callers narrow), as
        of block number ``block`` (default: the newest)."""
        at: Any = "latest" if block is None else block
        try:
            return retry(
                lambda: getattr(self.contract.functions, name)(*args).call(block_identifier=at)
            )
        except BadFunctionCallOutput:  # empty output: most likely no code there
            self.require_contract()
            raise

    def require_contract(self) -> None:
        """Raise ``LedgerError`` naming the address if no contract is deployed there (a
        reader of events alone would find none and report an empty history)."""
        if not retry(lambda: self.w3.eth.get_code(self.contract.address)):
            raise LedgerError(
                f"no contract at {self.contract.address} on {self.chain.url}: check the"
                " contract address (--contract, or contract in the config)"
            )

    def checksum(self, account: str) -> str:
        return str(self.w3.to_checksum_address(account))

    def params(self) -> Params:
        return Params(*self.view("params"))

    def proposed_params(self) -> tuple[Params, int]:
        """The proposed parameters and when they may be applied (0: no proposal)."""
        return Params(*self.view("proposed_params")), int(self.view("params_eta"))

    def worker(self, account: str, block: int | None = None) -> WorkerInfo:
        r = self.view("workers", self.checksum(account), block=block)
        return WorkerInfo(bytes(r[0]), *r[1:])

    def registration(self, account: str, block: int | None = None) -> tuple[bytes, bytes]:
        """(peer key, stored signature) of an account, as of ``block`` (default: now)."""
        peer_key = self.worker(account, block).peer_key
        return peer_key, bytes(self.view("signatures", self.checksum(account), block=block))

    def registration_valid(self, account: str) -> bool:
        """Whether the account's stored registration signature is valid (checked off-chain:
        the EVM cannot verify Ed25519)."""
        return self.registration_status(account)[1]

    def registration_status(self, account: str, block: int | None = None) -> tuple[bytes, bool]:
        """(peer key, whether its stored signature is valid for this chain and account), as
        of ``block`` (default: now; an older block needs a node that keeps its state)."""
        peer_key, signature = self.registration(account, block)
        return peer_key, verify_registration(peer_key, signature, self.guard.check(), account)

    def submission(self, worker: str, key: bytes, block: int | None = None) -> SubmissionInfo:
        r = list(self.view("submission", self.checksum(worker), key, block=block))
        r[11] = STATUS[r[11]]
        r[15] = str(r[15])
        return SubmissionInfo(*r)

    def head(self) -> int:
        """The chain's newest block number."""
        return int(retry(lambda: self.w3.eth.block_number))

    def chain_time(self) -> int:
        """The timestamp of the chain's newest block (the contract's clock)."""
        return int(retry(lambda: self.w3.eth.get_block("latest")["timestamp"]))

    def block_time(self, block: int) -> int:
        """The timestamp of block number ``block``."""
        return int(retry(lambda: self.w3.eth.get_block(block)["timestamp"]))

    def claimable(self, account: str) -> int:
        return int(self.view("claimable", self.checksum(account)))

    def pending(self, account: str) -> int:
        return int(self.view("pending", self.checksum(account)))

    def matured(self, account: str) -> int:
        return int(self.view("matured", self.checksum(account)))

    def is_validator(self, account: str) -> bool:
        return bool(self.view("is_validator", self.checksum(account)))

    def validator_bond(self) -> int:
        """The stake a validator needs to vote: max(min_stake, the largest collateral)."""
        return int(self.view("validator_bond"))

    def validator_until(self, account: str) -> int:
        """When a validator was removed (it votes only on work submitted up to then); 0: not."""
        return int(self.view("validator_until", self.checksum(account)))

    def reward_pool(self) -> int:
        return int(self.view("reward_pool"))

    def total_burned(self) -> int:
        return int(self.view("total_burned"))

    def policy_version(self) -> int:
        return int(self.view("policy_version"))

    def owner(self) -> str:
        return str(self.view("owner"))
