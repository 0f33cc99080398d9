"""The per-batch verdict and its noise model, on synthetic logits (no model needed).

A worker samples with the seeded Gumbel-max from its own logits; the validator holds the
same logits plus honest noise of a chosen size (in noise units), or a cheater's."""

import math

import pytest
import torch

from crypto.sampling import (
    SamplingCheck,
    budgets,
    check_sampling,
    count_bound,
    gumbel_noise_rows,
    honest_bound,
    near_tie_density,
    nucleus_bounds,
    nucleus_bounds_at,
    nucleus_mask,
    sample_tokens,
)
from crypto.toploc import build_proofs
from crypto.verdict import (
    FP32,
    GPU_BF16,
    PROFILES,
    RolloutClaim,
    check_batch,
    check_rollout,
    profile,
)
from tests.helpers.boundary import boundary_drops

VOCAB = 512
N = 96


def worker_logits(seed, n=N, vocab=VOCAB, scale=3.6):
    return torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * scale


def perturbed(logits, units, check, seed):
    """The validator's logits: the worker's plus Gaussian noise whose score differences
    have an RMS of ``units`` noise units."""
    unit = check.unit(logits, 1.0)[:, None]
    g = torch.Generator().manual_seed(10_000 + seed)
    return (
        logits.double()
        + torch.randn(logits.shape, generator=g, dtype=torch.float64) * unit * units / math.sqrt(2)
    ).float()


def rollout(seed, check, *, units, top_p=1.0):
    """(claim, validator activations, validator logits) of one synthetic rollout."""
    logits = worker_logits(seed)
    noise = gumbel_noise_rows([seed] * N, list(range(N)), VOCAB)
    tokens = sample_tokens(logits, noise, 1.0, top_p).tolist()
    acts = [
        torch.zeros(4, 64),
        torch.randn(N - 1, 64, generator=torch.Generator().manual_seed(seed)),
    ]
    from crypto.toploc import build_proofs

    claim = RolloutClaim(tokens, build_proofs(acts), seed, "length", N, 1.0, top_p)
    return claim, acts, perturbed(logits, units, check, seed)


def batch(seeds, check, *, units, top_p=1.0):
    claims, recomputed = [], []
    for s in seeds:
        claim, acts, logits = rollout(s, check, units=units, top_p=top_p)
        claims.append(claim)
        recomputed.append((acts, logits))
    return claims, recomputed


CHECK = GPU_BF16.sampling


def test_honest_noise_at_the_profiles_rms_passes_every_batch():
    statistic = expected = 0.0
    for start in range(0, 80, 16):
        claims, rec = batch(range(start, start + 16), CHECK, units=CHECK.noise_rms)
        v = check_batch(claims, rec, eos_token_id=1, config=GPU_BF16)
        assert v.passed, v.reason
        assert v.margin < 0.5
        statistic += v.statistic
        expected += sum(r.sampling.expected for r in v.rollouts)
    # on average the statistic stays below its designed mean, as the model says it must
    assert 0.25 * expected < statistic <= expected


def test_systematic_substitution_is_rejected_and_located():
    claims, rec = batch(range(16), CHECK, units=4 * CHECK.noise_rms)
    v = check_batch(claims, rec, eos_token_id=1, config=GPU_BF16)
    assert not v.passed and v.reason.startswith("sampling"), v.reason
    assert v.margin > 1
    assert v.flagged


def test_one_forged_token_sinks_the_batch_and_is_pinpointed():
    claims, rec = batch(range(16), CHECK, units=0.0)
    c = claims[5]
    _, logits = rec[5]
    forged = list(c.tokens)
    forged[40] = int(logits[40].argmin())  # a token the noise never picks
    claims[5] = RolloutClaim(forged, c.proofs, c.seed, c.finish_reason, c.max_new_tokens, 1.0)
    v = check_batch(claims, rec, eos_token_id=1, config=GPU_BF16)
    assert not v.passed
    assert v.reason.startswith("sampling: rollouts [5]"), v.reason
    assert "positions [40]" in v.reason
    assert v.rollouts[5].sampling.bad_positions == [40]
    assert all(r.passed for i, r in enumerate(v.rollouts) if i != 5)


