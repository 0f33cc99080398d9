"""What a newcomer hit (#53, item 6), each fixed with a test here when no other file
covers it."""

from __future__ import annotations

from rich.console import Console

from node.cli.tables import rewards_view

ETH = 10**18


def rendered(r: dict[str, object]) -> str:
    console = Console(record=True, width=200)
    for part in rewards_view(r):
        console.print(part)
    return console.export_text()


def report(**changes: object) -> dict[str, object]:
    r: dict[str, object] = {
        "address": "0x" + "11" * 20,
        "contract": "0x" + "22" * 20,
        "chain_id": 31337,
        "registered": False,
        "registration_valid": False,
        "stake": 0,
        "locked": 0,
        "unbonding": 0,
        "pending": 0,
        "claimable": 0,
        "accepted": 0,
        "rejected": 0,
        "slashed": 0,
        "is_validator": False,
        "history": [],
    }
    return {**r, **changes}


def test_a_validators_rewards_show_its_bond_not_stake_not_registered():
    text = rendered(report(is_validator=True, stake=100 * ETH))
    assert "100" in text.split("stake", 1)[1].splitlines()[0], text
    assert "not registered" not in text
    assert "no peer key registered (a validator needs none)" in text


def test_an_account_with_nothing_staked_is_told_how_to_stake():
    text = rendered(report())
    assert "none (intellect-node stake add AMOUNT registers it)" in text
    registered = rendered(report(registered=True, registration_valid=True, stake=2 * ETH))
    assert "peer key" not in registered and "2" in registered.split("stake", 1)[1]


def submission(status: str, **changes: object):
    from ledger.records import SubmissionInfo

    fields: dict[str, object] = dict(
        index=0,
        units=10,
        policy_version=1,
        submitted_at=1,
        fetch_after=2,
        verdict_until=3,
        unlock_at=4,
        reward=2 * 10**15,
        collateral=5 * 10**16,
        validator_share_bps=1000,
        quorum=1,
        status=status,
        final=False,
        settled=False,
        reason=0,
        rejecter="0x" + "00" * 20,
        accept_votes=0,
        reject_votes=0,
    )
    return SubmissionInfo(**{**fields, **changes})  # type: ignore[arg-type]


def test_a_worker_logs_every_verdict_on_its_work_with_the_reason():
    from node.roles.io.submissions import verdict_line

    key = bytes.fromhex("ab" * 32)
    assert verdict_line(key, submission("pending"), "rejected") is None
    assert verdict_line(key, submission("accepted", accept_votes=1), "rejected") == (
        "batch abababababababab accepted (1 accept, 0 reject): reward 0.002000 ETH"
    )
    rejected = submission("rejected", reason=1, reject_votes=1, rejecter="0x" + "77" * 20)
    assert verdict_line(key, rejected, "invalid") == (
        f"batch abababababababab rejected by validator 0x{'77' * 20}: invalid (0 accept, "
        "1 reject); its collateral of 0.050000 ETH is slashed when the verdict matures"
    )


async def test_the_worker_says_each_verdict_once_as_it_reads_it(caplog):
    """``Submissions.refresh`` over a ledger whose batch goes pending → rejected: one
    warning naming the reason, and none on the reads after."""
    import logging

    from node.roles.decisions.clock import StepClock
    from node.roles.io.submissions import Submissions

    class Ledger:
        status = "pending"
        head = 0

        def confirmed_head(self) -> int:
            self.head += 1
            return self.head

        def submission(self, address, key, block):
            return submission(self.status, reason=2, reject_votes=1, verdict_until=2**40)

        def chain_time(self) -> int:
            return 0

        def worker(self, address):
            raise AssertionError("not read here")

    subs = Submissions(None, StepClock("trainer"), 2)  # type: ignore[arg-type]
    ledger = Ledger()
    subs.ledger = ledger  # type: ignore[assignment]
    subs.reads.money_due = lambda now, verdicts: False  # type: ignore[method-assign]
    key = bytes(32)
    subs.pending.submitted(key, 1)
    caplog.set_level(logging.INFO, logger="intellect.inference")
    await subs.refresh()
    assert not [r for r in caplog.records if "batch 0000" in r.getMessage()]
    ledger.status = "rejected"
    await subs.refresh()
    await subs.refresh()
    lines = [r.getMessage() for r in caplog.records if "batch 0000" in r.getMessage()]
    assert len(lines) == 1 and ": unavailable (0 accept, 1 reject)" in lines[0], lines
    assert subs.pending.rejected_by_reason == {"unavailable": 1}


async def test_a_worker_stakes_nothing_until_a_peer_of_its_run_answers(autojump_clock):
    """An unreachable bootstrap is one line every 10 s, and the role waits (its stake is
    locked in ``_setup``, after this returns)."""
    import trio

    from crypto.identity import Identity
    from node.config import load_config
    from node.roles.services.inference import until_run_peers

    boot = f"/ip4/127.0.0.1/tcp/9/p2p/{Identity.generate().peer_id}"
    cfg = load_config(
        flags={"role": "inference", "run.id": "r", "net.bootstrap": [boot]}, environ={}
    )
    lines: list[tuple[float, str]] = []
    answered_at = 25.0

    def peers() -> int:
        return int(trio.current_time() >= answered_at)

    await until_run_peers(peers, cfg, lambda line: lines.append((trio.current_time(), line)))
    assert trio.current_time() == answered_at
    assert [t for t, _ in lines] == [0.0, 10.0, 20.0]
    assert lines[0][1] == (
        f"no peer of run r reached yet (bootstrap: {boot}): nothing is staked until one answers"
    )


def test_name_and_chain_fund_find_a_running_devnets_nodes_and_chain(tmp_path, monkeypatch, capsys):
    """``status|ping|dashboard --name inference-0`` and ``chain fund`` without
    ``--data-dir`` found nothing of a devnet (its nodes and chain live under
    ``~/.intellect-node/devnet/``); a node or chain of the name's own still comes first."""
    import argparse
    import json

    from node.cli.adminclient import data_dir, devnet_chain_dir
    from node.cli.main import main

    monkeypatch.setenv("HOME", str(tmp_path))
    home = tmp_path / ".intellect-node"
    worker = home / "devnet" / "inference-0"
    worker.mkdir(parents=True)
    (worker / "admin.json").write_text(json.dumps({"port": 9, "token": "t"}))
    named = argparse.Namespace(name="inference-0", data_dir=None)
    assert data_dir(named) == worker
    assert data_dir(argparse.Namespace(name="trainer", data_dir=None)) == home / "trainer"
    (home / "inference-0").mkdir()
    (home / "inference-0" / "admin.json").write_text(json.dumps({"port": 9, "token": "t"}))
    assert data_dir(named) == home / "inference-0"  # a node of its own name comes first
    (home / "inference-0" / "admin.json").unlink()
    # the real command asks the devnet's node (which does not answer on port 9 here)
    assert main(["status", "--name", "inference-0"]) == 1
    assert f"the node of {worker} does not answer" in capsys.readouterr().err

    default = home / "chain"
    assert devnet_chain_dir(default) == default
    (home / "devnet" / "chain").mkdir()
    (home / "devnet" / "chain" / "chain.json").write_text("{}")
    assert devnet_chain_dir(default) == home / "devnet" / "chain"
    default.mkdir()
    (default / "chain.json").write_text("{}")
    assert devnet_chain_dir(default) == default
