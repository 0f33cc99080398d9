"""The validator's voucher: its ledger account vouching for the peer id it fetches batches as.

A worker serves the run's validators before anyone else (SPEC §13: upload slots kept for
them), but a batch request comes from a peer id, and the chain knows validators by account.
A validator signs, once, with its account key (EIP-191 ``personal_sign``), a message naming
the chain, the contract and its own peer id, and sends the signature with every batch
request; the worker recovers the account and asks the contract whether it is a validator.
The peer id in the message is checked against the peer the request came from (libp2p
authenticates it), so a voucher copied by another peer vouches for nothing.
"""

from __future__ import annotations

from eth_account import Account
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount

VOUCHER_SIZE = 65  # r ‖ s ‖ v


def voucher_text(chain_id: int, contract: str, peer: str) -> str:
    """What a validator's account signs: the chain, the contract and its peer id."""
    if not 0 < chain_id < 2**256:
        raise ValueError(f"not a chain id: {chain_id}")
    return (
        f"intellect-node validator voucher v1\nchain {chain_id}\n"
        f"contract {contract.lower()}\npeer {peer}"
    )


def sign_voucher(account: LocalAccount, chain_id: int, contract: str, peer: str) -> bytes:
    """``account``'s voucher for ``peer`` (65 bytes)."""
    message = encode_defunct(text=voucher_text(chain_id, contract, peer))
    return bytes(account.sign_message(message).signature)


def voucher_signer(voucher: bytes, chain_id: int, contract: str, peer: str) -> str | None:
    """The account that signed ``voucher`` for ``peer``, or None for anything else (a
    voucher of another length, or one that recovers to no account)."""
    if len(voucher) != VOUCHER_SIZE:
        return None
    message = encode_defunct(text=voucher_text(chain_id, contract, peer))
    try:
        return str(Account.recover_message(message, signature=voucher))
    except Exception:  # eth_keys' BadSignature, ValueError: not a signature of anyone
        return None
