"""TOPLOC proofs: byte format, field arithmetic, malformed proofs, and detection with a
tiny real transformer."""

import numpy as np
import pytest
import torch

from crypto import toploc
from crypto.sampling import derive_seed
from crypto.toploc import (
    PAPER,
    STRICT_FP32,
    P,
    Thresholds,
    build_proofs,
    build_proofs_batch,
    chunks_of,
    verify_proofs,
)
from crypto.verdict import RolloutClaim, VerifyConfig, check_rollout
from tests.helpers.tiny_lm import EOS, attack, generate, recompute, tiny_llama


def random_acts(prompt_len=20, steps=100, hidden=512, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(prompt_len, hidden, generator=g)] + [
        torch.randn(hidden, generator=g) for _ in range(steps)
    ]


def test_honest_roundtrip_and_258_byte_format():
    acts = random_acts()
    proofs = build_proofs(acts)
    assert len(proofs) == 1 + 4  # prefill, then 32 + 32 + 32 + 4 decode steps
    assert all(len(p) == 258 for p in proofs)
    results = verify_proofs(acts, proofs)
    assert all(r.passed and r.exp_mismatches == 0 and r.mant_err_mean == 0 for r in results)
    assert build_proofs(acts) == proofs  # deterministic


def test_chunks_larger_than_the_field():
    """A prefill chunk of more than 65,497 entries: indices are reduced mod m (also when
    m is 65,497 itself), and the proof round-trips."""
    g = torch.Generator().manual_seed(3)
    for rows in (70, 90):
        acts = [torch.randn(rows, 1024, generator=g)] + [torch.randn(1024, generator=g)] * 5
        proofs = build_proofs(acts)
        assert all(r.passed for r in verify_proofs(acts, proofs))
        m = int.from_bytes(proofs[0][:2], "big")
        assert 128 <= m <= P


def test_ties_select_the_lowest_indices_alone_or_in_a_batch():
    """Equal magnitudes are common in bf16; the selection breaks ties by index, so the
    same chunk gives the same proof alone or batched with chunks of other sizes, and an
    honest recomputation matches every entry even under STRICT_FP32."""
    tied = torch.ones(20, 64)
    tied[1, 36] = -1.0  # same magnitude, other sign
    tied[7] = 0.5
    ((idx, bits),) = toploc._top_entries([tied], 128)
    assert sorted(idx.tolist()) == list(range(128))
    assert int(bits[idx.tolist().index(64 + 36)]) >> 15 == 1  # the sign is kept
    alone = build_proofs([tied])
    others = [random_acts(prompt_len=n, steps=s, hidden=64, seed=n) for n, s in ((3, 40), (50, 7))]
    batched = build_proofs_batch([others[0], [tied], others[1]])
    assert batched[1] == alone
    assert batched[0] == build_proofs(others[0]) and batched[2] == build_proofs(others[1])
    (result,) = verify_proofs([tied], alone, thresholds=STRICT_FP32)
    assert result.passed and result.exp_mismatches == 0


def test_padding_never_enters_the_selection_even_of_an_all_zero_chunk():
    """Chunks of 1,200 entries are padded to 2,048 for one top-k call; padding has the
    magnitude of a zero, so a chunk of zeros must still pick its own lowest indices."""
    zeros = torch.zeros(3, 400)
    mixed = torch.zeros(3, 400)
    mixed[2, 399] = 1.0
    (z_idx, _), (m_idx, m_bits) = toploc._top_entries([zeros, mixed], 128)
    assert sorted(z_idx.tolist()) == list(range(128))
    assert 1199 in m_idx.tolist() and sorted(m_idx.tolist())[:127] == list(range(127))
    assert int(m_bits[m_idx.tolist().index(1199)]) == 0x3F80  # bf16 1.0


def test_chunking():
    acts = random_acts(steps=70)
    chunks = chunks_of(acts, 32, skip_prefill=False)
    assert [tuple(c.shape) for c in chunks] == [(20, 512), (32, 512), (32, 512), (6, 512)]
    assert len(chunks_of(acts[1:], 32, skip_prefill=True)) == 3
    with pytest.raises(ValueError, match="prefill"):
        chunks_of([torch.randn(4)], 32, skip_prefill=False)


