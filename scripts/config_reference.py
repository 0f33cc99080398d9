"""The configuration reference (docs/CONFIG.md), generated from ``node.config.NodeConfig``.

Every field with its type, default, bounds, environment variable, ``intellect-node start``
flag (named by ``node.cli.flags``, which generates the start command's flags from the same
model, so the two cannot drift) and description, grouped by what it is about. A field no group names lands under "Other"
so it is never missing.

    .venv/bin/python scripts/config_reference.py > docs/CONFIG.md   # regenerate
    .venv/bin/python scripts/config_reference.py --check docs/CONFIG.md  # exit 1 if stale
"""

from __future__ import annotations

import argparse
import sys
import types
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pydantic.fields import FieldInfo  # noqa: E402

from node.cli.flags import flag_name  # noqa: E402
from node.config import ENV_PREFIX, NodeConfig  # noqa: E402

# (title, one line on who needs it, fields in reading order)
GROUPS: list[tuple[str, str, list[str]]] = [
    (
        "Node",
        "Who this node is and where it keeps its files.",
        ["role", "name", "data_dir", "run_id", "log_level", "admin_port"],
    ),
    (
        "Network",
        "libp2p transport, discovery, presence and gossip. The defaults suit most nodes; "
        "a bootstrap node wants a fixed `listen` port.",
        [
            "listen",
            "bootstrap",
            "heartbeat_interval",
            "peer_ttl",
            "presence_rate",
            "discovery_interval",
            "discovery_max_interval",
            "conn_low",
            "conn_high",
            "peers_per_role",
            "read_timeout",
            "connect_timeout",
            "peer_max_streams",
            "peer_request_rate",
            "peer_request_burst",
            "peer_presence_rate",
            "peer_presence_streams",
            "peer_shun_cooldown",
            "max_clock_skew",
            "gossip_rate",
            "gossip_queue",
            "announce_buffer",
        ],
    ),
    (
        "Ledger",
        "The chain and contract of the run (inference, validator and trainer roles). "
        "`intellect-node chain` prints them for the local development chain, and writes "
        "them to `~/.intellect-node/chain/chain.json`.",
        ["chain", "contract", "contract_block", "chain_id", "chain_confirmations", "stake"],
    ),
    (
        "Weights (SHARDCAST)",
        "Who may publish policy versions, how far workers may lag, and how shards move.",
        [
            "trainer_peer_id",
            "async_level",
            "shard_size",
            "download_slots",
            "upload_slots",
            "upload_rate",
            "follow_weights",
        ],
    ),
    (
        "Work",
        "The run's model, tasks and verification. Every node of a run must use the same "
        "`taskset`, `tasks_per_batch`, `group_size`, `max_new_tokens`, `temperature` and "
        "`verify_profile`: a validator checks a batch against them.",
        [
            "model",
            "verify_profile",
            "taskset",
            "tasks_per_batch",
            "group_size",
            "max_new_tokens",
            "temperature",
            "engine_batch",
            "torch_threads",
            "max_unjudged",
            "spot_check",
        ],
    ),
    (
        "Training",
        "The trainer role only.",
        [
            "train_steps",
            "batches_per_step",
            "step_wait",
            "learning_rate",
            "train_procs",
            "train_device",
            "diloco",
            "diloco_inner_steps",
            "diloco_outer_lr",
            "diloco_momentum",
            "diloco_quant",
            "diloco_members",
            "diloco_admit",
            "objective",
            "data",
            "pretrain_seq_len",
            "pretrain_batch",
            "eval_every",
            "heldout_per_level",
            "heldout_draws",
            "seed",
        ],
    ),
    (
        "Development and tests only",
        "Not for a real run.",
        ["network_only"],
    ),
]

HEADER = """\
# Configuration reference

Generated from `node.config.NodeConfig` by `scripts/config_reference.py`; do not edit by
hand (`.venv/bin/python scripts/config_reference.py > docs/CONFIG.md` regenerates it, and
a test fails when it is out of date).

A node's settings come from, in increasing precedence: the defaults below, a TOML file
(`intellect-node start --config FILE`, keys are the setting names), the environment
(`INTELLECT_NODE_<SETTING>` in upper case; lists comma-separated; booleans `true` /
`false`) and the flags of `intellect-node start`, one per setting (a list flag is
repeated; a boolean flag alone means `true`): flag > environment > TOML file > default.
`intellect-node start --print-config` prints the resolved configuration and exits.

```toml
# node.toml: intellect-node start --config node.toml
role = "inference"
bootstrap = ["/ip4/203.0.113.7/tcp/4001/p2p/12D3KooW..."]
model = "/models/tiny"
trainer_peer_id = "12D3KooW..."
chain = "http://127.0.0.1:8545"
contract = "0x..."
chain_id = 131277322940537
```

The ledger commands (`stake`, `rewards`) read `chain`, `contract`, `contract_block` and
`chain_id` from the same file and environment (`--config`), and fall back to the local
development chain's `chain.json`; `intellect-node start` does not fall back: a role that
uses the ledger needs `contract` and `chain_id` set.
"""


