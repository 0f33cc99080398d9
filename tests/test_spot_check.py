"""The spot check's draw (``node/roles/decisions/spotcheck.py``, SPEC §18): every validator of
a submission recomputes the same rollouts, drawn from a seed its worker could not know while
it generated the batch (the submission's block hash), so one faked rollout cannot split
honest validators."""

import dataclasses

import pytest

from node.roles.decisions.spotcheck import (
    spot_check_count,
    spot_check_sample,
    spot_check_seed,
)
from node.roles.io.chain import _submission

KEY = bytes(range(32))
BLOCK = bytes(range(100, 132))


def test_two_validators_of_one_submission_draw_the_same_rollouts():
    seed = spot_check_seed(KEY, BLOCK)
    assert spot_check_sample(0.25, 40, seed) == spot_check_sample(0.25, 40, bytes(seed))
    assert spot_check_seed(KEY, BLOCK) == seed  # nothing of the validator's own goes in


def test_the_draw_follows_the_block_hash_and_the_key():
    """The worker knows its work key when it generates; the block hash it cannot know: over
    blocks, every rollout gets drawn sometime, and the seed changes with either input."""
    seeds = {spot_check_seed(KEY, BLOCK[:-1] + bytes([b])) for b in range(64)}
    assert len(seeds) == 64
    assert spot_check_seed(bytes(32), BLOCK) != spot_check_seed(KEY, BLOCK)
    drawn = [spot_check_sample(0.25, 8, seed) for seed in seeds]
    assert {i for d in drawn for i in d} == set(range(8))
    assert len({tuple(d) for d in drawn}) > 10  # C(8, 2) = 28 possible draws


def test_the_seed_is_domain_separated_and_length_prefixed():
    # the key and block hash are not simply concatenated: moving bytes between them changes it
    assert spot_check_seed(KEY + BLOCK[:1], BLOCK[1:]) != spot_check_seed(KEY, BLOCK)


@pytest.mark.parametrize(
    ("share", "n", "count"),
    [(1.0, 7, 7), (0.5, 4, 2), (0.25, 4, 1), (0.01, 4, 1), (0.5, 5, 3), (0.3, 10, 3), (0.5, 0, 0)],
)
def test_how_many_rollouts_are_recomputed(share, n, count):
    assert spot_check_count(share, n) == count
    drawn = spot_check_sample(share, n, spot_check_seed(KEY, BLOCK))
    assert len(drawn) == count and drawn == sorted(set(drawn))
    assert all(0 <= i < n for i in drawn)


def test_the_draw_is_pinned_for_a_second_implementation():
    """SPEC §18's rule worked once, by hand for another implementation to match: the seed is
    BLAKE2b-256 of the length-prefixed domain, key and block hash; the draw, the indices
    with the lowest BLAKE2b-256(seed ‖ u32 i)."""
    seed = spot_check_seed(KEY, BLOCK)
    assert seed.hex() == "af6e76796278e36a09c1db5f3c2c0d48d09f44c41da82b2ce8a8c37d5538a105"
    assert spot_check_sample(0.25, 12, seed) == [2, 5, 11]


def test_the_validator_reads_the_block_hash_of_each_submission():
    event = {
        "args": {"worker": "0xAB" + "00" * 19, "key": KEY, "units": 9, "policy_version": 2},
        "blockNumber": 17,
        "blockHash": BLOCK,
    }
    sub = _submission(event)  # type: ignore[arg-type]
    assert sub.block == 17 and sub.block_hash == BLOCK
    assert dataclasses.replace(sub, block_hash=b"").block_hash == b""
