"""Issue #54's splits through real processes: honest validators cannot be split.

A run of real node processes on the served development chain (``tests/test_loop.py``'s
``Loop``): a trainer, three validators, an honest worker and two cheating ones
(``tests/helpers/cheating/``, its ``SPLITS``), one for each split, in one run (one start-up
of the network for both). A cheater's batch is honest work; what it plays with is whom it
serves when:

- ``rotate_split``: it submits the batch, rotates its registered peer key on-chain, serves
  the first validator that asks, waits for its vote, rotates back and serves the others. A
  validator that judged against the registration as it stands when it judges rejected it
  (bonded); the others accepted and overturned it, and its bond burned. Every validator
  judges against the registration as of the submission's block
  (``Registrations.get(worker, block)``, ``node/roles/io/chain.py``).
- ``ahead_split``: it makes the next step's batch before the trainer announces that step,
  serves it to the first validator that asks at once and to the others once the step is
  announced. A validator that rejected a batch ahead of its clock (bonded ``invalid``) was
  overturned the same way; now it judges it again later (``Later``,
  ``node/roles/services/validator.py``).

The test asserts, for each cheater, that the split was really tried (the chain and the validators' logs say
so), that all three validators reached the same verdict on the batch (accepted: it is
honest work), that no validator's bond was burned or its stake touched, and that the
contract's books are exact: its balance is the unreserved pool, the rewards reserved for
unrejected work and every account's stake, and the pool lost only those rewards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from node.cli.devnet import wait_ready
from tests.helpers.net import wait_until
from tests.test_loop import Loop, submissions

VALIDATORS = ("validator", "validator-1", "validator-2")
CHEATS = {"rotator": "rotate_split", "ahead": "ahead_split"}
WORKERS = ("honest", *CHEATS)


@dataclass(frozen=True)
class Start:
    """The contract before any worker came: its unreserved pool and what it burned."""

    pool: int
    burned: int
    bond: int


def start_run(loop: Loop) -> Start:
    client = loop.client()
    start = Start(client.reward_pool(), client.total_burned(), loop.chain_info["validator_bond"])
    loop.spawn("trainer", "trainer")
    for i in range(len(VALIDATORS)):
        loop.validator(i)
    loop.worker("honest")
    for name, cheat in CHEATS.items():
        loop.worker(name, cheat)
    for node in loop.nodes.values():
        wait_ready(node, timeout=180)
    return start


def the_split(loop: Loop, cheater: str, done: str) -> tuple[bytes, dict[str, Any]]:
    """A cheater's split key and its record, once the split is over (``done`` in it)."""

    def over():
        splits = (loop.section(cheater, "cheating") or {}).get("splits", {})
        return [(k, s) for k, s in splits.items() if s["phase"] == "all" and done in s["done"]]

    ((key, split),) = wait_until(over, 900, f"{cheater}'s split ({done})", interval=2)
    return bytes.fromhex(key), split


def verdicts_on(loop: Loop, worker: str, key: bytes) -> dict[str, list[str]]:
    """Each validator's own verdicts posted on ``key`` (its ``/status`` ``recent``; a vote
    the chain refused because the same verdict stands counts as posted)."""
    out = {}
    for name in VALIDATORS:
        recent = (loop.section(name, "validator") or {}).get("recent", [])
        out[name] = [
            r["verdict"] for r in recent if r["worker"] == worker and r["key"] == key.hex()[:16]
        ]
    return out


def peer_name(loop: Loop, peer: str | None) -> str:
    (name,) = [n for n in VALIDATORS if (loop.nodes[n].status() or {}).get("peer_id") == peer]
    return name


def votes_on(client: Any, key: bytes) -> list[tuple[int, str, str]]:
    """(block, event, validator) of every vote on ``key``, in chain order."""
    out = []
    for name in ("WorkAccepted", "WorkRejected"):
        for e in getattr(client.contract.events, name).get_logs(from_block=0):
            if bytes(e["args"]["key"]) == key:
                out.append((int(e["blockNumber"]), name, str(e["args"]["validator"]).lower()))
    return sorted(out)


