"""A restarted validator far behind the window (issue #28): work submitted while it was down
is judged in the window it was submitted in (the chain's record of the policy version then),
never in today's, and work it already voted on is not judged again."""

from types import SimpleNamespace

from node.roles.decisions.clock import StepClock
from node.roles.io.catchup import History, read_history

TRAINER = "trainer-peer"


def clock_at(step: int, version: int, async_level: int = 2) -> StepClock:
    c = StepClock(TRAINER, async_level)
    c.step, c.policy_version = step, version
    return c


def history() -> History:
    # versions 1, 2, ... 9 set in blocks 10, 20, ... 90
    return History(upto=95, blocks=[10 * v for v in range(1, 10)], versions=list(range(1, 10)))


def test_the_version_in_force_before_a_block():
    h = history()
    assert h.version_before(5) == 0  # before any was set
    assert h.version_before(10) == 0  # set in the same block: the submission may precede it
    assert h.version_before(11) == 1
    assert h.version_before(95) == 9
    assert h.clock_at(35) == (3, 3)
    assert h.covers(95) and not h.covers(96)


def test_old_honest_work_is_judged_in_its_own_window_not_todays():
    """Step 3 made with version 2, submitted in block 35 (version 3 in force): inside the
    window then. Judged at step 9 against today's clock it would be rejected."""
    now = clock_at(9, 9)
    assert now.window(3, 2, history().clock_at(35)) is None
    assert now.window(3, 2, None) is not None  # what the clock now says: stale
    assert now.window(3, 2, (None, 0)) is not None  # a clock unknown then: the same


def test_old_stale_work_is_still_rejected():
    """Step 0 made with version 0, submitted in block 45 (version 4): outside the window then
    (a replay of an old batch), and so still rejected."""
    now = clock_at(9, 9)
    why = now.window(0, 0, history().clock_at(45))
    assert why is not None and "older" in why


def test_read_history_keeps_versions_and_only_this_validators_votes(monkeypatch):
    me, other, worker = "0x" + "11" * 20, "0x" + "22" * 20, "0x" + "aa" * 20
    events = [
        {"event": "PolicyVersion", "blockNumber": 5, "args": {"version": 1}},
        {
            "event": "WorkAccepted",
            "blockNumber": 6,
            "args": {
                "validator": me.upper().replace("0X", "0x"),
                "worker": worker,
                "key": b"\x01" * 32,
            },
        },
        {
            "event": "WorkRejected",
            "blockNumber": 7,
            "args": {"validator": other, "worker": worker, "key": b"\x02" * 32},
        },
        {"event": "PolicyVersion", "blockNumber": 8, "args": {"version": 2}},
    ]
    seen = {}

    def fake_read(client, names, span):
        seen.update(names=names, span=span)
        return events

    monkeypatch.setattr("node.roles.io.catchup.read_events", fake_read)
    client = SimpleNamespace(head=lambda: 9)  # the chain's head; its events: fake_read
    h = read_history(client, me, 3)
    assert seen["span"] == {"from_block": 3, "to_block": 9}
    assert set(seen["names"]) == {"PolicyVersion", "WorkAccepted", "WorkRejected"}
    assert (h.upto, h.blocks, h.versions) == (9, [5, 8], [1, 2])
    assert h.voted == {(worker, b"\x01" * 32)}
    assert read_history(client, me, 10).upto == 9  # nothing to read: the head is behind