def test_a_rare_honest_near_tie_does_not_sink_a_batch():
    """A position flipped by noise within the bound costs a fraction of the budget."""
    claims, rec = batch(range(16), CHECK, units=0.0)
    c = claims[3]
    _, logits = rec[3]
    unit = CHECK.unit(logits, 1.0)
    noise = gumbel_noise_rows([c.seed] * N, list(range(N)), VOCAB)
    scores = logits.double() + noise
    tokens = list(c.tokens)
    # find a position whose runner-up is within one unit, and claim the runner-up
    top2 = scores.topk(2, dim=-1)
    gaps = (top2.values[:, 0] - top2.values[:, 1]) / unit
    pos = int(gaps.argmin())
    assert gaps[pos] < CHECK.noise_max
    tokens[pos] = int(top2.indices[pos, 1])
    claims[3] = RolloutClaim(tokens, c.proofs, c.seed, "length", N, 1.0)
    v = check_batch(claims, rec, eos_token_id=1, config=GPU_BF16)
    assert v.passed, v.reason
    assert v.rollouts[3].sampling.flips == 1 and v.statistic > 0


def test_toploc_evidence_rejects_outright():
    claims, rec = batch(range(4), CHECK, units=0.0)
    acts, logits = rec[2]
    rec[2] = ([acts[0], acts[1] * 1.5], logits)
    v = check_batch(claims, rec, eos_token_id=1, config=GPU_BF16)
    assert not v.passed and v.reason.startswith("toploc: rollouts [2]"), v.reason


def test_an_implausible_ending_rejects_the_batch():
    claims, rec = batch(range(4), CHECK, units=0.0)
    c = claims[1]
    claims[1] = RolloutClaim(c.tokens, c.proofs, c.seed, "stop", N, 1.0)  # no EOS at the end
    v = check_batch(claims, rec, eos_token_id=1, config=GPU_BF16)
    assert not v.passed and v.reason.startswith("termination: rollouts [1]"), v.reason


def test_check_batch_wants_one_recomputation_per_claim():
    claims, rec = batch(range(2), CHECK, units=0.0)
    with pytest.raises(ValueError, match="one recomputation per claim"):
        check_batch(claims, rec[:1], eos_token_id=1)
    with pytest.raises(ValueError, match="one recomputation per claim"):
        check_batch([], [], eos_token_id=1)


def test_validator_logits_in_bf16_and_float16_are_judged_the_same_way():
    claims, rec = batch(range(4), CHECK, units=0.0)
    for dtype in (torch.bfloat16, torch.float16):
        low = [(a, logits.to(dtype)) for a, logits in rec]
        v = check_batch(claims, low, eos_token_id=1, config=GPU_BF16)
        assert v.passed, (dtype, v.reason)


def test_near_tie_density_bounds_the_gap_distribution():
    """Monte Carlo: P(gap < δ) / δ for the Gumbel-max winner stays below the bound, and
    the bound is not vacuous (within 3x of the truth)."""
    g = torch.Generator().manual_seed(0)
    for scale in (0.5, 2.0, 5.0):
        logits = torch.randn(1, 50, generator=g, dtype=torch.float64) * scale
        probs = torch.softmax(logits, dim=-1)
        bound = float(near_tie_density(probs)[0])
        draws = 200_000
        u = torch.rand(draws, 50, generator=g, dtype=torch.float64)
        scores = logits - torch.log(-torch.log(u))
        top2 = scores.topk(2, dim=-1).values
        delta = 0.02
        rate = float(((top2[:, 0] - top2[:, 1]) < delta).double().mean()) / delta
        assert rate <= bound * 1.05 + 0.01, (scale, rate, bound)
        assert rate >= bound / 3, (scale, rate, bound)


