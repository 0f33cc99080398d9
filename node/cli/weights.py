"""``intellect-node weights publish|pull|ls``: SHARDCAST by hand, through the running node.

The node (``intellect-node start``) does the work: ``publish`` asks the trainer's node to
sign and serve a checkpoint directory as the next version; ``pull`` asks a node to fetch a
version (default: the newest any peer holds) and follows it with a progress bar (bytes,
rate, peers; ``node/cli/progress.py``) on a terminal, or one log line every couple of
seconds otherwise; ``ls`` lists the versions a node holds (read from its data dir when it is
not running) as a table. Only argparse is imported at start, so ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from node.cli.adminclient import admin_get, admin_post, data_dir
from node.cli.progress import BYTES, progress


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


def pull_info(job: dict[str, Any]) -> str:
    """What a pull's progress shows besides bytes: the rate the node measures, the peers
    that sent bytes, the peers banned, the shards resumed from an earlier run."""
    peers = sum(1 for p in job["peers"].values() if p["bytes"] > 0)
    text = f"{job['rate_Bps'] / 1e6:.1f} MB/s, {peers} peers"
    if job["banned"]:
        text += f", {len(job['banned'])} banned"
    if job["resumed_shards"]:
        text += f", {job['resumed_shards']} shards resumed"
    return text


def failure(job: dict[str, Any]) -> str:
    """A failed download, and when the node tries again (its own disk failed it)."""
    version = job["version"]
    text = f"version {version} failed: {job['error'].removeprefix(f'version {version}: ')}"
    if job.get("retry_in_s") is not None:
        kept = (
            f", keeping the {job['done_shards']} shards it verified" if job["done_shards"] else ""
        )
        text += f" (the node tries again in {job['retry_in_s']:.0f} s{kept})"
    return text


def _pull(args: argparse.Namespace) -> int:
    directory = data_dir(args)
    version = admin_post(directory, "/weights/pull", {"version": args.version}, timeout=120)[
        "version"
    ]
    started = time.monotonic()
    with progress(f"pull v{version}", unit=BYTES) as bar:
        while True:
            st = _get(directory)
            job = st["downloads"].get(str(version))
            held = next((v for v in st["versions"] if v["version"] == version), None)
            if job is None and held and held["complete"]:
                outcome = (0, f"version {version} already held: {held['path']}")
                break
            if job is not None:
                bar.update(job["done_bytes"], total=job["total_bytes"], info=pull_info(job))
                if job["state"] == "complete":
                    outcome = (0, f"version {version} complete: {held['path'] if held else ''}")
                    break
                if job["state"] == "failed":
                    outcome = (1, failure(job))
                    break
            if args.timeout and time.monotonic() - started > args.timeout:
                outcome = (1, f"gave up on version {version} after {args.timeout:.0f} s")
                break
            time.sleep(0.2)
    code, message = outcome
    print(message, file=sys.stderr if code else sys.stdout)
    return code


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
    from node.cli.tables import show, weights_view

    show(*weights_view(header, versions))
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