def one_verdict(loop: Loop, cheater: str, key: bytes) -> None:
    """All three validators accepted the cheater's ``key``, with one vote on the chain."""
    client = loop.client()
    address = loop.addresses[cheater]
    wait_until(
        lambda: all(verdicts_on(loop, address, key).values()),
        300,
        f"a verdict on {cheater}'s split batch from every validator",
        interval=2,
    )
    assert verdicts_on(loop, address, key) == {n: ["accepted"] for n in VALIDATORS}
    sub = client.submission(address, key)
    assert sub.status == "accepted" and sub.reject_votes == 0, sub
    assert [e for _, e, _ in votes_on(client, key)] == ["WorkAccepted"]


def no_bond_burned_and_exact_books(loop: Loop, start: Start) -> None:
    """No validator's bond burned or stake touched, nothing overturned; the books add up."""
    client = loop.client()
    assert not client.contract.events.RejectOverturned.get_logs(from_block=0)
    for address in loop.chain_info["validator_addresses"]:
        v = client.worker(address)
        assert (v.stake, v.locked, v.slashed) == (start.bond, 0, 0), (address, v)
    assert client.total_burned() == start.burned
    # the books: nothing was settled, claimed or withdrawn in the run, so the contract holds
    # the unreserved pool, the rewards reserved for work not rejected, and every stake; read
    # between two submissions (the workers go on submitting: one landing between the reads
    # took its reward from the pool but was not in the sum)
    accounts = [*loop.chain_info["validator_addresses"], *(loop.addresses[w] for w in WORKERS)]

    def books() -> tuple[int, int, int, int] | None:
        seen = submissions(client)
        reserved = sum(
            s.reward for s in (client.submission(w, k) for w, k in seen) if s.status != "rejected"
        )
        pool = client.reward_pool()
        staked = sum(client.worker(a).stake + client.worker(a).unbonding for a in accounts)
        balance = client.w3.eth.get_balance(client.contract.address)
        return (pool, reserved, staked, balance) if submissions(client) == seen else None

    pool, reserved, staked, balance = wait_until(books, 120, "a read between submissions")
    assert pool + reserved == start.pool
    assert balance == pool + reserved + staked


def rotated_around_the_first_vote(loop: Loop, key: bytes, split: dict[str, Any]) -> None:
    """The rotation split was real: the first validator voted while the other key was
    registered."""
    client = loop.client()
    first = loop.addresses[peer_name(loop, split["first"])].lower()
    rotator = loop.addresses["rotator"]
    rotations = [
        int(e["blockNumber"])
        for e in client.contract.events.PeerKeyChanged.get_logs(from_block=0)
        if str(e["args"]["worker"]).lower() == rotator
    ]
    submitted = next(
        int(e["blockNumber"])
        for e in client.contract.events.WorkSubmitted.get_logs(from_block=0)
        if bytes(e["args"]["key"]) == key
    )
    ((voted, _, voter),) = votes_on(client, key)
    assert voter == first and len(rotations) == 2, (voter, first, rotations)
    assert submitted < rotations[0] < voted < rotations[1], (submitted, rotations, voted)


@pytest.mark.timeout(2400)  # a hang guard: each split alone took 6 min at load 10, 10+ at 18
@pytest.mark.slow
def test_workers_rotating_keys_or_serving_a_step_ahead_cannot_split_validators(
    tmp_path, tiny_model_dir
):
    # a step lasts at least step_wait: time for the first validator to fetch the next
    # step's batch before the trainer announces that step
    loop = Loop(tmp_path, tiny_model_dir, step_wait=30)
    try:
        start = start_run(loop)
        # rotation: submitted, rotated, served to the first validator, rotated back
        key, split = the_split(loop, "rotator", "rotated back")
        assert split["done"] == ["rotated", "served the first", "rotated back"], split
        one_verdict(loop, "rotator", key)
        rotated_around_the_first_vote(loop, key, split)
        # step ahead: served to the first validator before the trainer announced its step
        key, split = the_split(loop, "ahead", "step announced")
        assert split["done"] == ["served the first", "step announced"], split
        one_verdict(loop, "ahead", key)
        log = loop.nodes[peer_name(loop, split["first"])].log_path.read_text()
        assert "is ahead of the trainer's" in log, log[-3000:]
        no_bond_burned_and_exact_books(loop, start)
    finally:
        loop.close()