def type_text(annotation: Any) -> str:
    """A Python annotation as a reader writes it: ``int``, ``str | None``, ``list[str]``,
    ``"a" | "b"`` for a Literal."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(f'"{a}"' for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_text(a) for a in args)
    if origin is list:
        return f"list[{type_text(args[0])}]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))


def default_text(field: FieldInfo) -> str:
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, list):
        return "`[" + ", ".join(f'"{v}"' for v in value) + "]`"
    if isinstance(value, int) and value >= 1 << 20 and value % (1 << 20) == 0:
        return f"`{value}` ({value >> 20} MiB)"
    return f"`{value}`"


def number(x: float) -> str:
    """``65536``, ``0.1``: integers without a decimal point or an exponent."""
    return str(int(x)) if float(x).is_integer() else str(x)


def bounds_text(field: FieldInfo) -> str:
    parts = []
    for m in field.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            if getattr(m, attr, None) is not None:
                parts.append(f"{sign} {number(getattr(m, attr))}")
        if getattr(m, "pattern", None):
            parts.append(f"matches `{m.pattern}`")
    return ", ".join(parts)


def start_flags() -> dict[str, str]:
    """Setting name -> its ``intellect-node start`` flag (every setting has one)."""
    return {name: flag_name(name) for name in NodeConfig.model_fields}


def cell(text: str) -> str:
    """One table cell: one line, pipes escaped, ``<`` kept from being read as HTML."""
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;")


def field_row(name: str, field: FieldInfo, flags: dict[str, str]) -> str:
    kind = f"`{type_text(field.annotation)}`"
    bounds = bounds_text(field)
    if bounds:
        kind += f"; {bounds}"
    flag = f"`{flags[name]}`"
    env = f"`{ENV_PREFIX}{name.upper()}`"
    return (
        f"| `{name}` | {cell(kind)} | {default_text(field)} | {env} | {flag} "
        f"| {cell(field.description or '(no description)')} |"
    )


def grouped() -> list[tuple[str, str, list[str]]]:
    """GROUPS restricted to fields that exist, plus "Other" for fields no group names."""
    fields = NodeConfig.model_fields
    named = {n for _, _, names in GROUPS for n in names}
    out = [(t, note, [n for n in names if n in fields]) for t, note, names in GROUPS]
    other = [n for n in fields if n not in named]
    if other:
        out.append(("Other", "Settings not yet placed in a group above.", other))
    return [g for g in out if g[2]]


def render() -> str:
    fields = NodeConfig.model_fields
    flags = start_flags()
    groups = grouped()
    lines = [HEADER]
    lines.append("Groups: " + ", ".join(f"[{t}](#{anchor(t)})" for t, _, _ in groups) + ".\n")
    for title, note, names in groups:
        lines.append(f"## {title}\n")
        lines.append(f"{note}\n")
        lines.append("| setting | type | default | environment | flag | description |")
        lines.append("| --- | --- | --- | --- | --- | --- |")
        lines.extend(field_row(n, fields[n], flags) for n in names)
        lines.append("")
    return "\n".join(lines)


def anchor(title: str) -> str:
    """GitHub's heading anchor: lower case, spaces to dashes, punctuation dropped."""
    kept = "".join(c for c in title.lower() if c.isalnum() or c in " -")
    return kept.replace(" ", "-")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Print the configuration reference (Markdown).")
    p.add_argument(
        "--check", type=Path, metavar="FILE", help="exit 1 if FILE differs from the output"
    )
    args = p.parse_args(argv)
    text = render()
    if args.check is None:
        sys.stdout.write(text)
        return 0
    try:
        current = args.check.read_text()
    except FileNotFoundError:
        current = ""
    if current != text:
        print(
            f"{args.check} is out of date: run "
            f".venv/bin/python scripts/config_reference.py > {args.check}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
