"""The centralized baseline: the same GRPO code in one process, no network.

Each step draws ``tasks_per_step`` tasks with ``node.tasks.assign`` for a fixed fake
worker address (derived from the seed) and the step, samples ``group_size`` completions
per task with the torch engine exactly as a worker does (``node.rollouts.generate.generate_groups``:
the same seeded sampler, temperature and token budget), scores them, drops groups whose
prompt is held out and groups with zero advantage, and takes one GRPO step
(``node.training.policy``) on the rest; the engine shares the policy's weights, so the
next step samples from the new policy (synchronous, on-policy: async level 0). The
held-out set (``node.training.heldout``) is evaluated before the first step and every
``eval_every`` steps: sampled accuracy (``heldout_draws`` draws per task at the training
temperature; ``base_accuracy`` and ``final_accuracy`` in the summary) and greedy accuracy
beside it (``base_greedy``, ``final_greedy``). The measurements below predate the sampled
figure: their accuracies are greedy.

``python -m node.training.central --steps N --seed S [--json]`` prints one line per step
(with ``--json``: one JSON object per step, then a summary object as the last line).

The run's settings, chosen here (issue #27) and used unchanged by the devnet: the
``model init`` base policy (750 steps of a 1500-step SFT schedule; ``node/engine/tinymodel.py``
has why), the task mix ``RL_TASKSET`` (arithmetic levels 2-3), GRPO at lr 1e-4 (the other
GRPO settings INTELLECT-2's), 32 tasks x 16 samples a step, T = 1, max_new_tokens 40.
Measured on the 2-core CPU machine, 40 steps, held-out 50 per level, sampled accuracy (8
draws per task) with greedy in brackets:

- From that base on levels 2-3 at lr 1e-4: 0.21 (0.29) -> 0.38 (0.47) with seed 0, and
  -> 0.35 (0.46) with seed 1 (+14 to +17 points; both levels rise: level 2 0.15 -> 0.34-0.35,
  level 3 0.27 -> 0.36-0.41). At lr 3e-5: -> 0.28 (0.38), +7. A base 25 steps further
  on (sampled 0.35, greedy 0.46) rose less: -> 0.46 (0.54), +11.
- Levels 1-3 from a base stopped at step 650 (0.36 (0.43); level 1 already 0.90 sampled):
  +4 points in 40 steps at lr 3e-5, +8 in 80 at 1e-4, +7 in 80 at 3e-4 (level 1 eroding
  to 0.93-0.95): level 2 (two-digit sums answered in one shot) stayed at 0.06-0.07, where
  its right answers were lucky guesses, and only level 3 rose.

Everything below was measured before, on the earlier base (a full 300-step schedule, now
``QUICK``), arithmetic levels 1-3, held-out 50 per level (greedy base: level 1 0.86, level 2
0.03, level 3 0.04, all 0.31), max_new_tokens 40 (level 3's worked answers take at most
~35 tokens):

- Nothing tried lifts held-out accuracy. 32 tasks x 16 samples, T = 1: lr 3e-5 flat for
  75+ steps (0.31 -> 0.30; training reward 0.20 -> 0.26); lr 1e-4 drifts down (0.31 ->
  0.21 at step 75, level 1 0.86 -> 0.61); lr 3e-4 collapses (0.05 at step 40), 1e-3
  within 10 steps. 64 x 16 at 1e-4, T = 0.7 at 5e-5, and Adam eps 1e-3 at 3e-4: flat or down.
- The algorithm does learn what it trains on: the same 16 level-2 prompts resampled each
  step (lr 1e-4, G = 16) go from 0/16 to 6/16 greedy in 24 steps, level-1 prompts from
  15/16 to 16/16 in 9. What does not happen is transfer to unseen problems: the held-out
  set is disjoint, and this policy answers level 2 in one shot (``\\boxed{139}``), so RL
  would have to teach it two-digit addition rather than sharpen what it knows.
- Gradients of independent 512-sample batches agree in sign on ~50% of the weights (cosine
  -0.4 .. 0.5): a few lucky right answers (advantage up to sqrt(G - 1)) dominate each step,
  which is why larger learning rates walk the policy away.
- The step is right but the landscape is sharp. The engine's sampling log-probs equal the
  trainer's recomputed ones to 6e-6; on the 50 trainable level-1 prompts (on the
  column-step base below) a small step raises the probability of the right completion
  (0.740 -> 0.745 after one SGD step at lr 1e-3, 0.759 at 1e-2; 0.793 after 30 Adam steps
  at 2e-5), but one SGD step of norm 0.1 drops it to 0.20, one Adam step at 1e-4 to 0.69,
  and 10 SGD steps at 0.3 collapse every answer to "11". Also tried, 40 steps each, none
  lifting held-out accuracy: a base with worked column steps for level 2 (greedy 0.39,
  pass@16 0.52 / 0.46 on levels 2 / 3) at lr 2e-5, 5e-5, 1e-4 with a 10-step warm-up, four
  optimizer steps per batch, and positive-advantage samples only at 3e-4 (0.33-0.39 at the
  end).
- Where held-out accuracy goes: level 1 has 100 problems, half held out. Training on the
  other half turns held-out answers into off-by-one ones (128 x 8 at lr 5e-5: level 1 0.88
  -> 0.68 in 30 steps; 7+2 -> 8, 1+1 -> 11); training on levels 2-3 alone keeps level 1 at
  0.86-0.92 but learns nothing there either (2% of samples right). A wider base (hidden
  256, SFT lr 1e-3: greedy 0.51) declines the same way (0.45 and 0.43 after 40 steps at lr
  3e-5 and 1e-4). The engine's sampler matches the model's distribution (2,000 draws per
  prompt, within 0.01 of every top-5 probability).
- Advantages only centred, not divided by the group's std (Dr. GRPO; a lone wrong answer
  in a near-solved group then weighs -0.94 instead of -3.9): 0.313 -> 0.267 after 40 steps
  (level 1 0.88 -> 0.76), against 0.273 (0.74) with the std: the erosion is not that.
- The level-1 erosion is not the held-out half forgetting what the trained half learns:
  after 6 steps at lr 1e-4 all 100 level-1 problems fall together (trained half 0.62,
  held-out half 0.58) and the wrong answers are the right one plus or minus one, the sign
  swinging between steps (trained on level-1 groups only: 51 of 100 answers one too low
  after 3 steps, 24 one too high after 6; levels 2-3 only: level 1 0.86 -> 0.74, mostly
  one too high). The updates overshoot along the digits' order; frozen embeddings do not
  stop it (level 1 0.88 -> 0.46 in 10 steps). The policy is sharp only along such
  directions: random noise of std 1e-3 on every weight (norm ~0.9) leaves a 1500-step
  base's greedy answers unchanged.
- What sampling finds (``HeldOut.sample_stats``, 64 draws per held-out task, T = 1): level
  2 right in 2.5% of draws, level 3 in 1.9%, spread over the tasks like lucky guesses
  (pass@16 0.31 and 0.23 against 0.33 and 0.27 at an even rate; the best task 16% and
  12%), level 1 62% (greedy 88%). GRPO does sharpen the sampling distribution: on a
  500-step SFT base (greedy 1.00 / 0.02 / 0.12, all 0.38), 100 steps at lr 1e-4 raise the
  reward on each step's fresh prompts from 0.26 to 0.39-0.46, but greedy held-out accuracy
  stays at 0.37-0.41: the most likely answer does not change. Lifting it 20 points needs
  the policy to learn two-digit arithmetic from ~4 right level-2 samples a step, where SFT
  with labels is still at 2% on level 2 after ~10,700 level-2 examples (500 steps) and
  reaches 0.80 after ~32,000 (1500 steps: all 0.91; 30 GRPO steps at 3e-5 keep it at
  0.89-0.91).
- Speed: 32 x 8 samples, one step (generate, score, train) 0.5 s on a quiet machine;
  32 x 16 took 3-8 s per step with the machine shared; a held-out evaluation 0.3-15 s.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from node.tasks import RL_TASKSET
from node.training.grpo import GRPOConfig

if TYPE_CHECKING:
    from node.rollouts.generate import ScoredGroup
    from node.training.heldout import HeldOut

DEFAULT_STEPS = 30


@dataclass(frozen=True)
class GenerationConfig:
    """How rollouts are generated (a worker's settings, and the baseline's)."""

    tasks_per_step: int = 32  # tasks (GRPO groups) per trainer step
    group_size: int = 16  # samples per task (G): more groups with a right answer
    max_new_tokens: int = 40  # arithmetic levels 1-3 answer in at most ~35 tokens
    temperature: float = 1.0  # sampling temperature (also used for the new log-probs)


@dataclass(frozen=True)
class CentralConfig:
    steps: int = DEFAULT_STEPS
    seed: int = 0
    taskset: str = RL_TASKSET
    gen: GenerationConfig = field(default_factory=GenerationConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    eval_every: int = 5
    heldout_per_level: int = 50
    heldout_draws: int = 8  # sampled accuracy and pass@k: draws per task at gen.temperature
    heldout_seed: int = 0
    heldout_max_new_tokens: int = 40
    threads: int = 2


def fake_worker(seed: int) -> str:
    """The address the baseline draws its tasks for (one per seed)."""
    from crypto.hashing import digest

    return "0x" + digest(b"intellect-node/central-baseline" + seed.to_bytes(8, "big"))[:20].hex()


def run(
    cfg: CentralConfig,
    model_dir: Path | str | None = None,
    *,
    on_metrics: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run the baseline; one metrics dict per step (step 0: the base policy)."""
    import torch

    from node.engine.base import SamplingParams
    from node.engine.torch_engine import TorchEngine
    from node.rollouts.generate import generate_groups
    from node.tasks import load_taskset
    from node.training.grpo import samples_from_groups
    from node.training.heldout import HeldOut, metrics_fields
    from node.training.policy import Policy

    torch.set_num_threads(cfg.threads)
    if model_dir is None:
        model_dir = base_model_dir()
    policy = Policy(Path(model_dir), cfg.grpo, seed=cfg.seed)
    engine = TorchEngine(policy.model, eos_token_ids=policy.eos_token_ids, max_batch=64)
    taskset = load_taskset(cfg.taskset)
    heldout = HeldOut(cfg.taskset, per_level=cfg.heldout_per_level, seed=cfg.heldout_seed)
    worker = fake_worker(cfg.seed)
    g = cfg.gen
    params = SamplingParams(max_new_tokens=g.max_new_tokens, temperature=g.temperature, prove=False)
    started = time.perf_counter()
    tokens_trained = 0
    history: list[dict[str, Any]] = []

    def evaluate(metrics: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        scores = heldout.evaluate(
            engine,
            policy.tokenizer,
            draws=cfg.heldout_draws,
            temperature=g.temperature,
            max_new_tokens=cfg.heldout_max_new_tokens,
        )
        metrics |= metrics_fields(scores, cfg.heldout_draws)
        metrics["eval_seconds"] = time.perf_counter() - t0

    def emit(metrics: dict[str, Any]) -> None:
        metrics["elapsed"] = time.perf_counter() - started
        history.append(metrics)
        if on_metrics is not None:
            on_metrics(metrics)

    base: dict[str, Any] = {"step": 0, "tokens_trained": 0, "seconds": 0.0}
    evaluate(base)
    emit(base)
    for step in range(cfg.steps):
        t0 = time.perf_counter()
        groups = generate_groups(
            engine,
            policy.tokenizer,
            taskset,
            worker=worker,
            step=step,
            count=g.tasks_per_step,
            group_size=g.group_size,
            params=params,
        )
        gen_seconds = time.perf_counter() - t0
        kept = trainable_groups(groups, heldout)
        samples = samples_from_groups(
            [
                (
                    gr.prompt,
                    [
                        (r.tokens, r.logprobs, w)
                        for r, w in zip(gr.results, gr.rewards, strict=True)
                    ],
                )
                for gr in kept
            ],
            cfg.grpo.adv_eps,
        )
        rewards = [w for gr in groups for w in gr.rewards]
        metrics: dict[str, Any] = {
            "step": step + 1,
            "reward_mean": sum(rewards) / len(rewards),
            "groups": len(groups),
            "groups_heldout": len(groups) - len(kept),
            "groups_used": sum(1 for gr in kept if len(set(gr.rewards)) > 1),
            "gen_seconds": gen_seconds,
        }
        if samples:
            stats = policy.train_step(samples, g.temperature)
            tokens_trained += int(stats["tokens"])
            metrics.update({k: stats[k] for k in ("loss", "grad_norm", "clip_frac", "samples")})
            metrics["train_seconds"] = stats["seconds"]
        metrics["tokens_trained"] = tokens_trained
        metrics["seconds"] = time.perf_counter() - t0
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            evaluate(metrics)
        emit(metrics)
    return history


def trainable_groups(groups: list[ScoredGroup], heldout: HeldOut) -> list[ScoredGroup]:
    """The groups whose prompt is not held out."""
    return [g for g in groups if not heldout.contains(g.task.prompt)]


def base_model_dir() -> Path:
    """The ``model init`` base policy (built once per machine, then cached)."""
    import tempfile

    from node.engine.tinymodel import Recipe, build_tiny_model, default_cache_dir

    cached = default_cache_dir() / Recipe().digest()
    out = cached if cached.is_dir() else Path(tempfile.mkdtemp(prefix="central-")) / "base"
    path, _ = build_tiny_model(out, Recipe(), cache_dir=default_cache_dir())
    return path


def summary(history: list[dict[str, Any]], cfg: CentralConfig) -> dict[str, Any]:
    evals = [m for m in history if "heldout_sampled" in m]
    steps = [m for m in history if m["step"] > 0]
    return {
        "config": {
            **asdict(cfg),
            "grpo": {**asdict(cfg.grpo), "betas": list(cfg.grpo.betas)},
        },
        "base_accuracy": evals[0]["heldout_sampled"],
        "final_accuracy": evals[-1]["heldout_sampled"],
        "base_greedy": evals[0]["heldout_greedy"],
        "final_greedy": evals[-1]["heldout_greedy"],
        "accuracy": {m["step"]: m["heldout_sampled"] for m in evals},
        "greedy": {m["step"]: m["heldout_greedy"] for m in evals},
        "heldout": {m["step"]: m["heldout_by_level"] for m in evals},
        "seconds_per_step": sum(m["seconds"] for m in steps) / max(len(steps), 1),
        "seconds": history[-1]["elapsed"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m node.training.central", description=__doc__)
    d, dg, dr = CentralConfig(), GenerationConfig(), GRPOConfig()
    ap.add_argument("--steps", type=int, default=d.steps)
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--model", type=Path, default=None, help="base model directory")
    ap.add_argument("--taskset", default=d.taskset)
    ap.add_argument("--tasks-per-step", type=int, default=dg.tasks_per_step)
    ap.add_argument("--group-size", type=int, default=dg.group_size)
    ap.add_argument("--max-new-tokens", type=int, default=dg.max_new_tokens)
    ap.add_argument("--temperature", type=float, default=dg.temperature)
    ap.add_argument("--lr", type=float, default=dr.lr)
    ap.add_argument("--micro-batch", type=int, default=dr.micro_batch)
    ap.add_argument("--eval-every", type=int, default=d.eval_every)
    ap.add_argument("--heldout-per-level", type=int, default=d.heldout_per_level)
    ap.add_argument("--heldout-draws", type=int, default=d.heldout_draws)
    ap.add_argument("--threads", type=int, default=d.threads)
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    a = ap.parse_args(argv)
    cfg = CentralConfig(
        steps=a.steps,
        seed=a.seed,
        taskset=a.taskset,
        gen=GenerationConfig(a.tasks_per_step, a.group_size, a.max_new_tokens, a.temperature),
        grpo=GRPOConfig(lr=a.lr, micro_batch=a.micro_batch),
        eval_every=a.eval_every,
        heldout_per_level=a.heldout_per_level,
        heldout_draws=a.heldout_draws,
        threads=a.threads,
    )

    def show(m: dict[str, Any]) -> None:
        if a.json:
            print(json.dumps(m), flush=True)
            return
        held = ""
        if "heldout_sampled" in m:  # sampled (greedy) per level, then over every level
            levels = m["heldout_by_level"].items()
            held = " ".join(f"{k}:{v['sampled']:.2f}({v['greedy']:.2f})" for k, v in levels)
            held += f" all:{m['heldout_sampled']:.2f}({m['heldout_greedy']:.2f})"
        print(
            f"step {m['step']:3d}  reward {m.get('reward_mean', float('nan')):.3f}  "
            f"tokens {m['tokens_trained']:7d}  {m['seconds']:5.1f}s  {held}",
            flush=True,
        )

    history = run(cfg, a.model, on_metrics=show)
    s = summary(history, cfg)
    if a.json:
        print(json.dumps(s), flush=True)
    else:
        print(
            f"held-out accuracy sampled {s['base_accuracy']:.3f} -> {s['final_accuracy']:.3f}, "
            f"greedy {s['base_greedy']:.3f} -> {s['final_greedy']:.3f} "
            f"in {cfg.steps} steps, {s['seconds_per_step']:.1f} s/step, {s['seconds']:.0f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