def test_honest_bound_is_bernstein():
    c = SamplingCheck(noise_rms=0.5, noise_max=2.0, false_slash=1e-6)
    mu, var = 10.0, 4.0
    t = honest_bound(mu, var, c) - mu
    ln = math.log(1e6)
    assert math.isclose(math.exp(-(t * t) / (2 * (var + c.noise_max * t / 3))), 1e-6, rel_tol=1e-9)
    assert honest_bound(mu, var, SamplingCheck(false_slash=1e-9)) > honest_bound(
        mu, var, SamplingCheck()
    )
    assert t > 0 and ln > 0


def test_nucleus_bounds_bracket_the_nucleus():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(64, 100, generator=g) * 3
    for top_p in (0.5, 0.9, 0.99):
        exact = nucleus_mask(logits, 1.0, top_p)
        zero = torch.zeros(64, dtype=torch.float64)
        allowed0, core0 = nucleus_bounds(logits, 1.0, top_p, zero)
        # without noise, "may be" and "surely" agree with the nucleus except at exact ties
        assert (allowed0 == exact).float().mean() > 0.99 and (core0 == exact).float().mean() > 0.99
        allowed, core = nucleus_bounds(
            logits, 1.0, top_p, torch.full((64,), 0.3, dtype=torch.float64)
        )
        assert bool((allowed | ~exact).all()) and bool(
            (exact | ~core).all()
        )  # core ⊆ nucleus ⊆ allowed
        assert int(allowed.sum()) > int(exact.sum()) > int(core.sum())


def test_honest_top_p_sampling_passes_with_noise_and_a_token_outside_fails():
    claims, rec = batch(range(16), CHECK, units=CHECK.noise_rms, top_p=0.9)
    v = check_batch(claims, rec, eos_token_id=1, config=GPU_BF16)
    assert v.passed, v.reason
    c = claims[0]
    _, logits = rec[0]
    tokens = list(c.tokens)
    tokens[10] = int(logits[10].argmin())  # far outside any nucleus
    r = check_sampling(
        logits, torch.tensor(tokens), c.seed, temperature=1.0, top_p=0.9, check=CHECK
    )
    assert not r.passed and 10 in r.bad_positions


def test_greedy_allows_only_gaps_within_the_bound():
    logits = worker_logits(1)
    tokens = logits.argmax(dim=-1)
    assert check_sampling(logits, tokens, 0, temperature=0.0).passed
    top2 = logits.double().topk(2, dim=-1)
    unit = CHECK.unit(logits, 1.0)
    gaps = (top2.values[:, 0] - top2.values[:, 1]) / unit
    far = int(gaps.argmax())
    wrong = tokens.clone()
    wrong[far] = top2.indices[far, 1]
    r = check_sampling(logits, wrong, 0, temperature=0.0)
    assert not r.passed and r.bad_positions == [far]


def test_profiles():
    assert {"gpu-bf16", "paper", "strict-fp32"} <= set(PROFILES)
    assert profile("strict-fp32") is FP32
    with pytest.raises(ValueError, match="unknown verification profile 'x'; choose from gpu-bf16"):
        profile("x")
    logits = worker_logits(0, n=2)
    deep = GPU_BF16.for_layers(16).sampling.unit(logits, 1.0)
    assert torch.allclose(deep, 4 * GPU_BF16.sampling.unit(logits, 1.0))
    with pytest.raises(ValueError, match="noise_rms and noise_max must be > 0"):
        SamplingCheck(noise_rms=0)
    with pytest.raises(ValueError, match="layers must be >= 1"):
        SamplingCheck(layers=0)


def test_check_rollout_keeps_its_api():
    claim, acts, logits = rollout(7, CHECK, units=0.0)
    v = check_rollout(claim, acts, logits, eos_token_id=1)
    assert v.passed and v.reason == "ok" and v.describe() == ""
    with pytest.raises(ValueError, match="one row per output token"):
        check_rollout(claim, acts, logits[:-1], eos_token_id=1)


def test_the_run_setting_names_every_profile():
    from typing import get_args

    from node.config import VerifyProfile, load_config

    assert set(get_args(VerifyProfile)) == set(PROFILES)
    assert load_config(environ={}).run.verify_profile == "gpu-bf16"
    assert (
        load_config(
            environ={"INTELLECT_NODE_RUN__VERIFY_PROFILE": "strict-fp32"}
        ).run.verify_profile
        == "strict-fp32"
    )


