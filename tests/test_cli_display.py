"""Progress and tables: a bar on a terminal, plain log lines in a pipe (the real binary, its
stdout a pipe); the status and devnet tables show the figures of ``/status``."""

from __future__ import annotations

import io
import os
import subprocess
import time
from pathlib import Path

import pytest
from rich.console import Console

from node.cli.progress import BYTES, progress
from node.cli.tables import show, status_view, work_view
from node.roles.decisions.status import InferenceStatus, Stake, TrainerStatus, ValidatorStatus
from tests.helpers.net import CLI


def terminal(buf: io.StringIO) -> Console:
    return Console(file=buf, force_terminal=True, width=160, color_system="standard")


def test_progress_draws_a_bar_on_a_terminal() -> None:
    buf = io.StringIO()
    with progress("SFT", 40, unit="steps", console=terminal(buf)) as bar:
        for step in range(40):
            bar.update(step + 1, info=f"loss {2 / (step + 1):.3f}")
    out = buf.getvalue()
    assert "\x1b[" in out and "━" in out  # escape codes and a bar
    assert "40/40" in out and "100%" in out and "loss 0.050" in out
    assert "SFT: " not in out  # not the log-line form


def test_progress_bytes_on_a_terminal_show_mib_and_a_rate() -> None:
    buf = io.StringIO()
    with progress("pull v3", unit=BYTES, console=terminal(buf)) as bar:
        bar.update(32 * 1024 * 1024, total=128 * 1024 * 1024, info="1 peers")
        time.sleep(0.1)  # two samples apart in time: a rate
        bar.update(64 * 1024 * 1024, info="2 peers")
    out = buf.getvalue()
    assert "64.0/128.0 MiB" in out and "50%" in out and "2 peers" in out
    assert "/s" in out  # the transfer rate column


def test_progress_in_a_log_is_throttled_plain_lines_with_the_last_one() -> None:
    out = io.StringIO()  # not a terminal
    with progress("claim", 300, unit="entries", out=out, log_every=3600) as bar:
        for done in range(1, 301):
            bar.update(done)
    assert out.getvalue() == "claim: 1/300 entries (0%)\nclaim: 300/300 entries (100%)\n"
    # interrupted work does not print a last line as if it had finished
    out = io.StringIO()

    def interrupted() -> None:
        with progress("SFT", 10, unit="steps", out=out, log_every=3600) as bar:
            bar.update(1)
            bar.update(2)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        interrupted()
    assert out.getvalue() == "SFT: 1/10 steps (10%)\n"


def test_work_that_never_reports_leaves_no_bar() -> None:
    buf = io.StringIO()
    with progress("SFT", 300, unit="steps", console=terminal(buf)):
        pass  # e.g. the model came from the cache
    assert "SFT" not in buf.getvalue()


@pytest.mark.timeout(600)  # torch and transformers load slowly on a busy machine
def test_model_init_in_a_pipe_logs_its_sft_steps(tmp_path: Path) -> None:
    """The binary with stdout a pipe (as in CI): SFT progress as plain lines."""
    res = subprocess.run(
        [*CLI, "model", "init", str(tmp_path / "m"), "--steps", "12", "--hidden", "32"]
        + ["--layers", "1", "--no-cache"],
        capture_output=True,
        text=True,
        timeout=540,
        env={**os.environ, "INTELLECT_NODE_CACHE": str(tmp_path / "cache")},
    )
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("SFT: 1/12 steps (8%) loss "), res.stdout
    assert any(line.startswith("SFT: 12/12 steps (100%) loss ") for line in lines), res.stdout
    assert "\r" not in res.stdout and "\x1b" not in res.stdout
    assert "built in" in res.stdout


def _status() -> dict:
    """A node's ``/status`` with every section the tables read, from the roles' own
    status models (so a renamed key fails here)."""
    stake = Stake(
        stake_wei=2 * 10**18,
        locked_wei=10**15,
        slashed=0,
        pending_wei=1_906_000_000_000_000,
        claimable_wei=250_000_000_000_000,
    )
    worker = InferenceStatus(
        address="0x" + "11" * 20,
        step=3,
        policy_version=2,
        version_used=2,
        weights_held=[1, 2],
        last_batch_step=3,
        idle_share=0.1,
        generated=7,
        submitted=6,
        accepted=5,
        rejected=1,
        unjudged=2,
        expired=0,
        tokens=900,
        errors=0,
        stale=0,
        tokens_per_s=39.6,
        stake=stake,
    )
    return {
        "peer_id": "12D3KooWPeerOfThisNode",
        "role": "inference",
        "run_id": "table-run",
        "addrs": ["/ip4/127.0.0.1/tcp/40001", "/ip4/10.1.2.3/tcp/40001"],
        "reachability": {
            "state": "private",
            "advertised": ["/ip4/10.1.2.3/tcp/40001"],
            "observed": ["/ip4/203.0.113.2/tcp/51234"],
            "reached_by": 0,
            "not_reached_by": 3,
            "refused": 1,
            "answered": {},
        },
        "peers": [
            {"role": "trainer", "peer_id": "12D3KooWTrainerPeer", "last_seen_s": 1.25},
            {"role": "validator", "peer_id": "12D3KooWValidatorPeer", "last_seen_s": 3.5},
        ],
        "peer_count": 2,
        "peers_by_role": {"trainer": 1, "validator": 1},
        "traffic": {"messages": {"in": 31, "out": 17}, "bytes": {"in": 4096, "out": 2048}},
        "rejected": {"stale": 4, "bad_signature": 1},
        "inference": worker.as_dict(),
        "weights": {"current": 2, "uploaded_bytes": 6_500_000, "downloaded_bytes": 19_600_000},
    }


