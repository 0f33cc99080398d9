"""Issue #54: strangers holding a worker's upload slots cannot make its batch unavailable.

A run of real node processes on the served development chain (``tests/test_loop.py``'s
``Loop``): a trainer, an honest worker and, once the worker's first batch is submitted and 8
outside peers (``tests/helpers/hogs.py``: no chain account, no voucher) hold every upload
slot open to anyone, three validators that fetch it. Each stranger keeps as many streams
asking for the batch as the worker lets one peer have, reads the reply header and never a
byte of the batch; a stream the worker ends (its write deadline) or refuses busy is asked
again at once. The worker keeps upload slots for the run's validators and trainer
(``serve_batches``' ``kept``, ``node/roles/io/exchange.py``): every validator fetches and
judges the batch, accepts it, and none votes ``unavailable``; nothing is slashed.

The batches are honestly large: a stalled reader lets the worker write one yamux window
(256 KiB) and no more, so a batch smaller than that is written whole at once and frees its
slot, and no stranger could hold one. A nearly untrained model (one SFT step) seldom ends a
sample early: 16 tasks x 16 samples of up to 400 tokens made 21,000 to 26,000 tokens, 475
to 530 KB (about 21 bytes a token), twice the window. Without the kept slots
(``first=None`` in the inference role) the same test fails: the validators are refused
``busy`` (one got a slot now and then, between two strangers) until the fetch deadline,
and vote the batch unavailable.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from node.cli.devnet import REPO_ROOT, p2p_addr, wait_ready
from protocol import ids
from tests.helpers.net import counter, metrics, status, wait_until
from tests.test_loop import RUN, Loop, submissions
from tests.test_verdict_split_network import VALIDATORS, verdicts_on

pytestmark = pytest.mark.slow

WINDOW = 256 * 1024  # what a stalled reader lets the worker write of one stream (yamux)
BIG_BATCHES = {
    "INTELLECT_NODE_RUN__TASKS_PER_BATCH": "16",
    "INTELLECT_NODE_RUN__GROUP_SIZE": "16",
    "INTELLECT_NODE_RUN__MAX_NEW_TOKENS": "400",
}
# the worker keeps its links to the 8 strangers (its connection watermark would close
# some of them, and with them the slots they hold: a test of the slots, not of trimming)
ROOMY = {"INTELLECT_NODE_NET__CONN_HIGH": "32"}
HOGS = 8
# no held-out evaluation: the untrained model's samples run long, and evaluating them took
# the trainer 3 minutes on 2 loaded cores before its first step
QUIET_TRAINER = {"INTELLECT_NODE_TRAINER__EVAL_EVERY": "0"}


@pytest.fixture(scope="module")
def untrained_model_dir(tmp_path_factory):
    """The tiny model after one SFT step (built once per machine into the cache under
    .cache/): it seldom samples the end of a sequence, so its samples run long."""
    import fcntl

    from node.engine.tinymodel import Recipe, build_tiny_model

    cache = Path(__file__).resolve().parent.parent / ".cache" / "models"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        out = tmp_path_factory.mktemp("model") / "untrained"
        path, _ = build_tiny_model(out, Recipe(steps=1, schedule=0), cache_dir=cache)
    return path


def start_hogs(loop: Loop, key: bytes) -> subprocess.Popen[bytes]:
    worker = p2p_addr(status(loop.nodes["honest"]))
    out = loop.base / "hogs"
    out.mkdir()
    with open(loop.base / "hogs.log", "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.hogs", "--worker", worker, "--key", key.hex()]
            + ["--dir", str(out), "--run-id", RUN, "--peers", str(HOGS)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
        )


def attack(loop: Loop) -> dict[str, Any] | None:
    """The hogs' tally (``tests/helpers/hogs.py``) with the worker's batch requests
    refused busy so far (``busy``), or None before the hogs report."""
    try:
        tally = json.loads((loop.base / "hogs" / "hogs.json").read_text())
    except FileNotFoundError:
        return None
    text = metrics(loop.nodes["honest"])
    tally["busy"] = counter(text, "intellect_rejected_total", reason="busy", protocol=ids.BATCH)
    return tally


@pytest.mark.timeout(1200)  # a hang guard
def test_strangers_holding_a_workers_upload_slots_cannot_make_its_batch_unavailable(
    tmp_path, untrained_model_dir
):
    # fetch deadline: 360 s // 6 = 60 s; the validators start well within the window
    loop = Loop(
        tmp_path, untrained_model_dir, chain_args=["--verdict-window", "360"], env=BIG_BATCHES
    )
    hogs = None
    try:
        loop.spawn("trainer", "trainer", env=QUIET_TRAINER)
        loop.worker("honest", env=ROOMY)
        for node in loop.nodes.values():
            wait_ready(node, timeout=180)
        client = loop.client()
        address = loop.addresses["honest"]
        ((_, key),) = wait_until(
            lambda: list(submissions(client)), 300, "the worker's first batch", interval=1
        )
        (stored,) = (tmp_path / "honest" / "batches").glob(f"{key.hex()}*")
        assert stored.stat().st_size > WINDOW * 3 // 2, stored.stat().st_size

        # every open slot held, again and again, before any validator is up to fetch
        hogs = start_hogs(loop, key)
        wait_until(
            lambda: (a := attack(loop)) and a["ready"] and a["held"] >= 8 and a["busy"] > 0,
            120,
            "the strangers to hold every open upload slot",
            interval=1,
        )
        for i in range(len(VALIDATORS)):
            loop.validator(i)
        for name in VALIDATORS:
            wait_ready(loop.nodes[name], timeout=180)
        before = attack(loop)

        wait_until(
            lambda: all(verdicts_on(loop, address, key).values()),
            300,
            "a verdict on the batch from every validator",
            interval=2,
        )
        after = attack(loop)
        assert hogs.poll() is None
        # the strangers held slots the whole time and were refused the rest: the worker's
        # open slots were full while the validators fetched
        assert after["held"] > before["held"] and after["busy"] > before["busy"], (before, after)
        assert set(after["refused"]) == {"busy"}, after

        assert verdicts_on(loop, address, key) == {n: ["accepted"] for n in VALIDATORS}
        sub = client.submission(address, key)
        assert sub.status == "accepted" and sub.reject_votes == 0, sub
        assert not client.contract.events.WorkRejected.get_logs(from_block=0)
        for name in VALIDATORS:
            assert not loop.section(name, "validator")["rejected_by_reason"], name
        assert client.worker(address).slashed == 0
        for account in loop.chain_info["validator_addresses"]:  # no bond locked or burned
            v = client.worker(account)
            assert (v.stake, v.locked, v.slashed) == (loop.chain_info["validator_bond"], 0, 0)

        hogs.send_signal(signal.SIGTERM)
        assert hogs.wait(60) == 0, (tmp_path / "hogs.log").read_text()[-3000:]
    finally:
        if hogs is not None and hogs.poll() is None:
            hogs.kill()
            hogs.wait()
        loop.close()
