import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from node.config import ConfigError, load_config
from node.keystore import KeystoreError, create_identity, load_identity, load_or_create_identity
from tests.helpers.net import CLI


def run(*args, env=None, check=True):
    env = {**os.environ, "INTELLECT_NODE_PASSWORD": "pw", **(env or {})}
    res = subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=60)
    if check:
        assert res.returncode == 0, res.stderr
    return res


def test_config_precedence_file_env_flags(tmp_path):
    peer = "/p2p/12D3KooWNTfKZ37isa5RWx23UwAhoHxHvSb6jxggwB1qqbZBRF4A"
    A, B = f"/ip4/10.0.0.1/tcp/1{peer}", f"/ip4/10.0.0.2/tcp/2{peer}"
    f = tmp_path / "node.toml"
    f.write_text(
        'role = "trainer"\n[run]\nid = "from-file"\n[net]\npeer_ttl = 30.0\nheartbeat_interval = 2.0\n'
    )
    cfg = load_config(file=f, environ={}, flags={})
    assert (cfg.role, cfg.run.id, cfg.net.peer_ttl) == ("trainer", "from-file", 30.0)
    cfg = load_config(
        file=f,
        environ={
            "INTELLECT_NODE_RUN__ID": "from-env",
            "INTELLECT_NODE_NET__BOOTSTRAP": f"{A}, {B}",
        },
        flags={},
    )
    assert cfg.run.id == "from-env" and cfg.net.bootstrap == [A, B] and cfg.role == "trainer"
    cfg = load_config(
        file=f,
        environ={"INTELLECT_NODE_RUN__ID": "from-env"},
        flags={"run.id": "from-flag", "role": None},
    )
    assert cfg.run.id == "from-flag" and cfg.role == "trainer"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"net.peer_ttl": 1, "net.heartbeat_interval": 2}, "peer_ttl must be longer"),
        ({"net.read_timeout": 0}, "net.read_timeout"),
        ({"admin.port": 70000}, "admin.port"),
        ({"run.id": "Bad Run"}, "run.id"),
        ({"role": "king"}, "role"),
        ({"colour": "red"}, "unknown setting: colour"),
    ],
)
def test_config_errors_are_clear(flags, message):
    with pytest.raises(ConfigError, match=message):
        load_config(environ={}, flags=flags)


