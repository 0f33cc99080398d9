"""DiLoCo, measured: bytes on the wire, final loss, compute utilization on a slow link.

    .venv/bin/python bench/diloco.py [--members 2] [--inner 10] [--outer 6] [--seeds 3]
                                     [--util-inner 1000] [--util-outer 2] [--hidden 64] [--layers 2] [--json]
                                     [--sparse-k 384] [--sparse-lr 1.5] [--sparse-momentum 0]
    .venv/bin/python bench/diloco.py --sweep [--seeds 3] [--sweep-k 64,256,384]
                                     [--sweep-outer 0.7/0.9,1/0.5,1.5/0]  # lr/momentum

The tiny Llama shape (vocabulary 256: byte tokens), pretraining on a tiny local corpus (this
repository's README.md, SPEC.md and docs/, the last 10% held out).

1. Bandwidth, over libp2p: ``--members`` processes on 127.0.0.1
   (``bench/workers/diloco_member.py``), each a real node with ``node.diloco``'s group and
   member, the leader admitting the others; their ring runs over libp2p streams
   (``/intellect/diloco/1.0.0``). Measured: the chunk payload bytes a member received in one
   outer step of the int8 ring, and in one step of the same ring in fp32 (what one
   data-parallel step moves: a gradient is as large as a pseudo-gradient); data-parallel
   training of the same tokens makes H such steps per outer step. ``bandwidth_reduction`` =
   H(=100) x fp32 bytes / int8 bytes. It is a little under 4 x 100: each int8 chunk carries
   its 1 KiB lookup table, which is 2 KiB / P per member and step (P parameters): visible on
   this tiny model, nothing at 10B. Not counted: envelopes, framing, yamux and noise.
   ``bandwidth_reduction_sparse``: the same with the bytes of one outer step of the sparse
   all-gather (``node/diloco/sparse.py``, ``--sparse-k`` of every 4096 values at 2 bits; its
   closing round's 32-byte digest is not a payload, and is not counted either).
2. Final loss at equal tokens, mean over ``--seeds``, in this process (the ring's arithmetic
   does not depend on the transport; ``tests/test_diloco_network.py`` checks the processes
   agree bit for bit): DiLoCo int8, fp32 and sparse (with error feedback and its own outer
   ``--sparse-lr`` / ``--sparse-momentum``) (``--members`` members, ``--outer`` x
   ``--inner`` steps each), one worker (``members x inner x outer`` steps of the same batch)
   and data parallel (``inner x outer`` steps of ``members`` batches: one model, the
   gradient of the concatenated batch = the members' averaged gradients). The loss is
   cross-entropy on fixed held-out batches.
3. Utilization, over libp2p: the same processes go on with int8 DiLoCo, ``--util-outer``
   outer steps per link. Real: the processes, the inner steps, the sync with the leader,
   the chunks on libp2p streams. Simulated: the link's speed: after each pull a member
   sleeps the chunk's bytes / bandwidth, the bandwidth calibrated on ``--util-outer``
   unthrottled outer steps so that all-reduce time / inner time is 103/2280, 382/2280 and
   469/2280 (INTELLECT-1's median US / transatlantic / global all-reduce against 2280 s of
   inner compute). Measured: inner / (inner + all-reduce) wall-clock of every member's
   outer steps, against the predicted 95.7 / 85.6 / 83.0 %. The all-reduce time includes
   waiting in the sync for the slowest member's inner steps, as in a real group.
   ``utilization_sparse``: the same links (the bandwidths calibrated on int8) carrying the
   sparse all-gather. The group takes ``--util-inner`` inner steps per outer step (1000 by
   default: about 7.5 s of the tiny model's inner compute here). The all-reduce has a fixed
   cost on loopback besides the simulated link (the sync with the leader and two stream
   round trips, 0.05-0.08 s; the codecs are a tenth of it: docs/benchmarks.md): at H = 10
   it was above every link's target, and at H = 100 (0.77 s of inner compute) still 6 % of
   it, so the figures measured that cost, not the payloads' sizes. At H = 1000 it is about
   1 %, as the internet's round trips are of INTELLECT-1's 38 minutes of inner compute, and
   int8's measured utilization is INTELLECT-1's within a point (docs/benchmarks.md). The
   traffic figures do not depend on it (``bandwidth_reduction`` is at H = 100).

``--sweep``: only the in-process loss of sparse DiLoCo for a grid of ``k`` (``--sweep-k``)
and outer lr / momentum (``--sweep-outer``) against int8's, ``--seeds`` seeds each (how the
defaults were chosen: docs/benchmarks.md).

``--json``: the last line is one JSON object with ``bandwidth_reduction``,
``bandwidth_reduction_sparse``, ``bytes`` (``diloco_outer_step``, ``sparse_outer_step``,
``ddp_step``), ``loss`` (``int8``, ``fp32``, ``sparse``, ``single``, ``ddp``: mean over
seeds), ``loss_per_seed``, ``sparse`` (its settings), ``utilization`` and
``utilization_sparse`` (``us``, ``transatlantic``, ``global``), ``predicted_utilization``,
``links`` (per link: the simulated bandwidth, the target and measured all-reduce/inner, the
utilization, int8 and sparse), ``unthrottled`` and ``seconds``.
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import trio  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from node.diloco import ring  # noqa: E402
from node.diloco.codecs import compressor  # noqa: E402
from node.diloco.inner import Corpus, InnerConfig, eval_loss, inner_step, make_optimizer  # noqa: E402
from node.diloco.outer import OuterConfig, OuterState  # noqa: E402
from node.diloco.quant import Compressor  # noqa: E402
from node.diloco.sparse import ErrorFeedback  # noqa: E402
from node.keystore import load_or_create_identity  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LINKS = {"us": 103 / 2280, "transatlantic": 382 / 2280, "global": 469 / 2280}
H_PUBLISHED = 100
WORKER = ROOT / "bench" / "workers" / "diloco_member.py"


def corpus_bytes() -> tuple[bytes, bytes]:
    files = [ROOT / "README.md", ROOT / "SPEC.md", *sorted((ROOT / "docs").glob("*.md"))]
    text = b"\n".join(f.read_bytes() for f in files if f.exists())
    cut = int(len(text) * 0.9)
    return text[:cut], text[cut:]


def make_model(seed: int, hidden: int, layers: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 16),
        num_key_value_heads=max(1, hidden // 32),
        max_position_embeddings=512,
    )
    return LlamaForCausalLM(cfg).eval()


class Link:
    """The ring in memory, for the loss runs (the arithmetic is the libp2p group's)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.received = 0

    async def reduce(
        self, vecs: list[torch.Tensor], codec: Compressor, feedback: list[ErrorFeedback]
    ) -> torch.Tensor:
        """The group's average; with error feedback as ``DilocoGroup.all_reduce`` keeps it."""
        boxes = [ring.Outbox() for _ in range(self.n)]
        out: list[Any] = [None] * self.n
        if codec.feedback:
            vecs = [fb.compensate(v) for fb, v in zip(feedback, vecs, strict=True)]

        async def member(i: int) -> None:
            async def pull(phase: str, rnd: int) -> bytes:
                return await boxes[(i - 1) % self.n].take(phase, rnd)

            out[i] = await ring.all_reduce(vecs[i], i, self.n, codec, boxes[i], pull)

        async with trio.open_nursery() as nursery:
            for i in range(self.n):
                nursery.start_soon(member, i)
        for avg, _ in out[1:]:
            assert torch.equal(avg, out[0][0]), "ring members disagree"
        self.received = out[0][1]
        if codec.feedback:
            for fb, v in zip(feedback, vecs, strict=True):
                fb.keep(v, codec.roundtrip(v))
        return out[0][0]


def diloco(
    args: argparse.Namespace,
    seed: int,
    codec: Compressor,
    train: bytes,
    link: Link,
    outer_cfg: OuterConfig | None = None,
) -> Any:
    """A DiLoCo group of ``args.members`` in one process; (model, inner s, all-reduce s)."""
    base = make_model(seed, args.hidden, args.layers)
    cfg = InnerConfig(batch=args.batch, seq_len=args.seq)
    models = [copy.deepcopy(base) for _ in range(args.members)]
    opts = [make_optimizer(m, cfg) for m in models]
    data = [Corpus(train, seed=seed, shard=k) for k in range(args.members)]
    outer = OuterState.of(base, outer_cfg or OuterConfig())
    feedback = [ErrorFeedback() for _ in models]
    inner_s = reduce_s = 0.0
    for _ in range(args.outer):
        t0 = time.perf_counter()
        for m, o, d in zip(models, opts, data, strict=True):
            for _ in range(args.inner):
                inner_step(m, o, d.batch(cfg.batch, cfg.seq_len), cfg)
        t1 = time.perf_counter()
        avg = trio.run(link.reduce, [outer.pseudo_gradient(m) for m in models], codec, feedback)
        t2 = time.perf_counter()
        outer.apply(models[0], avg, alone=False)
        for m in models[1:]:
            with torch.no_grad():
                for p, theta in zip(m.parameters(), outer.params, strict=True):
                    p.copy_(theta)
        inner_s, reduce_s = inner_s + t1 - t0, reduce_s + t2 - t1
    return models[0], inner_s, reduce_s


def single(args: argparse.Namespace, seed: int, train: bytes, ddp: bool) -> Any:
    """One worker for the same tokens; ``ddp``: ``members`` batches per step (averaged)."""
    model = make_model(seed, args.hidden, args.layers)
    cfg = InnerConfig(batch=args.batch * (args.members if ddp else 1), seq_len=args.seq)
    opt = make_optimizer(model, cfg)
    data = Corpus(train, seed=seed, shard=0)
    steps = args.inner * args.outer * (1 if ddp else args.members)
    for _ in range(steps):
        inner_step(model, opt, data.batch(cfg.batch, cfg.seq_len), cfg)
    return model


def held_out_loss(model: torch.nn.Module, held: bytes, seq: int) -> float:
    c = Corpus(held, seed=12345, shard=0)
    return sum(eval_loss(model, c.batch(16, seq)) for _ in range(4)) / 4


class Group:
    """The bench's DiLoCo group over libp2p: ``members`` processes on 127.0.0.1
    (``bench/workers/diloco_member.py``), run segment by segment."""

    def __init__(self, args: argparse.Namespace, root: Path) -> None:
        self.args, self.root = args, root
        self.dirs = [root / f"m{i}" for i in range(args.members)]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.segment = 0

    def start(self) -> None:
        for d in self.dirs:
            d.mkdir(parents=True)
        leader = load_or_create_identity(self.dirs[0]).peer_id
        for i, d in enumerate(self.dirs):
            boot = ["--bootstrap", self._addr(0)] if i else []
            a = self.args
            cmd = [sys.executable, str(WORKER), "--dir", str(d), "--leader", leader]
            cmd += ["--index", str(i), "--members", str(a.members), *boot, "--seed", "0"]
            cmd += ["--hidden", str(a.hidden), "--layers", str(a.layers), "--batch", str(a.batch)]
            cmd += ["--seq", str(a.seq), "--inner", str(a.util_inner)]
            with (d / "log").open("wb") as log:
                self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
            if i == 0:
                self._addr(0)
        for i in range(1, len(self.dirs)):
            self._addr(i)

    def _addr(self, i: int) -> str:
        path = self.dirs[i] / "addr"
        self._wait(lambda: path.exists(), f"member {i} to start")
        return path.read_text()

    def _wait(self, done: Any, what: str, limit: float = 600.0) -> None:
        deadline = time.monotonic() + limit
        while not done():
            for d, p in zip(self.dirs, self.procs, strict=False):
                if p.poll() is not None:
                    tail = (d / "log").read_text()[-2000:]
                    raise RuntimeError(
                        f"{d.name} exited ({p.returncode}) waiting for {what}:\n{tail}"
                    )
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}")
            time.sleep(0.05)

    def run(self, outer: int, encoding: str, bandwidth: float | None) -> list[dict[str, Any]]:
        """``outer`` outer steps of the whole group; every member's records of them."""
        k, self.segment = self.segment, self.segment + 1
        seg = {"outer": outer, "encoding": encoding, "bandwidth": bandwidth}
        self._order(k, seg)
        self._wait(lambda: all((d / f"done-{k}").exists() for d in self.dirs), f"segment {k}")
        out = []
        for d in self.dirs:
            for line in (d / "steps.jsonl").read_text().splitlines():
                rec = json.loads(line)
                if rec["segment"] == k:
                    out.append(rec)
        if len({r["hash"] for r in out if r["step"] == out[-1]["step"]}) != 1:
            raise RuntimeError("the members' parameters differ after an outer step")
        return out

    def _order(self, k: int, seg: dict[str, Any]) -> None:
        """Tell every member what segment ``k`` is (atomically: they poll for the file)."""
        tmp = self.root / f".segment-{k}.json"
        tmp.write_text(json.dumps(seg))
        tmp.rename(self.root / f"segment-{k}.json")

    def stop(self) -> None:
        self._order(self.segment, {"stop": True})
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def mean(recs: list[dict[str, Any]], key: str) -> float:
    return sum(r[key] for r in recs) / len(recs)


