"""Rewrite references to the old, one-file SPEC's sections for the split spec (issue #52).

The spec used to be one file, SPEC.md, numbered 1-17, 19, 20 (no 18). It is now three files
with one numbering: SPEC.md (the wire protocol, §1-§17), docs/spec/economics.md (judging
and the ledger, §18-§19) and docs/spec/training.md (training, DiLoCo in the trainer role,
pretraining, §20-§22). ``OLD_TO_NEW`` maps every old section to its new number.

    .venv/bin/python scripts/spec_renumber.py FILE...            # rewrite the files in place
    .venv/bin/python scripts/spec_renumber.py --dry-run FILE...  # only print what would change

It rewrites "SPEC §12.1", "SPEC.md §12", "SPEC section 12", "SPEC.md section 12", "§§19-20",
"§19–20" and a bare "§12" (in this repository "§" means a SPEC section; check a file where it
does not). "SPEC.md §N" whose new N lives in another file becomes "SPEC §N". Each change is
printed as ``file:line: old -> new``. Run it once per file: the old and new numbers overlap
(old §12 is new §19, old §19 is new §16), so a second run would renumber again.

Two old sections were split. Old §14 (the batch exchange) is new §13, but its validators'
schedule, checks and spot checks went to §18; old §11 (proofs of inference) is new §11, but
a reference about the verdict's noise model or false-slash budget means §18.1 (old §11.1).
For these, words in the reference's clause decide (``SPLIT``), and the change is marked
``(split: check)``: read those.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

OLD_TO_NEW: dict[str, str] = {
    "1": "1",
    "2": "2",
    "3": "3",
    "4": "4",
    "5": "5",
    "6": "6",
    "7": "7",
    "8": "8",
    "8.1": "8.1",
    "9": "9",
    "10": "10",
    "11": "11",  # proofs of inference: TOPLOC and the sampler
    "11.1": "18.1",  # the verdict on a batch
    "11.2": "18.2",  # the substitution test
    "12": "19",  # the ledger
    "12.1": "19.1",  # the cheating matrix
    "13": "12",  # tasks and assignment
    "14": "13",  # rollout batch exchange (the validator's part: 18)
    "15": "14",  # SHARDCAST
    "16": "20",  # training
    "17": "15",  # DiLoCo trainer groups (the protocol)
    "17.1": "21",  # DiLoCo in the trainer role
    "17.2": "22",  # pretraining in a DiLoCo group
    "19": "16",  # reachability
    "20": "17",  # relays and hole punching
}

# old section -> (new section, words that pick it: in the reference's clause, up to WINDOW
# characters before it and WINDOW / 2 after, stopping at a "." or ";" that ends a sentence)
SPLIT: dict[str, tuple[str, re.Pattern[str]]] = {
    "14": ("18", re.compile(r"spot|recomput|check\s+order|cheapest\s+first|schedule", re.I)),
    "11": (
        "18.1",
        re.compile(
            r"false.slash|honest.noise|noise\s+model|statistic|RMS|derives\s+the\s+rule", re.I
        ),
    ),
}
WINDOW = 100

# New sections by file: SPEC.md holds 1-17, economics 18-19, training 20-22.
SPEC_FILES = ("SPEC.md", "docs/spec/economics.md", "docs/spec/training.md")


def spec_file(section: str) -> str:
    top = int(section.split(".")[0])
    return SPEC_FILES[0] if top <= 17 else SPEC_FILES[1] if top <= 19 else SPEC_FILES[2]


NUM = r"\d+(?:\.\d+)?"
RANGE = rf"(?P<a>{NUM})(?:(?P<dash>\s?[–-]\s?)(?P<b>{NUM}))?"
# "§12", "§ 12", "§§19–20"; "SPEC section 12", "SPEC.md sections 19-20", across a line break
# and a comment's "#" too.
SIGN = re.compile(rf"(?P<pre>(?P<spec>SPEC(?P<md>\.md)?[\s#*]*)?)(?P<sign>§§?\s?){RANGE}")
WORD = re.compile(rf"(?P<pre>(?P<spec>SPEC(?P<md>\.md)?[\s#*]+))(?P<sign>sections?\s){RANGE}")
BARE_WORD = re.compile(rf"(?P<pre>)(?P<sign>\b[Ss]ections?\s){RANGE}")


@dataclass
class Change:
    line: int
    old: str
    new: str
    split: bool


def new_number(old: str, text: str, start: int, end: int) -> tuple[str, bool]:
    """The new number of old section ``old`` for a reference at text[start:end]."""
    if old in SPLIT:
        other, words = SPLIT[old]
        before = re.split(r"[.;](?:\s|$)", text[max(0, start - WINDOW) : start])[-1]
        after = re.split(r"[.;](?:\s|$)", text[end : end + WINDOW // 2])[0]
        if words.search(before + text[start:end] + after):
            return other, True
        return OLD_TO_NEW[old], True
    return OLD_TO_NEW[old], False


def rewrite(text: str, *, bare_sections: bool = False) -> tuple[str, list[Change]]:
    """``text`` with its SPEC section references renumbered, and the changes made.

    ``bare_sections``: also rewrite "section 12" without "SPEC" before it (the spec's own
    files say so)."""
    changes: list[Change] = []
    patterns = [SIGN, WORD] + ([BARE_WORD] if bare_sections else [])

    def one(m: re.Match[str]) -> str:
        a, b = m["a"], m["b"]
        if a not in OLD_TO_NEW or (b is not None and b not in OLD_TO_NEW):
            print(f"  unknown old section in {m[0]!r}: left alone", file=sys.stderr)
            return m[0]
        new_a, split_a = new_number(a, text, m.start(), m.end())
        new_b, split_b = new_number(b, text, m.start(), m.end()) if b else (None, False)
        pre = m["pre"]
        if m.groupdict().get("md") and spec_file(new_a) != SPEC_FILES[0]:
            pre = pre.replace("SPEC.md", "SPEC", 1)  # SPEC.md has no such section now
        out = pre + m["sign"] + new_a + (m["dash"] + new_b if new_b else "")
        if out != m[0] or split_a or split_b:  # a split section's reference: shown even so
            line = text.count("\n", 0, m.start()) + 1
            changes.append(Change(line, m[0], out, split_a or split_b))
        return out

    # Every match first, then one substitution pass, so no reference is renumbered twice.
    spans: list[tuple[int, int, re.Match[str]]] = []
    for p in patterns:
        for m in p.finditer(text):
            if not any(s < m.end() and m.start() < e for s, e, _ in spans):
                spans.append((m.start(), m.end(), m))
    spans.sort(key=lambda s: s[0])
    out, pos = [], 0
    for s, e, m in spans:
        out.append(text[pos:s])
        out.append(one(m))
        pos = e
    out.append(text[pos:])
    changes.sort(key=lambda c: c.line)
    return "".join(out), changes


def rewrite_file(path: Path, *, dry_run: bool = False, bare_sections: bool = False) -> int:
    """Rewrite ``path`` in place (unless ``dry_run``); print and count the changes."""
    text = path.read_text()
    new, changes = rewrite(text, bare_sections=bare_sections)
    for c in changes:
        mark = "  (split: check)" if c.split else ""
        print(f"{path}:{c.line}: {c.old!r} -> {c.new!r}{mark}")
    if new != text and not dry_run:
        path.write_text(new)
    return len(changes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--dry-run", action="store_true", help="print the changes only")
    parser.add_argument(
        "--bare-sections",
        action="store_true",
        help='also rewrite "section N" without "SPEC" before it (the spec files)',
    )
    args = parser.parse_args(argv)
    total = sum(
        rewrite_file(f, dry_run=args.dry_run, bare_sections=args.bare_sections) for f in args.files
    )
    print(f"{total} reference(s) in {len(args.files)} file(s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