def test_bad_config_file(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("role = = 1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(file=f, environ={})
    with pytest.raises(ConfigError, match="not found"):
        load_config(file=tmp_path / "missing.toml", environ={})


def test_print_config_and_help_do_not_import_libp2p(tmp_path):
    out = run(
        "start",
        "--role",
        "validator",
        "--data-dir",
        str(tmp_path),
        "--net.peer-ttl",
        "12",
        "--print-config",
        env={"INTELLECT_NODE_RUN__ID": "env-run"},
    ).stdout
    assert 'role = "validator"' in out and 'id = "env-run"' in out and "peer_ttl = 12.0" in out
    code = "import sys; from node.cli import main; main(['start','--print-config']); print(sorted(m for m in sys.modules if m.split('.')[0] in ('libp2p','trio','torch')))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.stdout.strip().endswith("[]"), res.stdout
    assert "--bootstrap" in run("start", "--help").stdout


def test_commands_and_a_network_node_import_no_answer_checker_and_no_web3(tmp_path):
    """Every command imports the task sets, and a node its roles: math-verify (sympy) is
    imported at the first answer that needs it, and web3 only where a chain is used."""
    import ast

    heavy = ("math_verify", "sympy", "web3")

    def imported(code: str) -> list[str]:
        """The heavy modules loaded once ``code`` has run in a fresh interpreter."""
        show = f"print(sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r}))"
        res = subprocess.run(
            [sys.executable, "-c", f"import sys\n{code}\n{show}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 0, res.stderr
        return list(ast.literal_eval(res.stdout.strip().splitlines()[-1]))

    for argv in (["status", "--data-dir", str(tmp_path)], ["start", "--print-config"]):
        code = f"from node.cli import main\ntry: main({argv!r})\nexcept SystemExit: pass"
        assert imported(code) == [], argv
    # what a network-only node's start imports (tests/test_adversarial.py's nodes), and a
    # worker's and a validator's roles (web3 there: they use the chain)
    for mods, absent in (
        ("node.net.runtime, node.net.admin, node.roles.io.chain, node.shardcast.service", heavy),
        (
            "node.roles.services.validator, node.roles.services.inference, node.roles.services.trainer",
            heavy[:2],
        ),
    ):
        names = imported(f"import {mods}")
        assert not [m for m in names if m.split(".")[0] in absent], (mods, names)
    from node.tasks.answers import answers_match  # and the checker still loads when needed

    assert answers_match("1/2", "0.5") and not answers_match("1/2", "0.4")


def test_cli_reports_bad_flags_without_a_traceback(tmp_path):
    res = run(
        "start",
        "--net.peer-ttl",
        "0.5",
        "--net.heartbeat-interval",
        "1",
        "--print-config",
        check=False,
    )
    assert (
        res.returncode == 2
        and "peer_ttl must be longer" in res.stderr
        and "Traceback" not in res.stderr
    )
    res = run("status", "--data-dir", str(tmp_path), check=False)
    assert res.returncode == 1 and "no running node" in res.stderr


def test_keys_new_show_and_file_mode(tmp_path):
    d = tmp_path / "n"
    out = run("keys", "new", "--data-dir", str(d)).stdout
    peer_id = out.split()[2]
    assert peer_id.startswith("12D3KooW")
    assert stat.S_IMODE((d / "identity.key").stat().st_mode) == 0o600
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert stat.S_IMODE((d / "account.json").stat().st_mode) == 0o600
    # a user's keystore keeps eth-account's full scrypt (the devnet's light one is its own)
    assert json.loads((d / "account.json").read_text())["crypto"]["kdfparams"]["n"] == 2**18
    shown = run("keys", "show", "--data-dir", str(d)).stdout
    assert peer_id in shown and "account    0x" in shown
    res = run(
        "keys",
        "new",
        "--data-dir",
        str(tmp_path / "other"),
        env={"INTELLECT_NODE_PASSWORD": ""},
        check=False,
    )
    assert res.returncode == 1 and "empty keystore password" in res.stderr
    res = run("keys", "new", "--data-dir", str(d), check=False)
    assert res.returncode == 1 and "already exists" in res.stderr
    assert peer_id not in run("keys", "new", "--data-dir", str(d), "--force").stdout


def test_keys_new_keeps_an_identity_start_made_and_a_damaged_keystore_is_one_line(tmp_path):
    """`start` makes identity.key; a later `keys new` (the guides' order) kept refusing
    ("already exists") unless --force replaced the peer id; an empty password wrote the
    identity before refusing. A damaged account.json was a KeyError traceback."""
    d = tmp_path / "n"
    res = run("keys", "new", "--data-dir", str(d), env={"INTELLECT_NODE_PASSWORD": ""}, check=False)
    assert res.returncode == 1 and "empty keystore password" in res.stderr
    assert not (d / "identity.key").exists()
    ident = create_identity(d)  # as `start` makes it
    out = run("keys", "new", "--data-dir", str(d)).stdout
    assert ident.peer_id in out and (d / "account.json").exists()
    from ledger.accounts import AccountError, load_account

    for damaged in ('{"garbage": 1}', "not json", '{"address": 5, "crypto": 7}'):
        (d / "account.json").write_text(damaged)
        res = run("keys", "show", "--data-dir", str(d), check=False)
        assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
        assert "account.json is not a valid keystore" in res.stderr, res.stderr
        with pytest.raises(AccountError, match="is not a valid keystore"):
            load_account(d, "pw")  # what stake, rewards claim and a worker's start read


def test_keystore_refuses_unsafe_or_corrupt_keys(tmp_path):
    ident = create_identity(tmp_path)
    assert load_or_create_identity(tmp_path) == ident
    (tmp_path / "identity.key").chmod(0o644)
    with pytest.raises(KeystoreError, match="other users"):
        load_identity(tmp_path)
    (tmp_path / "identity.key").chmod(0o600)
    (tmp_path / "identity.key").write_bytes(b"short")
    with pytest.raises(KeystoreError, match="32-byte"):
        load_identity(tmp_path)
    with pytest.raises(KeystoreError, match="no identity"):
        load_identity(tmp_path / "nowhere")


def test_start_status_and_sigint(tmp_path):
    """The binary end to end: start, status (table and JSON), metrics, Ctrl-C."""
    import signal
    import time

    from node.cli.devnet import spawn_node, wait_ready
    from tests.helpers.net import metrics

    node = spawn_node(
        "solo",
        "trainer",
        tmp_path,
        run_id="cli-run",
        listen="/ip4/127.0.0.1/tcp/0",
        bootstrap=[],
        extra=["--network-only"],  # the trainer's work needs a model and a chain
    )
    try:
        wait_ready(node)
        st = json.loads(run("status", "--data-dir", str(node.data_dir), "--json").stdout)
        assert st["role"] == "trainer" and st["run_id"] == "cli-run" and st["peers"] == []
        assert st["peer_id"].startswith("12D3KooW") and st["addrs"][0].startswith(
            "/ip4/127.0.0.1/tcp/"
        )
        # up: what it loaded is out of the garbage collector's walks (node/net/collector.py)
        assert st["collector"]["frozen"] > 50_000, st["collector"]
        table = run("status", "--data-dir", str(node.data_dir)).stdout
        assert st["peer_id"] in table and re.search(r"^peers +0 ", table, re.M), table
        assert re.search(r"^reachability +(unknown|public|private) ", table, re.M), table
        peers = {
            s.labels["role"]: s.value
            for f in text_string_to_metric_families(metrics(node))
            if f.name == "intellect_peers"
            for s in f.samples
        }
        assert peers == dict.fromkeys(("bootstrap", "inference", "validator", "trainer"), 0)
        node.proc.send_signal(signal.SIGINT)
        assert node.proc.wait(15) == 0
        time.sleep(0.1)
        assert not (node.data_dir / "admin.json").exists()
        assert "left the network" in node.log_path.read_text()
    finally:
        node.stop()


@pytest.mark.timeout(900)  # with the base policy's build (~3 min) when it is not cached
def test_devnet_main_job(tmp_path, base_model_dir):
    """The README's first command: chain, bootstrap, trainer, validator and two workers; one
    GRPO step learned from accepted work, every node on the new version, a report, and a
    clean stop by itself. (``base_model_dir`` builds the base policy into the cache the
    devnet reads, outside the command's deadline.)"""
    cache = Path(__file__).resolve().parent.parent / ".cache"  # shared with tiny_model_dir
    report = tmp_path / "report"
    res = subprocess.run(
        [*CLI, "devnet", "--base-dir", str(tmp_path), "--steps", "1", "--report", str(report)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "INTELLECT_NODE_CACHE": str(cache)},
    )
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert "devnet: chain at http://127.0.0.1:" in out and "contract 0x" in out
    assert "devnet: 5 nodes up" in out
    assert "devnet: dashboard of every node at http://127.0.0.1:" in out  # one URL
    assert f"devnet: base model {tmp_path / 'model'}" in out
    assert "devnet: 1 steps done, every node holds version 1" in out
    assert (tmp_path / "model" / "config.json").is_file()
    assert (
        f'model = "{tmp_path / "model"}"'
        in run(
            "start", "--print-config", env={"INTELLECT_NODE_RUN__MODEL": str(tmp_path / "model")}
        ).stdout
    )
    lines = [json.loads(x) for x in (report / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1]
    assert lines[1]["batches_used"] >= 1
    for m in lines:  # both figures: sampled (the headline) and greedy, with pass@k
        assert m["heldout_draws"] == 8
        for key in ("heldout_sampled", "heldout_greedy", "heldout_pass_at_k"):
            assert 0 <= m[key] <= 1, (key, m[key])
        assert set(m["heldout_by_level"]) == {"2", "3"}  # the run's task set: levels 2-3
        assert set(m["heldout_by_level"]["2"]) == {"sampled", "greedy", "pass_at_k"}
    assert "devnet: held-out accuracy, step 0 -> 1: sampled (8 draws per task) " in out
    assert (report / "learning.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "all nodes and the chain stopped" in out


def test_every_argument_of_every_command_says_what_it_is():
    """`--help` explains: no option or positional argument of any command without help."""
    import argparse

    from node.cli.main import build_parser

    bare = []

    def walk(parser, path):
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    walk(sub, [*path, name])
            elif not isinstance(a, argparse._HelpAction) and not a.help:
                bare.append(" ".join([*path, *(a.option_strings or [a.dest])]))

    walk(build_parser(), ["intellect-node"])
    assert bare == []


def test_the_devnet_has_no_cheaters_and_the_tests_devnet_adds_them():
    """``intellect-node devnet`` runs honest nodes only; the tests' devnet
    (``tests/helpers/cheating/devnet.py``) starts its last ``--cheaters`` workers as the
    tests' cheating worker process, checks its flags before anything starts, and says
    where the other flags come from."""
    from node.cli.devnet import Launch
    from tests.helpers.cheating.devnet import cheating_workers

    assert "cheat" not in run("devnet", "--help").stdout.lower()
    wrapper = [sys.executable, "-m", "tests.helpers.cheating.devnet"]
    shown = subprocess.run([*wrapper, "--help"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "--cheaters" in shown.stdout
    assert "intellect-node devnet --help" in " ".join(shown.stdout.split())
    refused = subprocess.run(
        [*wrapper, "--inference", "2", "--cheaters", "3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "--cheaters must be between 0 and --inference" in (
        refused.stderr
    )
    extra = cheating_workers(3, 1, "greedy,truncated")
    assert extra["batches_per_step"] == 2  # the trainer waits for the honest batches only
    honest, cheater = extra["launch"](1), extra["launch"](2)
    assert honest.module == "node.cli" and not honest.env
    assert cheater == Launch(
        "tests.helpers.cheating.worker", {"CHEATS": "greedy,truncated"}, "cheats: greedy,truncated"
    )
    with pytest.raises(ValueError, match="unknown cheat"):
        cheating_workers(2, 1, "teleport")


def test_start_unlocks_the_account_with_its_password_file(tmp_path, monkeypatch):
    """`start --password-file FILE` (as `keys new` and the ledger commands take it) is the
    password the node's roles unlock the keystore with, ahead of INTELLECT_NODE_PASSWORD."""
    import ledger.chain
    import ledger.client
    from ledger.accounts import LIGHT_SCRYPT_N, create_account
    from node.cli.main import _config_from_args, build_parser
    from node.roles.io.chain import open_ledger

    data_dir = tmp_path / "n"
    address = create_account(data_dir, "from-file", scrypt_n=LIGHT_SCRYPT_N).address
    (tmp_path / "pw").write_text("from-file\n")
    monkeypatch.setenv("INTELLECT_NODE_PASSWORD", "from-env")
    monkeypatch.setattr(ledger.chain, "connect", lambda url, **_: url)
    monkeypatch.setattr(
        ledger.client, "LedgerClient", lambda chain, contract, account, **_: account
    )
    flags = ["--data-dir", str(data_dir), "--contract", "0x" + "11" * 20, "--chain.id", "1"]
    args = build_parser().parse_args(["start", *flags, "--password-file", str(tmp_path / "pw")])
    cfg = _config_from_args(args)
    assert cfg.chain.password_file == tmp_path / "pw"
    assert open_ledger(cfg).address == address
