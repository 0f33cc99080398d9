"""One GRPO step sharded with FSDP2 equals the same step in one process.

Run under torchrun: ``torchrun --nproc-per-node 2 -m node.training.fsdp_check --model DIR``
(gloo on a CPU, NCCL with ``--device cuda``; ``--workdir`` a directory every rank sees). Every rank builds the same fixed samples
(two arithmetic groups answered right and wrong, with the base policy's own log-probs as
the sampling log-probs), takes one sharded step (each rank trains on its share of the
samples), saves the full weights and the optimizer state from rank 0, and resumes a second
sharded policy from them; rank 0 then takes the same step in one process and compares the
step's statistics and every weight, and the resumed policy's next step with the
original's. Exit status 0 and a line
``fsdp-check ok ...`` when they agree within ``--atol``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from node.training.grpo import GRPOConfig, TrainSample, samples_from_groups

PROBLEMS = (
    ("3+4=?\nAnswer:", "7", ("8", "6", "12")),
    ("21+35=?\nAnswer:", "56", ("55", "65", "46")),
    ("6*7+5=?\nAnswer:", "47", ("42", "45", "57")),
)


def fixed_samples(policy: Any, temperature: float = 1.0) -> list[TrainSample]:
    from node.engine.models import prompt_ids

    tok = policy.tokenizer
    groups = []
    for prompt, right, wrongs in PROBLEMS:
        comps = []
        for answer, reward in [(right, 1.0)] + [(w, 0.0) for w in wrongs]:
            out = tok(f" \\boxed{{{answer}}}", add_special_tokens=False)["input_ids"]
            out = [*out, tok.eos_token_id]
            comps.append((out, [0.0] * len(out), reward))
        groups.append((prompt_ids(tok, prompt), comps))
    samples = samples_from_groups(groups)
    for s, lps in zip(samples, policy.logprobs(samples, temperature), strict=True):
        s.logprobs = lps
    return samples


def main(argv: list[str] | None = None) -> int:
    from node.training.policy import Policy

    ap = argparse.ArgumentParser(prog="python -m node.training.fsdp_check")
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--workdir", type=Path, required=True, help="a directory all ranks see")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--micro-batch", type=int, default=5)
    ap.add_argument("--atol", type=float, default=1e-5)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    # fp32 on a GPU too: the check is that sharding changes nothing, to the last bit
    cfg = GRPOConfig(lr=a.lr, micro_batch=a.micro_batch, bf16_on_gpu=False)
    sharded = Policy(a.model, cfg, device=a.device, distributed=True)
    rank = sharded.ranks.rank
    # the samples (and their log-probs) come from an unsharded copy, identical on every
    # rank; 11 of them, so the ranks' shares differ and one rank runs an idle micro-batch
    single = Policy(a.model, cfg, device=a.device, distributed=False)
    samples = fixed_samples(single)[:-1]
    got = sharded.train_step(samples, 1.0)
    saved = sharded.save(a.workdir / "v1")
    sharded.save_state(a.workdir / "v1.state")
    sharded._barrier()
    # resuming sharded from what rank 0 wrote gives the same next step as going on
    resumed = Policy.from_checkpoint(
        a.workdir / "v1", a.workdir / "v1.state", cfg, device=a.device, distributed=True
    )
    go_on = sharded.train_step(samples[::-1], 1.0)
    again = resumed.train_step(samples[::-1], 1.0)
    after = sharded.full_state_dict()
    after_resumed = resumed.full_state_dict()
    # every rank done with every collective before the group goes: a rank that tore it
    # down while the other's last exchange was in flight aborted at exit ("terminate
    # called without an active exception"), under load, after printing its result
    sharded._barrier()
    sharded.close()
    if rank != 0:
        return 0
    assert saved is not None
    from safetensors.torch import load_file

    want = single.train_step(samples, 1.0)
    on_disk = load_file(saved / "model.safetensors")
    ref = single.model.state_dict()
    worst = max((on_disk[k] - ref[k].cpu()).abs().max().item() for k in on_disk)
    resume_diff = max((after[k] - after_resumed[k]).abs().max().item() for k in after)
    stats_ok = all(
        abs(got[k] - want[k]) <= 1e-4 * max(1.0, abs(want[k]))
        for k in ("loss", "grad_norm", "clip_frac", "tokens")
    )
    resume_ok = resume_diff <= a.atol and abs(go_on["loss"] - again["loss"]) <= 1e-6
    ok = worst <= a.atol and stats_ok and resume_ok
    report = {
        "world": sharded.ranks.world,
        "samples": len(samples),
        "max_weight_diff": worst,
        "resume_max_weight_diff": resume_diff,
        "sharded": {k: got[k] for k in ("loss", "grad_norm", "tokens")},
        "single": {k: want[k] for k in ("loss", "grad_norm", "tokens")},
    }
    print(f"fsdp-check {'ok' if ok else 'FAILED'} {json.dumps(report)}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