def over_libp2p(args: argparse.Namespace) -> dict[str, Any]:
    """Bandwidth and utilization from a group of processes whose ring runs over libp2p."""
    with tempfile.TemporaryDirectory(prefix="diloco-bench-") as tmp:
        group = Group(args, Path(tmp))
        try:
            group.start()
            print(f"{args.members} member processes up (libp2p on 127.0.0.1)", flush=True)
            ddp = group.run(1, "fp32", None)  # also the warm-up: the first step is not timed
            calib = group.run(args.util_outer, "int8", None)
            int8_bytes, inner_s, reduce_s = (
                mean(calib, k) for k in ("received", "inner_s", "reduce_s")
            )
            out: dict[str, Any] = {
                "params": sum(
                    p.numel() for p in make_model(0, args.hidden, args.layers).parameters()
                ),
                "diloco_outer_step": round(int8_bytes),
                "ddp_step": round(mean(ddp, "received")),
                "unthrottled": {"inner_s": inner_s, "reduce_s": reduce_s},
                "links": {},
            }
            print(
                f"  unthrottled: inner {inner_s:.2f} s, all-reduce {reduce_s:.3f} s per outer step",
                flush=True,
            )
            for name, ratio in LINKS.items():
                # the link's delay fills what the unthrottled all-reduce (sync, streams,
                # encoding, decoding) leaves of the target; a member's pulls run in turn
                delay = max(ratio * inner_s - reduce_s, 1e-3 * inner_s)
                if ratio * inner_s <= reduce_s:
                    print(
                        f"  {name}: the unthrottled all-reduce alone is above the target "
                        f"({reduce_s:.3f} s > {ratio * inner_s:.3f} s): raise --util-inner",
                        flush=True,
                    )
                bw = int8_bytes / delay
                recs = group.run(args.util_outer, "int8", bw)
                i_s, r_s = sum(r["inner_s"] for r in recs), sum(r["reduce_s"] for r in recs)
                out["links"][name] = {
                    "bandwidth_Bps": bw,
                    "target": ratio,
                    "measured": r_s / i_s,
                    "utilization": i_s / (i_s + r_s),
                }
                print(
                    f"  {name:<13} all-reduce/inner {r_s / i_s:.4f} (target {ratio:.4f})",
                    flush=True,
                )
            sparse = sparse_codec(args).wire
            out["sparse_outer_step"] = round(mean(group.run(1, sparse, None), "received"))
            for name, link in out["links"].items():
                recs = group.run(args.util_outer, sparse, link["bandwidth_Bps"])
                i_s, r_s = sum(r["inner_s"] for r in recs), sum(r["reduce_s"] for r in recs)
                link["utilization_sparse"] = i_s / (i_s + r_s)
                print(f"  {name:<13} sparse all-reduce/inner {r_s / i_s:.4f}", flush=True)
        finally:
            group.stop()
    out["bandwidth_reduction"] = H_PUBLISHED * out["ddp_step"] / out["diloco_outer_step"]
    out["bandwidth_reduction_sparse"] = H_PUBLISHED * out["ddp_step"] / out["sparse_outer_step"]
    return out


