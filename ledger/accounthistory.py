"""One account's history on the ledger, from the contract's events: every submission,
verdict, slash, settlement, claim and stake change, with totals per day (UTC).

Each batch's life (``batch_lives``): submitted, judged, matured, settled and claimed, each
with the transaction that did it; and where the node's own record (its stored batches, its
nonce journal's unconfirmed transactions) or the contract's view of a batch disagrees with
the events (``disagreements``).

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


LIVES = 50  # the newest batches whose life is shown (each costs one contract read)


def _at(ev: dict[str, Any]) -> dict[str, Any]:
    return {"block": ev["block"], "tx": ev.get("tx", "")}


def batch_lives(events: list[dict[str, Any]], address: str) -> list[dict[str, Any]]:
    """Each batch ``address`` submitted, oldest first: its key, index and units; when and
    by which transaction it was submitted, judged (every vote), settled (the contract
    settles a worker's batches oldest first, so the n-th batch is settled by the
    ``Settled`` event that brings the count of settled entries past n) and claimed (the
    first ``Claimed`` of the account at or after its settlement). Pure."""
    a = address.lower()
    lives: dict[str, dict[str, Any]] = {}
    settlements: list[tuple[int, dict[str, Any]]] = []  # (entries settled after it, event)
    claims: list[dict[str, Any]] = []
    settled_count = 0
    for ev in sorted(events, key=lambda e: (e["block"], e["log"])):
        args, name = ev["args"], ev["event"]
        mine = _lower(args.get("worker")) == a
        if name == "WorkSubmitted" and mine:
            lives[str(args["key"])] = {
                "key": str(args["key"]),
                "index": int(args["index"]),
                "units": int(args["units"]),
                "submitted": _at(ev),
                "verdicts": [],
                "settled": None,
                "claimed": None,
            }
        elif name in ("WorkAccepted", "WorkRejected", "RejectOverturned") and mine:
            life = lives.get(str(args["key"]))
            if life is not None:
                life["verdicts"].append(
                    {"event": name, "validator": str(args.get("validator", "")), **_at(ev)}
                )
        elif name == "Settled" and mine:
            settled_count += int(args["entries"])
            settlements.append((settled_count, ev))
        elif name == "Claimed" and _lower(args.get("account")) == a:
            claims.append(ev)
    for life in lives.values():
        settling = next((ev for count, ev in settlements if life["index"] < count), None)
        if settling is None:
            continue
        life["settled"] = _at(settling)
        at = (settling["block"], settling["log"])
        claim = next((c for c in claims if (c["block"], c["log"]) >= at), None)
        life["claimed"] = _at(claim) if claim is not None else None
    return sorted(lives.values(), key=lambda life: life["index"])


def disagreements(
    lives: list[dict[str, Any]],
    chain: dict[str, Any],
    *,
    stored: set[str] | None = None,
    unconfirmed: list[tuple[int, str, str]] | None = None,
) -> list[str]:
    """Where the node's belief or the contract's view disagrees with the events, one line
    each. ``chain``: per key, the contract's view now (``SubmissionInfo``) of the batches
    shown; ``stored``: the keys of the batches the node keeps (it submits every batch it
    stores); ``unconfirmed``: the nonce journal's (nonce, call, hash) sent and not
    confirmed."""
    out = []
    for life in lives:
        info = chain.get(life["key"])
        if info is None:
            continue
        last = life["verdicts"][-1]["event"] if life["verdicts"] else None
        events_say = {
            "WorkAccepted": "accepted",
            "WorkRejected": "rejected",
            "RejectOverturned": "accepted",
            None: "pending",
        }[last]
        if info.status != events_say:
            out.append(
                f"batch {life['key'][:18]}: the events say {events_say}, the contract {info.status}"
            )
        if bool(info.settled) != (life["settled"] is not None):
            says = "settled" if info.settled else "not settled"
            out.append(f"batch {life['key'][:18]}: the contract says {says}, the events do not")
    on_chain = {life["key"] for life in lives}
    for key in sorted((stored or set()) - on_chain):
        out.append(f"batch {key[:18]}: stored by the node, not submitted on-chain")
    for nonce, call, tx in unconfirmed or []:
        out.append(f"transaction {tx[:18]} ({call}, nonce {nonce}): sent, not confirmed")
    return out


def account_history(
    index: Any,
    address: str,
    *,
    submission: Callable[[str, bytes], Any] | None = None,
    stored: set[str] | None = None,
    unconfirmed: list[tuple[int, str, str]] | None = None,
) -> dict[str, Any]:
    """Blocking (chain reads): the history report of ``address`` from an ``EventIndex``;
    with ``submission`` (the contract's view of a batch), the newest ``LIVES`` batches'
    lives and the disagreements with the contract, the node's ``stored`` batch keys and
    its ``unconfirmed`` transactions (``disagreements``)."""
    from ledger.history import EventIndex

    events = EventIndex.involving(index.update(), address)
    history = rows(events, address, BlockTimes(index.w3))
    report: dict[str, Any] = {
        "address": address,
        "contract": index.contract,
        "rows": history,
        "days": daily_totals(history),
    }
    if submission is not None:
        lives = batch_lives(events, address)[-LIVES:]
        views = {life["key"]: submission(address, bytes.fromhex(life["key"][2:])) for life in lives}
        # a stored batch older than those shown: only the contract can say it is there
        missing = {
            k
            for k in stored or set()
            if k not in views and submission(address, bytes.fromhex(k[2:])).status == "none"
        }
        report["batches"] = lives
        report["disagreements"] = disagreements(
            lives, views, stored=missing, unconfirmed=unconfirmed
        )
    return report
