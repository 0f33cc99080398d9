"""The CLI's tables, drawn with ``rich``: a node's status, the devnet's live table, the
weight versions a node holds, an account on the ledger.

Each builder takes the same JSON that ``--json`` prints (``/status``, ``/weights``, the
rewards report), so the table and the JSON cannot disagree. ``show`` prints to stdout: with
colour and the terminal's width on a terminal; without escape codes and without wrapping
where stdout is a pipe or a log (a long peer id or path stays on one line, greppable).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.table import Table

PIPE_WIDTH = 1000  # columns when stdout is not a terminal: never wrap
MiB = 1024 * 1024


def console(out: TextIO | None = None) -> Console:
    from rich.console import Console

    con = Console(file=out or sys.stdout, highlight=False)
    if not con.is_terminal:
        con = Console(file=out or sys.stdout, highlight=False, width=PIPE_WIDTH)
    return con


def show(
    *renderables: RenderableType, out: TextIO | None = None, con: Console | None = None
) -> None:
    """Print on a terminal as rich draws it; elsewhere plain text, lines right-stripped.
    Nothing at all for nothing (a devnet table before any node answers)."""
    if not renderables:
        return
    con = con or console(out)
    if con.is_terminal:
        for r in renderables:
            con.print(r, crop=False)
        return
    with con.capture() as captured:
        for r in renderables:
            con.print(r, crop=False)
    text = "\n".join(line.rstrip() for line in captured.get().splitlines())
    con.file.write(text + "\n")
    con.file.flush()


def _table(*columns: str, title: str | None = None) -> Table:
    """A table with a header rule and no outer frame; columns named ``>x`` align right."""
    from rich import box
    from rich.table import Table

    t = Table(
        box=box.SIMPLE_HEAD, title=title, title_justify="left", pad_edge=False, show_edge=False
    )
    for c in columns:
        right = c.startswith(">")
        t.add_column(c.lstrip(">"), justify="right" if right else "left", no_wrap=True)
    return t


def _fields(rows: Iterable[tuple[str, str]]) -> Table:
    """Label / value lines (a grid: no header, no rules)."""
    from rich.table import Table

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(no_wrap=True)
    for label, value in rows:
        grid.add_row(label, value)
    return grid


def _counts(d: dict[str, int]) -> str:
    return ", ".join(f"{k}={n}" for k, n in sorted(d.items())) or "none"


def eth(wei: int | float) -> str:
    return f"{Decimal(int(wei)) / 10**18:f}"


# ---- a node's status ----


def status_view(st: dict[str, Any]) -> list[RenderableType]:
    """``intellect-node status``: identity, addresses, reachability, peers by role, traffic, rejected
    input; the peers; and the role's own figures (the devnet table's row for this node)."""
    t = st["traffic"]
    count = st.get("peer_count", len(st["peers"]))
    rows = [("peer id", st["peer_id"]), ("role", st["role"]), ("run", st["run_id"])]
    rows += [("address", a) for a in st["addrs"]]
    reach = st.get("reachability")
    if reach:  # SPEC §16
        rows.append(
            (
                "reachability",
                f"{reach['state']} (reached by {reach['reached_by']}, "
                f"not reached by {reach['not_reached_by']})",
            )
        )
        rows += [("observed at", a) for a in reach["observed"]]
    rows += [
        ("peers", f"{count} ({_counts(st['peers_by_role'])})"),
        (
            "traffic",
            f"in {t['messages'].get('in', 0)} msgs / {t['bytes'].get('in', 0)} B, "
            f"out {t['messages'].get('out', 0)} msgs / {t['bytes'].get('out', 0)} B",
        ),
        ("rejected", _counts(st["rejected"])),
    ]
    chain = st.get("chain")
    if chain:  # the ledger client's figures (ledger/rpc.py, ledger/transactions.py)
        rows.append(("transactions", _counts(chain["transactions"])))
        for r in chain["rpc"]:
            faults = {k: r[k] for k in ("rate_limit", "server", "unreachable", "bad_answer")}
            used = " (in use)" if r["current"] else ""
            rows.append(
                (
                    f"rpc {r['url']}{used}",
                    f"{r['ok']} answers, {r['refusal']} refused, faults: {_counts(faults)}",
                )
            )
    out: list[RenderableType] = [_fields(rows)]
    if st["peers"]:
        peers = _table("role", "peer id", ">seen s ago")
        for p in st["peers"]:
            peers.add_row(p["role"], p["peer_id"], f"{p['last_seen_s']:.1f}")
        out.append(peers)
    out += work_view([("this node", st)])
    return out


# ---- the devnet's live table (and a node's role figures) ----


def trainer_line(t: dict[str, Any]) -> str:
    if t.get("objective") == "pretrain":
        loss, data = t.get("loss"), t.get("data") or {}
        return (
            f"trainer (pretrain): step {t['step']}"
            + (f"/{t['train_steps']}" if t.get("train_steps") else "")
            + f", loss {'-' if loss is None else f'{loss:.4f}'}"
            + f", data position {data.get('position', 0)}"
            + (f" in shard {data['shard']}/{data['shards']}" if "shard" in data else "")
            + f", tokens seen {t['tokens_trained']}"
        )
    last = t.get("last") or {}
    sampled, greedy = last.get("heldout_sampled"), last.get("heldout_greedy")
    reward = last.get("reward_mean")
    return (
        f"trainer: step {t['step']}"
        + (f"/{t['train_steps']}" if t.get("train_steps") else "")
        + f", reward {'-' if reward is None else f'{reward:.3f}'}"
        + f", held-out accuracy sampled {'-' if sampled is None else f'{sampled:.3f}'}"
        + f" (greedy {'-' if greedy is None else f'{greedy:.3f}'})"
        + f", accepted {t['accepted']}, rejected {t['rejected']}, slashed {t['slashed']}"
        + f", batches used {t['batches_used']}, tokens trained {t['tokens_trained']}"
    )


WORK_COLUMNS = (
    "node",
    "role",
    ">holds",
    ">gen",
    ">acc",
    ">rej",
    ">wait",
    ">tok/s",
    ">stake ETH",
    ">pending",
    ">claimable",
    ">MB up",
    ">MB dn",
    "note",
)


def _work_row(name: str, st: dict[str, Any]) -> list[str] | None:
    """One node's row: a worker's batches generated / accepted / rejected / waiting for a
    verdict and its money; a validator's verdicts; every node's policy version and bytes
    of weights moved. None for a node without a role section (bootstrap)."""
    w, v, tr = st.get("inference"), st.get("validator"), st.get("trainer")
    weights = st.get("weights") or {}
    held = str(weights.get("current", "-"))
    moved = [
        f"{weights.get('uploaded_bytes', 0) / 1e6:.1f}",
        f"{weights.get('downloaded_bytes', 0) / 1e6:.1f}",
    ]
    if w is not None:
        money = [eth(w.get(k, 0)) for k in ("stake_wei", "pending_wei", "claimable_wei")]
        counts = [str(w[k]) for k in ("generated", "accepted", "rejected", "unjudged")]
        return [name, "inference", held, *counts, f"{w['tokens_per_s']}", *money, *moved, ""]
    if v is not None:
        reasons = ", ".join(f"{k} {c}" for k, c in v["rejected_by_reason"].items())
        counts = [str(v["accepted"]), str(v["rejected"]), str(v["waiting"])]
        note = f"judged {v['judged']}" + (f"; rejected: {reasons}" if reasons else "")
        return [name, "validator", held, "", *counts, "", "", "", "", *moved, note]
    if tr is not None:
        steps = f"step {tr['step']}" + (f"/{tr['train_steps']}" if tr.get("train_steps") else "")
        return [name, "trainer", held, "", "", "", "", "", "", "", "", *moved, steps]
    return None


def work_view(named: Sequence[tuple[str, dict[str, Any]]]) -> list[RenderableType]:
    """The trainer's line (step, reward, held-out accuracy sampled then greedy, verdicts it
    saw) and a table with a row per node that has a role section; empty when none has."""
    out: list[RenderableType] = [
        trainer_line(st["trainer"]) for _, st in named if st.get("trainer") is not None
    ]
    rows = [r for name, st in named if (r := _work_row(name, st)) is not None]
    if rows:
        table = _table(*WORK_COLUMNS)
        for r in rows:
            table.add_row(*r)
        out.append(table)
    return out


# ---- weight versions ----


def weights_view(header: str, versions: list[dict[str, Any]]) -> list[RenderableType]:
    """``weights ls``: each version's step, size, shards held of shards, and where its
    files are (or ``(partial)`` while a download is incomplete)."""
    table = _table(">version", ">step", ">MiB", ">shards", ">held", "path")
    for v in versions:
        table.add_row(
            str(v["version"]),
            str(v["step"]),
            f"{v['bytes'] / MiB:.1f}",
            str(v["shards"]),
            str(v["held"]),
            v["path"] if v["complete"] else "(partial)",
        )
    return [header, table]


# ---- an account on the ledger ----


def rewards_view(r: dict[str, Any]) -> list[RenderableType]:
    """``rewards``: the account's stake, rewards and verdict counts, and its recent events."""
    rows = [
        ("account", r["address"] + ("  (validator)" if r["is_validator"] else "")),
        ("contract", f"{r['contract']} on chain {r['chain_id']}"),
    ]
    if not r["registered"] and not (r["stake"] or r["locked"] or r["unbonding"]):
        rows.append(("stake", "none (intellect-node stake add AMOUNT registers it)"))
    else:  # a validator's bond is stake too, with no peer key registered
        rows.append(
            (
                "stake",
                f"{eth(r['stake'])} ETH ({eth(r['locked'])} locked as collateral), "
                f"unbonding {eth(r['unbonding'])} ETH",
            )
        )
        if not r["registered"]:
            rows.append(
                (
                    "",
                    "no peer key registered (a validator needs none)"
                    if r["is_validator"]
                    else "no peer key registered (intellect-node stake add AMOUNT registers one)",
                )
            )
        elif not r["registration_valid"]:
            rows.append(("", "the registration signature is NOT valid: nodes will ignore it"))
    rows += [
        ("rewards", f"pending {eth(r['pending'])} ETH, claimable {eth(r['claimable'])} ETH"),
        (
            "work",
            f"accepted {r['accepted']}, rejected {r['rejected']}, slashed {eth(r['slashed'])} ETH",
        ),
    ]
    out: list[RenderableType] = [_fields(rows)]
    if r["history"]:
        table = _table(">block", "event", "detail", "confirmed", title="recent")
        for e in r["history"]:
            detail = ", ".join(
                f"{k}={v}" for k, v in e["args"].items() if k not in ("worker", "account")
            )
            table.add_row(str(e["block"]), e["event"], detail, "yes" if e["confirmed"] else "no")
        out.append(table)
    return out