def with_tokens(claim, changes):
    tokens = list(claim.tokens)
    for k, t in changes.items():
        tokens[k] = t
    return RolloutClaim(tokens, claim.proofs, claim.seed, "length", N, 1.0, claim.top_p)


@pytest.mark.parametrize("top_p", [0.9, 0.95])
def test_an_honest_flip_at_the_nucleus_boundary_is_counted_not_fatal(top_p):
    """The worker's noise moved a boundary token out of its nucleus, so the seeded sampler
    drew another one far behind it: one event, well within the count honest noise makes
    (it rejected the whole batch as 'not drawn' before)."""
    claims, rec = batch(range(16), CHECK, units=0.0, top_p=top_p)
    i, drops = next(
        (i, d)
        for i, c in enumerate(claims)
        if (d := boundary_drops(rec[i][1], c.seed, CHECK, 1.0, top_p))
    )
    k = min(drops)
    claims[i] = with_tokens(claims[i], {k: drops[k]})
    v = check_batch(claims, rec, eos_token_id=1, config=GPU_BF16)
    assert v.passed, v.reason
    assert v.rollouts[i].sampling.boundary_positions == [k] and v.boundary == 1
    assert not v.rollouts[i].sampling.bad_positions and v.rollouts[i].passed
    assert 0 < v.boundary_bound and i in v.flagged
    assert "nucleus-boundary events at positions" in v.rollouts[i].describe()


def test_a_token_drawn_just_outside_the_nucleus_is_an_event_and_far_outside_is_not_drawn():
    """The worker's noise moved a token into its nucleus that is allowed only at 2κ units,
    and the seeded sampler drew it: an event. A token outside even that is not drawn."""
    claims, rec = batch(range(16), CHECK, units=0.0, top_p=0.9)
    for c, (_, logits) in zip(claims, rec, strict=True):
        unit = CHECK.unit(logits, 1.0)
        scores = logits.double() + gumbel_noise_rows([c.seed] * N, list(range(N)), VOCAB)
        spreads = (CHECK.noise_max * unit, CHECK.forged_factor * CHECK.noise_max * unit)
        (allowed, _), (wide, _) = nucleus_bounds_at(logits, 1.0, 0.9, spreads)
        winners = scores.masked_fill(~wide, -torch.inf).argmax(dim=-1)
        outside = [k for k in range(N) if not allowed[k, winners[k]]]
        if outside:
            break
    k = outside[0]
    near = with_tokens(c, {k: int(winners[k])}).tokens
    r = check_sampling(logits, torch.tensor(near), c.seed, temperature=1.0, top_p=0.9, check=CHECK)
    assert r.boundary_positions == [k] and not r.bad_positions and r.passed
    far = with_tokens(c, {k: int(logits[k].argmin())}).tokens
    r = check_sampling(logits, torch.tensor(far), c.seed, temperature=1.0, top_p=0.9, check=CHECK)
    assert r.bad_positions == [k] and not r.passed


def test_more_boundary_events_than_noise_explains_reject_the_batch():
    """A worker that drops the boundary token wherever that changes its draw: every event
    alone is plausible, their number is not."""
    claims, rec = batch(range(32), CHECK, units=0.0, top_p=0.9)
    drops = [
        boundary_drops(logits, c.seed, CHECK, 1.0, 0.9)
        for c, (_, logits) in zip(claims, rec, strict=True)
    ]
    cheat = [with_tokens(c, d) for c, d in zip(claims, drops, strict=True)]
    v = check_batch(cheat, rec, eos_token_id=1, config=GPU_BF16)
    assert not v.passed
    assert v.reason.startswith("sampling: ") and "nucleus-boundary events above" in v.reason
    assert v.boundary == sum(len(d) for d in drops) > v.boundary_bound
    assert all(not r.sampling.bad_positions for r in v.rollouts)  # nothing structural
    honest = check_batch(claims, rec, eos_token_id=1, config=GPU_BF16)
    assert honest.passed and honest.boundary == 0


