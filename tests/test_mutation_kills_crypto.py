"""crypto/: behaviour that survived mutation testing (bench/mutation.py) unchecked.

Peer ids that are base58 but not an Ed25519 identity multihash; envelopes whose key or
signature alone is malformed; the messages a user or a peer reads when a key, peer id,
signature or profile name is wrong; the per-rollout and per-batch verdict text and the
pooled-statistic rejection judged under the batch's own profile; the bounds of the
honest-noise model; nucleus edges; EOS plausibility at the sampling temperature; proofs of
decode states alone and of a chunk with an entry at flat index P; EOS judged at the
position that drew it; the boundary bound and the top-k selection on their input's device.
"""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import replace

import base58
import pytest
import torch

from crypto.envelope import Envelope, SignatureError, signing_bytes
from crypto.hashing import digest, hexdigest
from crypto.identity import Identity, IdentityError, peer_id_of, public_key_of_peer_id, verify
from crypto.sampling import (
    SamplingCheck,
    SamplingResult,
    check_sampling,
    check_termination,
    gumbel_noise_rows,
    nucleus_bounds,
    nucleus_mask,
    sample_tokens,
)
from crypto.toploc import (
    STRICT_FP32,
    P,
    ProofResult,
    build_proofs,
    build_proofs_batch,
    verify_proofs,
)
from crypto.verdict import (
    GPU_BF16,
    PROFILES,
    RolloutClaim,
    RolloutVerdict,
    check_batch,
    check_rollout,
    profile,
)

KEY = Identity(bytes(range(32)))


def test_hexdigest_is_the_blake2b_256_hex_of_the_data():
    assert hexdigest(b"abc") == hashlib.blake2b(b"abc", digest_size=32).hexdigest()
    assert hexdigest(b"abc") == digest(b"abc").hex()


def test_a_peer_id_must_have_the_ed25519_prefix_and_length():
    raw = base58.b58decode(KEY.peer_id)
    assert public_key_of_peer_id(KEY.peer_id) == KEY.public_bytes
    other_type = raw[:3] + b"\x02" + raw[4:]  # same length, key type secp256k1
    too_long = raw + b"\x00"  # right prefix, one byte more
    for wrong in (other_type, too_long, raw[:-1]):
        peer_id = base58.b58encode(wrong).decode()
        with pytest.raises(IdentityError) as exc:
            public_key_of_peer_id(peer_id)
        assert str(exc.value) == f"not an Ed25519 peer id: {peer_id!r}"


def test_identity_errors_say_what_is_wrong():
    with pytest.raises(IdentityError) as exc:
        peer_id_of(bytes(33))
    assert str(exc.value) == "Ed25519 public key must be 32 bytes"
    with pytest.raises(IdentityError) as exc:
        public_key_of_peer_id("12D3Koo0")  # '0' is not a base58 digit
    assert str(exc.value) == "peer id is not base58: '12D3Koo0'"
    with pytest.raises(IdentityError) as exc:
        Identity(bytes(31))
    assert str(exc.value) == "Ed25519 private key must be 32 bytes"


def test_an_unknown_profile_lists_the_choices():
    with pytest.raises(ValueError, match="unknown verification profile") as exc:
        profile("fast")
    assert str(exc.value) == (
        f"unknown verification profile 'fast'; choose from {', '.join(PROFILES)}"
    )
    assert ", ".join(PROFILES) == "gpu-bf16, paper, strict-fp32"


def test_signing_domains_of_1_to_64_ascii_bytes():
    payload = b"p"
    assert (
        signing_bytes("a" * 64, payload) == b"intellect-node/sig/v1\x00\x40" + b"a" * 64 + payload
    )
    for bad in ("", "a" * 65):
        with pytest.raises(ValueError, match="signing domain must be 1..64 ASCII bytes"):
            signing_bytes(bad, payload)


def test_envelope_open_says_whether_the_input_is_malformed_or_wrongly_signed():
    good = Envelope.seal(KEY, "intellect/test/1", b"payload")
    assert good.open("intellect/test/1") == b"payload"
    for bad in (
        Envelope(good.payload, good.signer, good.signature[:-1]),  # key fine, signature short
        Envelope(good.payload, good.signer[:-1], good.signature),  # signature fine, key short
    ):
        with pytest.raises(SignatureError) as exc:
            bad.open("intellect/test/1")
        assert str(exc.value) == "malformed signer key or signature"
    with pytest.raises(SignatureError) as exc:
        good.open("intellect/other/1")
    assert str(exc.value) == "bad signature for domain 'intellect/other/1'"


