"""Measuring honest noise: what a validator's recomputation differs by, on given hardware.

A verification profile (``crypto.verdict.PROFILES``) states a model of honest noise: the
RMS ``σ`` and bound ``κ`` of the score difference between worker and validator, in units
of one bf16 spacing of the largest logit, and per-chunk TOPLOC thresholds. This module
measures those quantities for a model: generate with the engine (the worker), recompute
every rollout with one prefill (the validator, on its own device and dtype), and report
the distributions the profile's thresholds are set against. ``intellect-node model
calibrate`` and ``bench/verify.py`` print it; ``bench/gpu_rollouts.py`` writes rollouts
made on other hardware, which ``fixture_batches`` turns back into claims.

The random models used for fixtures are rebuilt from a recipe (config, init seed, LM head
scale) bit for bit on any machine; ``weights_sha256`` checks that.
"""

from __future__ import annotations

import copy
import hashlib
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from crypto.verdict import BatchVerdict, RolloutClaim, VerifyConfig, check_batch
from node.engine.base import GenRequest, GenResult, SamplingParams

BATCH_ROLLOUTS = 16  # rollouts per batch when fixtures are cut into batches


# Fixture recipes: random-init Llamas whose LM head is scaled so that the logits spread
# like a trained model's, and what a substituting worker runs instead of the model.
SHAPES: dict[str, dict[str, Any]] = {
    "small": {
        "config": {
            "vocab_size": 4096,
            "hidden_size": 512,
            "intermediate_size": 1408,
            "num_hidden_layers": 4,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "max_position_embeddings": 1024,
        },
        "lm_head_scale": 8.0,
    },
    "1.1b": {
        "config": {
            "vocab_size": 32000,
            "hidden_size": 2048,
            "intermediate_size": 5632,
            "num_hidden_layers": 22,
            "num_attention_heads": 32,
            "num_key_value_heads": 4,
            "max_position_embeddings": 2048,
        },
        "lm_head_scale": 4.0,
    },
    # a wide vocabulary on a narrow model: a nucleus of hundreds of tokens of near-equal
    # probability at its boundary, cheap enough on a CPU for thousands of rollouts (the
    # top-p calibration set, ``top_p_set``); logit std about 3.6, like ``small``
    "wide": {
        "config": {
            "vocab_size": 8192,
            "hidden_size": 256,
            "intermediate_size": 704,
            "num_hidden_layers": 6,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 512,
        },
        "lm_head_scale": 11.25,
    },
}
TOKEN_IDS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "tie_word_embeddings": False}
VARIANTS = (
    "honest_batch32",
    "honest_batch1",
    "int8_weights_batch16",
    "adamw_step_lr1e-4_batch16",
    "other_weights_batch16",
    "fp16_compute_batch16",
)
FIRST_SEED = 70000
# (temperature, top_p) of the top-p calibration sets: the settings a run may choose below
# top-p 1, where the nucleus has a boundary that honest noise moves tokens across
TOP_P_SETTINGS: tuple[tuple[float, float], ...] = tuple(
    (t, p) for t in (0.6, 0.8, 1.0) for p in (0.9, 0.95)
)


@torch.no_grad()
def int8_weights(model: Any) -> Any:
    """Every Linear weight fake-quantized to int8 per output row: a cheaper model."""
    cheap = copy.deepcopy(model)
    for module in cheap.modules():
        if isinstance(module, torch.nn.Linear):
            w = module.weight.float()
            scale = w.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127
            module.weight.copy_(((w / scale).round().clamp(-127, 127) * scale).to(w.dtype))
    return cheap


