"""DiLoCo groups as real processes on 127.0.0.1 (``tests/helpers/diloco_member.py``).

One cluster, to keep the suite's cost down: a leader and two members train the tiny model;
after outer steps 1 and 2 all three hold bitwise-identical parameters (hash); during step 3's
all-reduce one member is killed with SIGKILL and the other two complete the step without it
(a retry with the survivors), again identical. Then a fourth member joins: knowing only
member 1's address, it finds the group (the leader) through the DHT provider records of
``group_key``, and recovers the leader's whole state at that boundary over SHARDCAST (a
manifest the leader signed, verified shards; its hash equals the donor's, and both its
model and its outer copy hold the donor's θ) and trains on with the
group, identical after every step, until it leaves the group (its node stays up): the next
step goes on without it at once, not after the sync timeout. An outsider that the leader did not admit is refused
both a ring chunk and a place in the roster. A fourth starting member cheats in step 2: it
sends its pseudo-gradient × 1000 while declaring its true norm; its right neighbour finds
the chunk above the declared norms, the leader refuses the cheater for the step (counted),
and the step completes without it.

A second cluster does the same with ``quant = "sparse"`` (the all-gather of SPEC §15): a
leader and a member that stay, a member killed during an all-gather, a cheater whose payload's
positions are out of range, and a joiner that recovers the group's state.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from node.keystore import load_or_create_identity
from tests.helpers.net import wait_until

OUTER_STEPS = 5
KILL_AT = 2  # the outer step (counted from 0) during whose all-reduce a member dies
JOIN_AT = 3  # the boundary at which a fourth member joins
LEAVE_AFTER = 4  # ... and after which it leaves the group (its node stays up)
CHEAT_AT = 1  # the outer step in which a member cheats


def spawn(d: Path, leader: str, *extra: str) -> subprocess.Popen[bytes]:
    d.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "tests.helpers.diloco_member", "--dir", str(d)]
    cmd += ["--leader", leader, *extra]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    with (d / "log").open("wb") as log:  # the child keeps its own descriptor
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


def wait_all(procs: list[subprocess.Popen[bytes]], leader_dir: Path) -> None:
    """Wait for the members in ``procs[1:]`` to end, then tell the leader (``procs[0]``,
    started with ``--hold``) to stop, and wait for it."""
    for p in procs[1:]:
        p.wait(timeout=300)
    (leader_dir / "stop").touch()
    procs[0].wait(timeout=60)


def refusal(d: Path) -> str:
    """Why the member in ``d`` left its group: the refusal it got, else (for the failure's
    message) how it ended instead and the end of its log."""
    if (d / "refused").exists():
        return (d / "refused").read_text()
    crashed = (d / "crashed").read_text() if (d / "crashed").exists() else "no crash recorded"
    return f"not refused; {crashed}\n{(d / 'log').read_text()[-4000:]}"


def steps(d: Path) -> list[dict]:
    path = d / "steps.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.timeout(900)  # process start-up alone takes minutes on a loaded 2-core runner
@pytest.mark.slow
def test_three_members_stay_identical_and_survive_a_kill(tmp_path):
    dirs = [tmp_path / f"m{i}" for i in range(6)]
    for d in dirs:
        d.mkdir()
    ids = [load_or_create_identity(d).peer_id for d in dirs]
    leader = ids[0]
    common = ["--min-members", "4", "--outer-steps", str(OUTER_STEPS), "--inner-steps", "2"]
    procs = []
    try:
        procs.append(
            spawn(
                dirs[0],
                leader,
                *common,
                *("--hold", "--admit", ",".join(ids[i] for i in (1, 2, 4, 5))),
            )
        )
        addr = wait_until(lambda: (dirs[0] / "addr").exists(), 90, "the leader's address")
        addr = (dirs[0] / "addr").read_text()
        boot = ["--bootstrap", addr]
        procs.append(spawn(dirs[1], leader, *common, *boot, "--shard", "1"))
        wait_until(lambda: (dirs[1] / "addr").exists(), 90, "member 1's address")
        # the joiner knows only member 1's address, not the leader's: it finds the group
        # (and the leader's address) in the DHT
        boot1 = ["--bootstrap", (dirs[1] / "addr").read_text()]
        procs.append(
            spawn(dirs[2], leader, *common, *boot, "--shard", "2", "--pause-at", str(KILL_AT))
        )
        procs.append(spawn(dirs[3], leader, *boot, "--outsider"))
        procs.append(spawn(dirs[5], leader, *common, *boot, "--cheat-at", str(CHEAT_AT)))
        procs.append(
            spawn(
                dirs[4],
                leader,
                *common,
                *boot1,
                *("--shard", "4", "--join-at", str(JOIN_AT), "--leave-after", str(LEAVE_AFTER)),
            )
        )
        wait_until(lambda: (dirs[2] / "paused").exists(), 600, "member 2 inside the all-reduce")
        procs[2].send_signal(signal.SIGKILL)
        started = time.monotonic()
        wait_all([procs[i] for i in (0, 1, 3, 4, 5)], dirs[0])
        assert time.monotonic() - started < 290  # no hang: the survivors finished the step
        logs = {d.name: (d / "log").read_text()[-3000:] for d in dirs}
        a, b, killed = steps(dirs[0]), steps(dirs[1]), steps(dirs[2])
        assert len(a) == len(b) == OUTER_STEPS, logs
        assert len(killed) == KILL_AT
        cheater = steps(dirs[5])
        assert [r["step"] for r in cheater] == [CHEAT_AT]  # refused from its cheating step on
        assert "excluded" in (why := refusal(dirs[5])), why
        for i in range(KILL_AT):  # bitwise identical after every outer step
            assert a[i]["hash"] == b[i]["hash"] == killed[i]["hash"]
        assert cheater[0]["hash"] == a[0]["hash"]
        assert sorted(a[0]["members"]) == sorted(ids[i] for i in (0, 1, 2, 5))
        assert a[CHEAT_AT]["members"] == [m for m in a[0]["members"] if m != ids[5]]
        assert a[CHEAT_AT]["attempts"] >= 2  # the cheat spoiled the first attempt
        last_a, last_b = a[KILL_AT], b[KILL_AT]
        assert last_a["hash"] == last_b["hash"]
        survivors = [m for m in a[CHEAT_AT]["members"] if m != ids[2]]
        assert last_a["members"] == last_b["members"] == survivors  # the dead member evicted
        assert last_a["attempts"] >= 2  # the first attempt failed, a retry completed
        assert len({r["hash"] for r in a}) == OUTER_STEPS  # training moved the parameters
        # the joiner: the donor's whole state exactly (θ, momentum, AdamW, step, data
        # position, packed again after loading), then in step with the group
        recovered = json.loads((dirs[4] / "recovered.json").read_text())
        assert recovered["step"] == JOIN_AT
        assert recovered["state"] == a[JOIN_AT - 1]["state"]
        assert leader in recovered["found"]  # the DHT's provider records named the leader
        # pulled over SHARDCAST: a manifest the leader signed, several verified shards
        assert recovered["via"] == "shardcast" and recovered["signer"] == leader
        assert recovered["shards"] >= 2 and recovered["fetched"] >= recovered["shards"]
        assert recovered["model"] == recovered["hash"] == a[JOIN_AT - 1]["hash"]  # both copies
        joined = steps(dirs[4])
        assert [r["step"] for r in joined] == list(range(JOIN_AT + 1, LEAVE_AFTER + 1))
        for r in joined:
            assert r["hash"] == a[r["step"] - 1]["hash"] == b[r["step"] - 1]["hash"]
            assert r["members"] == [*survivors, ids[4]]
        after = a[LEAVE_AFTER]  # the step after the graceful leave
        assert after["members"] == b[LEAVE_AFTER]["members"] == survivors
        assert after["hash"] == b[LEAVE_AFTER]["hash"]
        assert after["reduce_s"] < 35  # not waiting out the 60 s sync timeout
        refused = json.loads((dirs[3] / "outsider.json").read_text())
        assert refused == {"chunk": "not_member", "sync": "not_member"}, logs["m3"]
        status = json.loads((dirs[0] / "status.json").read_text())
        assert status["refused"].get("not_admitted", 0) >= 1
        assert status["evicted"].get(ids[2], 0) >= 1
        assert status["rejected"] == {"chunk": 1}  # the cheater's step, counted once
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


SPARSE_STEPS = 4
SPARSE_CHEAT_AT = 1  # the cheater's payload does not decode in this step
SPARSE_KILL_AT = 2  # a member dies during this step's all-gather
SPARSE_JOIN_AT = 3  # a joiner recovers the group's state at this boundary


@pytest.mark.timeout(900)
@pytest.mark.slow
def test_a_sparse_group_survives_a_kill_a_join_and_refuses_a_cheat(tmp_path):
    """``quant = "sparse"`` between processes (the all-gather of SPEC §15): a leader and a
    member (the pair that stays), a member killed during step 2's all-gather and a cheater
    that, in step 1, serves its own payload with its positions out of range. Its right
    neighbour cannot decode it and blames it; the leader refuses it for the step (counted
    once) and the cheater never finishes the step (the all-gather's closing round: it had
    gathered everyone else's payloads). The killed member's step completes without it. A
    joiner recovers the leader's state over SHARDCAST at step 3's boundary and trains on.
    Every member ends every outer step with the same parameters hash and received exactly
    the other members' payloads."""
    from node.diloco.sparse import Sparse
    from tests.helpers.tiny_lm import tiny_llama

    dirs = [tmp_path / f"m{i}" for i in range(5)]
    for d in dirs:
        d.mkdir()
    ids = [load_or_create_identity(d).peer_id for d in dirs]
    leader = ids[0]
    common = ["--min-members", "4", "--outer-steps", str(SPARSE_STEPS), "--inner-steps", "2"]
    common += ["--encoding", "sparse"]
    procs = []
    try:
        procs.append(spawn(dirs[0], leader, *common, "--hold"))
        wait_until(lambda: (dirs[0] / "addr").exists(), 90, "the leader's address")
        boot = ["--bootstrap", (dirs[0] / "addr").read_text()]
        procs.append(spawn(dirs[1], leader, *common, *boot, "--shard", "1"))
        pause = ["--pause-at", str(SPARSE_KILL_AT)]
        procs.append(spawn(dirs[2], leader, *common, *boot, "--shard", "2", *pause))
        cheat = ["--cheat-at", str(SPARSE_CHEAT_AT), "--cheat-with", "range"]
        procs.append(spawn(dirs[3], leader, *common, *boot, "--shard", "3", *cheat))
        join = ["--shard", "4", "--join-at", str(SPARSE_JOIN_AT)]
        procs.append(spawn(dirs[4], leader, *common, *boot, *join))
        wait_until(lambda: (dirs[2] / "paused").exists(), 600, "member 2 inside the all-gather")
        procs[2].send_signal(signal.SIGKILL)
        wait_all([procs[i] for i in (0, 1, 3, 4)], dirs[0])
        logs = {d.name: (d / "log").read_text()[-3000:] for d in dirs}
        a, b, killed = steps(dirs[0]), steps(dirs[1]), steps(dirs[2])
        cheater, joined = steps(dirs[3]), steps(dirs[4])
        assert len(a) == len(b) == SPARSE_STEPS, logs
        assert len(killed) == SPARSE_KILL_AT
        # refused from its cheating step on, as excluded, without finishing that step
        assert [r["step"] for r in cheater] == [SPARSE_CHEAT_AT], logs["m3"]
        assert "excluded" in (why := refusal(dirs[3])), why
        blamer = "".join((d / "log").read_text() for d in dirs[:3])
        assert "a position past its block" in blamer  # out of range: it did not decode
        assert sorted(a[0]["members"]) == sorted(ids[:4])
        honest = [m for m in a[0]["members"] if m != ids[3]]
        assert a[SPARSE_CHEAT_AT]["members"] == honest
        assert a[SPARSE_CHEAT_AT]["attempts"] >= 2  # the cheat spoiled the first attempt
        pair = [m for m in honest if m != ids[2]]
        assert a[SPARSE_KILL_AT]["members"] == pair  # the dead member evicted
        assert a[SPARSE_KILL_AT]["attempts"] >= 2  # the first attempt failed, a retry completed
        assert a[SPARSE_JOIN_AT]["members"] == [*pair, ids[4]]
        numel = sum(p.numel() for p in tiny_llama(0, layers=1, hidden=32).parameters())
        payload = Sparse().wire_size(numel)
        for i, (ra, rb) in enumerate(zip(a, b, strict=True)):
            assert ra["hash"] == rb["hash"]  # bitwise identical after every outer step
            assert ra["members"] == rb["members"]
            assert ra["received"] == rb["received"] == (len(ra["members"]) - 1) * payload
            if i < SPARSE_KILL_AT:
                assert killed[i]["hash"] == ra["hash"]
        assert cheater[0]["hash"] == a[0]["hash"]
        assert len({r["hash"] for r in a}) == SPARSE_STEPS  # training moved the parameters
        recovered = json.loads((dirs[4] / "recovered.json").read_text())
        assert recovered["step"] == SPARSE_JOIN_AT
        assert recovered["state"] == a[SPARSE_JOIN_AT - 1]["state"]
        assert recovered["via"] == "shardcast" and recovered["signer"] == leader
        assert recovered["model"] == recovered["hash"] == a[SPARSE_JOIN_AT - 1]["hash"]
        assert [r["step"] for r in joined] == [SPARSE_JOIN_AT + 1]
        assert joined[0]["hash"] == a[SPARSE_JOIN_AT]["hash"]
        assert joined[0]["members"] == a[SPARSE_JOIN_AT]["members"]
        status = json.loads((dirs[0] / "status.json").read_text())
        assert status["rejected"] == {"chunk": 1}  # the cheater's step, counted once
        assert status["evicted"].get(ids[2], 0) >= 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
