"""Benchmark: what the per-batch verdict concludes about GPU-made work, and what it costs.

    .venv/bin/python bench/verify.py [--fixture FILE] [--cpu-trials 2] [--top-p-batches 64]
        [--top-p-cheat-batches 2] [--json]

One run, on this machine:

1. The GPU fixture (default ``tests/fixtures/gpu_rollouts_h200.json``, made on an H200 by
   ``bench/gpu_rollouts.py``): its model is rebuilt from the recipe (SHA-256 checked),
   every variant is cut into batches of 16 rollouts in order (``honest_batch32`` gives 3,
   every other variant 1) and judged with ``crypto.verdict.check_batch`` under the
   ``gpu-bf16`` profile, with the validator recomputing in bf16 and in fp32 on the CPU:
   batches accepted / total and rollouts flagged / total per variant.
2. The project's CPU cases (``tests/helpers/tiny_lm.py``: a 2-layer fp32 Llama; honest, other
   weights, other prompt, an edited token, a forced token, one AdamW step, bf16 compute
   claimed as fp32), batches of 8 rollouts, under ``strict-fp32`` (the profile of an fp32
   run) and ``gpu-bf16``.
3. The top-p calibration set, made on this CPU: a random-init Llama of the ``wide`` shape
   (vocabulary 8,192, 6 layers) generates in bf16 (16 in flight) at every setting of
   ``TOP_P_SETTINGS`` (temperature 0.6, 0.8, 1.0 × top-p 0.9, 0.95), ``--top-p-batches``
   honest batches of 16 each (seeds the tests never use: calibration data, not a tuned
   test), judged by validators recomputing in bf16 and in fp32; and at every setting the
   cheats of the verification matrix (``TOP_P_CHEATS``: int8 / other weights, one AdamW
   step, greedy, half the temperature, no top-p, an edited token), ``--top-p-cheat-batches``
   each, judged as a validator judges (``check_batch``, then the substitution test).
   Nucleus-boundary events and their honest bound are counted per setting.
4. The honest margin: the largest statistic / bound over every honest batch (below 1
   passes; the bound is what honest noise exceeds with probability ``false_slash``).
5. Validation time against generation time for the same rollouts: the fixture's model
   generates 48 rollouts of 96 tokens here (bf16, 32 in flight), and the validator judges
   exactly those (bf16 and fp32 recomputation, one prefill per rollout).

``--json``: the last line is one JSON object with ``honest_batches_accepted``,
``honest_batches`` (the top-p set included), ``honest_margin``, ``detected`` (variant →
[rejected, batches]), ``false_slash_bound`` (per profile), ``top_p`` (per setting: honest
batches accepted per precision, boundary events, their expected number and bound, and the
cheats' rejections) and the details.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from crypto.sampling import derive_seed  # noqa: E402
from crypto.toploc import build_proofs  # noqa: E402
from crypto.verdict import (  # noqa: E402
    FP32,
    GPU_BF16,
    PROFILES,
    BatchVerdict,
    RolloutClaim,
    VerifyConfig,
    check_batch,
)
from node.engine.base import GenRequest, SamplingParams  # noqa: E402
from node.engine.calibration import (  # noqa: E402
    TOP_P_SETTINGS,
    build_random_llama,
    claim_of,
    edited_variant,
    fixture_batches,
    generate_variant,
    judge_variant,
    model_layers,
    random_prompts,
    recompute_all,
    shape_recipe,
    variant_model,
    weights_sha256,
)
from node.engine.torch_engine import TorchEngine  # noqa: E402

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gpu_rollouts_h200.json"
HONEST = ("honest_batch32", "honest_batch1", "honest")
CPU_CASES = (
    "honest",
    "other_seed",
    "other_prompt",
    "token_changed",
    "tampered_sampling",
    "optimizer_step",
    "bf16_as_fp32",
)


def judge_fixture(doc: dict, precision: str, model, config: VerifyConfig) -> dict:
    eos = doc["config"]["eos_token_id"]
    out = {}
    for name, variant in doc["variants"].items():
        started = time.perf_counter()
        verdicts = judge_variant(model, variant, config, eos_token_id=eos)
        out[name] = summary(verdicts, time.perf_counter() - started)
    return out


# the verification matrix's cheats at a sampling setting: (name, model variant or None,
# sampled with (temperature, top_p) from the run's (t, p), an edit after proving)
TOP_P_CHEATS = (
    ("int8_weights", "int8_weights", lambda t, p: (t, p)),
    ("other_weights", "other_weights", lambda t, p: (t, p)),
    ("adamw_step", "adamw_step", lambda t, p: (t, p)),
    ("greedy", None, lambda t, p: (0.0, p)),
    ("half_temperature", None, lambda t, p: (t / 2, p)),
    ("no_top_p", None, lambda t, p: (t, 1.0)),
    ("edited_token", None, lambda t, p: (t, p)),
)
TOP_P_SHAPE = "wide"
TOP_P_NEW_TOKENS = 48
HELD_OUT_SEED = 424242  # prompts and sampling seeds of the calibration set (tests use others)


def as_validator(model, suspects, variant: dict, config: VerifyConfig) -> list[BatchVerdict]:
    """A validator's verdicts on ``variant``, batch by batch (``judge_claims``: check_batch,
    then the substitution test of a batch that passed)."""
    from node.rollouts.recheck import judge_claims

    return [
        judge_claims(
            model,
            2,
            [r["prompt"] for r in batch],
            [claim_of(r, variant) for r in batch],
            config,
            suspects,
        )
        for batch in fixture_batches(variant)
    ]


def top_p_set(batches: int, cheat_batches: int) -> dict:
    """The top-p calibration set (see the module's docstring, part 3)."""
    from node.rollouts.suspects import SuspectModels

    recipe = shape_recipe(TOP_P_SHAPE)
    bf16 = build_random_llama(recipe["config"], 0, recipe["lm_head_scale"])
    validators = {
        "bf16": bf16,
        "fp32": build_random_llama(recipe["config"], 0, recipe["lm_head_scale"]).float(),
    }
    suspects = {p: SuspectModels(m) for p, m in validators.items()}
    config = GPU_BF16.for_layers(model_layers(bf16))
    vocab = recipe["config"]["vocab_size"]
    cheat_models = {
        name: variant_model(f"{variant}_batch16", bf16, recipe, torch.device("cpu"))
        for name, variant, _ in TOP_P_CHEATS
        if variant
    }
    out: dict[str, dict] = {}
    for n, (t, p) in enumerate(TOP_P_SETTINGS):
        started = time.perf_counter()
        prompts = random_prompts(16 * batches, vocab, seed=HELD_OUT_SEED + n)
        first = HELD_OUT_SEED * 10 + 100_000 * n
        honest = generate_variant(
            bf16,
            prompts,
            batch=16,
            new_tokens=TOP_P_NEW_TOKENS,
            temperature=t,
            top_p=p,
            first_seed=first,
        )
        row: dict = {"temperature": t, "top_p": p}
        for precision, model in validators.items():
            verdicts = judge_variant(model, honest, config, eos_token_id=2)
            row[precision] = {
                **summary(verdicts, 0.0),
                "boundary_events": sum(v.boundary for v in verdicts),
                "boundary_expected": round(
                    sum(r.sampling.boundary_expected for v in verdicts for r in v.rollouts), 2
                ),
                "boundary_bound_per_batch": round(max(v.boundary_bound for v in verdicts), 2),
            }
        cheats = {}
        few = prompts[: 16 * cheat_batches]
        for name, _, sampled in TOP_P_CHEATS:
            ct, cp = sampled(t, p)
            made = generate_variant(
                cheat_models.get(name, bf16),
                few,
                batch=16,
                new_tokens=TOP_P_NEW_TOKENS,
                temperature=ct,
                top_p=cp,
                first_seed=first,
                claimed=(t, p),
            )
            if name == "edited_token":
                made = edited_variant(made, vocab)
            for precision, model in validators.items():
                verdicts = as_validator(model, suspects[precision], made, config)
                cheats[f"{name}/{precision}"] = [
                    sum(not v.passed for v in verdicts),
                    len(verdicts),
                    sorted({v.reason.split(":")[0] for v in verdicts if not v.passed}),
                ]
        row["cheats"] = cheats
        row["seconds"] = round(time.perf_counter() - started, 1)
        out[f"T{t}/p{p}"] = row
        print(
            f"  T {t} top-p {p}: honest accepted bf16 {row['bf16']['accepted']}/{batches}, "
            f"fp32 {row['fp32']['accepted']}/{batches}; boundary events "
            f"{row['bf16']['boundary_events']} / {row['fp32']['boundary_events']} (expected at "
            f"most {row['bf16']['boundary_expected']}); cheats rejected "
            f"{sum(c[0] for c in cheats.values())}/{sum(c[1] for c in cheats.values())} "
            f"({row['seconds']} s)",
            flush=True,
        )
    return out


def summary(verdicts, seconds: float) -> dict:
    return {
        "accepted": sum(v.passed for v in verdicts),
        "batches": len(verdicts),
        "flagged": sum(len(v.flagged) for v in verdicts),
        "rollouts": sum(len(v.rollouts) for v in verdicts),
        "margins": [round(v.margin, 4) for v in verdicts],
        "reasons": sorted({v.reason.split(":")[0] for v in verdicts if not v.passed}),
        "seconds": round(seconds, 2),
    }


def cpu_cases(trials: int) -> dict:
    """The tiny fp32 model's honest work and attacks, in batches of 8 rollouts."""
    from tests.helpers.tiny_lm import EOS, attack, generate, recompute, tiny_llama

    model = tiny_llama(0)
    prompts = [[(7 * i + j) % 250 + 3 for j in range(4 + i % 9)] for i in range(16)]
    max_new = 70
    out: dict[str, dict] = {}
    for profile in (FP32, GPU_BF16):
        config = profile.for_layers(model_layers(model))
        for case in CPU_CASES:
            verdicts = []
            started = time.perf_counter()
            for trial in range(trials):
                seeds = [derive_seed("bench", f"task-{i}", trial) for i in range(8)]
                claims, recomputed = [], []
                for i, seed in enumerate(seeds):
                    prompt = prompts[(i + trial) % 16]
                    if case == "honest":
                        validator, gen, checked = (
                            model,
                            generate(model, [prompt], [seed], max_new_tokens=max_new)[0],
                            prompt,
                        )
                    else:
                        other = prompts[(i + trial + 5) % 16]
                        validator, gen, checked = attack(
                            model, case, prompt, other, seed, max_new_tokens=max_new
                        )
                    claims.append(
                        RolloutClaim(
                            gen.tokens,
                            build_proofs(gen.activations),
                            gen.seed,
                            gen.finish_reason,
                            max_new,
                            1.0,
                        )
                    )
                    recomputed.append(recompute(validator, checked, gen.tokens))
                verdicts.append(check_batch(claims, recomputed, eos_token_id=EOS, config=config))
            out[f"{profile.name}/{case}"] = summary(verdicts, time.perf_counter() - started)
    return out


def timing(doc: dict, model_bf16, model_fp32, config: VerifyConfig) -> dict:
    """Generate the fixture's honest workload here and validate exactly those rollouts."""
    eos = doc["config"]["eos_token_id"]
    prompts = random_prompts(48, doc["config"]["vocab_size"])
    engine = TorchEngine(model_bf16, eos_token_ids=frozenset({eos}), max_batch=32)
    params = SamplingParams(max_new_tokens=96, stop_at_eos=False)
    reqs = [GenRequest(p, 70000 + i) for i, p in enumerate(prompts)]
    engine.generate(reqs[:4], params)  # warm-up
    started = time.perf_counter()
    results = engine.generate(reqs, params)
    gen_s = time.perf_counter() - started
    claims = [claim_of(r, {"max_new_tokens": 96, "temperature": 1.0}) for r in results]
    out = {"generate_s": round(gen_s, 2)}
    for precision, model in (("bf16", model_bf16), ("fp32", model_fp32)):
        started = time.perf_counter()
        accepted = 0
        for i in range(0, len(results), 16):
            part = results[i : i + 16]
            rec = recompute_all(model, [r.prompt for r in part], [r.tokens for r in part])
            accepted += check_batch(claims[i : i + 16], rec, eos_token_id=eos, config=config).passed
        out[f"validate_{precision}_s"] = round(time.perf_counter() - started, 2)
        out[f"validate_{precision}_over_generate"] = round(
            out[f"validate_{precision}_s"] / gen_s, 3
        )
        out[f"accepted_{precision}"] = accepted
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--fixture", type=Path, default=FIXTURE)
    ap.add_argument("--cpu-trials", type=int, default=2, help="batches per CPU case")
    ap.add_argument(
        "--top-p-batches", type=int, default=64, help="honest batches of 16 per top-p setting"
    )
    ap.add_argument(
        "--top-p-cheat-batches", type=int, default=2, help="batches of each cheat per setting"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    doc = json.loads(args.fixture.read_text())
    bf16 = build_random_llama(doc["config"], doc["init_seed"], doc["lm_head_scale"])
    if weights_sha256(bf16) != doc["weights_sha256_bf16"]:
        sys.exit(f"{args.fixture}: the rebuilt model's SHA-256 differs from the recipe's")
    fp32 = build_random_llama(doc["config"], doc["init_seed"], doc["lm_head_scale"]).float()
    config = GPU_BF16.for_layers(model_layers(bf16))

    fixture = {p: judge_fixture(doc, p, m, config) for p, m in (("bf16", bf16), ("fp32", fp32))}
    cpu = cpu_cases(args.cpu_trials)
    times = timing(doc, bf16, fp32, config)
    print(
        f"top-p calibration set ({TOP_P_SHAPE} shape, bf16 worker on this CPU, "
        f"{args.top_p_batches} honest batches of 16 x {TOP_P_NEW_TOKENS} tokens per setting):"
    )
    top_p = top_p_set(args.top_p_batches, args.top_p_cheat_batches)

    print(
        f"GPU fixture {args.fixture.name} ({doc.get('device', '?')}), profile {config.name}, "
        f"{config.sampling.layers} layers; batches accepted/total, rollouts flagged/total"
    )
    print(f"  {'variant':<28} {'bf16 recompute':>22} {'fp32 recompute':>22}")
    for name in doc["variants"]:
        cells = [
            f"{r['accepted']}/{r['batches']} acc, {r['flagged']}/{r['rollouts']} flag"
            for r in (fixture["bf16"][name], fixture["fp32"][name])
        ]
        print(f"  {name:<28} {cells[0]:>22} {cells[1]:>22}")
    print("CPU cases (tiny fp32 model, batches of 8): batches accepted/total")
    for key, r in cpu.items():
        print(
            f"  {key:<32} {r['accepted']}/{r['batches']}  flagged {r['flagged']}/{r['rollouts']}"
            f"  {', '.join(r['reasons'])}"
        )

    honest = [
        m
        for table in (fixture["bf16"], fixture["fp32"])
        for name, r in table.items()
        if name in HONEST
        for m in r["margins"]
    ] + [m for key, r in cpu.items() if key.endswith("/honest") for m in r["margins"]]
    honest_accepted = sum(
        r["accepted"] for t in fixture.values() for n, r in t.items() if n in HONEST
    ) + sum(r["accepted"] for k, r in cpu.items() if k.endswith("/honest"))
    honest_total = sum(
        r["batches"] for t in fixture.values() for n, r in t.items() if n in HONEST
    ) + sum(r["batches"] for k, r in cpu.items() if k.endswith("/honest"))
    for row in top_p.values():
        for precision in ("bf16", "fp32"):
            honest_accepted += row[precision]["accepted"]
            honest_total += row[precision]["batches"]
            honest += row[precision]["margins"]
    detected: dict[str, list[int]] = {}
    for precision, table in fixture.items():
        for name, r in table.items():
            if name not in HONEST:
                detected[f"{name}/{precision}"] = [r["batches"] - r["accepted"], r["batches"]]
    for key, r in cpu.items():
        if not key.endswith("/honest"):
            detected[f"cpu:{key}"] = [r["batches"] - r["accepted"], r["batches"]]
    for setting, row in top_p.items():
        for key, (rejected, total, _) in row["cheats"].items():
            detected[f"top_p:{setting}/{key}"] = [rejected, total]
    margin = max(honest)
    print(
        f"honest batches accepted {honest_accepted}/{honest_total}; honest margin "
        f"(largest statistic / bound) {margin:.3f}; designed false-slash probability "
        f"{config.sampling.false_slash:g} per honest batch (SPEC §18.1)"
    )
    print(
        f"validation vs generation, the same 48 x 96-token rollouts on this CPU: generate "
        f"{times['generate_s']} s (bf16, 32 in flight); validate bf16 {times['validate_bf16_s']} s "
        f"({times['validate_bf16_over_generate']}x), fp32 {times['validate_fp32_s']} s "
        f"({times['validate_fp32_over_generate']}x)"
    )
    if args.json:
        print(
            json.dumps(
                {
                    "honest_batches_accepted": honest_accepted,
                    "honest_batches": honest_total,
                    "honest_margin": round(margin, 4),
                    "detected": detected,
                    "false_slash_bound": {
                        name: p.sampling.false_slash for name, p in PROFILES.items()
                    },
                    "profile": config.name,
                    "fixture": fixture,
                    "cpu_cases": cpu,
                    "timing": times,
                    "top_p": top_p,
                }
            )
        )


if __name__ == "__main__":
    torch.set_num_threads(max(1, torch.get_num_threads()))
    main()
