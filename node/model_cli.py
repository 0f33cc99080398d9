"""``intellect-node model``: build the tiny base policy, generate rollouts with a model.

Torch and transformers are imported inside the commands, never at ``--help``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

TASK_HELP = (
    "task set: 'arithmetic' (levels 1-3), 'arithmetic:LO-HI' (levels 1..5), "
    "or a .jsonl/.parquet math file (fields problem + answer or solution with \\boxed{})"
)


def default_cache_dir() -> Path:
    env = os.environ.get("INTELLECT_NODE_CACHE")
    if env:
        return Path(env).expanduser() / "models"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "intellect-node" / "models"


def add_model_parsers(sub: Any) -> None:
    model = sub.add_parser(
        "model", help="build the tiny base model, or generate proven rollouts with a model"
    )
    msub = model.add_subparsers(dest="model_command", required=True, metavar="ACTION")

    init = msub.add_parser(
        "init",
        help="build a tokenizer and a small Llama, SFT it briefly on a task set, save in HF format",
        description="Builds a character-level tokenizer and a small Llama-architecture model, "
        "trains it briefly (SFT) on the task format and saves it as a Hugging Face directory. "
        "The result is a weak base policy (right on some easy problems). Built once per "
        "recipe: later calls copy it from the cache.",
    )
    init.add_argument("out_dir", type=Path, metavar="OUT_DIR")
    init.add_argument("--task", default="arithmetic", help=TASK_HELP)
    init.add_argument("--steps", type=int, default=300, help="SFT steps (default 300)")
    init.add_argument("--hidden", type=int, default=128, help="hidden size (default 128)")
    init.add_argument("--layers", type=int, default=4, help="decoder layers (default 4)")
    init.add_argument("--seed", type=int, default=0)
    init.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="where built models are kept (default $INTELLECT_NODE_CACHE/models or "
        "~/.cache/intellect-node/models)",
    )
    init.add_argument("--no-cache", action="store_true", help="neither read nor fill the cache")
    init.add_argument("--json", action="store_true", help="print a JSON summary")

    roll = msub.add_parser(
        "rollouts",
        help="generate one step's rollout batch (assigned tasks, G samples each, scored, proven)",
    )
    roll.add_argument("model_dir", type=Path, metavar="MODEL_DIR")
    roll.add_argument("--task", default="arithmetic", help=TASK_HELP)
    roll.add_argument("--worker", required=True, help="the worker's 0x address (task assignment)")
    roll.add_argument("--step", type=int, default=0)
    roll.add_argument("--count", type=int, default=8, help="tasks (default 8)")
    roll.add_argument("--group-size", type=int, default=4, help="samples per task (default 4)")
    roll.add_argument("--max-new-tokens", type=int, default=32)
    roll.add_argument("--temperature", type=float, default=1.0)
    roll.add_argument("--top-p", type=float, default=1.0)
    roll.add_argument("--backend", choices=["auto", "torch", "vllm"], default="auto")
    roll.add_argument(
        "--max-batch", type=int, default=32, help="sequences decoded together (default 32)"
    )
    roll.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    roll.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    roll.add_argument("--run-id", default="devnet")
    roll.add_argument(
        "--data-dir", type=Path, help="node data dir holding the signing key (made if missing)"
    )
    roll.add_argument("--name", help="node name (data dir ~/.intellect-node/<name>)")
    roll.add_argument("--out", type=Path, help="write the signed batch envelope here")
    roll.add_argument("--json", action="store_true", help="print a JSON summary")


def cmd_model(args: argparse.Namespace) -> int:
    if args.model_command == "init":
        return cmd_init(args)
    return cmd_rollouts(args)


def _bar(done: int, total: int, loss: float, started: float) -> None:
    width = 30
    fill = width * done // total
    sys.stderr.write(
        f"\rSFT [{'#' * fill}{'.' * (width - fill)}] {done}/{total} loss {loss:.3f} "
        f"{time.monotonic() - started:.0f}s"
    )
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def cmd_init(args: argparse.Namespace) -> int:
    from node.engine.tinymodel import Recipe, build_tiny_model, evaluate

    task = args.task
    recipe = Recipe(
        task=task, steps=args.steps, hidden=args.hidden, layers=args.layers, seed=args.seed
    )
    cache = None if args.no_cache else (args.cache_dir or default_cache_dir())
    started = time.monotonic()
    interactive = sys.stderr.isatty() and not args.json
    out, built = build_tiny_model(
        args.out_dir,
        recipe,
        cache_dir=cache,
        progress=(lambda d, t, loss: _bar(d, t, loss, started)) if interactive else None,
    )
    accuracy = evaluate(out, task)
    summary = {
        "model_dir": str(out),
        "built": built,
        "seconds": round(time.monotonic() - started, 1),
        "recipe": recipe.digest(),
        "task": task,
        "accuracy_greedy": accuracy,
    }
    if args.json:
        print(json.dumps(summary))
    else:
        how = "built" if built else "already built (recipe unchanged); reused"
        print(f"{out}: {how} in {summary['seconds']} s")
        print(f"greedy accuracy on 64 {task} tasks: {accuracy:.1%}")
    return 0


def cmd_rollouts(args: argparse.Namespace) -> int:
    from node.engine import open_engine
    from node.engine.base import SamplingParams
    from node.rollouts import generate_groups, to_batch
    from node.tasks import load_taskset

    worker = args.worker.lower()
    if not (worker.startswith("0x") and len(worker) == 42):
        raise ValueError(f"--worker must be a 0x-prefixed 20-byte address, got {args.worker!r}")
    taskset = load_taskset(args.task)
    engine, tokenizer = open_engine(
        str(args.model_dir),
        backend=args.backend,
        dtype=args.dtype,
        device=args.device,
        max_batch=args.max_batch,
    )
    params = SamplingParams(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p
    )
    started = time.monotonic()
    groups = generate_groups(
        engine,
        tokenizer,
        taskset,
        worker=worker,
        step=args.step,
        count=args.count,
        group_size=args.group_size,
        params=params,
    )
    seconds = time.monotonic() - started
    tokens = sum(len(r.tokens) for g in groups for r in g.results)
    rewards = [x for g in groups for x in g.rewards]
    summary: dict[str, Any] = {
        "engine": engine.name,
        "tasks": len(groups),
        "samples": len(rewards),
        "tokens": tokens,
        "tokens_per_s": round(tokens / seconds, 1),
        "mean_reward": round(sum(rewards) / len(rewards), 4),
    }
    if args.out is not None:
        from node.config import NodeConfig
        from node.keystore import ensure_data_dir, load_or_create_identity
        from protocol.wire import seal

        data_dir = args.data_dir or NodeConfig(name=args.name).resolved_data_dir
        identity = load_or_create_identity(ensure_data_dir(Path(data_dir).expanduser()))
        batch = to_batch(
            groups,
            run_id=args.run_id,
            sender=identity.peer_id,
            seq=time.time_ns() // 1000,
            ts_ms=time.time_ns() // 1_000_000,
            worker=worker,
            step=args.step,
            policy_version=0,
            taskset=taskset.name,
            params=params,
        )
        envelope = seal(identity, batch)
        staging = args.out.with_name(f".{args.out.name}.partial")
        staging.write_bytes(envelope)
        staging.replace(args.out)  # never a half-written batch under the final name
        summary |= {
            "out": str(args.out),
            "bytes": len(envelope),
            "work_key": batch.work_key().hex(),
        }
    if args.json:
        print(json.dumps(summary))
        return 0
    for g in groups[:4]:
        print(f"{g.task.task_id}  {g.task.prompt.splitlines()[0][:60]!r}  answer {g.task.answer}")
        for text, reward in zip(g.completions, g.rewards, strict=True):
            print(f"    {reward:.0f}  {text[:60].replace(chr(10), ' / ')}")
    print(", ".join(f"{k} {v}" for k, v in summary.items()))
    return 0
