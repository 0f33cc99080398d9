"""``intellect-node weights publish|pull|ls``: SHARDCAST by hand, through the running node.

The node (``intellect-node start``) does the work: ``publish`` asks the trainer's node to
sign and serve a checkpoint directory as the next version; ``pull`` asks a node to fetch a
version (default: the newest any peer holds) and follows it with a progress bar (bytes,
rate, peers) on a terminal, or one log line every couple of seconds otherwise; ``ls`` lists
the versions a node holds (read from its data dir when it is not running). Only argparse is
imported at start, so ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from node.cli.adminclient import admin_get, admin_post, data_dir

MiB = 1024 * 1024


def add_weights_parsers(sub: Any) -> None:
    weights = sub.add_parser(
        "weights", help="publish, pull and list checkpoint versions (SHARDCAST over libp2p)"
    )
    wsub = weights.add_subparsers(dest="weights_command", required=True, metavar="ACTION")
    pub = wsub.add_parser("publish", help="sign and serve a checkpoint directory (trainer node)")
    pub.add_argument("dir", type=Path, help="checkpoint directory (safetensors, config, tokenizer)")
    pub.add_argument("--version", type=int, help="version number (default: newest known + 1)")
    pub.add_argument("--step", type=int, help="training step (default: the version)")
    pull = wsub.add_parser("pull", help="fetch a version from the peers that hold it")
    pull.add_argument("--version", type=int, help="version (default: the newest any peer holds)")
    pull.add_argument(
        "--timeout", type=float, default=0, help="give up after this many seconds (0: never)"
    )
    ls = wsub.add_parser("ls", help="list the versions this node holds")
    ls.add_argument("--json", action="store_true", help="print the raw JSON")
    for p in (pub, pull, ls):
        p.add_argument("--data-dir", type=Path, help="the node's data dir")
        p.add_argument("--name", help="the node's name (data dir ~/.intellect-node/<name>)")


def cmd_weights(args: argparse.Namespace) -> int:
    commands = {"publish": _publish, "pull": _pull, "ls": _ls}
    return commands[args.weights_command](args)


def _publish(args: argparse.Namespace) -> int:
    body = {"dir": str(Path(args.dir).resolve()), "version": args.version, "step": args.step}
    r = admin_post(data_dir(args), "/weights/publish", body, timeout=3600)
    print(
        f"published version {r['version']} (step {r['step']}): {r['bytes']} bytes, "
        f"{r['files']} files, {r['shards']} shards, digest {r['digest'][:16]}…"
    )
    print(f"  served from {r['path']}")
    return 0


def _get(directory: Path) -> dict[str, Any]:
    st: dict[str, Any] = admin_get(directory, "/weights", timeout=30)
    return st


def format_progress(job: dict[str, Any], *, tty: bool, width: int = 30) -> str:
    """One progress line: a bar on a terminal, key=value text otherwise."""
    total = max(job["total_bytes"], 1)
    frac = job["done_bytes"] / total
    peers = sum(1 for p in job["peers"].values() if p["bytes"] > 0)
    rate = job["rate_Bps"] / 1e6
    done_mib, total_mib = job["done_bytes"] / MiB, job["total_bytes"] / MiB
    banned = len(job["banned"])
    if tty:
        filled = int(frac * width)
        bar = "#" * filled + "." * (width - filled)
        return (
            f"v{job['version']} [{bar}] {frac * 100:5.1f}% {done_mib:.1f}/{total_mib:.1f} MiB "
            f"{rate:6.1f} MB/s peers {peers}" + (f" banned {banned}" if banned else "")
        )
    return (
        f"pull version={job['version']} state={job['state']} done={frac * 100:.1f}% "
        f"bytes={job['done_bytes']}/{job['total_bytes']} rate_MBps={rate:.1f} peers={peers} "
        f"banned={banned} resumed_shards={job['resumed_shards']}"
    )


def _pull(args: argparse.Namespace) -> int:
    directory = data_dir(args)
    version = admin_post(directory, "/weights/pull", {"version": args.version}, timeout=120)[
        "version"
    ]
    tty = sys.stdout.isatty()
    started, last_line = time.monotonic(), 0.0
    while True:
        st = _get(directory)
        job = st["downloads"].get(str(version))
        held = next((v for v in st["versions"] if v["version"] == version), None)
        if job is None and held and held["complete"]:
            print(f"version {version} already held: {held['path']}")
            return 0
        if job is not None:
            now = time.monotonic()
            if tty:
                print("\r" + format_progress(job, tty=True), end="", flush=True)
            elif now - last_line >= 2 or job["state"] != "downloading":
                print(format_progress(job, tty=False), flush=True)
                last_line = now
            if job["state"] == "complete":
                path = held["path"] if held else ""
                print(("\n" if tty else "") + f"version {version} complete: {path}")
                return 0
            if job["state"] == "failed":
                print(("\n" if tty else "") + f"version {version} failed: {job['error']}")
                return 1
        if args.timeout and time.monotonic() - started > args.timeout:
            print(f"\ngave up on version {version} after {args.timeout:.0f} s", file=sys.stderr)
            return 1
        time.sleep(0.2 if tty else 0.5)


def _ls(args: argparse.Namespace) -> int:
    import json

    directory = data_dir(args)
    try:
        st = _get(directory)
        versions = st["versions"]
        header = f"current {st['current']}  newest known {st['newest_known']}  keep {st['keep']}"
    except (RuntimeError, OSError):  # no node running: read the store as it is on disk
        versions = _offline_versions(directory / "weights")
        header = "(node not running: listing the data dir)"
    if args.json:
        print(json.dumps(versions, indent=2))
        return 0
    print(header)
    print(f"{'version':>8} {'step':>8} {'MiB':>10} {'shards':>7} {'held':>7}  path")
    for v in versions:
        state = v["path"] if v["complete"] else "(partial)"
        print(
            f"{v['version']:>8} {v['step']:>8} {v['bytes'] / MiB:>10.1f} {v['shards']:>7} "
            f"{v['held']:>7}  {state}"
        )
    return 0


def _offline_versions(root: Path) -> list[dict[str, Any]]:
    from protocol.errors import WireError
    from protocol.shardcast import WeightManifest
    from protocol.wire import open_message

    out = []
    for path in sorted(root.glob("*v[0-9]*")) if root.exists() else []:
        complete = not path.name.startswith(".")
        try:
            m = open_message((path / "manifest.sig").read_bytes(), WeightManifest)
        except (OSError, WireError):
            continue
        held = m.num_shards
        if not complete:
            journal = path / "done"
            held = (
                len(
                    set(
                        journal.read_bytes()[i : i + 4] for i in range(0, journal.stat().st_size, 4)
                    )
                )
                if journal.exists()
                else 0
            )
        out.append(
            {
                "version": m.version,
                "step": m.step,
                "bytes": m.total_size,
                "shards": m.num_shards,
                "held": held,
                "complete": complete,
                "path": str(path / "files") if complete else None,
            }
        )
    return sorted(out, key=lambda v: v["version"])
