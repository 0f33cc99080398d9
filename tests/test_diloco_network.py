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

A second, smaller cluster does the same with ``quant = "sparse"`` (the all-gather of SPEC
§15): two honest members and a cheater.
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
            spawn(dirs[0], leader, *common, "--admit", ",".join(ids[i] for i in (1, 2, 4, 5)))
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
        for p in (procs[0], procs[1], procs[3], procs[4], procs[5]):
            p.wait(timeout=300)
        assert time.monotonic() - started < 290  # no hang: the survivors finished the step
        logs = {d.name: (d / "log").read_text()[-3000:] for d in dirs}
        a, b, killed = steps(dirs[0]), steps(dirs[1]), steps(dirs[2])
        assert len(a) == len(b) == OUTER_STEPS, logs
        assert len(killed) == KILL_AT
        cheater = steps(dirs[5])
        assert [r["step"] for r in cheater] == [CHEAT_AT]  # refused from its cheating step on
        assert "excluded" in (dirs[5] / "refused").read_text()
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
