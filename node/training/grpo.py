"""GRPO as INTELLECT-2 ran it: advantages, the clipped token-level loss, training samples.

Where the samples come from: an inference worker generated ``G`` completions of one
prompt (a GRPO group) with the policy version it held, kept the log-probability of every
sampled token under its sampling distribution (``log_softmax(logits / temperature)``) and
scored each completion with the task's verifier; a validator accepted the batch on-chain.
Where they go next: ``node.training.policy.Policy.train_step``.

The choices, and why:

- **Group-normalized advantages.** For the rewards ``r_1..r_G`` of one prompt,
  ``A_i = (r_i - mean(r)) / (std(r) + eps)`` (population std). No value network: the group
  is the baseline. A group whose rewards are all equal has ``A = 0`` for every sample and
  carries no signal; it is dropped before training (it would only dilute the token count).
- **Token-level loss.** The loss of a step is the sum of the per-token objective over every
  completion token of the step divided by the number of those tokens (DAPO /
  INTELLECT-2), not a mean per sequence then over sequences: long completions are not
  down-weighted per token. With micro-batches (and ranks) the divisor is the token count of
  the whole step, so accumulation gives exactly the full-batch gradient.
- **Importance ratio against the sampling policy.** Samples are off-policy (the worker's
  version may lag the trainer by up to the async level), so each token is weighted by
  ``ratio = exp(new_logprob - old_logprob)`` where ``old_logprob`` is what the worker
  recorded when it sampled.
- **Two-sided clipping with the δ clamp.** The usual PPO objective
  ``min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)`` with ``eps = 0.2`` bounds the
  update where the ratio moves in the advantage's direction, but for ``A < 0`` a large ratio
  is left unbounded (``ratio * A`` is the minimum), and one token whose probability rose a
  lot under the new policy can dominate the step. INTELLECT-2 therefore clamps the ratio to
  at most ``δ = 4`` first: ``min(min(ratio, δ) * A, clip(ratio, 1 - eps, 1 + eps) * A)``.
  For ``A > 0`` the clamp changes nothing (``δ > 1 + eps``); for ``A < 0`` and
  ``ratio > δ`` the term is the constant ``δ * A`` and gives no gradient.
- **No KL term by default** (``kl_coef = 0``, as INTELLECT-2 and DAPO). When set, the k3
  estimator ``exp(q - p) - (q - p) - 1`` of KL(new || reference) per token is added, with the
  sampling log-probs as the reference unless others are given.
- **Gradient-norm clipping** (``max_grad_norm``) and **AdamW** for the step.

The default learning rate, 1e-4, was chosen on the centralized baseline from the ``model
init`` base policy (``node.training.central``, whose docstring has the measurements: it
lifts held-out accuracy faster than 3e-5, and 3e-4 lifts no more and erodes the easy level);
the rest are INTELLECT-2's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from protocol.rollouts import RolloutBatch, RolloutGroup


@dataclass(frozen=True)
class GRPOConfig:
    """Hyperparameters of one GRPO step (the optimizer's and the loss's)."""

    lr: float = 1e-4  # AdamW learning rate (constant): chosen on the central baseline
    clip_eps: float = 0.2  # PPO clip: ratio kept in [1 - eps, 1 + eps]
    ratio_clamp: float = 4.0  # δ: the ratio is clamped to at most this before clipping
    max_grad_norm: float = 1.0  # gradient-norm clipping
    kl_coef: float = 0.0  # weight of the k3 KL term against the reference log-probs
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    betas: tuple[float, float] = (0.9, 0.99)  # AdamW betas
    adam_eps: float = 1e-8  # AdamW epsilon
    adv_eps: float = 1e-4  # added to the group's std when normalizing advantages
    micro_batch: int = 32  # sequences per forward pass (gradients accumulate across them)
    # on a GPU the forward and backward run in bfloat16 under autocast (log-softmax in fp32:
    # autocast's rule), the weights and AdamW's state stay fp32; the CPU is fp32 throughout
    bf16_on_gpu: bool = True

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError("lr must be > 0")
        if not 0 < self.clip_eps < 1:
            raise ValueError("clip_eps must be in (0, 1)")
        if self.ratio_clamp <= 1 + self.clip_eps:
            raise ValueError("ratio_clamp must be > 1 + clip_eps")
        if self.max_grad_norm <= 0:
            raise ValueError("max_grad_norm must be > 0")
        if self.kl_coef < 0 or self.weight_decay < 0 or self.adv_eps < 0:
            raise ValueError("kl_coef, weight_decay and adv_eps must be >= 0")
        if self.micro_batch < 1:
            raise ValueError("micro_batch must be >= 1")


def group_advantages(rewards: Sequence[float], eps: float = GRPOConfig.adv_eps) -> list[float]:
    """``(r - mean) / (std + eps)`` within one group (population std)."""
    if not rewards:
        return []
    n = len(rewards)
    mean = sum(rewards) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / n)
    return [(r - mean) / (std + eps) for r in rewards]


def grpo_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: GRPOConfig,
    *,
    ref_logprobs: torch.Tensor | None = None,
    num_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The step's loss over ``[B, T]`` log-probs, ``[B]`` advantages and a ``[B, T]`` mask
    of completion tokens: ``-sum(objective * mask) / num_tokens`` (``num_tokens`` defaults
    to ``mask.sum()``; pass the whole step's count when this is one micro-batch of it).

    Stats (over the masked tokens): ``clip_frac`` (tokens whose objective is the clipped,
    gradient-free value), ``ratio_mean``, ``ratio_max``, ``kl`` (k3 against the reference
    when ``kl_coef > 0``, else against the sampling log-probs, for monitoring).
    """
    import torch

    m = mask.to(new_logprobs.dtype)
    count = float(m.sum().item())
    denom = num_tokens if num_tokens is not None else max(count, 1.0)
    log_ratio = new_logprobs - old_logprobs.to(new_logprobs.dtype)
    ratio = torch.exp(log_ratio)
    adv = advantages.to(new_logprobs.dtype)[:, None]  # [B, 1]
    eps, delta = cfg.clip_eps, cfg.ratio_clamp
    unclipped = torch.clamp(ratio, max=delta) * adv
    clipped = torch.clamp(ratio, 1 - eps, 1 + eps) * adv
    objective = torch.minimum(unclipped, clipped)  # [B, T]
    per_token = -objective
    ref = ref_logprobs.to(new_logprobs.dtype) if ref_logprobs is not None else None
    d = (ref if ref is not None else old_logprobs.to(new_logprobs.dtype)) - new_logprobs
    kl = torch.exp(d) - d - 1  # k3 estimator of KL(new || reference), >= 0
    if cfg.kl_coef > 0:
        per_token = per_token + cfg.kl_coef * kl
    loss = (per_token * m).sum() / denom
    with torch.no_grad():
        frozen = ((adv > 0) & (ratio > 1 + eps)) | (
            (adv < 0) & ((ratio < 1 - eps) | (ratio > delta))
        )
        n = max(count, 1.0)
        stats = {
            "clip_frac": float((frozen.to(m.dtype) * m).sum().item()) / n,
            "ratio_mean": float((ratio * m).sum().item()) / n,
            "ratio_max": float(ratio.masked_fill(m == 0, 0).max().item()) if count else 0.0,
            "kl": float((kl * m).sum().item()) / n,
            "tokens": count,
        }
    return loss, stats


