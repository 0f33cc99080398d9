"""``intellect-node rewards history ADDRESS``: an account's history on the ledger.

Every submission, verdict, slash, settlement, claim and stake change of ADDRESS from the
contract's events (``ledger/accounthistory.py``), then totals per UTC day. Read-only: no
keystore is opened, any address may be audited. ``--json`` prints one object (``rows`` and
``days``), ``--csv`` the rows then a blank line then the days.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
from typing import Any

from node.config import NodeConfig


def cmd_history(args: argparse.Namespace, located: tuple[Any, NodeConfig, int]) -> int:
    from ledger.accounthistory import account_history
    from ledger.history import EventIndex
    from node.roles.io.submissions import local_record

    client, cfg, start_block = located
    target = args.target or args.address
    if not target:
        raise ValueError("rewards history needs an ADDRESS (0x followed by 40 hex digits)")
    if not client.w3.is_address(target):
        raise ValueError(f"not an address: {target!r} (0x followed by 40 hex digits)")
    address = client.w3.to_checksum_address(target)
    client.require_contract()  # a wrong --contract has no events either: not "no events"
    index = EventIndex(
        client.w3,
        client.contract.address,
        start_block,
        cfg.resolved_data_dir / "ledger-events.json",
        confirmations=cfg.chain.confirmations,
    )
    mine = local_record(cfg.resolved_data_dir, address)  # empty for another's address
    report = account_history(
        index,
        address,
        submission=client.submission,
        stored=mine.stored,
        unconfirmed=mine.unconfirmed,
    )
    if args.json:
        print(json.dumps(report))
    elif args.csv:
        print(to_csv(report), end="")
    else:
        print(to_text(report))
    return 0


def to_csv(report: dict[str, Any]) -> str:
    from ledger.accounthistory import ROW_FIELDS, TOTALS

    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(ROW_FIELDS)
    for r in report["rows"]:
        w.writerow([r[k] for k in ROW_FIELDS])
    w.writerow([])
    w.writerow(("day", *TOTALS))
    for d in report["days"]:
        w.writerow([d["day"], *(d[k] for k in TOTALS)])
    return out.getvalue()


def _eth(wei: int) -> str:
    from ledger.client import fmt_eth

    return fmt_eth(wei)


def to_text(report: dict[str, Any]) -> str:
    from datetime import UTC, datetime

    lines = [f"account    {report['address']}", f"contract   {report['contract']}"]
    if not report["rows"]:
        lines.append("no events for this account")
        return "\n".join(lines)
    lines.append(f"{'time (UTC)':<19}  {'block':>6}  {'kind':<10} {'amount':>24}  detail")
    for r in report["rows"]:
        when = datetime.fromtimestamp(r["time"], UTC).strftime("%Y-%m-%d %H:%M:%S")
        amount = _eth(r["amount_wei"]) if r["amount_wei"] else ""
        key = f" key {r['key'][:18]}" if r["key"] else ""
        mark = "  (unconfirmed)" if not r["confirmed"] else ""
        lines.append(
            f"{when}  {r['block']:>6}  {r['kind']:<10} {amount:>24}  {r['detail']}{key}{mark}"
        )
    lines.append("")
    lines.append(
        f"{'day':<10}  {'subm':>5} {'acc':>4} {'rej':>4} {'judged':>6}  "
        f"{'slashed':>14} {'settled':>14} {'claimed':>14} {'staked':>14}"
    )
    for d in report["days"]:
        lines.append(
            f"{d['day']:<10}  {d['submitted']:>5} {d['accepted']:>4} {d['rejected']:>4} "
            f"{d['judged']:>6}  {_eth(d['slashed_wei']):>14} {_eth(d['settled_reward_wei']):>14} "
            f"{_eth(d['claimed_wei']):>14} {_eth(d['staked_wei']):>14}"
        )
    lines += batches_text(report.get("batches", []), report.get("disagreements", []))
    return "\n".join(lines)


def _tx(at: dict[str, Any] | None) -> str:
    return f"{at['block']} {at['tx'][:12]}" if at else "-"


def batches_text(batches: list[dict[str, Any]], disagreements: list[str]) -> list[str]:
    """Each batch's life (block and transaction of each stage), then the disagreements."""
    lines = []
    if batches:
        lines += ["", f"the last {len(batches)} batches (block, transaction):"]
        lines.append(
            f"{'key':<18}  {'submitted':<20} {'verdicts':<30} {'settled':<20} {'claimed':<20}"
        )
        for b in batches:
            votes = ", ".join(
                f"{v['event'].removeprefix('Work').lower()} {_tx(v)}" for v in b["verdicts"]
            )
            lines.append(
                f"{b['key'][:18]:<18}  {_tx(b['submitted']):<20} {votes or '-':<30} "
                f"{_tx(b['settled']):<20} {_tx(b['claimed']):<20}"
            )
    lines += [
        "",
        "disagreements between the node and the chain:"
        if disagreements
        else "the node and the chain agree",
    ]
    lines += [f"  {d}" for d in disagreements]
    return lines
