"""Which rollouts a validator recomputes when the run's ``spot_check`` share is below 1
(SPEC §18, "Spot checks"): the same rollouts for every validator of a submission, so that one
faked rollout cannot make honest validators disagree (one draws it and rejects with a bond,
the others miss it and overturn that reject), and none its worker could know while it
generated the batch: the draw is seeded by the work key and the hash of the block that
recorded the submission.

Pure: no chain, no clock. The validator reads the block hash from the ``WorkSubmitted``
event it judges (``node/roles/io/chain.py``).
"""

from __future__ import annotations

import math

from crypto.hashing import digest, digest_parts

DOMAIN = b"intellect/spot-check/1"


def spot_check_seed(key: bytes, block_hash: bytes) -> bytes:
    """The draw's seed: BLAKE2b-256 of the domain, the work key and the submission's block
    hash, each length-prefixed (``digest_parts``)."""
    return digest_parts(DOMAIN, key, block_hash)


def spot_check_count(share: float, n: int) -> int:
    """How many of ``n`` rollouts are recomputed: all at ``share`` >= 1, else
    ``max(1, floor(share × n + 1/2))``."""
    if share >= 1 or n == 0:
        return n
    return min(n, max(1, math.floor(share * n + 0.5)))


def spot_check_sample(share: float, n: int, seed: bytes) -> list[int]:
    """The indices (in batch order: group by group, sample by sample) of the rollouts to
    recompute: the ``spot_check_count`` with the lowest BLAKE2b-256 of ``seed`` followed by
    the index as a u32 big-endian, returned in ascending order."""
    count = spot_check_count(share, n)
    if count == n:
        return list(range(n))
    ranked = sorted(range(n), key=lambda i: digest(seed + i.to_bytes(4, "big")))
    return sorted(ranked[:count])
