"""The configuration reference (docs/CONFIG.md), generated from ``node.config.NodeConfig``.

Every setting with its type, default, bounds, environment variable, ``intellect-node start``
flags (named by ``node.cli.flags``, which generates the start command's flags from the same
model, so the two cannot drift), description and old flat name, under a heading per
section (the section model's docstring says what it is about).

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

from node.cli.flags import flag_strings  # noqa: E402
from node.config import Setting, section_models, settings  # noqa: E402

HEADER = """\
# Configuration reference

Generated from `node.config.NodeConfig` by `scripts/config_reference.py`; do not edit by
hand (`.venv/bin/python scripts/config_reference.py > docs/CONFIG.md` regenerates it, and
a test fails when it is out of date).

A node's settings are a few top-level keys and one section per part of the node. They
come from, in increasing precedence: the defaults below, a TOML file (`intellect-node
start --config FILE`: the top-level keys, then a `[section]` table each), the environment
(`INTELLECT_NODE_<SECTION>__<SETTING>` in upper case, `INTELLECT_NODE_<SETTING>` for a
top-level key; lists comma-separated; booleans `true` / `false`) and the flags of
`intellect-node start`, one per setting, `--<section>.<setting>` with dashes (a list flag
is repeated; a boolean flag alone means `true`; a few settings also have a short flag):
flag > environment > TOML file > default. `intellect-node start --print-config` prints the
resolved configuration in this file's form and exits.

```toml
# node.toml: intellect-node start --config node.toml
role = "inference"

[run]
model = "/models/tiny"
trainer_peer_id = "12D3KooW..."

[net]
bootstrap = ["/ip4/203.0.113.7/tcp/4001/p2p/12D3KooW..."]

[chain]
url = "http://127.0.0.1:8545"
contract = "0x..."
id = 131277322940537
```

The ledger commands (`stake`, `rewards`) read the `[chain]` section from the same file and
environment (`--config`), and fall back to the local development chain's `chain.json`;
`intellect-node start` does not fall back: a role that uses the ledger needs `[chain]
contract` and `id` set.

Settings were once flat (`heartbeat_interval`, `INTELLECT_NODE_HEARTBEAT_INTERVAL`,
`--heartbeat-interval`); an old key is refused with one line naming its new place.
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
    """Setting place -> its ``intellect-node start`` flags (every setting has one, a few
    a short one beside it), as ``node.cli.flags`` declares them."""
    return {s.path: ", ".join(flag_strings(s)) for s in settings()}


def cell(text: str) -> str:
    """One table cell: one line, pipes escaped, ``<`` kept from being read as HTML."""
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;")


def field_row(setting: Setting, flags: dict[str, str]) -> str:
    field = setting.field
    kind = f"`{type_text(field.annotation)}`"
    bounds = bounds_text(field)
    if bounds:
        kind += f"; {bounds}"
    flag = ", ".join(f"`{f}`" for f in flags[setting.path].split(", "))
    was = f" Was `{setting.was}`." if setting.was and setting.was != setting.name else ""
    return (
        f"| `{setting.name}` | {cell(kind)} | {default_text(field)} | `{setting.env}` | {flag} "
        f"| {cell((field.description or '(no description)') + was)} |"
    )


def grouped() -> list[tuple[str, str, list[Setting]]]:
    """(title, note, settings): the top-level keys, then each section, in the model's order."""
    notes = {name: " ".join((m.__doc__ or "").split()) for name, m in section_models().items()}
    top = [s for s in settings() if s.section is None]
    out = [("Top level", "Who this node is and where it keeps its files.", top)]
    for name, note in notes.items():
        out.append((f"[{name}]", note, [s for s in settings() if s.section == name]))
    return out


def render() -> str:
    flags = start_flags()
    groups = grouped()
    lines = [HEADER]
    lines.append("Sections: " + ", ".join(f"[{t}](#{anchor(t)})" for t, _, _ in groups) + ".\n")
    for title, note, members in groups:
        lines.append(f"## {title}\n")
        lines.append(f"{note}\n")
        lines.append("| setting | type | default | environment | flag | description |")
        lines.append("| --- | --- | --- | --- | --- | --- |")
        lines.extend(field_row(s, flags) for s in members)
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