def verdict(toploc, *, bad=(), suspect=(), termination_ok=True):
    sampling = SamplingResult(
        passed=not bad, bad_positions=list(bad), max_gap=0.0, suspect_positions=list(suspect)
    )
    return RolloutVerdict(toploc, sampling, termination_ok)


def test_describe_names_the_failing_chunks_and_the_worst_one():
    ok = ProofResult(0, 0.5, 0.0, True)
    bad = ProofResult(40, 12.5, 9.0, False)
    assert verdict([ok, ok]).describe() == ""
    v = verdict([ok, bad], bad=[3], suspect=[1, 2], termination_ok=False)
    assert v.describe() == (
        "toploc chunks [1] fail (worst: 40 exponent mismatches, mean mantissa error 12.50); "
        "tokens not drawn by the seeded sampler at positions [3]; "
        "gaps beyond the noise bound at positions [1, 2]; implausible ending"
    )
    assert verdict([]).describe() == "toploc chunks [] fail"  # no proofs at all
    many = verdict([ok], bad=range(10), suspect=range(20, 30)).describe()
    assert many == (
        "tokens not drawn by the seeded sampler at positions [0, 1, 2, 3, 4, 5, 6, 7]; "
        "gaps beyond the noise bound at positions [20, 21, 22, 23, 24, 25, 26, 27]"
    )
    assert (verdict([]).toploc_ok, verdict([ok]).toploc_ok) == (False, True)


def synthetic_batch(rollouts, units, check):
    """Rollouts a worker sampled from random logits, and a validator's recomputation whose
    score differences have an RMS of ``units`` noise units (as in test_verdict.py)."""
    n, vocab = 96, 512
    claims, recomputed = [], []
    for seed in range(rollouts):
        logits = torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * 3.6
        noise = gumbel_noise_rows([seed] * n, list(range(n)), vocab)
        tokens = sample_tokens(logits, noise, 1.0).tolist()
        acts = [
            torch.zeros(4, 64),
            torch.randn(n - 1, 64, generator=torch.Generator().manual_seed(seed)),
        ]
        claims.append(RolloutClaim(tokens, build_proofs(acts), seed, "length", n, 1.0))
        unit = check.unit(logits, 1.0)[:, None]
        g = torch.Generator().manual_seed(10_000 + seed)
        drift = (
            torch.randn(logits.shape, generator=g, dtype=torch.float64)
            * unit
            * units
            / math.sqrt(2)
        )
        recomputed.append((acts, (logits.double() + drift).float()))
    return claims, recomputed


def test_pooled_statistic_rejects_under_the_batch_profile_and_names_the_largest_rollouts():
    # a noise model that never calls a single gap forged, so only the pooled statistic can
    # reject: check_batch must judge every rollout under this profile, not the default
    lenient = replace(
        GPU_BF16, sampling=SamplingCheck(forged_factor=100.0, false_slash=0.01), name="lenient"
    )
    claims, recomputed = synthetic_batch(6, 6 * lenient.sampling.noise_rms, lenient.sampling)
    v = check_batch(claims, recomputed, eos_token_id=1, config=lenient)
    assert v.passed is False
    assert all(not r.sampling.bad_positions for r in v.rollouts)
    assert v.statistic == pytest.approx(sum(r.sampling.excess for r in v.rollouts))
    assert v.statistic > v.bound > 0 and v.margin == v.statistic / v.bound
    assert v.reason == (
        f"sampling: statistic {v.statistic:.1f} above the honest bound {v.bound:.1f} "
        "(profile lenient, false-slash 0.01); largest contributions from rollouts [4, 2, 3, 0]"
    )
    # the default profile calls some of the same gaps forged: a structural rejection
    strict = check_batch(claims, recomputed, eos_token_id=1, config=GPU_BF16)
    assert strict.reason.startswith("sampling: rollouts [")


@pytest.mark.parametrize(
    "fields",
    [
        {"false_slash": 0.0},
        {"false_slash": 1.0},
        {"false_slash": 1.5},
        {"noise_max": 0.0},
        {"noise_rms": 0.0},
        {"forged_factor": 0.99},
        {"precision_bits": 0},
        {"precision_bits": 53},
        {"layers": 0},
    ],
)
def test_sampling_check_refuses_a_meaningless_noise_model(fields):
    with pytest.raises(ValueError, match="must be"):
        SamplingCheck(**fields)


