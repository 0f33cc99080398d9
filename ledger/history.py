"""Incremental index of the contract's events, cached in the data directory.

Scanning logs from genesis gets slow on development chains (eth-tester's ``eth_getLogs``
from block 0 took 66 s at 800 blocks here), so the index starts at the contract's
deployment block, remembers the last block it read, and only ever asks for new blocks,
in bounded ranges.

The cache is kept per contract address, chain id and genesis block hash: a new chain may
repeat the first two, never the third. Only blocks at least ``confirmations`` deep are
cached (a reorg can drop newer ones); the newer tail is read fresh on every update and never
stored. Events are kept per account (every address an event names), the newest ``keep`` of
each, so one busy account cannot push another's history out.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from eth_utils.abi import event_abi_to_log_topic
from web3 import Web3
from web3._utils.events import get_event_data

from ledger.build import load_artifact
from ledger.chain import default_confirmations

CHUNK = 2000
KEEP_PER_ACCOUNT = 500
GLOBAL = "*"  # events that name no account (parameters, policy versions)
FORMAT = 3  # 3: each event with its transaction's hash


class EventIndex:
    def __init__(
        self,
        w3: Web3,
        contract: str,
        start_block: int,
        path: Path,
        *,
        confirmations: int | None = None,
        keep: int = KEEP_PER_ACCOUNT,
    ) -> None:
        self.w3 = w3
        self.contract = Web3.to_checksum_address(contract)
        self.path = path
        # None: the chain id's default (``ledger.chain.default_confirmations``)
        self.confirmations = (
            default_confirmations(int(w3.eth.chain_id)) if confirmations is None else confirmations
        )
        self.keep = keep
        abi = cast("list[Any]", load_artifact()["abi"])  # the JSON ABI: web3 reads each entry
        self.events_by_topic = {
            event_abi_to_log_topic(entry): entry for entry in abi if entry["type"] == "event"
        }
        # the cache is of one contract on one chain: a new development chain has the same
        # chain id and, deployed by the same key, the same contract address, but its own
        # genesis block (an index kept from the old chain showed the old chain's history)
        key = {
            "format": FORMAT,
            "contract": self.contract,
            "chain_id": w3.eth.chain_id,
            "genesis": Web3.to_hex(w3.eth.get_block(0)["hash"]),
        }
        state = self._load()
        if any(state.get(k) != v for k, v in key.items()):
            state = {**key, "last_block": start_block - 1, "accounts": {}}
        self.state = state

    def _load(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.path.read_text())
            return data
        except (FileNotFoundError, ValueError):
            return {}

    def _read(self, start: int, end: int) -> list[dict[str, Any]]:
        out = []
        while start <= end:
            stop = min(end, start + CHUNK - 1)
            for log in self.w3.eth.get_logs(
                {"address": self.contract, "fromBlock": start, "toBlock": stop}
            ):
                abi = self.events_by_topic.get(bytes(log["topics"][0]))
                if abi is None:
                    continue
                ev = get_event_data(self.w3.codec, abi, log)
                args = {k: _plain(v) for k, v in ev["args"].items()}
                out.append(
                    {
                        "block": ev["blockNumber"],
                        "log": ev["logIndex"],
                        "tx": "0x" + bytes(ev["transactionHash"]).hex(),
                        "event": ev["event"],
                        "args": args,
                    }
                )
            start = stop + 1
        return out

    @staticmethod
    def _accounts(event: dict[str, Any]) -> set[str]:
        found = {
            v.lower()
            for v in event["args"].values()
            if isinstance(v, str) and v.startswith("0x") and len(v) == 42
        }
        return found or {GLOBAL}

    def update(self) -> list[dict[str, Any]]:
        """Cache confirmed blocks since the last update; returns all cached events plus the
        unconfirmed tail (each marked ``confirmed``), oldest first."""
        latest = self.w3.eth.block_number
        confirmed_to = latest - self.confirmations
        start = self.state["last_block"] + 1
        if confirmed_to >= start:
            accounts: dict[str, list[dict[str, Any]]] = self.state["accounts"]
            for ev in self._read(start, confirmed_to):
                for account in self._accounts(ev):
                    accounts.setdefault(account, []).append(ev)
            for account, evs in accounts.items():
                accounts[account] = evs[-self.keep :]
            self.state["last_block"] = confirmed_to
            self._save()
        tail = self._read(max(start, confirmed_to + 1), latest)
        return self._merge(self.state["accounts"].values(), True) + self._merge([tail], False)

    @staticmethod
    def _merge(groups: Any, confirmed: bool) -> list[dict[str, Any]]:
        seen: dict[tuple[int, int], dict[str, Any]] = {}
        for evs in groups:
            for ev in evs:  # an event naming two accounts is stored under both
                seen[(ev["block"], ev["log"])] = {**ev, "confirmed": confirmed}
        return [seen[k] for k in sorted(seen)]

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state))
        os.replace(tmp, self.path)

    @staticmethod
    def involving(events: list[dict[str, Any]], address: str) -> list[dict[str, Any]]:
        a = address.lower()
        return [
            e
            for e in events
            if any(isinstance(v, str) and v.lower() == a for v in e["args"].values())
        ]


def _plain(v: Any) -> Any:
    """Event values as JSON: bytes as hex, tuples (structs) as lists."""
    if isinstance(v, bytes | bytearray):
        return "0x" + bytes(v).hex()
    if isinstance(v, tuple | list):
        return [_plain(x) for x in v]
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    return v
