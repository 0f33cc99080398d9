"""Faults with exact books (issue #28, item 2): the reconciliation of a run's books
(``tests/helpers/books.py``) on hand-made books, each protection broken on its own; and a
short chaos run of real processes (``bench/chaos.py``): a worker, the validator, the
trainer and the bootstrap killed and frozen, and the served chain restarted from its saved
state, at seeded random moments, after which the books still add up."""

import copy

import pytest

from tests.helpers.books import Books, Outage, Stored, Vote, Work, figures, reconcile

A, B, V = "0x" + "aa" * 20, "0x" + "bb" * 20, "0x" + "99" * 20
T0 = 1_000_000.0


def k(worker: str, n: int) -> tuple[str, bytes]:
    return (worker, bytes([n]) * 32)


def text(key) -> str:
    return f"{key[0]}:{key[1].hex()}"


def clean() -> Books:
    """Two workers, five batches, all accepted and in their stores: four trained on in
    steps 0-2, one accepted after the trainer's last choice."""
    keys = [k(A, 1), k(B, 2), k(A, 3), k(B, 4), k(A, 5)]
    versions = [0, 0, 1, 2, 3]
    submitted = {
        key: Work(24, v, 10 + i) for i, (key, v) in enumerate(zip(keys, versions, strict=True))
    }
    votes = {
        key: [Vote(V, True, "accepted", T0 + 10 * i)] for i, key in enumerate(keys)
    }  # each accepted 10 s after the last
    stored = {A: {}, B: {}}
    for key, v in zip(keys, versions, strict=True):
        stored[key[0]][key[1]] = Stored(v, v, 24)
    lines = [
        {"step": 0, "used": [], "time": T0, "seconds": 0.0},
        {"step": 1, "used": [text(keys[0]), text(keys[1])], "time": T0 + 12, "seconds": 12.0},
        {"step": 2, "used": [text(keys[2])], "time": T0 + 25, "seconds": 5.0},
        {"step": 3, "used": [text(keys[3])], "time": T0 + 35, "seconds": 5.0},
    ]
    return Books(
        async_level=2,
        honest={A, B},
        names={A: "worker-0", B: "worker-1"},
        submitted=submitted,
        votes=votes,
        status=dict.fromkeys(keys, "accepted"),
        slashed={A: 0, B: 0},
        stored=stored,
        lines=lines,
        state={"step": 3, "batches_used": 4, "consumed": {text(x): 0 for x in keys[:4]}},
        exits={"trainer": 0, "validator": 0, "worker-0": 0, "worker-1": 0, "bootstrap": 0},
    )


def test_the_books_of_a_clean_run_add_up():
    books = clean()
    assert reconcile(books) == []
    f = figures(books)
    assert (f["submitted"], f["accepted"], f["trained_on"], f["steps"]) == (5, 5, 4, 3)
    assert f["lost_work"] == f["double_counted_work"] == f["honest_false_slashes"] == 0


def broken(change) -> list[str]:
    books = copy.deepcopy(clean())
    change(books)
    return reconcile(books)


def test_a_batch_trained_on_twice_is_caught():
    """What a restarted trainer that forgot what it consumed would do."""

    def retrain(b):
        b.lines[3]["used"].append(b.lines[1]["used"][0])
        b.state["batches_used"] = 5

    (line,) = broken(retrain)
    assert "trained on 2 times" in line


def test_a_pending_or_unjudged_or_doubly_judged_batch_is_caught():
    def pending(b):
        b.status[k(A, 5)] = "pending"
        b.votes.pop(k(A, 5))

    assert [x for x in broken(pending) if "no final verdict" in x or "no validator" in x]
    assert any(
        "voted 2 times" in x for x in broken(lambda b: b.votes[k(A, 5)].append(b.votes[k(A, 5)][0]))
    )
    ghost = k(B, 9)
    assert any(
        "never submitted" in x
        for x in broken(lambda b: b.votes.setdefault(ghost, [Vote(V, True, "accepted", T0)]))
    )