@dataclass
class TrainSample:
    """One completion to train on: prompt and output token ids, the sampling log-prob of
    every output token, and its group-normalized advantage."""

    prompt: list[int]
    tokens: list[int]
    logprobs: list[float]
    advantage: float


Group = tuple[Sequence[int], Sequence[tuple[Sequence[int], Sequence[float], float]]]


def samples_from_groups(
    groups: Sequence[Group], eps: float = GRPOConfig.adv_eps
) -> list[TrainSample]:
    """Each group is ``(prompt_ids, [(tokens, logprobs, reward), ...])``; groups whose
    rewards are all equal (zero advantage) are dropped, as are empty completions."""
    out: list[TrainSample] = []
    for prompt, completions in groups:
        rewards = [float(r) for _, _, r in completions]
        if len(rewards) < 2 or max(rewards) == min(rewards):
            continue
        for (tokens, logprobs, _), adv in zip(
            completions, group_advantages(rewards, eps), strict=True
        ):
            if len(tokens) != len(logprobs):
                raise ValueError(f"{len(logprobs)} logprobs for {len(tokens)} tokens")
            if tokens:
                out.append(TrainSample(list(prompt), list(tokens), list(logprobs), adv))
    return out


def samples_from_batch(
    batch: RolloutBatch,
    eps: float = GRPOConfig.adv_eps,
    *,
    drop: Callable[[RolloutGroup], bool] | None = None,
) -> list[TrainSample]:
    """The training samples of one (accepted) rollout batch; groups for which ``drop``
    is true (held-out prompts: ``HeldOut.batch_filter``) are left out."""
    from protocol.rollouts import unpack_floats, unpack_tokens

    groups: list[Group] = [
        (
            unpack_tokens(g.prompt),
            [(unpack_tokens(s.tokens), unpack_floats(s.logprobs), s.reward) for s in g.samples],
        )
        for g in batch.groups
        if drop is None or not drop(g)
    ]
    return samples_from_groups(groups, eps)


def describe(cfg: GRPOConfig) -> dict[str, Any]:
    """The config as plain JSON-able values (for logs and metrics)."""
    from dataclasses import asdict

    d = asdict(cfg)
    d["betas"] = list(cfg.betas)
    return d
