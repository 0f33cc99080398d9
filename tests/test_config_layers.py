"""The configuration layers: every setting has a generated ``start`` flag, a flag beats the
environment beats the TOML file beats the default (exact values, through the real binary),
and a bad value exits with status 2 naming the setting."""

from __future__ import annotations

import os
import subprocess
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

import pytest

from node.cli.flags import flag_help, flags_given
from node.cli.main import build_parser
from node.config import (
    ConfigError,
    NodeConfig,
    Setting,
    by_path,
    config_toml,
    load_config,
    moved,
    settings,
)
from tests.helpers.net import CLI

# settings whose values follow a pattern a generic rule cannot guess
PATTERNED = {
    "chain.contract": "0x" + "ab" * 20,
    "run.trainer_peer_id": "12D3KooW" + "a" * 44,
    "run.id": "flag-run",
    "run.taskset": "arithmetic:1-2",
    "chain.url": "http://127.0.0.1:9999",
    "chain.public_url": "https://rpc.example.org/v1",
}


P2P = "/p2p/12D3KooWNTfKZ37isa5RWx23UwAhoHxHvSb6jxggwB1qqbZBRF4A"  # a bootstrap names its peer


def _bound(field: Any, attr: str) -> float | None:
    return next(
        (getattr(m, attr) for m in field.metadata if getattr(m, attr, None) is not None), None
    )


def value_of(cfg: NodeConfig, setting: Setting) -> Any:
    return getattr(getattr(cfg, setting.section) if setting.section else cfg, setting.name)


def sample(setting: Setting) -> tuple[list[str], Any]:
    """Command-line words for a value of ``setting`` other than its default, and that value
    as the config holds it."""
    field, name = setting.field, setting.path
    default = field.get_default(call_default_factory=True)
    kind0 = field.annotation
    if typing.get_origin(kind0) in (typing.Union, types.UnionType):
        (kind0,) = [a for a in typing.get_args(kind0) if a is not type(None)]
    if name in PATTERNED:
        return [PATTERNED[name]], PATTERNED[name]
    if typing.get_origin(kind0) is typing.Literal:
        value = next(c for c in typing.get_args(kind0) if c != default)
        return [value], value
    if kind0 is bool:
        return ["false" if default else "true"], not default
    if kind0 is Path:
        return ["/tmp/flag-path"], Path("/tmp/flag-path")
    if kind0 is str or "list[" in str(field.annotation):
        value = f"/ip4/10.0.0.1/tcp/4{len(name)}{P2P}" if "list[" in str(field.annotation) else "x1"
        return [value], [value] if "list[" in str(field.annotation) else value
    number = kind0 if kind0 in (int, float) else type(default)
    lo = _bound(field, "ge") or _bound(field, "gt") or 0
    hi = _bound(field, "le")
    value = number(default + 1) if default is not None else number(lo) + 1
    if hi is not None and value > hi:
        value = number((lo + hi) / 2)
    return [str(value)], value


PRETRAIN = [
    "--diloco.enabled",
    "--trainer.objective",
    "pretrain",
    "--trainer.data",
    "/tmp/flag-path",
]


@pytest.mark.parametrize("short", [False, True])
def test_every_setting_has_a_generated_flag_that_sets_it(short: bool) -> None:
    """``--<section>.<name>`` sets each setting (``--role`` a top-level one); so does each
    short flag a field declares (``--bootstrap``: net.bootstrap)."""
    start = build_parser()
    chosen = [s for s in settings() if s.short_flag] if short else settings()
    assert len(chosen) >= (1 if short else 80)
    for setting in chosen:
        words, value = sample(setting)
        argv = ["start", (setting.short_flag if short else setting.flag) or "", *words]
        if setting.path in ("trainer.objective", "trainer.data"):  # each needs the other
            argv += PRETRAIN
        cfg = load_config(flags=flags_given(start.parse_args(argv)), environ={})
        assert value_of(cfg, setting) == value, (setting.path, argv)
        assert value != setting.field.get_default(call_default_factory=True)