def test_a_rejected_or_out_of_window_batch_trained_on_is_caught():
    def rejected(b):
        b.status[k(A, 3)] = "rejected"
        b.votes[k(A, 3)] = [Vote(V, False, "rejected", T0 + 20)]

    assert any("not accepted" in x for x in broken(rejected))

    def stale(b):  # version 0 trained on at step 2, with a window of 1
        b.async_level = 1
        b.lines[1]["used"] = [text(k(B, 2))]
        b.lines[3]["used"].append(text(k(A, 1)))

    assert any("outside the async window" in x for x in broken(stale))


def test_an_accepted_batch_left_unused_while_it_was_usable_is_caught():
    """A restarted trainer that forgot an accepted batch: it was available 20 s before step
    2 began (accepted at T0 + 10) and in its window, and no step took it."""

    def forgot(b):
        b.lines[1]["used"] = [text(k(A, 1))]
        b.state["batches_used"] = 3
        del b.state["consumed"][text(k(B, 2))]

    (line,) = broken(forgot)
    assert "never trained on" in line and text(k(B, 2)) in line
    # unless its worker (or the trainer, or the bootstrap) was down until shortly before
    books = copy.deepcopy(clean())
    forgot(books)
    books.outages = [Outage("worker-1", "sigkill_worker", T0 + 5, T0 + 30)]
    assert reconcile(books) == []
    books.outages = [Outage("worker-0", "sigkill_worker", T0 + 5, T0 + 30)]  # another worker
    assert reconcile(books) != []
    books.outages = [Outage("chain", "restart_chain", T0 + 5, T0 + 30)]  # no chain: no step
    assert reconcile(books) == []


def test_a_submitted_batch_missing_from_its_store_or_differing_is_caught():
    assert any(
        "not in its worker's store" in x for x in broken(lambda b: b.stored[A].pop(bytes([3]) * 32))
    )
    assert any(
        "on-chain 24 units" in x
        for x in broken(lambda b: b.stored[A].__setitem__(bytes([3]) * 32, Stored(1, 1, 23)))
    )


def test_an_honest_reject_or_slash_is_caught():
    def rejected(b):
        b.votes[k(A, 5)] = [Vote(V, False, "rejected", T0 + 40)]
        b.status[k(A, 5)] = "rejected"

    assert any("honest worker's batch got a reject" in x for x in broken(rejected))
    assert broken(lambda b: b.slashed.__setitem__(B, 1)) == [f"{B}: honest, slashed 1 times"]
    books = copy.deepcopy(clean())
    books.honest = {B}
    rejected(books)
    assert reconcile(books) == []  # a cheater's reject is no violation


def test_a_node_that_hangs_or_fails_on_sigterm_is_caught():
    assert broken(lambda b: b.exits.__setitem__("validator", None)) == [
        "validator: did not exit on SIGTERM in time"
    ]
    assert broken(lambda b: b.exits.__setitem__("trainer", 1)) == ["trainer: exited 1"]


def test_trainer_state_that_disagrees_with_its_metrics_is_caught():
    assert any(
        "trainer-state.json step" in x for x in broken(lambda b: b.state.__setitem__("step", 2))
    )
    assert any(
        "not 0..4 once each" in x for x in broken(lambda b: b.lines.append(dict(b.lines[3])))
    )


# ---- one real run ------------------------------------------------------------------------


# In the default run: it passed twice in a row on this code (bench/chaos.py seed 7 in
# 1,225 s, then this test in 721 s, at load 30-50 on 2 cores shared with other runs; most
# of it nodes starting). The deadline is generous: it only catches a hang.
@pytest.mark.timeout(2400)
@pytest.mark.slow
def test_a_chaos_run_keeps_exact_books(tmp_path, tiny_model_dir):
    from bench.chaos import KINDS, run

    out = run(7, steps=3, workers=2, base=tmp_path, model=tiny_model_dir, timeout=600)
    assert out["faults"] == dict.fromkeys(KINDS, 1), out["faults"]
    assert out["violations"] == [], out["violations"]
    assert out["steps"] == 3 and out["trained_on"] >= 3 and out["accepted"] >= out["trained_on"]
    assert out["lost_work"] == out["double_counted_work"] == out["honest_false_slashes"] == 0
    assert set(out["exits"].values()) == {0}, out["exits"]
