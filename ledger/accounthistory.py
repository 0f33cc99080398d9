"""One account's history on the ledger, from the contract's events: every submission,
verdict, slash, settlement, claim and stake change, with totals per day (UTC).

Read-only and keyless: anyone can audit anyone. The events come from the incremental
index (``ledger/history.py``); each row gets its block's timestamp, so the day it falls on
is the chain's, not the reader's clock. ``rows`` and ``daily_totals`` are pure, so the
command (``intellect-node rewards history``) and the dashboard's rewards panel show the
same figures.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from ledger.codes import REASON_NAMES

# per-day totals, in this order (the CSV's columns): counts, then amounts in wei
TOTALS = (
    "submitted",
    "accepted",
    "rejected",
    "judged",  # verdicts this account gave as a validator
    "slashed_wei",
    "settled_reward_wei",
    "claimed_wei",
    "staked_wei",  # stake added (registration, add), less stake unbonded
)
ROW_FIELDS = ("time", "day", "block", "event", "kind", "role", "amount_wei", "key", "detail")


def _lower(v: Any) -> str:
    return v.lower() if isinstance(v, str) else ""


def _row(kind: str, role: str, amount_wei: int, detail: str, key: str) -> dict[str, Any]:
    return {"kind": kind, "role": role, "amount_wei": amount_wei, "key": key, "detail": detail}


def classify(event: dict[str, Any], address: str) -> dict[str, Any] | None:
    """What ``event`` means for ``address``: kind, role, signed amount and detail; None
    when it concerns the account only in passing (e.g. a transfer of ownership)."""
    a, args, name = address.lower(), event["args"], event["event"]
    worker = _lower(args.get("worker")) == a
    role = "worker" if worker else "validator"
    key = str(args.get("key", ""))
    if name == "WorkSubmitted" and worker:
        detail = f"{args['units']} units, policy v{args['policy_version']}"
        return _row("submission", role, int(args["reward"]), detail, key)
    if name in ("WorkAccepted", "WorkRejected", "RejectOverturned"):
        if name == "WorkAccepted":
            detail = "accepted" + (" (final)" if args.get("final") else "")
        elif name == "WorkRejected":
            detail = "rejected: " + REASON_NAMES.get(int(args["reason"]), str(args["reason"]))
        else:
            detail = f"rejection overturned, bond burned {int(args['burned_bond'])} wei"
        if not worker:
            detail += f" (worker {args['worker']})"
        return _row("verdict", role, 0, detail, key)
    if name == "Slashed":
        if worker:
            detail = f"burned {int(args['burned'])} wei"
            return _row("slash", role, -int(args["stake"]), detail, "")
        detail = f"validator share of slashing {args['worker']}"
        return _row("slash", role, int(args["validator_share"]), detail, "")
    if name == "Settled" and worker:
        detail = f"{args['entries']} entries, unpaid {int(args['unpaid'])} wei"
        return _row("settle", role, int(args["reward"]), detail, "")
    if name == "Claimed":
        detail = f"reward {int(args['reward'])} wei + credit {int(args['credit'])} wei"
        return _row("claim", "account", int(args["total"]), detail, "")
    stake = {
        "Registered": (int(args.get("stake", 0)), "registered"),
        "StakeAdded": (int(args.get("amount", 0)), "stake added"),
        "Unbonded": (-int(args.get("stake", 0)), "unbonding"),
        "Withdrawn": (0, f"withdrew {int(args.get('unbonded_stake', 0))} wei unbonded"),
    }.get(name)
    if stake is not None:
        return _row("stake", "account", stake[0], stake[1], "")
    return None


def rows(
    events: list[dict[str, Any]], address: str, timestamp: Callable[[int], int]
) -> list[dict[str, Any]]:
    """The account's rows, oldest first; ``timestamp(block)`` gives a block's time."""
    out = []
    for ev in sorted(events, key=lambda e: (e["block"], e["log"])):
        meaning = classify(ev, address)
        if meaning is None:
            continue
        t = int(timestamp(ev["block"]))
        out.append(
            {
                "time": t,
                "day": datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d"),
                "block": ev["block"],
                "log": ev["log"],
                "event": ev["event"],
                **meaning,
                "confirmed": ev.get("confirmed", True),
            }
        )
    return out


def daily_totals(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per UTC day (oldest first): the counts and amounts of ``TOTALS``."""
    days: dict[str, dict[str, Any]] = {}
    for r in history:
        d = days.setdefault(r["day"], {"day": r["day"], **dict.fromkeys(TOTALS, 0)})
        kind, amount = r["kind"], r["amount_wei"]
        if kind == "submission":
            d["submitted"] += 1
        elif kind == "verdict" and r["role"] == "validator":
            d["judged"] += 1
        elif kind == "verdict" and r["event"] == "WorkAccepted":
            d["accepted"] += 1
        elif kind == "verdict" and r["event"] == "WorkRejected":
            d["rejected"] += 1
        elif kind == "slash" and r["role"] == "worker":
            d["slashed_wei"] += -amount
        elif kind == "settle":
            d["settled_reward_wei"] += amount
        elif kind == "claim":
            d["claimed_wei"] += amount
        elif kind == "stake":
            d["staked_wei"] += amount
    return [days[k] for k in sorted(days)]


class BlockTimes:
    """Block timestamps, each read once (a history names few distinct blocks)."""

    def __init__(self, w3: Any) -> None:
        self.w3 = w3
        self.seen: dict[int, int] = {}

    def __call__(self, block: int) -> int:
        if block not in self.seen:
            self.seen[block] = int(self.w3.eth.get_block(block)["timestamp"])
        return self.seen[block]


def account_history(index: Any, address: str) -> dict[str, Any]:
    """Blocking (chain reads): the history report of ``address`` from an ``EventIndex``."""
    from ledger.history import EventIndex

    events = EventIndex.involving(index.update(), address)
    history = rows(events, address, BlockTimes(index.w3))
    return {
        "address": address,
        "contract": index.contract,
        "rows": history,
        "days": daily_totals(history),
    }
