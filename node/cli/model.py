"""``intellect-node model``: build the tiny base policy, generate rollouts with a model,
measure a model's honest verification noise on this machine.

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

from node.cli.flags import at_least
from node.cli.progress import progress
from node.engine.tinymodel import FAMILIES, QWEN2, SHAPES, Recipe

DEFAULT = Recipe()
BASES = {"llama": DEFAULT, "qwen2": QWEN2}  # each family's defaults (``--family``)

TASK_HELP = (
    "task set: 'arithmetic' (levels 1-3), 'arithmetic:LO-HI' (levels 1..5), "
    "or a .jsonl/.parquet math file (fields problem + answer or solution with \\boxed{})"
)


def add_model_parsers(sub: Any) -> None:
    model = sub.add_parser(
        "model", help="build the tiny base model, or generate proven rollouts with a model"
    )
    msub = model.add_subparsers(dest="model_command", required=True, metavar="ACTION")

    init = msub.add_parser(
        "init",
        help="build a tokenizer and a small Llama or Qwen2, SFT it on a task set, save in HF "
        "format",
        description="Builds a tokenizer and a small model, trains it (SFT) on worked "
        "solutions of the task set and saves it as a Hugging Face directory. --family llama "
        "(the default): a character-level tokenizer and a Llama-architecture model; by "
        "default the SFT stops half-way through its learning-rate schedule (750 of 1500 "
        "steps, about 2.5 minutes on 2 CPU cores): a base policy where RL can improve it, "
        "weak when it decodes greedily on arithmetic levels 2-3 (the devnet's task set) yet "
        "holding a right answer among 16 samples on most tasks. --family qwen2: a byte-level "
        "BPE tokenizer trained on the task set's text, with a ChatML chat template, and a "
        "Qwen2-architecture model (grouped-query attention, q/k/v bias), 100 SFT steps "
        "(about 30 s): it proves the path, not the skill. Built once per recipe: later calls "
        "copy it from the cache.",
    )
    init.add_argument(
        "out_dir", type=Path, metavar="OUT_DIR", help="where the model goes (new or empty)"
    )
    init.add_argument("--task", default="arithmetic", help=TASK_HELP)
    init.add_argument(
        "--family",
        choices=list(FAMILIES),
        default="llama",
        help="the architecture and tokenizer: llama (character tokenizer; default) or qwen2 "
        "(byte-level BPE trained on the task set, chat template); each has its own defaults "
        "for the settings below",
    )
    init.add_argument(
        "--vocab",
        type=int,
        help=f"qwen2: the BPE tokenizer's vocabulary, >= 512 (default {QWEN2.vocab_size})",
    )
    init.add_argument(
        "--steps",
        type=int,
        help=f"SFT steps (default {DEFAULT.steps}; qwen2 {QWEN2.steps})",
    )
    init.add_argument(
        "--schedule",
        type=int,
        help="length of the one-cycle learning-rate schedule the SFT steps follow; the build "
        f"stops after --steps of it (default {DEFAULT.schedule}, qwen2 {QWEN2.schedule}; 0: "
        "--steps, a full schedule)",
    )
    init.add_argument(
        "--shape",
        choices=list(SHAPES),
        default="tiny",
        help="the model's shape: tiny (default: --hidden, --layers) or 1.1b, TinyLlama's (22 "
        "layers, hidden 2048, MLP 5632, 32 heads, 4 KV heads; build it with --device cuda, "
        "a few hundred --steps and a --lr near 3e-4)",
    )
    init.add_argument(
        "--hidden",
        type=int,
        help=f"hidden size (default {DEFAULT.hidden}, qwen2 {QWEN2.hidden}; --shape tiny)",
    )
    init.add_argument(
        "--layers",
        type=int,
        help=f"decoder layers (default {DEFAULT.layers}, qwen2 {QWEN2.layers}; --shape tiny)",
    )
    init.add_argument(
        "--lr",
        type=float,
        help=f"peak SFT learning rate (default {DEFAULT.lr}, qwen2 {QWEN2.lr})",
    )
    init.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="where the SFT runs (default cpu; cuda: in bfloat16 autocast)",
    )
    init.add_argument("--seed", type=int, default=0, help="the build's seed (default 0)")
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
    roll.add_argument("model_dir", type=Path, metavar="MODEL_DIR", help="a model directory")
    roll.add_argument("--task", default="arithmetic", help=TASK_HELP)
    roll.add_argument("--worker", required=True, help="the worker's 0x address (task assignment)")
    roll.add_argument("--step", type=at_least(0), default=0, help="the step (default 0)")
    roll.add_argument("--count", type=at_least(1), default=8, help="tasks (default 8)")
    roll.add_argument(
        "--group-size", type=at_least(1), default=4, help="samples per task (default 4)"
    )
    roll.add_argument(
        "--max-new-tokens", type=at_least(1), default=32, help="per sample (default 32)"
    )
    roll.add_argument("--temperature", type=float, default=1.0, help="sampling (default 1.0)")
    roll.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (default 1.0)")
    roll.add_argument(
        "--backend",
        choices=["auto", "torch", "vllm"],
        default="auto",
        help="the engine (auto: vLLM where installed with a GPU, else torch)",
    )
    roll.add_argument(
        "--max-batch", type=int, default=32, help="sequences decoded together (default 32)"
    )
    roll.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    roll.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    roll.add_argument("--run-id", type=run_id, default="devnet", help="(default devnet)")
    roll.add_argument(
        "--data-dir", type=Path, help="node data dir holding the signing key (made if missing)"
    )
    roll.add_argument("--name", help="node name (data dir ~/.intellect-node/<name>)")
    roll.add_argument("--out", type=Path, help="write the signed batch envelope here")
    roll.add_argument("--json", action="store_true", help="print a JSON summary")

    cal = msub.add_parser(
        "calibrate",
        help="measure the honest noise a validator sees for a model on this hardware, "
        "against a verification profile",
        description="Generates honest rollouts with the torch engine (the worker), recomputes "
        "each with one prefill pass (the validator, on its own device and dtype), and "
        "reports what the verification profile's thresholds are set against: the RMS and "
        "largest score gap in noise units, TOPLOC mantissa errors, and the batch verdicts "
        "(16 rollouts a batch). Exit status 0 when the profile fits (every honest batch "
        "accepted, RMS <= the profile's sigma, every gap <= its kappa), 1 when it does not.",
    )
    cal.add_argument("model_dir", type=Path, metavar="MODEL_DIR", help="a model directory")
    cal.add_argument(
        "--profile",
        default=None,
        help="verification profile: gpu-bf16, paper or strict-fp32 (default: the run's "
        "verify_profile setting, INTELLECT_NODE_RUN__VERIFY_PROFILE, else gpu-bf16)",
    )
    cal.add_argument("--device", default="auto", help="worker device: auto, cpu, cuda, cuda:N")
    cal.add_argument("--dtype", default="auto", help="worker dtype (auto: bf16 on a GPU)")
    cal.add_argument(
        "--validator-device", default=None, help="validator device (default: the worker's)"
    )
    cal.add_argument(
        "--validator-dtype", default=None, help="validator dtype (default: the worker's)"
    )
    cal.add_argument("--rollouts", type=int, default=32, help="honest rollouts (default 32)")
    cal.add_argument("--batch", type=int, default=32, help="sequences in flight (default 32)")
    cal.add_argument("--new-tokens", type=int, default=96, help="tokens per rollout (default 96)")
    cal.add_argument("--temperature", type=float, default=1.0, help="sampling (default 1.0)")
    cal.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (default 1.0)")
    cal.add_argument(
        "--prompts",
        default="arithmetic",
        help="'random' token ids, or a task set for real prompts: " + TASK_HELP,
    )
    cal.add_argument("--json", action="store_true", help="print the report as one JSON object")


def cmd_model(args: argparse.Namespace) -> int:
    if args.model_command == "init":
        return cmd_init(args)
    if args.model_command == "calibrate":
        return cmd_calibrate(args)
    return cmd_rollouts(args)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from crypto.verdict import DEFAULT_PROFILE, profile
    from node.config import by_path
    from node.engine.calibration import calibrate, model_layers, random_prompts
    from node.engine.models import load_model, prompt_ids
    from node.tasks import assign, load_taskset

    config = profile(
        args.profile or os.environ.get(by_path()["run.verify_profile"].env) or DEFAULT_PROFILE
    )
    if args.rollouts < 1 or args.batch < 1 or args.new_tokens < 1:
        raise ValueError("--rollouts, --batch and --new-tokens must be >= 1")
    worker = load_model(args.model_dir, dtype=args.dtype, device=args.device)
    vdev, vdtype = args.validator_device, args.validator_dtype
    if (vdev is None or vdev == str(worker.device)) and vdtype in (None, str(worker.dtype)[6:]):
        validator = worker
    else:
        validator = load_model(
            args.model_dir, dtype=vdtype or str(worker.dtype)[6:], device=vdev or str(worker.device)
        )
    vocab = int(worker.model.get_output_embeddings().weight.shape[0])
    if args.prompts == "random":
        prompts = random_prompts(args.rollouts, vocab)
    else:
        tasks = assign(load_taskset(args.prompts), "0x" + "00" * 20, 0, args.rollouts)
        prompts = [prompt_ids(worker.tokenizer, t.prompt) for t in tasks]
    if not args.json:
        print(
            f"calibrating {args.model_dir}: worker {worker.device}/{str(worker.dtype)[6:]}, "
            f"validator {validator.device}/{str(validator.dtype)[6:]}, {args.rollouts} rollouts "
            f"x {args.new_tokens} tokens, {args.batch} in flight",
            file=sys.stderr,
        )
    with progress("calibrate", 3, unit="stages", out=sys.stderr) as bar:
        report = calibrate(
            worker.model,
            validator.model,
            eos_token_ids=worker.eos_token_ids,
            config=config.for_layers(model_layers(worker.model)),
            batch=args.batch,
            new_tokens=args.new_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            prompts=prompts,
            progress=lambda done, total, stage: bar.update(done, total=total, info=stage),
        )
    summary = {
        **report.as_dict(),
        "worker": f"{worker.device}/{str(worker.dtype)[6:]}",
        "validator": f"{validator.device}/{str(validator.dtype)[6:]}",
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print("\n".join(report.lines()))
        print(
            f"generation {report.generate_s:.1f} s, validation {report.validate_s:.1f} s "
            f"({report.validate_s / max(report.generate_s, 1e-9):.2f} of generation)"
        )
    return 0 if report.fits else 1


def cmd_init(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from node.engine.tinymodel import build_tiny_model, default_cache_dir, evaluate
    from node.tasks import builtin_taskset, load_taskset

    task = args.task
    shape = SHAPES[args.shape]
    if shape and (args.hidden is not None or args.layers is not None):
        raise SystemExit(f"model init: --shape {args.shape} sets the hidden size and layers")
    base = BASES[args.family]
    given = {
        k: v
        for k, v in {
            "steps": args.steps,
            "schedule": args.schedule,
            "lr": args.lr,
            "hidden": args.hidden,
            "layers": args.layers,
            "vocab": args.vocab,
        }.items()
        if v is not None
    }
    if "vocab" in given and args.family != "qwen2":
        raise SystemExit(
            "model init: --vocab is the qwen2 family's (llama's tokenizer is by character)"
        )
    try:
        if not given.get("lr", base.lr) > 0:
            raise ValueError("--lr must be > 0")
        if not builtin_taskset(task):
            load_taskset(task)  # a file that is missing or does not parse: one line, first
        recipe = replace(base, task=task, seed=args.seed, **{**given, **shape})
    except (ValueError, OSError) as e:
        raise SystemExit(f"model init: {e}") from None
    if args.device == "cuda":
        from node.engine.models import pick_device

        pick_device("cuda")  # one line, not a traceback, on a machine without one
    cache = None if args.no_cache else (args.cache_dir or default_cache_dir())
    started = time.monotonic()
    # the SFT steps: a bar on a terminal, else a log line every few seconds (on stderr
    # with --json, so stdout stays one JSON object)
    with progress("SFT", recipe.steps, unit="steps", out=sys.stderr if args.json else None) as bar:
        out, built = build_tiny_model(
            args.out_dir,
            recipe,
            cache_dir=cache,
            progress=lambda done, total, loss: bar.update(
                done, total=total, info=f"loss {loss:.3f}"
            ),
            device=args.device,
        )
    accuracy = evaluate(out, task)
    summary = {
        "model_dir": str(out),
        "built": built,
        "seconds": round(time.monotonic() - started, 1),
        "recipe": recipe.digest(),
        "family": recipe.family,
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


def run_id(text: str) -> str:
    from protocol.ids import check_run_id

    try:
        return check_run_id(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cmd_rollouts(args: argparse.Namespace) -> int:
    from node.engine import open_engine
    from node.engine.base import SamplingParams
    from node.rollouts.generate import generate_groups, to_batch
    from node.tasks import load_taskset

    worker = args.worker.lower()
    if not (worker.startswith("0x") and len(worker) == 42):
        raise ValueError(f"--worker must be a 0x-prefixed 20-byte address, got {args.worker!r}")
    if args.out is not None and not args.out.parent.is_dir():
        raise ValueError(f"--out {args.out}: {args.out.parent} is not a directory")
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
        from node.cli.adminclient import data_dir as named_data_dir
        from node.keystore import ensure_data_dir, load_or_create_identity
        from protocol.wire import seal

        identity = load_or_create_identity(ensure_data_dir(named_data_dir(args)))
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
