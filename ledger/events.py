"""The contract's events: those a receipt carries, and those of a span of blocks read with
one ``eth_getLogs`` (the validator's and the trainer's view of submitted and judged work,
``node/roles/io/chain.py``). ``ledger/history.py`` indexes an account's events the same way
for ``intellect-node ledger history``.
"""

from __future__ import annotations

from typing import Any

from web3 import Web3
from web3.contract import Contract
from web3.types import EventData, FilterParams, TxReceipt


class LedgerEvents:
    """The contract's event logs, decoded."""

    def __init__(self, w3: Web3, contract: Contract) -> None:
        self.w3 = w3
        self.contract = contract

    def in_receipt(self, name: str, receipt: TxReceipt) -> list[EventData]:
        """The contract's ``name`` events in a receipt (other logs skipped)."""
        from web3.logs import DISCARD

        event: Any = getattr(self.contract.events, name)()  # web3 types events by name only
        return list(event.process_receipt(receipt, errors=DISCARD))

    def read(self, names: tuple[str, ...], from_block: int, to_block: int) -> list[EventData]:
        """The contract's events of the kinds ``names`` in blocks ``from_block`` to
        ``to_block``, in chain order, read with one ``eth_getLogs`` (its first topic: any
        of theirs)."""
        events = self.contract.events
        kinds = {getattr(events, n).topic.removeprefix("0x"): getattr(events, n)() for n in names}
        query: FilterParams = {
            "address": self.contract.address,
            "fromBlock": from_block,
            "toBlock": to_block,
            "topics": [["0x" + t for t in kinds]],
        }
        logs = self.w3.eth.get_logs(query)
        out: list[EventData] = [
            kinds[bytes(log["topics"][0]).hex()].process_log(log) for log in logs
        ]
        out.sort(key=lambda ev: (int(ev["blockNumber"]), int(ev["logIndex"])))
        return out
