"""Benchmark: TOPLOC proof cost, validation speed and detection, measured in one run.

    .venv/bin/python bench/toploc.py [--trials 5] [--large-trials 3] [--json]

(a) proof build time per 32 generated tokens as a percentage of the generation time of
    those tokens, both measured in the project's engine (``TorchEngine``: generation
    without proofs, and the engine's own proof timer on a run with proofs; tiny and larger
    model, 256 new tokens, batch 1 and batch 16 in flight, each batch proven in one call; the JSON's ``build_overhead_pct`` is
    the tiny model at batch 16, the engine's path, ``..._batch1`` the worst case);
(b) validation (one prefill pass + TOPLOC verify + sampling check) vs. generation time
    for 256-token outputs;
(c) verify a (1000, 5120) bf16 activation set in 32-row chunks, k = 128 (median of 5 warm
    runs; the reference implementation's own bound is < 100 ms on CPU);
(d) detection: for each substitution, N trials (other prompts and seeds), detected/N, and
    honest false positives/N (honest batched generation, batch 4, verified one by one),
    under the paper's thresholds and under STRICT_FP32, on the tiny model (2 layers,
    hidden 64) and a larger random-init model (8 layers, hidden 1024).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from crypto.sampling import derive_seed  # noqa: E402
from crypto.toploc import PAPER, STRICT_FP32, build_proofs, verify_proofs  # noqa: E402
from crypto.verdict import RolloutClaim, VerifyConfig, check_rollout  # noqa: E402
from node.engine.base import GenRequest, SamplingParams  # noqa: E402
from node.engine.torch_engine import TorchEngine  # noqa: E402
from tests.helpers.tiny_lm import ATTACKS, EOS, attack, generate, recompute, tiny_llama  # noqa: E402

GEN_TOKENS = 256


def prompt_of(i: int, vocab: int) -> list[int]:
    g = torch.Generator().manual_seed(1000 + i)
    return torch.randint(3, vocab, (6 + i % 11,), generator=g).tolist()


def timing(model, label: str, batch: int) -> dict[str, float]:
    """With the project's engine (``TorchEngine``, ``batch`` sequences in flight): generate
    256 tokens for ``batch`` prompts without proofs, then again with proofs (the engine
    times its own proof building), and validate one sequence (prefill + verify + sampling
    check)."""
    vocab = model.config.vocab_size
    engine = TorchEngine(model, eos_token_ids=frozenset({EOS}), max_batch=batch)
    reqs = [
        GenRequest(prompt_of(i, vocab), derive_seed("bench", f"timing-{i}", 0))
        for i in range(batch)
    ]
    off = SamplingParams(max_new_tokens=GEN_TOKENS, stop_at_eos=False, prove=False)
    engine.generate(reqs, SamplingParams(max_new_tokens=8, stop_at_eos=False))  # warm-up
    t0 = time.perf_counter()
    engine.generate(reqs, off)
    gen_s = time.perf_counter() - t0
    engine.proof_seconds = 0.0
    results = engine.generate(reqs, dataclasses.replace(off, prove=True))
    build_s = engine.proof_seconds
    gen = results[0]
    t0 = time.perf_counter()
    acts, logits = recompute(model, gen.prompt, gen.tokens)
    claim = RolloutClaim(gen.tokens, gen.proofs, gen.seed, gen.finish_reason, GEN_TOKENS, 1.0)
    verdict = check_rollout(claim, acts, logits, eos_token_id=EOS)
    validate_s = time.perf_counter() - t0
    if not verdict.passed:
        raise RuntimeError(f"honest rollout failed validation: {verdict.reason}")
    # per 32 generated tokens: proof time vs the generation time of those tokens
    blocks = batch * GEN_TOKENS / 32
    out = {
        "build_overhead_pct": (build_s / blocks) / (gen_s / blocks) * 100,
        "build_ms_per_32": build_s / blocks * 1000,
        "validate_speedup": (gen_s / batch) / validate_s if batch == 1 else float("nan"),
    }
    line = (
        f"  {label:<34} batch {batch:>2}: generate {gen_s * 1000:8.1f} ms, prove {build_s * 1000:7.1f} ms "
        f"({out['build_ms_per_32']:.2f} ms per 32 tokens) = {out['build_overhead_pct']:.2f}% overhead"
    )
    if batch == 1:
        line += f" | validate {validate_s * 1000:.1f} ms = {out['validate_speedup']:.1f}x faster than generating"
    print(line)
    return out


def verify_big() -> tuple[float, float]:
    g = torch.Generator().manual_seed(5)
    acts = [torch.randn(5120, generator=g).to(torch.bfloat16) for _ in range(1000)]
    proofs = build_proofs(acts, skip_prefill=True)
    t0 = time.perf_counter()
    first = verify_proofs(acts, proofs, skip_prefill=True)
    first_ms = (time.perf_counter() - t0) * 1000
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        res = verify_proofs(acts, proofs, skip_prefill=True)
        runs.append((time.perf_counter() - t0) * 1000)
    if not all(r.passed for r in first + res):
        raise RuntimeError("honest activations failed verification")
    return statistics.median(runs), first_ms


def detection(model, trials: int, max_new: int, label: str) -> dict[str, object]:
    vocab = model.config.vocab_size
    profiles = {"paper": PAPER, "strict_fp32": STRICT_FP32}
    detected = {p: {a: 0 for a in ATTACKS} for p in profiles}
    false_pos = {p: 0 for p in profiles}
    honest_trials = 0

    def passes(validator_model, gen, prompt, th) -> bool:
        acts, logits = recompute(validator_model, prompt, gen.tokens)
        claim = RolloutClaim(
            gen.tokens, build_proofs(gen.activations), gen.seed, gen.finish_reason, max_new, 1.0
        )
        return check_rollout(
            claim, acts, logits, eos_token_id=EOS, config=VerifyConfig(thresholds=th)
        ).passed

    for t in range(trials):
        prompts = [prompt_of(4 * t + j, vocab) for j in range(4)]
        seeds = [derive_seed("bench", f"task-{t}-{j}", t) for j in range(4)]
        for gen in generate(model, prompts, seeds, max_new_tokens=max_new):  # honest, batched
            honest_trials += 1
            for p, th in profiles.items():
                false_pos[p] += not passes(model, gen, gen.prompt, th)
        for name in ATTACKS:
            validator_model, gen, prompt = attack(
                model, name, prompts[0], prompts[1], seeds[0], max_new_tokens=max_new
            )
            for p, th in profiles.items():
                detected[p][name] += not passes(validator_model, gen, prompt, th)
    print(
        f"  {label}: {trials} trials per attack, {honest_trials} honest rollouts, {max_new} new tokens"
    )
    print(f"    {'attack':<20} {'paper thresholds':>18} {'STRICT_FP32':>14}")
    for name in ATTACKS:
        print(
            f"    {name:<20} {detected['paper'][name]:>8}/{trials:<9} {detected['strict_fp32'][name]:>6}/{trials}"
        )
    print(
        f"    {'honest: false pos.':<20} {false_pos['paper']:>8}/{honest_trials:<9} {false_pos['strict_fp32']:>6}/{honest_trials}"
    )
    return {
        "honest_trials": honest_trials,
        "false_positives": false_pos["paper"],
        "false_positives_strict": false_pos["strict_fp32"],
        "detection": {a: [detected["paper"][a], trials] for a in ATTACKS},
        "detection_strict": {a: [detected["strict_fp32"][a], trials] for a in ATTACKS},
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--trials", type=int, default=5, help="detection trials per attack, tiny model")
    ap.add_argument(
        "--large-trials",
        type=int,
        default=3,
        help="detection trials per attack, larger model (0: skip)",
    )
    ap.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    args = ap.parse_args()
    torch.manual_seed(0)
    tiny = tiny_llama(0)
    large = tiny_llama(0, layers=8, hidden=1024, vocab=4096) if args.large_trials else None

    print(f"(a, b) proof build overhead and validation speed, {GEN_TOKENS} new tokens, CPU fp32:")
    t_tiny = timing(tiny, "tiny (2 layers, hidden 64)", 1)
    t_tiny16 = timing(tiny, "tiny (2 layers, hidden 64)", 16)
    t_large = timing(large, "larger (8 layers, hidden 1024)", 1) if large is not None else None
    t_large16 = timing(large, "larger (8 layers, hidden 1024)", 16) if large is not None else None
    verify_ms, first_ms = verify_big()
    print(
        f"(c) verify (1000, 5120) bf16 in 32-row chunks, k=128: {verify_ms:.1f} ms (median of 5 warm runs; first call {first_ms:.1f} ms)"
    )
    print(f"    vs. the reference's < 100 ms bound: {100 / verify_ms:.1f}x under it")
    print("(d) detection (a rollout is detected when TOPLOC, sampling or termination fails):")
    d_tiny = detection(tiny, args.trials, 70, "tiny model")
    d_large = detection(large, args.large_trials, 48, "larger model") if large is not None else None
    if args.json:
        figures = {
            "build_overhead_pct": round(t_tiny16["build_overhead_pct"], 3),
            "build_overhead_pct_batch1": round(t_tiny["build_overhead_pct"], 3),
            "validate_speedup": round(t_tiny["validate_speedup"], 2),
            "verify_1000x5120_ms": round(verify_ms, 2),
            "verify_1000x5120_first_call_ms": round(first_ms, 2),
            **d_tiny,
            "large": None
            if t_large is None
            else {
                "build_overhead_pct": round(t_large16["build_overhead_pct"], 3),  # type: ignore[index]
                "build_overhead_pct_batch1": round(t_large["build_overhead_pct"], 3),
                "validate_speedup": round(t_large["validate_speedup"], 2),
                **(d_large or {}),
            },
        }
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