def test_short_flags_are_few_and_name_their_setting() -> None:
    shorts = {s.short_flag: s.path for s in settings() if s.short_flag}
    assert shorts == {
        "--run-id": "run.id",
        "--model": "run.model",
        "--listen": "net.listen",
        "--bootstrap": "net.bootstrap",
        "--chain": "chain.url",
        "--contract": "chain.contract",
        "--password-file": "chain.password_file",  # as `keys new` and the ledger commands
    }


def test_start_help_lists_every_setting_with_its_env_var() -> None:
    text = subprocess.run(
        [*CLI, "start", "--help"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    flat = " ".join(text.split())
    for s in settings():
        assert s.flag in text, s.path
        assert s.env in flat.replace("_ ", "_"), s.path
    assert "[net] settings:" in text and "[trainer] settings:" in text
    assert "INTELLECT_NODE_NET__HEARTBEAT_INTERVAL" in flat
    assert "flag > environment > TOML file > default" in flat
    assert "--heartbeat-interval" not in text  # an old flag is not offered


def printed(tmp_path: Path, *flags: str, env: dict[str, str], toml: str | None) -> dict[str, Any]:
    """``start --print-config`` through the binary, parsed back."""
    argv = [*CLI, "start", "--data-dir", str(tmp_path / "d"), "--print-config", *flags]
    if toml is not None:
        (tmp_path / "node.toml").write_text(toml)
        argv += ["--config", str(tmp_path / "node.toml")]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("INTELLECT_NODE_")}
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60, env={**clean, **env})
    assert res.returncode == 0, res.stderr
    return tomllib.loads(res.stdout)


def test_flag_beats_env_beats_toml_beats_default(tmp_path: Path) -> None:
    """Sections in the file, ``__`` in the environment, dots on the command line: each layer
    overrides the one below it setting by setting, within a section too (the file's
    peer_ttl stays under the environment's heartbeat_interval)."""
    toml = (
        "network_only = true\n[net]\nheartbeat_interval = 2.5\npeer_ttl = 40\n"
        f'bootstrap = ["/ip4/1.1.1.1/tcp/1{P2P}"]\n[trainer]\nsteps = 7\n'
    )
    env = {
        "INTELLECT_NODE_NET__HEARTBEAT_INTERVAL": "3.5",
        "INTELLECT_NODE_NET__BOOTSTRAP": f"/ip4/2.2.2.2/tcp/2{P2P}, /ip4/3.3.3.3/tcp/3{P2P}",
        "INTELLECT_NODE_NETWORK_ONLY": "false",
    }
    flags = ["--net.heartbeat-interval", "4.5", "--bootstrap", f"/ip4/4.4.4.4/tcp/4{P2P}"]
    flags += ["--net.bootstrap", f"/ip4/5.5.5.5/tcp/5{P2P}", "--network-only"]
    got = printed(tmp_path, *flags, env=env, toml=toml)
    assert got["net"]["heartbeat_interval"] == 4.5 and got["net"]["peer_ttl"] == 40
    assert got["net"]["bootstrap"] == [f"/ip4/4.4.4.4/tcp/4{P2P}", f"/ip4/5.5.5.5/tcp/5{P2P}"]
    assert got["network_only"] is True and got["trainer"]["steps"] == 7
    got = printed(tmp_path, env=env, toml=toml)
    assert got["net"]["heartbeat_interval"] == 3.5 and got["net"]["peer_ttl"] == 40
    assert got["net"]["bootstrap"] == [f"/ip4/2.2.2.2/tcp/2{P2P}", f"/ip4/3.3.3.3/tcp/3{P2P}"]
    assert got["network_only"] is False
    got = printed(tmp_path, env={}, toml=toml)
    assert got["net"]["heartbeat_interval"] == 2.5
    assert got["net"]["bootstrap"] == [f"/ip4/1.1.1.1/tcp/1{P2P}"]
    assert got["network_only"] is True
    got = printed(tmp_path, env={}, toml=None)
    assert got["net"]["heartbeat_interval"] == 5.0 and got["network_only"] is False
    assert got["net"]["bootstrap"] == [] and got["trainer"]["steps"] == 0


