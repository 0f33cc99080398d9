import math

import pytest
import torch

from crypto.sampling import (
    SamplingCheck,
    check_sampling,
    check_termination,
    derive_seed,
    gumbel_noise,
    gumbel_noise_rows,
    min_eos_prob,
    nucleus_mask,
    reference_uniform,
    sample_tokens,
)


def test_seeds_are_deterministic_and_bound_to_their_inputs():
    s = derive_seed("w", "task", 3, 0)
    assert s == derive_seed("w", "task", 3, 0)
    others = {
        derive_seed("w2", "task", 3, 0),
        derive_seed("w", "task2", 3, 0),
        derive_seed("w", "task", 4, 0),
        derive_seed("w", "task", 3, 1),
    }
    assert s not in others and len(others) == 4
    assert 0 <= s < 2**63
    assert torch.equal(gumbel_noise(s, 5, 100), gumbel_noise(s, 5, 100))
    assert not torch.equal(gumbel_noise(s, 5, 100), gumbel_noise(s, 6, 100))


def test_noise_is_the_specified_hash_and_uniform():
    """The vectorized noise equals the plain-integer specification bit for bit, rows
    computed together equal rows computed alone, and the draws look uniform."""
    import math

    seeds, positions, vocab = [3, 2**63 - 1, 0, 12345], [0, 7, 2**40, 1], 1000
    rows = gumbel_noise_rows(seeds, positions, vocab)
    for i, (s, p) in enumerate(zip(seeds, positions, strict=True)):
        assert torch.equal(rows[i], gumbel_noise(s, p, vocab))
        for t in (0, 1, 499, 999):
            u = reference_uniform(s, p, t)
            assert 0 < u < 1
            assert rows[i, t].item() == -math.log(-math.log(u))
    u = torch.exp(-torch.exp(-gumbel_noise_rows([9] * 200, list(range(200)), 500)))
    assert abs(u.mean().item() - 0.5) < 0.005 and abs(u.var().item() - 1 / 12) < 0.002
    hist = torch.histc(u.float(), bins=10, min=0, max=1) / u.numel()
    assert torch.allclose(hist, torch.full((10,), 0.1), atol=0.005)


def test_gumbel_max_draws_from_the_softmax():
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]])
    probs = torch.softmax(logits[0], dim=0)
    counts = torch.zeros(4)
    n = 4000
    for i in range(n):
        counts[sample_tokens(logits, gumbel_noise(i, 0, 4)[None], temperature=1.0)] += 1
    freq = counts / n
    assert torch.allclose(freq, probs.float(), atol=0.03), (freq, probs)


def test_temperature_zero_is_greedy_and_top_p_restricts():
    logits = torch.tensor([[0.0, 5.0, 4.9, -3.0]])
    noise = torch.tensor([[100.0, 0.0, 0.0, 0.0]])
    assert sample_tokens(logits, noise, temperature=0.0).item() == 1
    assert sample_tokens(logits, noise, temperature=1.0, top_p=1.0).item() == 0  # noise wins
    assert (
        sample_tokens(logits, noise, temperature=1.0, top_p=0.5).item() == 1
    )  # 0 is outside the nucleus


def test_nucleus_mask():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert nucleus_mask(logits, 1.0, 0.5).tolist() == [True, False, False, False]
    assert nucleus_mask(logits, 1.0, 0.6).tolist() == [True, True, False, False]
    assert nucleus_mask(logits, 1.0, 0.95).tolist() == [True, True, True, False]
    assert nucleus_mask(logits, 1.0, 1.0).all()


def honest(n=50, vocab=64, seed=11, temperature=0.8, top_p=0.9):
    logits = torch.randn(n, vocab, generator=torch.Generator().manual_seed(1)) * 3
    noise = gumbel_noise_rows([seed] * n, list(range(n)), vocab)
    return logits, sample_tokens(logits, noise, temperature, top_p)


