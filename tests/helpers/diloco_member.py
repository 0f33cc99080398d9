"""A DiLoCo member as its own process, for tests: a real node, the tiny model, pretraining.

    python -m tests.helpers.diloco_member --dir D --leader PEER [--bootstrap ADDR] ...

It starts a libp2p node (trainer role, network only), writes its address to ``D/addr``,
runs ``--outer-steps`` outer steps of ``--inner-steps`` AdamW steps each on its own shard of
a random byte corpus, and appends one JSON line per outer step to ``D/steps.jsonl``
(outer step, parameter hash, roster, attempts). ``--pause-at STEP`` makes it write
``D/paused`` and sleep before its first reduce-scatter pull of that step (so a test can kill
it during the all-reduce). ``--admit A,B`` (leader): admit only these peers.
``--join-at K``: join the running group at outer step K or later, recovering its state from
the leader over SHARDCAST after finding the group in the DHT (written to
``D/recovered.json``). ``--cheat-at K``: at outer step K send its pseudo-gradient × 1000 while declaring its true
norm (``--cheat-with norm``, the default), or (``--cheat-with range``, a sparse encoding)
serve its own payload with every position past the end of the vector's last block (out of
range: it does not decode). ``--leave-after K``: leave the group after outer step K, staying up 40 s.
``--outsider``: not a member; it tries to pull the leader's first ring chunk and to sync
with the leader, and writes the refusal reasons it got to ``D/outsider.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import traceback
from dataclasses import replace
from pathlib import Path

import torch
import trio

from node.config import NodeConfig
from node.diloco.chunks import serve_chunk
from node.diloco.codecs import compressor
from node.diloco.group import DilocoGroup, GroupConfig, GroupError
from node.diloco.inner import Corpus, InnerConfig, inner_step, make_optimizer
from node.diloco.member import Member
from node.diloco.outer import OuterConfig, OuterState, params_hash
from node.diloco.quant import Compressor
from node.diloco.ring import Outbox
from node.diloco.sparse import BLOCK, CODES, POS_BITS, Sparse
from node.keystore import load_or_create_identity
from node.logs import setup_logging
from node.net.requests import RemoteRefusal
from node.net.runtime import Node
from protocol.diloco import DILOCO, DilocoChunk, DilocoRequest, DilocoRoster
from protocol.shardcast import MIN_SHARD
from tests.helpers.tiny_lm import tiny_llama


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--leader", required=True)
    p.add_argument("--bootstrap", action="append", default=[])
    p.add_argument("--shard", type=int, default=0)
    p.add_argument("--min-members", type=int, default=1)
    p.add_argument("--outer-steps", type=int, default=2)
    p.add_argument("--inner-steps", type=int, default=2)
    p.add_argument("--encoding", default="int8")
    p.add_argument("--outer-lr", type=float, default=0.7)
    p.add_argument("--outer-momentum", type=float, default=0.9)
    p.add_argument("--pause-at", type=int, default=-1)
    p.add_argument("--admit", default="")
    p.add_argument("--outsider", action="store_true")
    p.add_argument("--join-at", type=int, default=-1)
    p.add_argument("--cheat-at", type=int, default=-1)
    p.add_argument("--cheat-with", choices=("norm", "range"), default="norm")
    p.add_argument("--leave-after", type=int, default=-1)
    p.add_argument("--resync-timeout", type=float, default=10.0)
    # the leader: after its last step, serve until DIR/stop exists (the test creates it
    # once every other member has ended), so that a member still failing its last attempt
    # is answered, not left asking a leader that is gone
    p.add_argument("--hold", action="store_true")
    return p.parse_args()


def node_config(args: argparse.Namespace) -> NodeConfig:
    return NodeConfig(
        role="trainer",
        data_dir=args.dir,
        run={"id": "test-run", "trainer_peer_id": args.leader},
        net={
            "listen": ["/ip4/127.0.0.1/tcp/0"],
            "bootstrap": args.bootstrap,
            "heartbeat_interval": 0.5,
            "peer_ttl": 6,
            "discovery_interval": 0.5,
            "read_timeout": 5,
            "connect_timeout": 5,
            "presence_rate": 1000,
        },
    )


async def main(args: argparse.Namespace) -> None:
    cfg = node_config(args)
    node = Node(cfg, load_or_create_identity(args.dir))
    torch.manual_seed(0)
    model = tiny_llama(0, layers=1, hidden=32)
    inner_cfg = InnerConfig(batch=4, seq_len=32)
    opt = make_optimizer(model, inner_cfg)
    corpus = Corpus(bytes(torch.randint(0, 256, (4096,)).tolist()), seed=1, shard=args.shard)

    codec = compressor(args.encoding)
    first = "rs" if codec.summable else "ag"  # the first phase of the exchange

    async def before_pull(step: int, attempt: int, phase: str, rnd: int) -> None:
        if step == args.pause_at and attempt == 0 and (phase, rnd) == (first, 0):
            (args.dir / "paused").write_text("1")
            await trio.sleep_forever()

    group = (Cheater if args.cheat_at >= 0 else DilocoGroup)(
        node,
        GroupConfig(
            leader=args.leader,
            compressor=codec,
            min_members=args.min_members,
            sync_timeout=60,
            resync_timeout=args.resync_timeout,
            round_timeout=10,
            step_timeout=300,
            admit=frozenset(args.admit.split(",")) if args.admit else None,
            provide_every=10.0,
            find_timeout=60.0,
            state_shard=MIN_SHARD,  # a state of several shards, as a large model's
        ),
        before_pull=before_pull,
    )
    group.cheat_at = args.cheat_at  # type: ignore[attr-defined]
    group.cheat_with = args.cheat_with  # type: ignore[attr-defined]
    outer = OuterState.of(model, OuterConfig(args.outer_lr, args.outer_momentum))

    def inner() -> float:
        return inner_step(model, opt, corpus.batch(inner_cfg.batch, inner_cfg.seq_len), inner_cfg)

    member = Member(model, outer, group, inner, opt, corpus, args.inner_steps)
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
        if args.outsider:
            await outsider(node, args)
            adverts.cancel()
            node.request_stop()
            return
        with (args.dir / "steps.jsonl").open("a") as out:
            try:
                if args.join_at >= 0:
                    step, digest = await member.join(args.join_at)
                    pulled = member.recovered
                    assert pulled is not None
                    recovered = {
                        "step": step,
                        "state": digest,
                        "position": corpus.position,
                        "found": sorted(member.found),  # the group's providers in the DHT
                        "via": pulled.via,
                        "signer": pulled.signer,
                        "shards": pulled.shards,
                        "fetched": pulled.fetched,
                        "hash": member.state_hash(),  # θ, to compare with the model's
                        "model": params_hash(list(model.parameters())),
                    }
                    (args.dir / "recovered.json").write_text(json.dumps(recovered))
                while member.outer.step < args.outer_steps:
                    rec = await member.outer_step()
                    out.write(json.dumps(rec.__dict__) + "\n")
                    out.flush()
                    if member.outer.step == args.leave_after:
                        await group.leave()  # out of the group, still up in the run
                        await trio.sleep(40)
                        break
            except GroupError as exc:
                (args.dir / "refused").write_text(str(exc))
            except Exception:  # for the test's message: why a member ended neither way
                (args.dir / "crashed").write_text(traceback.format_exc())
                raise
        for _ in range(1500 if args.hold else 0):  # 300 s at most
            if (args.dir / "stop").exists():
                break
            await trio.sleep(0.2)
        (args.dir / "status.json").write_text(json.dumps(group.status()))
        # keep serving a little: a slower neighbour may still pull our last offer
        await trio.sleep(2)
        adverts.cancel()
        node.request_stop()


log = logging.getLogger("intellect.diloco")


class Cheater(DilocoGroup):
    cheat_at = -1
    cheat_with = "norm"

    async def all_reduce(self, step, vec, state, layout, norm=None):  # type: ignore[no-untyped-def]
        if step == self.cheat_at and self.cheat_with == "norm":
            return await super().all_reduce(step, vec * 1000, state, layout, float(vec.norm()))
        self.numel = vec.numel()
        return await super().all_reduce(step, vec, state, layout, norm)

    async def _handle(self, msg, responder):  # type: ignore[no-untyped-def]
        attempt = self.attempts.get((msg.step, msg.attempt))
        if (
            self.cheat_with == "range"
            and msg.op == "chunk"
            and msg.step == self.cheat_at
            and attempt is not None
        ):  # our own payload (round 0), its positions out of range
            outbox = OutOfRange(attempt.outbox, self.cfg.compressor, self.numel)
            await serve_chunk(self.node, replace(attempt, outbox=outbox), msg, responder)
            return
        await super()._handle(msg, responder)


class OutOfRange:
    """An outbox whose round-0 sparse payload has every position bit set: 4095, past the
    end of the vector's last block (shorter than 4096 values), so it does not decode."""

    def __init__(self, outbox: Outbox, codec: Compressor, numel: int) -> None:
        assert isinstance(codec, Sparse) and numel % BLOCK, "needs a short last block"
        self.outbox, self.codec, self.numel = outbox, codec, numel

    async def take(self, phase: str, rnd: int) -> bytes:
        data = await self.outbox.take(phase, rnd)
        if (phase, rnd) != ("ag", 0):
            return data
        blocks = -(-self.numel // BLOCK)
        at = 4 * CODES * blocks
        entries = self.codec.k * (blocks - 1) + min(self.codec.k, self.numel % BLOCK)
        size = -(-entries * POS_BITS // 8)
        return data[:at] + b"\xff" * size + data[at + size :]


def request(node: Node, op: str, phase: str = "") -> DilocoRequest:
    fields = dict(step=0, attempt=0, phase=phase, round=0, layout="", norm=0.0, state="", blame="")
    return DilocoRequest(**node.header(), op=op, **fields)


async def outsider(node: Node, args: argparse.Namespace) -> None:
    """Try to take part without being admitted; record how the leader answered."""
    got: dict[str, str] = {}
    with trio.move_on_after(90):
        while "chunk" not in got:
            try:
                async with node.open_request(
                    args.leader, DILOCO, request(node, "chunk", "rs"), DilocoChunk
                ):
                    got["chunk"] = "served"
            except RemoteRefusal as exc:
                if exc.reason != "busy":  # busy: the leader's first attempt has not begun
                    got["chunk"] = exc.reason
            except Exception as exc:  # not connected yet, slow dial: try again
                log.info("outsider: pull failed: %r", exc)
            await trio.sleep(0.2)
        try:
            await node.request(args.leader, DILOCO, request(node, "sync"), DilocoRoster)
            got["sync"] = "admitted"
        except RemoteRefusal as exc:
            got["sync"] = exc.reason
    (args.dir / "outsider.json").write_text(json.dumps(got))


if __name__ == "__main__":
    a = parse()
    setup_logging("INFO", "diloco")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    trio.run(main, a)