def test_sampling_check_takes_the_edges_of_its_ranges():
    SamplingCheck(forged_factor=1.0, precision_bits=1, layers=1, false_slash=1e-300)
    SamplingCheck(precision_bits=52, false_slash=0.999)


def test_eos_plausibility_is_judged_at_the_sampling_temperature():
    # EOS 10 logits below the rest: e^-5 / (1 + e^-5) at T = 2, e^-20 at T = 0.5
    eos_logits = torch.tensor([0.0, -10.0])

    def stop(temperature):
        return check_termination(
            finish_reason="stop", num_tokens=3, max_new_tokens=8, last_token=1, eos_token_id=1,
            eos_logits=eos_logits, temperature=temperature,
            check=SamplingCheck(min_eos_prob=1e-4),
        )  # fmt: skip

    assert stop(2.0) is True
    assert stop(0.5) is False
    assert stop(0.0) is False  # greedy: judged at T = 1, e^-10 < 1e-4


def test_proofs_of_decode_states_alone():
    states = [torch.randn(64, generator=torch.Generator().manual_seed(i)) for i in range(40)]
    proofs = build_proofs(states, skip_prefill=True)
    assert len(proofs) == 2  # 32 + 8 decode states
    assert proofs == build_proofs_batch([states], skip_prefill=True)[0]
    results = verify_proofs(states, proofs, skip_prefill=True, thresholds=STRICT_FP32)
    assert [r.passed for r in results] == [True, True]
    with pytest.raises(ValueError, match="topk must be in 1..4096"):
        build_proofs(states, topk=0, skip_prefill=True)


def test_nucleus_bounds_at_zero_spread_are_the_nucleus_even_at_an_exact_tie():
    # probabilities exactly 0.5, 0.25, 0.25: with top_p = 0.5 the nucleus is the first token
    logits = torch.tensor([[math.log(2), 0.0, 0.0]], dtype=torch.float64)
    allowed, core = nucleus_bounds(logits, 1.0, 0.5, torch.zeros(1))
    assert allowed.tolist() == core.tolist() == nucleus_mask(logits, 1.0, 0.5).tolist()
    assert allowed.tolist() == [[True, False, False]]
    # top_p = 1: every token, whatever the spread
    allowed, core = nucleus_bounds(logits, 1.0, 1.0, torch.full((1,), 3.0))
    assert allowed.all() and core.all()


def test_sampling_result_reports_gaps_in_units_of_the_sampling_temperature():
    c = SamplingCheck()
    logits = torch.tensor([[4.0, 3.0, -2.0, 0.0]] * 3)
    scores = logits.double() / 0.5 + gumbel_noise_rows([7] * 3, [0, 1, 2], 4)
    best = scores.argmax(dim=-1)
    exact = check_sampling(logits, best, 7, temperature=0.5, check=c)
    assert exact.passed and exact.max_gap == 0.0 and exact.max_units == 0.0 and exact.flips == 0
    runner_up = scores.topk(2, dim=-1).indices[:, 1]
    tokens = torch.cat([best[:2], runner_up[2:]])  # the last position takes the runner-up
    r = check_sampling(logits, tokens, 7, temperature=0.5, check=c)
    gap = float(scores[2, best[2]] - scores[2, runner_up[2]])
    assert r.max_gap == pytest.approx(gap)
    assert r.max_units == pytest.approx(gap / float(c.unit(logits, 0.5)[2]))
    assert r.flips == 1 and r.positions == 3
    # the honest-noise model of SPEC §18.1: E[S] <= q σ²/4, Var[S] <= q κ σ²/6
    assert r.expected == pytest.approx(r.near_ties * c.noise_rms**2 / 4)
    assert r.variance == pytest.approx(r.near_ties * c.noise_max * c.noise_rms**2 / 6)
    outside = check_sampling(logits, torch.tensor([0, 4, 1]), 7, temperature=0.5)
    assert outside.passed is False and outside.bad_positions == [1]


def test_a_chunk_with_an_entry_at_flat_index_p_is_proven():
    # the top-2 entries of a 65536-entry chunk at flat indices 0 and P = 65497: mod P they
    # collide, so the proof must use a smaller modulus
    chunk = torch.zeros(2, 32768)
    chunk.view(-1)[0], chunk.view(-1)[P] = 5.0, -7.0
    proofs = build_proofs([chunk], topk=2)
    assert struct.unpack(">H", proofs[0][:2])[0] < P
    assert verify_proofs([chunk], proofs, topk=2, thresholds=STRICT_FP32)[0].passed


