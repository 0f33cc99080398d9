"""The cheating matrix through real processes and the served development chain (issue 28).

One devnet (``tests/helpers/matrix.py``): two honest workers and four cheating ones, each
cheater cycling through a few cheats of the catalogue (``tests/helpers/cheating/``, SPEC
§19.1) one batch each, a trainer and a validator. Every cheating batch gets one verdict: a
reject on-chain with the reason the catalogue gives; at settlement exactly its collateral
is taken from the cheater's stake; the trainer never trains on it; and every honest batch in
the same run (the honest workers', and a version cheater's before there is a version to
lie about) is accepted, and nothing of an honest worker is slashed."""

from collections import Counter

import pytest

from ledger.codes import REASON_NAMES
from tests.helpers.cheating.catalogue import CATALOGUE
from tests.helpers.matrix import CHAIN_ARGS, CHEATERS, HONEST, MatrixBooks, run_matrix
from tests.helpers.net import counter, metrics
from tests.test_loop import Loop


def test_the_run_covers_every_cheat_of_the_catalogue():
    assert {c for spec in CHEATERS.values() for c in spec.split(",")} == set(CATALOGUE)


def test_the_books_name_each_cheat_that_was_not_rejected_for_its_reason():
    w = "0x" + "ab" * 20
    subs = [(w, bytes([n]) * 32) for n in range(3)]
    books = MatrixBooks(
        made=dict(zip(subs, ("foreign_proofs", "foreign_proofs", "withhold"), strict=True)),
        worker_of={w: "c"},
        status=dict(zip(subs, ("rejected", "accepted", "rejected"), strict=True)),
        reason=dict(zip(subs, ("invalid", None, "invalid"), strict=True)),
        verdicts=dict.fromkeys(subs, 1),
        slashed={},
        collateral=dict.fromkeys(subs, 1),
        consumed=set(),
    )
    assert books.per_attack()["foreign_proofs"]["detected"] == 1
    assert books.misses("foreign_proofs") == [("01" * 8, "accepted", None)]
    assert books.misses("withhold") == [("02" * 8, "rejected", "invalid")]  # not unavailable


# Not behind the slow marker since version cheats are made only beyond what verification
# can tell apart (an older_version batch one devnet step from the claimed version was once
# accepted: SPEC §19.1's bound); passed twice in a row on this code before it joined CI.
@pytest.mark.timeout(2700)  # a hang guard: ~30 min measured at load 35-45 on 2 cores
@pytest.mark.slow
def test_every_cheat_is_rejected_for_its_reason_and_slashed_and_no_honest_work_is(
    tmp_path, tiny_model_dir
):
    loop = Loop(tmp_path, tiny_model_dir, chain_args=CHAIN_ARGS)
    try:
        books = run_matrix(loop)
        own_counts_and_metrics_agree_with_the_chain(loop, books)
    finally:
        loop.close()
    assert books.made and all(n == 1 for n in books.verdicts.values()), books.verdicts
    assert books.judged_by_validator == len(books.made)
    attacks = books.per_attack()
    assert set(attacks) == set(CATALOGUE), attacks
    for cheat, row in attacks.items():
        assert row["trials"] >= 1, cheat
        assert row["detected"] == row["trials"], (cheat, row, books.misses(cheat))
        assert row["slashed"] == row["trials"], (cheat, row)
        assert row["trained"] == 0, (cheat, row)
    for sub in books.honest():
        assert books.status[sub] == "accepted" and not books.slashed.get(sub), sub
    assert books.honest_false_slashes() == 0
    assert books.consumed, "the trainer trained on nothing"
    assert all(books.made.get(s) == "none" for s in books.consumed), books.consumed
    for name in HONEST:
        assert books.stake_lost[name] == 0, name
        address = next(a for a, n in books.worker_of.items() if n == name)
        assert any(w == address for w, _ in books.honest()), name
    for name in CHEATERS:  # each cheater lost exactly the collateral of its rejected work
        address = next(a for a, n in books.worker_of.items() if n == name)
        owed = sum(
            books.collateral[s] for s, c in books.made.items() if s[0] == address and c != "none"
        )
        assert owed > 0 and books.stake_lost[name] == owed, name


def own_counts_and_metrics_agree_with_the_chain(loop: Loop, books: MatrixBooks) -> None:
    """Each node's own counts are the chain's; /metrics times each verdict and each
    generated batch; honest work earned rewards (claimable or maturing) after settlement."""
    client = loop.client()
    for address, name in books.worker_of.items():
        own = loop.section(name, "inference")
        mine = [s for s in books.made if s[0] == address]
        assert own["submitted"] == len(mine), name
        for outcome in ("accepted", "rejected"):
            assert own[outcome] == sum(books.status[s] == outcome for s in mine), (name, outcome)
    v = loop.section("validator", "validator")
    assert v["accepted"] == sum(s == "accepted" for s in books.status.values())
    by_reason = Counter(r for r in books.reason.values() if r is not None)
    assert {r: n for r, n in v["rejected_by_reason"].items() if n} == dict(by_reason)
    assert set(by_reason) <= set(REASON_NAMES.values())
    assert v["fetch_failures"] >= 1  # the withheld batch: asked for, never served
    for name, section, figure, histogram in (
        ("validator", "validator", "judged", "intellect_verdict_latency_seconds_count"),
        ("honest-0", "inference", "generated", "intellect_generation_tokens_per_second_count"),
    ):
        before = loop.section(name, section)[figure]
        observed = counter(metrics(loop.nodes[name]), histogram)
        assert 1 <= before <= observed <= loop.section(name, section)[figure], (name, observed)
    for name in HONEST:
        address = loop.addresses[name]
        assert client.claimable(address) + client.matured(address) > 0, name