def test_the_boundary_count_shares_the_false_slash_budget_below_top_p_one():
    c = GPU_BF16.sampling
    assert budgets(c, 1.0, 1.0) == (c.false_slash, 0.0)
    assert budgets(c, 0.0, 0.9) == (c.false_slash, 0.0)  # greedy: no draw, no boundary
    assert budgets(c, 1.0, 0.95) == (c.false_slash / 2, c.false_slash / 2)
    assert c.boundary_rate == pytest.approx((c.noise_rms / c.noise_max) ** 2)
    # the Poisson-binomial Chernoff tail e^-β (eβ/k)^k equals α at the bound
    mu, alpha = 5.0, 5e-7
    k = count_bound(mu, alpha)
    assert math.isclose(-mu + k * (1 + math.log(mu / k)), math.log(alpha), rel_tol=1e-9)
    assert count_bound(mu, alpha) < count_bound(2 * mu, alpha) and k > mu
    assert count_bound(0.0, alpha) == 0 and count_bound(mu, 0.0) == 0
    claims, rec = batch(range(8), CHECK, units=0.0, top_p=0.9)
    v = check_batch(claims, rec, eos_token_id=1, config=GPU_BF16)
    mu, var = (sum(getattr(r.sampling, f) for r in v.rollouts) for f in ("expected", "variance"))
    assert v.bound == pytest.approx(honest_bound(mu, var, c, c.false_slash / 2))
    q = sum(r.sampling.boundary_expected for r in v.rollouts)
    assert q > 0 and v.boundary_bound == pytest.approx(count_bound(q, c.false_slash / 2))
    flat = check_batch(*batch(range(8), CHECK, units=0.0), eos_token_id=1, config=GPU_BF16)
    assert flat.boundary_bound == 0 and all(
        r.sampling.boundary_expected == 0 for r in flat.rollouts
    )


def test_a_token_is_surely_in_the_nucleus_when_its_own_mass_settles_it():
    """A top token of probability 0.97 at top-p 0.95 is in every worker's nucleus: the
    bounds count its own mass (without it the set of tokens surely in was empty at most
    positions of a peaked model, and no gap was measured there)."""
    logits = torch.log(torch.tensor([[0.97, 0.02, 0.01]], dtype=torch.float64))
    allowed, core = nucleus_bounds(logits, 1.0, 0.95, torch.tensor([0.2], dtype=torch.float64))
    assert core[0].tolist() == [True, False, False]
    assert allowed[0].tolist() == [True, False, False]


@pytest.mark.parametrize(("scale", "layers"), [(3.6, 1), (6.0, 22)])
def test_a_worker_choosing_low_tokens_of_the_nucleus_is_rejected_below_top_p_one(scale, layers):
    """At a quarter of the positions the cheater takes the least probable token it may
    claim is in the nucleus: far behind the draw's winner, so not drawn, on flat logits
    and on a deep model's (wide noise bounds, where the top token alone must count)."""
    config = GPU_BF16.for_layers(layers)
    check = config.sampling
    cheat, rec = [], []
    for seed in range(16):
        logits = worker_logits(seed, scale=scale)
        noise = gumbel_noise_rows([seed] * N, list(range(N)), VOCAB)
        tokens = sample_tokens(logits, noise, 1.0, 0.95).tolist()
        unit = check.unit(logits, 1.0)
        allowed, _ = nucleus_bounds(logits, 1.0, 0.95, check.noise_max * unit)
        low = logits.masked_fill(~allowed, torch.inf).argmin(dim=-1)
        for k in range(0, N, 4):
            tokens[k] = int(low[k])
        acts = [torch.zeros(4, 64), torch.randn(N - 1, 64)]
        cheat.append(RolloutClaim(tokens, build_proofs(acts), seed, "length", N, 1.0, 0.95))
        rec.append((acts, logits))
    v = check_batch(cheat, rec, eos_token_id=1, config=config)
    assert not v.passed and v.reason.startswith("sampling: rollouts"), v.reason
    assert sum(bool(r.sampling.bad_positions) for r in v.rollouts) >= 8