def adamw_step(model: Any, device: torch.device) -> Any:
    """The model after one AdamW step (lr 1e-4) on a random LM batch: other weights."""
    stepped = copy.deepcopy(model).float().train()
    opt = torch.optim.AdamW(stepped.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(3, model.config.vocab_size, (4, 32), generator=g).to(device)
    stepped(input_ids=x, labels=x).loss.backward()
    opt.step()
    return stepped.to(torch.bfloat16).eval()


def variant_model(name: str, base: Any, recipe: dict[str, Any], device: torch.device) -> Any:
    """The model a fixture variant's worker really ran (``base`` for honest ones)."""
    if name.startswith("honest"):
        return base
    if name.startswith("int8"):
        return int8_weights(base)
    if name.startswith("adamw"):
        return adamw_step(base, device)
    if name.startswith("other_weights"):
        return build_random_llama(recipe["config"], 99, recipe["lm_head_scale"]).to(device)
    if name.startswith("fp16"):
        return copy.deepcopy(base).to(torch.float16)
    raise ValueError(f"unknown variant {name!r}")


def shape_recipe(shape: str) -> dict[str, Any]:
    """``{"config": ..., "lm_head_scale": ...}`` of a named shape, with the token ids."""
    recipe = SHAPES[shape]
    return {**recipe, "config": {**recipe["config"], **TOKEN_IDS}}


def build_random_llama(config: dict[str, Any], init_seed: int, lm_head_scale: float) -> Any:
    """The fixture recipe: fp32 init on the CPU under ``init_seed``, LM head × scale, bf16."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(init_seed)
    model = LlamaForCausalLM(LlamaConfig(**config))
    with torch.no_grad():
        model.lm_head.weight.mul_(lm_head_scale)
    # transformers types .to through a decorator that loses its signature
    return model.to(torch.bfloat16).eval()  # type: ignore[arg-type]


def weights_sha256(model: Any) -> str:
    """SHA-256 over the state dict in sorted key order: each key's UTF-8 bytes, then the
    tensor's raw bytes."""
    h = hashlib.sha256()
    for key, value in sorted(model.state_dict().items()):
        h.update(key.encode())
        h.update(value.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def claim_of(rollout: dict[str, Any] | GenResult, params: dict[str, Any]) -> RolloutClaim:
    """A fixture rollout (or an engine result) as the claim a worker ships."""
    if isinstance(rollout, GenResult):
        tokens, proofs, seed, finish = (
            rollout.tokens,
            rollout.proofs,
            rollout.seed,
            rollout.finish_reason,
        )
    else:
        tokens, seed, finish = rollout["tokens"], rollout["seed"], rollout["finish_reason"]
        proofs = [bytes.fromhex(p) for p in rollout["proofs"]]
    return RolloutClaim(
        tokens=list(tokens),
        proofs=list(proofs),
        seed=int(seed),
        finish_reason=finish,
        max_new_tokens=int(params["max_new_tokens"]),
        temperature=float(params["temperature"]),
        top_p=float(params.get("top_p", 1.0)),
    )


def fixture_batches(
    variant: dict[str, Any], size: int = BATCH_ROLLOUTS
) -> list[list[dict[str, Any]]]:
    """A variant's rollouts cut into batches in order (the last may be smaller)."""
    rollouts = variant["rollouts"]
    return [rollouts[i : i + size] for i in range(0, len(rollouts), size)]


def generate_variant(
    model: Any,
    prompts: list[list[int]],
    *,
    batch: int,
    new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    first_seed: int = FIRST_SEED,
    claimed: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """A fixture variant: ``model`` generates one rollout per prompt with the project's
    engine (``batch`` in flight, EOS ignored, seeds from ``first_seed`` on) at
    ``temperature`` and ``top_p``, and the variant states ``claimed`` (temperature, top_p)
    instead when given (a worker misstating its sampling)."""
    from node.engine.torch_engine import TorchEngine

    engine = TorchEngine(
        model, eos_token_ids=frozenset({TOKEN_IDS["eos_token_id"]}), max_batch=batch
    )
    params = SamplingParams(
        max_new_tokens=new_tokens, temperature=temperature, top_p=top_p, stop_at_eos=False
    )
    requests = [GenRequest(p, first_seed + i) for i, p in enumerate(prompts)]
    stated_t, stated_p = claimed or (temperature, top_p)
    return {
        "max_new_tokens": new_tokens,
        "temperature": stated_t,
        "top_p": stated_p,
        "rollouts": [
            {
                "prompt": r.prompt,
                "tokens": r.tokens,
                "seed": r.seed,
                "finish_reason": r.finish_reason,
                "logprobs": [round(x, 6) for x in r.logprobs],
                "proofs": [p.hex() for p in r.proofs],
            }
            for r in engine.generate(requests, params)
        ],
    }


def judge_variant(
    model: Any, variant: dict[str, Any], config: VerifyConfig, *, eos_token_id: int
) -> list[BatchVerdict]:
    """A validator's verdicts on a fixture variant: cut into batches (``fixture_batches``),
    each recomputed with ``model`` and judged with ``check_batch``."""
    return [
        check_batch(
            [claim_of(r, variant) for r in batch],
            recompute_all(model, [r["prompt"] for r in batch], [r["tokens"] for r in batch]),
            eos_token_id=eos_token_id,
            config=config,
        )
        for batch in fixture_batches(variant)
    ]


def edited_variant(variant: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    """``variant`` with one token of each rollout changed after proving (the middle one, to
    the next id): work whose proofs no longer match what it claims was sampled."""
    rollouts = []
    for r in variant["rollouts"]:
        tokens = list(r["tokens"])
        tokens[len(tokens) // 2] = (tokens[len(tokens) // 2] + 1) % vocab_size
        rollouts.append({**r, "tokens": tokens})
    return {**variant, "rollouts": rollouts}


def recompute_all(
    model: Any, prompts: list[list[int]], outputs: list[list[int]]
) -> list[tuple[list[torch.Tensor], torch.Tensor]]:
    """The validator's prefill for every rollout of a batch, batched as a validator runs
    it (``torch_engine.recompute_batch``)."""
    from node.engine.torch_engine import recompute_batch

    return recompute_batch(model, prompts, outputs)


@dataclass
class NoiseReport:
    """Honest noise, measured: compare with the profile's ``σ`` (``noise_rms``), ``κ``
    (``noise_max``) and TOPLOC thresholds. ``fits`` says whether the profile holds."""

    profile: str
    rollouts: int
    positions: int
    flip_share: float  # share of positions whose token is not our perturbed argmax
    sigma_measured: float  # the σ that honest S implies: sqrt(4 S / Σ near_ties)
    sigma_profile: float
    gap_units_max: float  # largest gap, in units (κ bounds it)
    kappa_profile: float
    logprob_diff_units_rms: float  # worker's vs our log-prob of the chosen token, in units
    logprob_diff_units_max: float
    toploc_mean_max: float  # largest per-chunk mean mantissa error
    toploc_median_max: float
    toploc_exp_mismatch_max: int
    batch_margin_max: float  # largest statistic / bound over the batches (below 1 passes)
    batches_accepted: int
    batches: int
    rollouts_accepted: int
    generate_s: float = 0.0
    validate_s: float = 0.0

    @property
    def fits(self) -> bool:
        """Every honest batch accepted, the RMS within σ, every gap within κ."""
        return (
            self.batches_accepted == self.batches
            and self.sigma_measured <= self.sigma_profile
            and self.gap_units_max <= self.kappa_profile
        )

    def as_dict(self) -> dict[str, Any]:
        fields = {**asdict(self), "fits": self.fits}
        return {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in fields.items()
        }

    def lines(self) -> list[str]:
        ok = "fits" if self.fits else "DOES NOT FIT"
        return [
            f"profile {self.profile}: {ok} ({self.rollouts} rollouts, {self.positions} positions)",
            f"  sampling noise RMS  {self.sigma_measured:6.3f} units   (profile σ {self.sigma_profile})",
            f"  largest gap         {self.gap_units_max:6.3f} units   (profile κ {self.kappa_profile})",
            f"  flipped positions   {self.flip_share:6.2%}",
            f"  log-prob difference RMS {self.logprob_diff_units_rms:.3f}, max {self.logprob_diff_units_max:.3f} units",
            f"  TOPLOC worst chunk  mean {self.toploc_mean_max:.2f}, median {self.toploc_median_max:.1f}, "
            f"{self.toploc_exp_mismatch_max} exponent mismatches",
            f"  batches accepted    {self.batches_accepted}/{self.batches} "
            f"(largest statistic/bound {self.batch_margin_max:.3f}); rollouts alone "
            f"{self.rollouts_accepted}/{self.rollouts}",
        ]


def measure(
    claims: list[RolloutClaim],
    recomputed: list[tuple[list[torch.Tensor], torch.Tensor]],
    *,
    eos_token_id: int,
    config: VerifyConfig,
    logprobs: list[list[float]] | None = None,
    batch_size: int = BATCH_ROLLOUTS,
) -> tuple[NoiseReport, list[BatchVerdict]]:
    """Judge the rollouts in batches of ``batch_size`` and summarize the honest noise."""
    verdicts = [
        check_batch(
            claims[i : i + batch_size],
            recomputed[i : i + batch_size],
            eos_token_id=eos_token_id,
            config=config,
        )
        for i in range(0, len(claims), batch_size)
    ]
    rollouts = [v for b in verdicts for v in b.rollouts]
    excess = sum(v.sampling.excess for v in rollouts)
    ties = sum(v.sampling.near_ties for v in rollouts)
    positions = sum(v.sampling.positions for v in rollouts)
    lp_diffs: list[float] = []
    for n, (claim, (_, logits)) in enumerate(zip(claims, recomputed, strict=True)):
        if logprobs is not None:
            t = claim.temperature if claim.temperature > 0 else 1.0
            ell = logits.double()
            ours = torch.log_softmax(ell / t, dim=-1).gather(
                1, torch.tensor(claim.tokens, device=ell.device)[:, None]
            )[:, 0]
            unit = config.sampling.unit(ell, t)
            diff = (torch.tensor(logprobs[n], dtype=torch.float64, device=ell.device) - ours) / unit
            lp_diffs.extend(diff.abs().tolist())
    chunks = [r for v in rollouts for r in v.toploc]
    report = NoiseReport(
        profile=config.name,
        rollouts=len(rollouts),
        positions=positions,
        flip_share=sum(v.sampling.flips for v in rollouts) / max(1, positions),
        sigma_measured=math.sqrt(4 * excess / ties) if ties > 0 else 0.0,
        sigma_profile=config.sampling.noise_rms,
        gap_units_max=max((v.sampling.max_units for v in rollouts), default=0.0),
        kappa_profile=config.sampling.noise_max,
        logprob_diff_units_rms=math.sqrt(statistics.fmean(d * d for d in lp_diffs))
        if lp_diffs
        else 0.0,
        logprob_diff_units_max=max(lp_diffs, default=0.0),
        toploc_mean_max=max((c.mant_err_mean for c in chunks), default=0.0),
        toploc_median_max=max((c.mant_err_median for c in chunks), default=0.0),
        toploc_exp_mismatch_max=max((c.exp_mismatches for c in chunks), default=0),
        batch_margin_max=max((b.margin for b in verdicts), default=0.0),
        batches_accepted=sum(b.passed for b in verdicts),
        batches=len(verdicts),
        rollouts_accepted=sum(v.passed for v in rollouts),
    )
    return report, verdicts


def model_layers(model: Any) -> int:
    """The number of residual layers of a transformers model (1 when it says nothing)."""
    cfg = getattr(model, "config", None)
    for name in ("num_hidden_layers", "n_layer", "num_layers"):
        value = getattr(cfg, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 1


def random_prompts(n: int, vocab: int, seed: int = 1234) -> list[list[int]]:
    """``n`` prompts of 16–63 random token ids (ids ≥ 3: past pad, BOS and EOS)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(16, 64, (n,), generator=g).tolist()
    return [torch.randint(3, vocab, (length,), generator=g).tolist() for length in lengths]


def calibrate(
    worker_model: Any,
    validator_model: Any,
    *,
    eos_token_ids: frozenset[int],
    config: VerifyConfig,
    rollouts: int = 32,
    batch: int = 32,
    new_tokens: int = 96,
    temperature: float = 1.0,
    top_p: float = 1.0,
    prompts: list[list[int]] | None = None,
    progress: Callable[[int, int, str], None] | None = None,
) -> NoiseReport:
    """Generate honest rollouts with ``worker_model`` (``batch`` in flight, stopping at
    EOS), recompute them with ``validator_model``, and measure. ``progress(stages done,
    stages, next stage)`` is told as each of the three stages starts and at the end."""
    report_stage = progress or (lambda done, total, stage: None)
    from node.engine.torch_engine import TorchEngine

    vocab = int(worker_model.get_output_embeddings().weight.shape[0])
    prompts = prompts or random_prompts(rollouts, vocab)
    engine = TorchEngine(worker_model, eos_token_ids=eos_token_ids, max_batch=batch)
    params = SamplingParams(max_new_tokens=new_tokens, temperature=temperature, top_p=top_p)
    report_stage(0, 3, "generating")
    started = time.perf_counter()
    results = engine.generate([GenRequest(p, 70000 + i) for i, p in enumerate(prompts)], params)
    generated = time.perf_counter()
    report_stage(1, 3, "validating")
    recomputed = recompute_all(
        validator_model, [r.prompt for r in results], [r.tokens for r in results]
    )
    report_stage(2, 3, "measuring")
    claims = [claim_of(r, asdict(params)) for r in results]
    report, _ = measure(
        claims,
        recomputed,
        eos_token_id=min(eos_token_ids),
        config=config,
        logprobs=[r.logprobs for r in results],
    )
    report.generate_s = generated - started
    report.validate_s = time.perf_counter() - generated
    report_stage(3, 3, "done")
    return report