def test_interpolation_passes_through_every_point():
    rng = np.random.default_rng(1)
    for k in (1, 2, 17, 128):
        xs = np.stack([rng.choice(P, size=k, replace=False) for _ in range(3)]).astype(np.int64)
        ys = rng.integers(0, P, size=(3, k), dtype=np.int64)
        coeffs = toploc._interpolate(xs, ys)
        assert (toploc._evaluate(coeffs, xs) == ys).all()
        assert coeffs.shape == (3, k) and (coeffs < P).all()


def test_interpolation_is_exact_at_the_edges_of_the_field():
    rng = np.random.default_rng(4)
    for _ in range(50):
        xs = np.sort(rng.choice(np.arange(P - 400, P), size=128, replace=False))[None].astype(
            np.int64
        )
        ys = rng.choice([0, 1, P - 2, P - 1], size=(1, 128)).astype(np.int64)
        coeffs = toploc._interpolate(xs, ys)
        assert (coeffs >= 0).all() and (coeffs < P).all()
        assert (toploc._evaluate(coeffs, xs) == ys).all()


def test_modulus_is_the_largest_that_separates_the_indices():
    rng = np.random.default_rng(2)
    for _ in range(20):
        idx = torch.from_numpy(rng.choice(3_000_000, size=128, replace=False).astype(np.int64))
        m = toploc._find_modulus(idx)
        assert len(set((idx % m).tolist())) == 128
        for bigger in range(m + 1, P + 1):
            assert len(set((idx % bigger).tolist())) < 128


def test_indices_colliding_mod_65497_get_a_smaller_modulus_and_still_verify():
    chunk = torch.randn(1, 200_000) * 0.01
    chunk[0, 5] = 100.0
    chunk[0, 5 + P] = -90.0  # collides with index 5 mod 65497
    proofs = build_proofs([chunk], skip_prefill=False)
    m = int.from_bytes(proofs[0][:2], "big")
    assert m < P
    # the reference forgets "mod m" in one verification path: that would fail here
    assert verify_proofs([chunk], proofs)[0].passed


def test_small_chunks_are_padded_to_the_fixed_size():
    acts = [torch.randn(1, 16)] + [torch.randn(16) for _ in range(3)]
    proofs = build_proofs(acts)
    assert all(len(p) == 258 for p in proofs)
    assert all(r.passed for r in verify_proofs(acts, proofs))


@pytest.mark.parametrize(
    "bad",
    [
        b"",
        b"\x00" * 258,
        b"\x01" * 257,
        b"\x01" * 259,
        b"\xff\xff" + b"\x00" * 256,
        b"\x00\x10" + b"\xff" * 256,
        None,
        "text",
    ],
)
def test_null_short_and_garbage_proofs_fail_without_crashing(bad):
    acts = random_acts(steps=10)
    proofs = build_proofs(acts)
    proofs[1] = bad
    results = verify_proofs(acts, proofs)
    assert results[0].passed and not results[1].passed


def test_random_proof_and_missing_proofs_fail():
    acts = random_acts(steps=40)
    proofs = build_proofs(acts)
    rng = np.random.default_rng(3)
    garbage = b"\xff\xd0" + rng.integers(0, P, size=128).astype(">u2").tobytes()
    results = verify_proofs(acts, [proofs[0], garbage])
    assert [r.passed for r in results] == [True, False, False]


def test_detects_other_activations_and_tolerates_tiny_noise():
    acts = random_acts()
    proofs = build_proofs(acts)
    other = random_acts(seed=9)
    assert not any(r.passed for r in verify_proofs(other, proofs))
    nudged = [a * (1 + 1e-4 * torch.randn_like(a)) for a in acts]
    assert all(r.passed for r in verify_proofs(nudged, proofs))


def test_thresholds_are_configurable():
    acts = random_acts()
    proofs = build_proofs(acts)
    noisy = [a + 0.02 * torch.randn_like(a) for a in acts]
    lenient = verify_proofs(noisy, proofs)
    strict = verify_proofs(
        noisy,
        proofs,
        thresholds=Thresholds(max_mant_err_mean=0.01, max_mant_err_median=0, min_exp_matches=128),
    )
    assert all(r.passed for r in lenient)
    assert not any(r.passed for r in strict)


# ---- with a tiny real transformer ---------------------------------------------------------