@pytest.mark.parametrize(
    ("argv", "env", "names"),
    [
        (["--admin.port", "70000"], {}, "admin.port: Input should be less than"),
        (["--net.heartbeat-interval", "soon"], {}, "--net.heartbeat-interval"),
        (["--network-only", "maybe"], {}, "--network-only"),
        (["--role", "king"], {}, "--role"),
        ([], {"INTELLECT_NODE_ADMIN__PORT": "lots"}, "admin.port: Input should be a valid"),
        ([], {"INTELLECT_NODE_SHARDCAST__UPLOAD_SLOTS": "0"}, "shardcast.upload_slots: "),
        ([], {"INTELLECT_NODE_NET__PEER_TTL": "1"}, "net: Value error, peer_ttl must be longer"),
        (
            ["--listen", "/ip4/0.0.0.0/tcp/99999"],
            {},
            "net.listen: Value error, '/ip4/0.0.0.0/tcp/99999",
        ),
        (["--listen", "/ip4/127.0.0.1/udp/5"], {}, "a node listens on TCP"),
        (["--bootstrap", "/ip4/127.0.0.1/tcp/1"], {}, "must end in /p2p/<peer id>"),
        ([], {"INTELLECT_NODE_NET__BOOTSTRAP": "garbage"}, "'garbage' is not a multiaddr"),
    ],
)
def test_a_bad_value_exits_2_naming_the_setting(
    tmp_path: Path, argv: list[str], env: dict[str, str], names: str
) -> None:
    res = subprocess.run(
        [*CLI, "start", "--data-dir", str(tmp_path), "--print-config", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert res.returncode == 2, res.stdout + res.stderr
    assert names in res.stderr and "Traceback" not in res.stderr
    assert res.stdout == ""


def test_a_config_built_in_code_ignores_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only ``load_config`` reads the environment; a ``NodeConfig(...)`` built in code is
    exactly its arguments over the defaults."""
    monkeypatch.setenv("INTELLECT_NODE_VALIDATOR__SPOT_CHECK", "0.5")
    assert NodeConfig().validator.spot_check == 1.0
    env = {"INTELLECT_NODE_VALIDATOR__SPOT_CHECK": "0.5"}
    assert load_config(environ=env).validator.spot_check == 0.5
    assert load_config().validator.spot_check == 0.5  # os.environ, through load_config


def test_a_flag_says_its_default_once() -> None:
    """A description that states the default (``--data-dir``: ~/.intellect-node/<name>) is
    not followed by "Default: none"; every other one ends with its default."""
    for s in settings():
        text = flag_help(s)
        assert "Default: none" not in text or "default" not in (s.field.description or "").lower()
        assert "default" in text.lower(), s.path
    data_dir = flag_help(by_path()["data_dir"])
    assert "~/.intellect-node/<name>" in data_dir and "Default: none" not in data_dir
    threads = flag_help(by_path()["engine.torch_threads"])
    assert "Default: 0." in threads  # its description names torch's default, not its own


MOVED = (
    "moved: [net] heartbeat_interval (--net.heartbeat-interval, "
    "INTELLECT_NODE_NET__HEARTBEAT_INTERVAL)"
)


@pytest.mark.parametrize(
    ("argv", "env", "toml", "line"),
    [
        ([], {}, "heartbeat_interval = 1.0\n", f"heartbeat_interval {MOVED}"),
        (
            [],
            {"INTELLECT_NODE_HEARTBEAT_INTERVAL": "1"},
            None,
            f"INTELLECT_NODE_HEARTBEAT_INTERVAL {MOVED}",
        ),
        (["--heartbeat-interval", "1"], {}, None, f"--heartbeat-interval {MOVED}"),
        # an old key that is now a section's name: a value, not a table
        ([], {}, "diloco = true\n", "diloco moved: [diloco] enabled (--diloco.enabled, "),
        ([], {"INTELLECT_NODE_CHAIN": "http://x"}, None, "INTELLECT_NODE_CHAIN moved: [chain] url"),
        (["--relay"], {}, None, "--relay moved: [relay] enabled (--relay.enabled, "),
        (["--train-steps", "3"], {}, None, "--train-steps moved: [trainer] steps (--trainer.steps"),
    ],
)
def test_an_old_flat_key_is_refused_in_one_line(
    tmp_path: Path, argv: list[str], env: dict[str, str], toml: str | None, line: str
) -> None:
    """In the file, the environment or the flags: exit 2 and one line naming the new place
    in all three spellings."""
    cmd = [*CLI, "start", "--data-dir", str(tmp_path), "--print-config", *argv]
    if toml is not None:
        (tmp_path / "node.toml").write_text(toml)
        cmd += ["--config", str(tmp_path / "node.toml")]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("INTELLECT_NODE_")}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env={**clean, **env})
    assert res.returncode == 2 and res.stdout == "", res.stdout + res.stderr
    assert res.stderr.count("\n") == 1 and line in res.stderr, res.stderr


def test_every_old_flat_name_maps_to_a_place() -> None:
    """The old-to-new map is the model's: each section field's old name, once."""
    old = moved()
    assert old["heartbeat_interval"].path == "net.heartbeat_interval"
    assert old["train_device"].path == "trainer.device"
    assert old["engine_batch"].path == "engine.batch"
    assert old["relay_circuit_bytes"].path == "relay.circuit_bytes"
    assert old["chain_id"].path == "chain.id" and old["run_id"].path == "run.id"
    assert old["admin_port"].path == "admin.port" and old["diloco"].path == "diloco.enabled"
    top = {s.name for s in settings() if s.section is None}
    assert top == {"role", "name", "data_dir", "log_level", "network_only"}
    newer = {s.path for s in settings() if s.section is not None and s.was is None}
    assert newer == {"chain.password_file"}  # came after the sections: never flat
    assert len(old) + len(top) + len(newer) == len(settings())
    with pytest.raises(
        ConfigError, match="^--run-id moved: \\[run\\] id \\(--run.id, INTELLECT_NODE_RUN__ID\\)$"
    ):
        load_config(flags={"run_id": "x"}, environ={})


def test_print_config_is_by_section_and_loads_back(tmp_path: Path) -> None:
    """Top-level keys first, then ``[run]``, ``[net]``, ...; the printed file loads back to
    the same configuration."""
    cfg = load_config(
        environ={},
        flags={
            "role": "trainer",
            "data_dir": tmp_path / "d",
            "net.bootstrap": [f"/ip4/1.1.1.1/tcp/1{P2P}"],
            "net.peer_ttl": 45.5,
            "trainer.learning_rate": 1e-5,
            "diloco.enabled": True,
            "diloco.admit": ["12D3KooW" + "a" * 44],
            "run.taskset": 'arith"metic',
            "chain.id": 7,
        },
    )
    text = config_toml(cfg)
    parsed = tomllib.loads(text)
    assert list(parsed)[:5] == ["role", "data_dir", "log_level", "network_only", "run"]
    assert [k for k in parsed if isinstance(parsed[k], dict)] == [
        "run",
        "net",
        "relay",
        "chain",
        "shardcast",
        "engine",
        "inference",
        "validator",
        "admin",
        "trainer",
        "diloco",
    ]
    assert text.index("[run]") < text.index("[net]") < text.index("[diloco]")
    assert parsed["net"]["peer_ttl"] == 45.5 and parsed["chain"]["id"] == 7
    (tmp_path / "printed.toml").write_text(text)
    again = load_config(file=tmp_path / "printed.toml", environ={})
    assert again == cfg
    assert config_toml(again) == text


def test_a_cross_section_check_names_both_places() -> None:
    """Pretraining needs a DiLoCo group: a check of the root, across [trainer] and [diloco]."""
    flags = {"trainer.objective": "pretrain", "trainer.data": "/tmp/p"}
    with pytest.raises(ConfigError, match=r"trainer.objective pretrain .* \[diloco\] enabled"):
        load_config(flags=flags, environ={})
    assert load_config(flags={**flags, "diloco.enabled": True}, environ={}).diloco.enabled
