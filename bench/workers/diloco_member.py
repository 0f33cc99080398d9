"""One member of ``bench/diloco.py``'s DiLoCo group, as its own process (not a benchmark).

    python bench/workers/diloco_member.py --dir D --leader PEER --index K --members N \
        [--bootstrap ADDR] [--seed S] [--hidden 64] [--layers 2] [--batch 8] [--seq 64] \
        [--inner 10]

A real libp2p node on 127.0.0.1 (trainer role) with ``node.diloco``'s ``DilocoGroup`` and
``Member``: the same code the trainer role runs. It writes its address to ``D/addr``, then
runs *segments* as the parent asks: it waits for ``D/../segment-{k}.json`` (``outer``: outer
steps to run, ``encoding``: ``int8`` | ``fp32`` ring or ``sparse-<k>`` all-gather,
``bandwidth``: bytes/s of the simulated slow link or null, ``stop``), runs them, appends one
JSON line per outer step to ``D/steps.jsonl`` and writes ``D/done-{k}``.

The link: every ring chunk crosses a real libp2p stream between the processes; with a
``bandwidth`` the member then sleeps ``len(chunk) / bandwidth`` seconds after each pull
(the chunk's exact payload bytes), as a slower link would have delivered it later.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import torch  # noqa: E402
import trio  # noqa: E402
from diloco import corpus_bytes, make_model  # noqa: E402

from node.config import NodeConfig  # noqa: E402
from node.diloco.codecs import compressor  # noqa: E402
from node.diloco.group import DilocoGroup, GroupConfig, Key  # noqa: E402
from node.diloco.inner import Corpus, InnerConfig, inner_step, make_optimizer  # noqa: E402
from node.diloco.member import Member  # noqa: E402
from node.diloco.outer import OuterConfig, OuterState  # noqa: E402
from node.keystore import load_or_create_identity  # noqa: E402
from node.logs import setup_logging  # noqa: E402
from node.net.runtime import Node  # noqa: E402


class ThrottledGroup(DilocoGroup):
    """The group, with each pulled chunk delayed as a link of ``bandwidth`` bytes/s would."""

    bandwidth: float | None = None

    async def _pull_once(self, left: str, key: Key, phase: str, rnd: int) -> bytes | None:
        data = await super()._pull_once(left, key, phase, rnd)
        if data is not None and self.bandwidth:
            await trio.sleep(len(data) / self.bandwidth)
        return data


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--leader", required=True)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--members", type=int, required=True)
    p.add_argument("--bootstrap", action="append", default=[])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--inner", type=int, default=10)
    return p.parse_args()


async def wait_for(path: Path) -> dict:
    """The JSON object in ``path``, once the parent wrote it."""
    file = trio.Path(path)
    while True:
        if await file.exists():
            return json.loads(await file.read_text())
        await trio.sleep(0.05)


async def main(args: argparse.Namespace) -> None:
    cfg = NodeConfig(
        role="trainer",
        data_dir=args.dir,
        run={"id": "bench-diloco", "trainer_peer_id": args.leader},
        net={
            "listen": ["/ip4/127.0.0.1/tcp/0"],
            "bootstrap": args.bootstrap,
            "heartbeat_interval": 0.5,
            "peer_ttl": 10,
            "discovery_interval": 0.5,
            "read_timeout": 10,
            "connect_timeout": 10,
        },
    )
    node = Node(cfg, load_or_create_identity(args.dir))
    model = make_model(args.seed, args.hidden, args.layers)
    inner_cfg = InnerConfig(batch=args.batch, seq_len=args.seq)
    opt = make_optimizer(model, inner_cfg)
    corpus = Corpus(corpus_bytes()[0], seed=args.seed, shard=args.index)
    group = ThrottledGroup(
        node,
        GroupConfig(
            leader=args.leader,
            min_members=args.members,
            sync_timeout=300,
            round_timeout=120,
            step_timeout=600,
            provide_every=5.0,
            poll_interval=0.02,  # ask the leader for the roster often: less idle in the sync
        ),
    )
    outer = OuterState.of(model, OuterConfig())

    def inner() -> float:
        return inner_step(model, opt, corpus.batch(inner_cfg.batch, inner_cfg.seq_len), inner_cfg)

    member = Member(model, outer, group, inner, opt, corpus, args.inner)
    async with trio.open_nursery() as nursery:
        await nursery.start(node.serve)
        adverts = trio.CancelScope()  # group.serve provides our DHT key until cancelled

        async def serve_group(
            task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
        ) -> None:
            with adverts:
                await group.serve(task_status=task_status)

        await nursery.start(serve_group)
        (args.dir / "addr").write_text(f"{node.addrs[0]}/p2p/{node.peer_id}")
        with (args.dir / "steps.jsonl").open("a") as out:
            for k in range(1_000):
                seg = await wait_for(args.dir.parent / f"segment-{k}.json")
                if seg.get("stop"):
                    break
                group.cfg = dataclasses.replace(group.cfg, compressor=compressor(seg["encoding"]))
                group.bandwidth = seg["bandwidth"]
                for _ in range(seg["outer"]):
                    rec = await member.outer_step()
                    out.write(json.dumps({"segment": k, **rec.__dict__}) + "\n")
                    out.flush()
                (args.dir / f"done-{k}").write_text("1")
        await trio.sleep(1)  # a slower neighbour may still pull our last offer
        adverts.cancel()
        node.request_stop()


if __name__ == "__main__":
    a = parse()
    torch.set_num_threads(1)
    setup_logging("WARNING", "diloco-bench")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    trio.run(main, a)