def test_honest_tokens_pass_even_with_small_logit_noise():
    logits, tokens = honest()
    assert check_sampling(logits, tokens, 11, temperature=0.8, top_p=0.9).passed
    wobble = logits + 1e-3 * torch.randn_like(logits)
    assert check_sampling(wobble, tokens, 11, temperature=0.8, top_p=0.9).passed


def test_a_boundary_token_the_worker_could_not_pick_does_not_fail_it():
    """Token 2 lies outside the nucleus for top_p 0.9 but inside it with the validator's
    slack: even when its perturbed score is the best, the honest choice passes."""
    logits = torch.log(torch.tensor([[0.5, 0.405, 0.095]]))
    for seed in range(1000):
        noise = gumbel_noise_rows([seed], [0], 3)
        scores = logits.double() + noise
        chosen = sample_tokens(logits, noise, 1.0, 0.9)
        if scores[0].argmax() == 2 and scores[0, 2] - scores[0, chosen] > 0.5:
            break
    else:
        raise AssertionError("no seed puts the boundary token on top")
    assert check_sampling(logits, chosen, seed, temperature=1.0, top_p=0.9).passed
    assert not check_sampling(logits, torch.tensor([2]), seed, temperature=1.0, top_p=0.8).passed


def test_a_token_the_noise_did_not_choose_is_caught():
    logits, tokens = honest()
    forged = tokens.clone()
    forged[7] = (tokens[7] + 1) % 64
    r = check_sampling(logits, forged, 11, temperature=0.8, top_p=0.9)
    assert not r.passed and r.bad_positions == [7]
    assert not check_sampling(logits, tokens, 12, temperature=0.8, top_p=0.9).passed  # another seed


def test_out_of_range_tokens_and_wrong_lengths():
    logits, tokens = honest()
    bad = tokens.clone()
    bad[3] = 10_000
    assert check_sampling(logits, bad, 11, temperature=0.8).bad_positions == [3]
    with pytest.raises(ValueError, match="expected 50 tokens"):
        check_sampling(logits, tokens[:-1], 11, temperature=0.8)


def test_greedy_check():
    logits, _ = honest()
    greedy = logits.argmax(dim=-1)
    assert check_sampling(logits, greedy, 0, temperature=0.0).passed
    greedy[0] = logits[0].argmin()
    assert not check_sampling(logits, greedy, 0, temperature=0.0).passed


def test_termination():
    eos = 1
    likely = torch.zeros(8)
    likely[eos] = 5.0
    unlikely = torch.zeros(8)
    unlikely[eos] = -30.0
    common = dict(max_new_tokens=10, eos_token_id=eos, temperature=1.0)
    assert check_termination(
        finish_reason="length", num_tokens=10, last_token=4, eos_logits=None, **common
    )
    assert not check_termination(
        finish_reason="length", num_tokens=9, last_token=4, eos_logits=None, **common
    )
    assert check_termination(
        finish_reason="stop", num_tokens=6, last_token=eos, eos_logits=likely, **common
    )
    assert not check_termination(
        finish_reason="stop", num_tokens=6, last_token=eos, eos_logits=unlikely, **common
    )
    assert not check_termination(
        finish_reason="stop", num_tokens=6, last_token=4, eos_logits=likely, **common
    )
    assert not check_termination(
        finish_reason="other", num_tokens=6, last_token=eos, eos_logits=likely, **common
    )
    lenient = SamplingCheck(min_eos_prob=0.0)
    assert check_termination(
        finish_reason="stop",
        num_tokens=6,
        last_token=eos,
        eos_logits=unlikely,
        check=lenient,
        **common,
    )
    # the threshold shares the false-slash budget among the batch's EOS draws
    check = SamplingCheck()
    assert check.min_eos_prob is None
    assert math.isclose(min_eos_prob(check, 24, 16) * 24 * 16, check.false_slash)
    assert min_eos_prob(lenient, 24, 16) == 0.0