def rendered(*renderables) -> str:
    out = io.StringIO()
    show(*renderables, out=out)
    return out.getvalue()


def test_status_table_shows_the_status_fields() -> None:
    text = rendered(*status_view(_status()))
    lines = text.splitlines()
    assert "12D3KooWPeerOfThisNode" in lines[0] and "table-run" in text
    assert "/ip4/127.0.0.1/tcp/40001" in text and "/ip4/10.1.2.3/tcp/40001" in text
    assert "2 (trainer=1, validator=1)" in text
    assert "private (reached by 0, not reached by 3)" in text
    assert "/ip4/203.0.113.2/tcp/51234" in text
    assert "in 31 msgs / 4096 B, out 17 msgs / 2048 B" in text
    assert "bad_signature=1, stale=4" in text
    peer_rows = [line.split() for line in lines if "KooWTrainer" in line or "KooWValid" in line]
    assert peer_rows == [
        ["trainer", "12D3KooWTrainerPeer", "1.2"],
        ["validator", "12D3KooWValidatorPeer", "3.5"],
    ]
    # the role's row: holds, gen, acc, rej, wait, tok/s, stake, pending, claimable, MB
    row = next(line for line in lines if line.startswith("this node"))
    assert row.split()[2:] == [
        "inference",
        "2",
        "7",
        "5",
        "1",
        "2",
        "39.6",
        "2",
        "0.001906",
        "0.00025",
        "6.5",
        "19.6",
    ]
    assert "\x1b" not in text and all(line == line.rstrip() for line in lines)


def test_devnet_table_has_a_row_per_role_and_the_trainer_line() -> None:
    worker = _status()
    other = {**worker, "inference": {**worker["inference"], "generated": 3}}
    validator = ValidatorStatus(
        address="0x" + "22" * 20,
        step=3,
        judged=6,
        accepted=4,
        rejected=2,
        rejected_by_reason={"invalid": 2},
        fetch_failures=0,
        unposted=0,
        removed_at=None,
        not_ours=0,
        judge_seconds=1.0,
        idle_share=0.5,
        waiting=1,
        given_up=0,
    ).as_dict()
    trainer = TrainerStatus(
        step=2,
        policy_version=2,
        train_steps=10,
        done=False,
        accepted=4,
        rejected=2,
        slashed=1,
        usable=4,
        batches_used=3,
        tokens_trained=288,
        idle_share=0.2,
        last={"step": 2, "reward_mean": 0.047, "heldout_sampled": 0.146, "heldout_greedy": 0.3},
    ).as_dict()
    named = [
        ("bootstrap", {"weights": {}}),
        ("trainer", {"trainer": trainer, "weights": {"current": 2, "uploaded_bytes": 19.6e6}}),
        ("validator", {"validator": validator, "weights": {"current": 2}}),
        ("inference-0", worker),
        ("inference-1", other),
    ]
    text = rendered(*work_view(named))
    lines = text.splitlines()
    assert lines[0] == (
        "trainer: step 2/10, reward 0.047, held-out accuracy sampled 0.146 (greedy 0.300), "
        "accepted 4, rejected 2, slashed 1, batches used 3, tokens trained 288"
    )
    rows = {line.split()[0]: line for line in lines[1:] if line.split()}
    assert "bootstrap" not in rows  # no role section, no row
    assert rows["trainer"].split()[1:] == ["trainer", "2", "19.6", "0.0", "step", "2/10"]
    assert rows["validator"].split()[1:6] == ["validator", "2", "4", "2", "1"]
    assert "judged 6; rejected: invalid 2" in rows["validator"]
    assert rows["inference-0"].split()[2:7] == ["2", "7", "5", "1", "2"]
    assert rows["inference-1"].split()[2:4] == ["2", "3"]
    # before any node answers, the live table prints nothing, not an empty line
    assert rendered(*work_view([("trainer", {}), ("validator", {})])) == ""
    # on a terminal the same table is drawn (colour, the terminal's width) without error
    buf = io.StringIO()
    show(*work_view(named), con=terminal(buf))
    assert "inference-1" in buf.getvalue() and "judged 6" in buf.getvalue()