MODEL = tiny_llama(0)
PROMPTS = [[(7 * i + j) % 250 + 3 for j in range(4 + i % 9)] for i in range(16)]
MAX_NEW = 70


def seeds(n, step=0):
    return [derive_seed("worker-a", f"task-{i}", step) for i in range(n)]


def claim_of(gen, temperature=1.0):
    return RolloutClaim(
        tokens=gen.tokens,
        proofs=build_proofs(gen.activations),
        seed=gen.seed,
        finish_reason=gen.finish_reason,
        max_new_tokens=MAX_NEW,
        temperature=temperature,
    )


def verdict(validator_model, gen, claim=None, prompt=None, thresholds=PAPER):
    acts, logits = recompute(validator_model, prompt or gen.prompt, gen.tokens)
    return check_rollout(
        claim or claim_of(gen),
        acts,
        logits,
        eos_token_id=EOS,
        config=VerifyConfig(thresholds=thresholds),
    )


@pytest.mark.parametrize("batch", [1, 4, 16])
@pytest.mark.parametrize("threads", [1, 2])
def test_honest_generation_verifies(batch, threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gens = generate(MODEL, PROMPTS[:batch], seeds(batch), max_new_tokens=MAX_NEW)
    finally:
        torch.set_num_threads(before)
    for gen in gens:
        assert len(gen.activations) == len(gen.tokens)  # prefill + one per token but the last
        for th in (PAPER, STRICT_FP32):
            v = verdict(MODEL, gen, thresholds=th)
            assert v.passed, (v.reason, v.toploc, v.sampling)


GROSS = ["other_seed", "other_prompt", "token_changed", "tampered_sampling"]
SUBTLE = ["optimizer_step", "bf16_as_fp32"]


@pytest.mark.parametrize("name", GROSS + SUBTLE)
def test_substitutions_are_detected(name):
    validator_model, gen, prompt = attack(
        MODEL, name, PROMPTS[3], PROMPTS[5], seeds(1)[0], max_new_tokens=MAX_NEW
    )
    thresholds = PAPER if name in GROSS else STRICT_FP32
    v = verdict(validator_model, gen, prompt=prompt, thresholds=thresholds)
    assert not v.passed, (name, v.toploc)
    if name == "tampered_sampling":
        assert v.toploc_ok and not v.sampling.passed and v.sampling.bad_positions == [20]


def test_batched_building_equals_one_by_one():
    seqs = [random_acts(prompt_len=3 + i, steps=10 * i + 1, hidden=64, seed=i) for i in range(5)]
    assert toploc.build_proofs_batch(seqs) == [build_proofs(a) for a in seqs]


def reference_results(acts, proofs, thresholds=PAPER, topk=128):
    """Each chunk's result the plain way (one chunk at a time, ``np.mean`` / ``np.median``
    of the matched entries): the oracle of the batched verification."""
    out = []
    for n, chunk in enumerate(chunks_of(acts, 32, False)):
        k = min(topk, chunk.numel())
        decoded = toploc._decode(proofs[n], topk) if n < len(proofs) else None
        if decoded is None:
            out.append(toploc._failed(k))
            continue
        ((idx, ours),) = toploc._top_entries([chunk], topk)
        m, coeffs = decoded
        theirs = toploc._evaluate(coeffs[None, :], (idx % m)[None, :])[0]
        match = (theirs >> 7) == (ours >> 7)
        err = np.abs((theirs & 0x7F) - (ours & 0x7F))[match]
        mean = float(err.mean()) if match.any() else float("inf")
        median = float(np.median(err)) if match.any() else float("inf")
        need = -(-thresholds.min_exp_matches * k // 128)
        passed = bool(
            match.sum() >= need
            and mean <= thresholds.max_mant_err_mean
            and median <= thresholds.max_mant_err_median
        )
        out.append(toploc.ProofResult(k - int(match.sum()), mean, median, passed))
    return out


def test_batched_verification_equals_one_chunk_at_a_time():
    """A batch of sequences of many shapes, verified together, gets each chunk's result
    of verifying it alone: honest, noisy (even and odd numbers of matches), other
    activations, a garbage, a null and a missing proof, chunks of fewer than k entries."""
    rng = np.random.default_rng(11)
    seqs, proofs = [], []
    for i in range(9):
        acts = random_acts(prompt_len=2 + 3 * i, steps=7 * i + 1, hidden=8 + 24 * (i % 3), seed=i)
        given = build_proofs(acts)
        if i % 3 == 1:  # noisy recomputation: some exponents and mantissas off
            acts = [a + (0.01 * i) * torch.randn_like(a) for a in acts]
        if i == 4:
            acts = random_acts(prompt_len=14, steps=29, hidden=32, seed=99)
        if i == 5:
            given[0] = b"\xff\xd0" + rng.integers(0, P, size=128).astype(">u2").tobytes()
        if i == 7:
            given = given[:-1]  # the last chunk's proof missing
        if i == 8:
            given[-1] = bytes(258)  # a null proof
        seqs.append(acts)
        proofs.append(given)
    # 128 entries (all selected), half recomputed one bf16 step up: errors 0 x 64, 1 x 64
    exact = (1 + (torch.arange(128) % 64) / 128).reshape(4, 32)
    seqs.append([exact + torch.where(torch.arange(128) < 64, 1 / 128, 0.0).reshape(4, 32)])
    proofs.append(build_proofs([exact]))
    for th in (PAPER, STRICT_FP32):
        batched = toploc.verify_proofs_batch(seqs, proofs, thresholds=th)
        expected = [reference_results(a, p, th) for a, p in zip(seqs, proofs, strict=True)]
        assert batched == expected
        outcomes = {r.passed for seq in batched for r in seq}
        assert outcomes == {True, False}
    assert batched[-1][0].mant_err_median == 0.5 and batched[-1][0].mant_err_mean == 0.5
    # medians of both an odd and an even count of matched entries (k = 128 and the
    # smaller chunks' k have both parities of mismatches among them)
    assert {(r.exp_mismatches % 2) for seq in batched for r in seq if r.exp_mismatches < 64} == {
        0,
        1,
    }
    with pytest.raises(ValueError, match="proofs of every sequence"):
        toploc.verify_proofs_batch(seqs, proofs[:-1])


def test_coefficients_match_the_reference_implementation():
    """Golden vectors produced by the reference (toploc 0.1.6's C++ ndd module): the same
    points give the same monomial coefficients, so the 258-byte proofs interoperate."""
    import json
    from pathlib import Path

    data = json.loads(
        (Path(__file__).parent / "fixtures" / "toploc_reference_vectors.json").read_text()
    )
    for vec in data["vectors"]:
        xs = np.array([vec["xs"]], dtype=np.int64)
        ys = np.array([vec["ys"]], dtype=np.int64)
        assert toploc._interpolate(xs, ys)[0].tolist() == vec["coeffs"]
        coeffs = np.array([vec["coeffs"]], dtype=np.int64)
        probe = np.array([vec["probe"]], dtype=np.int64)
        assert toploc._evaluate(coeffs, probe)[0].tolist() == vec["probe_values"]


def test_the_mantissa_distance_counts_only_where_sign_and_exponent_match():
    """bf16 patterns: 1 sign bit, 8 exponent bits, 7 mantissa bits. Two values of another
    sign or exponent are not near however close their mantissas: they do not match."""
    from crypto.toploc import mantissa_distance

    def bf16(x):
        return int(torch.tensor([x], dtype=torch.bfloat16).view(torch.int16).item()) & 0xFFFF

    pairs = [
        (1.5, 1.5, True, 0),
        (1.5, 1.5078125, True, 1),  # one unit in the last place
        (1.5, 1.0, True, 64),
        (1.5, -1.5, False, 0),  # the sign differs, mantissas equal
        (1.5, 3.0, False, 0),  # the lowest exponent bit differs, mantissas equal
        (1.5, 0.75, False, 0),  # exponent 127 vs 126: every exponent bit but the lowest
        (1.5, 1.5 * 2.0**64, False, 0),  # the highest exponent bit differs
    ]
    a = np.array([bf16(x) for x, *_ in pairs], dtype=np.int64)
    b = np.array([bf16(y) for _, y, *_ in pairs], dtype=np.int64)
    same, distance = mantissa_distance(a, b)
    assert same.tolist() == [s for *_, s, _ in pairs], "sign and exponent not both compared"
    assert distance.tolist() == [d for *_, d in pairs]
