"""DiLoCo, measured: bytes on the wire, final loss, compute utilization on a slow link.

    .venv/bin/python bench/diloco.py [--members 2] [--inner 10] [--outer 6] [--seeds 3]
                                     [--hidden 64] [--layers 2] [--json]

All in one process on the tiny Llama shape (vocabulary 256: byte tokens), pretraining on a
tiny local corpus (this repository's README.md, SPEC.md and docs/, the last 10% held out).
The ring is ``node.diloco.ring.all_reduce`` over in-memory outboxes (the same code the
libp2p group runs; ``tests/test_diloco_network.py`` runs it between processes).

1. Bandwidth: the payload bytes a member receives in one outer step of the int8 ring, and
   in one data-parallel step (fp32 gradients in the same ring); data-parallel training of
   the same tokens makes H such steps per outer step. ``bandwidth_reduction`` = H(=100) x
   DDP bytes / DiLoCo bytes. It is a little under 4 x 100: each int8 chunk carries its
   1 KiB lookup table, which is 2 KiB / P per member and step (P parameters): visible on
   this tiny model, nothing at 10B.
2. Final loss at equal tokens, mean over ``--seeds``: DiLoCo int8 and fp32 (``--members``
   members, ``--outer`` x ``--inner`` steps each), one worker (``members x inner x outer``
   steps of the same batch) and data parallel (``inner x outer`` steps of ``members``
   batches: one model, the gradient of the concatenated batch = the members' averaged
   gradients). The loss is cross-entropy on fixed held-out batches.
3. Utilization: int8 DiLoCo with the link throttled (each pull sleeps bytes / bandwidth,
   the bandwidth calibrated on an unthrottled run of the same length) so that all-reduce
   time / inner time is 103/2280, 382/2280 and 469/2280 (INTELLECT-1's
   median US / transatlantic / global all-reduce against 2280 s of inner compute); measured
   inner / (inner + all-reduce) wall-clock, against the predicted 95.7 / 85.6 / 83.0 %.

Measured on this shared 2-core machine (defaults, 54 s): 108,864 bytes per member and outer
step against 427,264 per data-parallel step: 392.5x at H = 100; held-out loss int8 3.335,
fp32 3.360, single 2.912, DDP 3.110 (per seed: int8 3.276 / 3.258 / 3.472, fp32 3.276 /
3.259 / 3.545); utilization 0.941 / 0.827 / 0.808 against 0.957 / 0.856 / 0.829. At this
scale (6 outer steps of H = 10, lr 0.7 Nesterov from the first step) DiLoCo trails one
worker at equal tokens; int8 matches fp32.

``--json``: the last line is one JSON object with ``bandwidth_reduction``, ``bytes``
(``diloco_outer_step``, ``ddp_step``), ``loss`` (``int8``, ``fp32``, ``single``, ``ddp``:
mean over seeds), ``loss_per_seed``, ``utilization`` (``us``, ``transatlantic``,
``global``), ``predicted_utilization`` and ``seconds``.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import trio  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from node.diloco import ring  # noqa: E402
from node.diloco.inner import Corpus, InnerConfig, eval_loss, inner_step, make_optimizer  # noqa: E402
from node.diloco.outer import OuterConfig, OuterState  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LINKS = {"us": 103 / 2280, "transatlantic": 382 / 2280, "global": 469 / 2280}
H_PUBLISHED = 100


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
    """A throttled in-memory ring: each pull waits ``bytes / bandwidth`` seconds."""

    def __init__(self, n: int, bandwidth: float | None) -> None:
        self.n, self.bandwidth = n, bandwidth
        self.received = 0

    async def reduce(self, vecs: list[torch.Tensor], encoding: str) -> torch.Tensor:
        boxes = [ring.Outbox() for _ in range(self.n)]
        out: list[Any] = [None] * self.n

        async def member(i: int) -> None:
            async def pull(phase: str, rnd: int) -> bytes:
                data = await boxes[(i - 1) % self.n].take(phase, rnd)
                if self.bandwidth:
                    await trio.sleep(len(data) / self.bandwidth)
                return data

            out[i] = await ring.all_reduce(vecs[i], i, self.n, encoding, boxes[i], pull)

        async with trio.open_nursery() as nursery:
            for i in range(self.n):
                nursery.start_soon(member, i)
        for avg, _ in out[1:]:
            assert torch.equal(avg, out[0][0]), "ring members disagree"
        self.received = out[0][1]
        return out[0][0]


def diloco(args: argparse.Namespace, seed: int, encoding: str, train: bytes, link: Link) -> Any:
    """A DiLoCo group of ``args.members`` in one process; (model, inner s, all-reduce s)."""
    base = make_model(seed, args.hidden, args.layers)
    cfg = InnerConfig(batch=args.batch, seq_len=args.seq)
    models = [copy.deepcopy(base) for _ in range(args.members)]
    opts = [make_optimizer(m, cfg) for m in models]
    data = [Corpus(train, seed=seed, shard=k) for k in range(args.members)]
    outer = OuterState.of(base, OuterConfig())
    inner_s = reduce_s = 0.0
    for _ in range(args.outer):
        t0 = time.perf_counter()
        for m, o, d in zip(models, opts, data, strict=True):
            for _ in range(args.inner):
                inner_step(m, o, d.batch(cfg.batch, cfg.seq_len), cfg)
        t1 = time.perf_counter()
        avg = trio.run(link.reduce, [outer.pseudo_gradient(m) for m in models], encoding)
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


def bandwidth(args: argparse.Namespace) -> dict[str, float]:
    model = make_model(0, args.hidden, args.layers)
    numel = sum(p.numel() for p in model.parameters())
    vecs = [torch.randn(numel) for _ in range(args.members)]
    link = Link(args.members, None)
    trio.run(link.reduce, vecs, "int8")
    int8 = link.received
    trio.run(link.reduce, vecs, "fp32")
    fp32 = link.received
    return {
        "params": numel,
        "diloco_outer_step": int8,
        "ddp_step": fp32,
        "bandwidth_reduction": H_PUBLISHED * fp32 / int8,
    }


def utilization(args: argparse.Namespace, train: bytes, numel_bytes: int) -> dict[str, float]:
    calib = argparse.Namespace(**{**vars(args), "outer": 2})
    _, inner_s, reduce_s = diloco(calib, 0, "int8", train, Link(args.members, None))
    out = {}
    for name, ratio in LINKS.items():
        # the link's delay fills what the unthrottled all-reduce (encoding, decoding,
        # scheduling) leaves of the target time; a member's pulls run one after another
        delay = max(ratio * inner_s - reduce_s, 1e-3 * inner_s)
        link = Link(args.members, numel_bytes * calib.outer / delay)
        _, i_s, r_s = diloco(calib, 0, "int8", train, link)
        out[name] = i_s / (i_s + r_s)
        print(f"  {name:<13} all-reduce/inner {r_s / i_s:.4f} (target {ratio:.4f})", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--members", type=int, default=2)
    ap.add_argument("--inner", type=int, default=10, help="H: inner steps per outer step")
    ap.add_argument("--outer", type=int, default=6, help="outer steps")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    args = ap.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    train, held = corpus_bytes()
    bw = bandwidth(args)
    print(
        f"bytes a member receives: int8 DiLoCo {bw['diloco_outer_step']} per outer step, "
        f"DDP {bw['ddp_step']} per step ({bw['params']} parameters): "
        f"{bw['bandwidth_reduction']:.1f}x less at H = {H_PUBLISHED}",
        flush=True,
    )
    losses: dict[str, list[float]] = {"int8": [], "fp32": [], "single": [], "ddp": []}
    for seed in range(args.seeds):
        link = Link(args.members, None)
        losses["int8"].append(
            held_out_loss(diloco(args, seed, "int8", train, link)[0], held, args.seq)
        )
        losses["fp32"].append(
            held_out_loss(diloco(args, seed, "fp32", train, link)[0], held, args.seq)
        )
        losses["single"].append(held_out_loss(single(args, seed, train, False), held, args.seq))
        losses["ddp"].append(held_out_loss(single(args, seed, train, True), held, args.seq))
        print(
            f"seed {seed}: " + ", ".join(f"{k} {v[-1]:.4f}" for k, v in losses.items()), flush=True
        )
    mean = {k: sum(v) / len(v) for k, v in losses.items()}
    print("final held-out loss (mean): " + ", ".join(f"{k} {v:.4f}" for k, v in mean.items()))
    print(
        f"int8 / fp32 {mean['int8'] / mean['fp32']:.4f}, int8 / ddp {mean['int8'] / mean['ddp']:.4f}"
    )
    util = utilization(args, train, bw["diloco_outer_step"])
    predicted = {k: 1 / (1 + r) for k, r in LINKS.items()}
    for k in LINKS:
        print(f"utilization {k:<13} {util[k]:.3f} (predicted {predicted[k]:.3f})")
    figures = {
        "bandwidth_reduction": bw["bandwidth_reduction"],
        "bytes": {"diloco_outer_step": bw["diloco_outer_step"], "ddp_step": bw["ddp_step"]},
        "params": bw["params"],
        "loss": mean,
        "loss_per_seed": losses,
        "utilization": util,
        "predicted_utilization": predicted,
        "seconds": time.perf_counter() - started,
    }
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