def test_an_honest_unlikely_eos_ending_is_plausible_in_its_batch():
    """Seen in a devnet run: the tiny model gives EOS ~3e-5 at every position, and an honest
    worker drew it (p = 3.71e-5) in a batch of 16 rollouts of at most 24 tokens; a fixed
    1e-4 threshold rejected that batch and slashed the worker. An EOS no honest draw
    explains at the design's false-slash rate is still refused."""
    eos, vocab = 1, 100
    logits = torch.zeros(vocab)
    logits[37] = 12.0
    logits[eos] = math.log(3.71e-5) + torch.logsumexp(logits, 0).item()
    p_eos = float(torch.softmax(logits.double(), 0)[eos])
    assert 3e-5 < p_eos < 1e-4
    common = dict(finish_reason="stop", num_tokens=6, max_new_tokens=24, last_token=eos)
    assert check_termination(
        **common, eos_token_id=eos, eos_logits=logits, temperature=1.0, rollouts=16
    )
    logits[eos] = -40.0  # p ~ 1e-23: below 1e-6 / (16 * 24)
    assert not check_termination(
        **common, eos_token_id=eos, eos_logits=logits, temperature=1.0, rollouts=16
    )


def _rows(rng, g, vocab, temperature):
    """Sequences sampled (mostly) honestly, some tokens replaced, now and then one out of
    the vocabulary: every kind of evidence the check gives."""
    rows = []
    for _ in range(rng.randint(1, 6)):
        n = rng.randint(1, 12)
        logits = torch.randn(n, vocab, generator=g) * rng.choice([1.0, 5.0])
        if rng.random() < 0.5:
            logits = logits.to(torch.bfloat16)
        seed = rng.randrange(1 << 62)
        scores = logits.double()
        if temperature > 0:
            scores = scores / temperature + gumbel_noise_rows([seed] * n, list(range(n)), vocab)
        tokens = scores.argmax(-1).tolist()
        for j in range(n):
            if rng.random() < 0.15:
                tokens[j] = rng.randrange(vocab)
        if rng.random() < 0.1:
            tokens[0] = vocab + 3
        rows.append((logits, tokens, seed))
    return rows


@pytest.mark.parametrize("chunk", [1 << 16, 400])
def test_sequences_judged_together_get_what_each_gets_alone(monkeypatch, chunk):
    """A batch's rollouts are judged in chunks of many positions (one set of operations
    per chunk: on a GPU one per rollout was most of a validator's time); each result must
    be exactly the one the rollout gets on its own, chunks split anywhere."""
    import random

    from crypto import sampling

    monkeypatch.setitem(sampling.SAMPLING_CHUNK, "cpu", chunk)
    rng, g = random.Random(7), torch.Generator().manual_seed(7)
    judged = 0
    for _ in range(40):
        vocab = rng.choice([7, 50, 300])
        temperature, top_p = rng.choice([0.0, 0.7, 1.0]), rng.choice([1.0, 0.9, 0.5])
        check = SamplingCheck(layers=rng.choice([1, 4]))
        rows = _rows(rng, g, vocab, temperature)
        together = sampling.check_sampling_many(
            rows, temperature=temperature, top_p=top_p, check=check
        )
        assert len(together) == len(rows)
        for (logits, tokens, seed), got in zip(rows, together, strict=True):
            alone = check_sampling(
                logits,
                torch.tensor(tokens),
                seed,
                temperature=temperature,
                top_p=top_p,
                check=check,
            )
            assert got == alone
            judged += 1
    assert judged > 100


def test_sequences_of_other_vocabularies_are_judged_apart():
    import random

    from crypto.sampling import check_sampling_many

    rng, g = random.Random(3), torch.Generator().manual_seed(3)
    rows = _rows(rng, g, 50, 1.0) + _rows(rng, g, 300, 1.0) + _rows(rng, g, 50, 1.0)
    together = check_sampling_many(rows, temperature=1.0)
    for (logits, tokens, seed), got in zip(rows, together, strict=True):
        assert got == check_sampling(logits, torch.tensor(tokens), seed, temperature=1.0)