def test_verify_refuses_a_key_or_signature_of_the_wrong_length():
    sig = KEY.sign(b"m")
    assert verify(KEY.public_bytes, sig, b"m")
    assert not verify(KEY.public_bytes, sig[:-1], b"m")
    assert not verify(KEY.public_bytes[:-1], sig, b"m")
    assert not verify(KEY.public_bytes, sig + b"\x00", b"m")


def test_noise_rows_need_one_position_per_seed():
    with pytest.raises(ValueError, match="zip"):
        gumbel_noise_rows([1, 2], [0], 8)


def bf16_bits(x: float) -> int:
    return int(torch.tensor(x).to(torch.bfloat16).view(torch.int16).item()) & 0xFFFF


def line_through(p1, p2, m):
    """Proof bytes of k = 2 by hand: the line through two points over GF(P)."""
    (x1, y1), (x2, y2) = p1, p2
    c1 = (y2 - y1) * pow(x2 - x1, P - 2, P) % P
    c0 = (y1 - c1 * x1) % P
    return struct.pack(">3H", m, c0, c1)


def test_top_k_of_chunks_past_2_16_entries_uses_wide_keys():
    # 80,000 entries (padded to 2^17): the two largest at flat indices 3 and 70,000
    chunk = torch.full((2, 40_000), 0.25)
    chunk.view(-1)[3], chunk.view(-1)[70_000] = 5.0, -7.0
    [proof] = build_proofs([chunk], topk=2)
    assert proof == line_through((3, bf16_bits(5.0)), (70_000 % P, bf16_bits(-7.0)), P)


def test_top_1_picks_the_largest_magnitude_of_any_exponent():
    # magnitudes of 2.0 and above have the top bit of the 15-bit key set
    chunk = torch.tensor([[0.5, -3.0, 1.0, 2.5]])
    [proof] = build_proofs([chunk], topk=1)
    assert proof == struct.pack(">2H", P, bf16_bits(-3.0))
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        build_proofs([chunk], chunk_size=0)


def test_a_stop_ending_is_judged_under_the_profiles_eos_threshold():
    [claim], [(acts, logits)] = synthetic_batch(1, 0.0, GPU_BF16.sampling)
    stop = replace(claim, finish_reason="stop", max_new_tokens=len(claim.tokens) + 1)
    eos = claim.tokens[-1]  # the sampled last token plays EOS
    assert check_rollout(stop, acts, logits, eos_token_id=eos, config=GPU_BF16).termination_ok
    demanding = replace(GPU_BF16, sampling=SamplingCheck(min_eos_prob=0.999), name="demanding")
    verdict = check_rollout(stop, acts, logits, eos_token_id=eos, config=demanding)
    assert not verdict.termination_ok and verdict.reason == "termination"


def test_a_stop_endings_eos_is_judged_at_the_position_that_drew_it():
    """The EOS probability is read from the logits of the last position, not another."""
    [claim], [(acts, logits)] = synthetic_batch(1, 0.0, GPU_BF16.sampling)
    stop = replace(claim, finish_reason="stop", max_new_tokens=len(claim.tokens) + 1)
    eos = claim.tokens[-1]  # the sampled last token plays EOS
    before = logits.clone()
    before[-2, eos] = -1e4  # EOS impossible one position earlier: no matter
    assert check_rollout(stop, acts, before, eos_token_id=eos, config=GPU_BF16).termination_ok
    last = logits.clone()
    last[-1, eos] = -1e4  # impossible where it was drawn: implausible
    verdict = check_rollout(stop, acts, last, eos_token_id=eos, config=GPU_BF16)
    assert not verdict.termination_ok


def test_the_boundary_bound_and_the_top_k_selection_stay_on_their_inputs_device():
    """The meta device stands in for a GPU: nothing comes back on (or mixes in) the CPU."""
    from crypto.sampling import _boundary_rate
    from crypto.toploc import _select

    ell = torch.zeros(3, 5, device="meta")
    assert _boundary_rate(ell, 1.0, 1.0, [], ell, SamplingCheck()).device == ell.device
    chunks = [torch.zeros(4, 8, device="meta") for _ in range(2)]
    idx, picked = _select(chunks, [0, 1], 32, 4)
    assert idx.device == picked.device == chunks[0].device
    assert idx.shape == picked.shape == (2, 4)