def sparse_codec(args: argparse.Namespace) -> Compressor:
    return compressor("sparse", args.sparse_k)


def sweep(args: argparse.Namespace, train: bytes, held: bytes) -> None:
    """Sparse DiLoCo's held-out loss for a grid of k and outer settings, against int8's."""
    outers = [tuple(float(v) for v in o.split("/")) for o in args.sweep_outer.split(",")]
    grid = [(int(k), lr, mu) for k in args.sweep_k.split(",") for lr, mu in outers]
    ref = []
    for seed in range(args.seeds):
        ref.append(
            held_out_loss(
                diloco(args, seed, compressor("int8"), train, Link(args.members))[0], held, args.seq
            )
        )
    int8 = sum(ref) / len(ref)
    print(f"int8 (lr 0.7, momentum 0.9): {int8:.4f} {[round(x, 4) for x in ref]}", flush=True)
    for k, lr, mu in grid:
        codec, outer = compressor("sparse", k), OuterConfig(lr, mu)
        got = [
            held_out_loss(
                diloco(args, seed, codec, train, Link(args.members), outer)[0], held, args.seq
            )
            for seed in range(args.seeds)
        ]
        m = sum(got) / len(got)
        print(
            f"k {k:>4} lr {lr} momentum {mu}: {m:.4f} ({100 * (m / int8 - 1):+.2f}% of int8) "
            f"{[round(x, 4) for x in got]}",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--members", type=int, default=2)
    ap.add_argument(
        "--inner", type=int, default=10, help="H: inner steps per outer step (the losses)"
    )
    ap.add_argument(
        "--util-inner",
        type=int,
        default=1000,
        help="inner steps per outer step of the group over libp2p (bytes, utilization; "
        "default 1000: the loopback's fixed all-reduce cost about 1%% of inner compute)",
    )
    ap.add_argument("--outer", type=int, default=6, help="outer steps")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument(
        "--util-outer", type=int, default=2, help="outer steps per link in the libp2p group"
    )
    ap.add_argument("--sparse-k", type=int, default=384, help="sparse: values of every 4096 sent")
    ap.add_argument("--sparse-lr", type=float, default=1.5, help="sparse: outer lr")
    ap.add_argument("--sparse-momentum", type=float, default=0.0, help="sparse: outer momentum")
    ap.add_argument("--sweep", action="store_true", help="only the sparse settings' loss sweep")
    ap.add_argument("--sweep-k", default="64,256,384", help="--sweep: the k values")
    ap.add_argument("--sweep-outer", default="0.7/0.9,1/0.5,1.5/0", help="--sweep: lr/momentum")
    ap.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    args = ap.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    train, held = corpus_bytes()
    if args.sweep:
        sweep(args, train, held)
        return
    bw = over_libp2p(args)
    print(
        f"bytes a member receives: int8 DiLoCo {bw['diloco_outer_step']} per outer step, "
        f"DDP {bw['ddp_step']} per step ({bw['params']} parameters): "
        f"{bw['bandwidth_reduction']:.1f}x less at H = {H_PUBLISHED}; sparse "
        f"{bw['sparse_outer_step']}: {bw['bandwidth_reduction_sparse']:.1f}x less",
        flush=True,
    )
    losses: dict[str, list[float]] = {"int8": [], "fp32": [], "sparse": [], "single": [], "ddp": []}
    sparse_outer = OuterConfig(args.sparse_lr, args.sparse_momentum)
    for seed in range(args.seeds):
        link = Link(args.members)
        for name in ("int8", "fp32"):
            model = diloco(args, seed, compressor(name), train, link)[0]
            losses[name].append(held_out_loss(model, held, args.seq))
        model = diloco(args, seed, sparse_codec(args), train, link, sparse_outer)[0]
        losses["sparse"].append(held_out_loss(model, held, args.seq))
        losses["single"].append(held_out_loss(single(args, seed, train, False), held, args.seq))
        losses["ddp"].append(held_out_loss(single(args, seed, train, True), held, args.seq))
        print(
            f"seed {seed}: " + ", ".join(f"{k} {v[-1]:.4f}" for k, v in losses.items()), flush=True
        )
    avg = {k: sum(v) / len(v) for k, v in losses.items()}
    print("final held-out loss (mean): " + ", ".join(f"{k} {v:.4f}" for k, v in avg.items()))
    print(f"int8 / fp32 {avg['int8'] / avg['fp32']:.4f}, int8 / ddp {avg['int8'] / avg['ddp']:.4f}")
    print(f"sparse / int8 {avg['sparse'] / avg['int8']:.4f}")
    util = {k: v["utilization"] for k, v in bw["links"].items()}
    util_sparse = {k: v["utilization_sparse"] for k, v in bw["links"].items()}
    predicted = {k: 1 / (1 + r) for k, r in LINKS.items()}
    for k in LINKS:
        print(
            f"utilization {k:<13} {util[k]:.3f} (predicted {predicted[k]:.3f}), "
            f"sparse {util_sparse[k]:.3f}"
        )
    figures = {
        "bandwidth_reduction": bw["bandwidth_reduction"],
        "bandwidth_reduction_sparse": bw["bandwidth_reduction_sparse"],
        "bytes": {
            "diloco_outer_step": bw["diloco_outer_step"],
            "sparse_outer_step": bw["sparse_outer_step"],
            "ddp_step": bw["ddp_step"],
        },
        "params": bw["params"],
        "loss": avg,
        "loss_per_seed": losses,
        "sparse": {"k": args.sparse_k, "lr": args.sparse_lr, "momentum": args.sparse_momentum},
        "utilization": util,
        "utilization_sparse": util_sparse,
        "predicted_utilization": predicted,
        "links": bw["links"],
        "unthrottled": bw["unthrottled"],
        "transport": "libp2p streams between processes on 127.0.0.1; link delay simulated",
        "seconds": time.perf_counter() - started,
    }
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
