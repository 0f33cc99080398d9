"""Joining a running devnet by hand, with ``--bootstrap`` alone (issue #53).

The devnet's trainer signs the run's manifest (``node/cli/devnet.py``: ``manifest_env``,
``signed_run_id``), so a node started by hand with a funded account and the bootstrap
address the devnet prints finds the run, takes the chain URL and every work setting from
the manifest, pulls the model, and works: its first batch is accepted. One that gives a
setting the manifest contradicts stops in one line naming both values, before it stakes
(a newcomer once joined the devnet with other settings, staked, and had both its batches
rejected without a word in its log).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from node.cli.adminclient import admin_status
from node.cli.devnet import DEVNET_PASSWORD, NodeProcess, fund, make_account
from tests.helpers.net import wait_until

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
FAST = ["--net.heartbeat-interval", "2", "--net.peer-ttl", "10", "--net.discovery-interval", "1"]


def started(base: Path, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "node.cli", "devnet", "--base-dir", str(base)]
    cmd += ["--inference", "1", "--steps", "1000"]  # runs until the test stops it
    env = {**os.environ, "INTELLECT_NODE_CACHE": str(REPO / ".cache")}
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)


def by_hand(data_dir: Path, boot: str, *flags: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "node.cli",
        "start",
        "--role",
        "inference",
        "--data-dir",
        str(data_dir),
        "--listen",
        "/ip4/127.0.0.1/tcp/0",
        "--bootstrap",
        boot,
        *FAST,
        *flags,
    ]


@pytest.mark.timeout(900)
def test_a_node_started_by_hand_joins_the_devnet_by_its_manifest(tmp_path, base_model_dir):
    base, log, mine = tmp_path / "devnet", tmp_path / "devnet.log", tmp_path / "joiner"
    devnet = started(base, log)
    joiner: subprocess.Popen[bytes] | None = None
    env = {**os.environ, "INTELLECT_NODE_PASSWORD": DEVNET_PASSWORD}
    try:
        wait_until(lambda: "nodes up;" in log.read_text(), 600, f"the devnet up\n{log}", 2)
        text = log.read_text()
        run_id, boot = re.search(
            r"devnet: run (\S+): its manifest, model and tasks are served to a node started "
            r"with --bootstrap (\S+) alone",
            text,
        ).groups()  # type: ignore[union-attr]
        assert re.fullmatch(r"devnet-[0-9a-f]{32}", run_id), run_id
        assert (admin_status(base / "trainer") or {}).get("manifest") == {
            "held": True,
            "run": run_id,
        }

        # a setting the run's manifest contradicts: one line, nothing staked
        bad = tmp_path / "bad"
        fund(base / "chain", make_account(bad), "10")
        res = subprocess.run(
            by_hand(bad, boot, "--run.temperature", "0.5"),
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert res.returncode == 1, res.stdout + res.stderr
        [line] = [x for x in res.stderr.splitlines() if x.startswith("intellect-node: error:")]
        assert line == (
            f"intellect-node: error: --run.temperature 0.5 contradicts the run manifest of "
            f"{run_id}: run.temperature is 1.0 there"
        ), line
        assert "registered" not in res.stdout + res.stderr

        # --bootstrap alone: the manifest's chain URL, model, tasks and settings; accepted work
        fund(base / "chain", make_account(mine), "10")
        with open(tmp_path / "joiner.log", "wb") as out:
            joiner = subprocess.Popen(
                by_hand(mine, boot), stdout=out, stderr=subprocess.STDOUT, env=env
            )

        def accepted() -> bool:
            assert joiner is not None and joiner.poll() is None, (
                tmp_path / "joiner.log"
            ).read_text()
            st = admin_status(mine) or {}
            return ((st.get("inference") or {}).get("accepted") or 0) >= 1

        wait_until(
            accepted, 600, f"the joiner's first accepted batch\n{tmp_path / 'joiner.log'}", 2
        )
        said = (tmp_path / "joiner.log").read_text()
        assert f"joining run {run_id} by its manifest" in said
        assert "using the run manifest's chain URL http://127.0.0.1:" in said
        assert (admin_status(mine) or {}).get("run_id") == run_id
    finally:  # Ctrl-C, as a person stops them (the devnet stops its nodes and chain)
        for name, proc, where in (("joiner", joiner, mine), ("devnet", devnet, base)):
            if proc is not None:
                NodeProcess(name, "", where, proc, log).stop(signal.SIGINT, grace=120)
