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

from node.cli.flags import flag_name, flags_given
from node.cli.main import build_parser
from node.config import NodeConfig, load_config
from tests.helpers.net import CLI

# settings whose values follow a pattern a generic rule cannot guess
PATTERNED = {
    "contract": "0x" + "ab" * 20,
    "trainer_peer_id": "12D3KooW" + "a" * 44,
    "run_id": "flag-run",
    "taskset": "arithmetic:1-2",
    "chain": "http://127.0.0.1:9999",
}


P2P = "/p2p/12D3KooWNTfKZ37isa5RWx23UwAhoHxHvSb6jxggwB1qqbZBRF4A"  # a bootstrap names its peer


def _bound(field: Any, attr: str) -> float | None:
    return next(
        (getattr(m, attr) for m in field.metadata if getattr(m, attr, None) is not None), None
    )


def sample(name: str) -> tuple[list[str], Any]:
    """Command-line words for a value of ``name`` other than its default, and that value
    as the config holds it."""
    field = NodeConfig.model_fields[name]
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


def test_every_setting_has_a_generated_flag_that_sets_it() -> None:
    start = build_parser()
    for name in NodeConfig.model_fields:
        words, value = sample(name)
        argv = ["start", flag_name(name), *words]
        if name in ("objective", "data"):  # each needs the other, and a DiLoCo group
            argv += ["--diloco", "--objective", "pretrain", "--data", "/tmp/flag-path"]
        args = start.parse_args(argv)
        cfg = load_config(flags=flags_given(args), environ={})
        assert getattr(cfg, name) == value, (name, argv)
        assert value != NodeConfig.model_fields[name].get_default(call_default_factory=True)


def test_start_help_lists_every_setting_with_its_env_var() -> None:
    text = subprocess.run(
        [*CLI, "start", "--help"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    flat = " ".join(text.split())
    for name in NodeConfig.model_fields:
        assert flag_name(name) in text, name
        assert f"INTELLECT_NODE_{name.upper()}" in flat.replace("_ ", "_"), name
    assert "flag > environment > TOML file > default" in flat


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
    toml = (
        f'heartbeat_interval = 2.5\nbootstrap = ["/ip4/1.1.1.1/tcp/1{P2P}"]\nnetwork_only = true\n'
    )
    env = {
        "INTELLECT_NODE_HEARTBEAT_INTERVAL": "3.5",
        "INTELLECT_NODE_BOOTSTRAP": f"/ip4/2.2.2.2/tcp/2{P2P}, /ip4/3.3.3.3/tcp/3{P2P}",
        "INTELLECT_NODE_NETWORK_ONLY": "false",
    }
    flags = ["--heartbeat-interval", "4.5", "--bootstrap", f"/ip4/4.4.4.4/tcp/4{P2P}"]
    flags += ["--bootstrap", f"/ip4/5.5.5.5/tcp/5{P2P}", "--network-only"]
    got = printed(tmp_path, *flags, env=env, toml=toml)
    assert got["heartbeat_interval"] == 4.5
    assert got["bootstrap"] == [f"/ip4/4.4.4.4/tcp/4{P2P}", f"/ip4/5.5.5.5/tcp/5{P2P}"]
    assert got["network_only"] is True
    got = printed(tmp_path, env=env, toml=toml)
    assert got["heartbeat_interval"] == 3.5
    assert got["bootstrap"] == [f"/ip4/2.2.2.2/tcp/2{P2P}", f"/ip4/3.3.3.3/tcp/3{P2P}"]
    assert got["network_only"] is False
    got = printed(tmp_path, env={}, toml=toml)
    assert got["heartbeat_interval"] == 2.5
    assert got["bootstrap"] == [f"/ip4/1.1.1.1/tcp/1{P2P}"]
    assert got["network_only"] is True
    got = printed(tmp_path, env={}, toml=None)
    assert got["heartbeat_interval"] == 5.0 and got["network_only"] is False
    assert got["bootstrap"] == []


@pytest.mark.parametrize(
    ("argv", "env", "names"),
    [
        (["--admin-port", "70000"], {}, "admin_port"),
        (["--heartbeat-interval", "soon"], {}, "--heartbeat-interval"),
        (["--network-only", "maybe"], {}, "--network-only"),
        (["--role", "king"], {}, "--role"),
        ([], {"INTELLECT_NODE_ADMIN_PORT": "lots"}, "admin_port"),
        ([], {"INTELLECT_NODE_UPLOAD_SLOTS": "0"}, "upload_slots"),
        (
            ["--listen", "/ip4/0.0.0.0/tcp/99999"],
            {},
            "listen: Value error, '/ip4/0.0.0.0/tcp/99999",
        ),
        (["--listen", "/ip4/127.0.0.1/udp/5"], {}, "a node listens on TCP"),
        (["--bootstrap", "/ip4/127.0.0.1/tcp/1"], {}, "must end in /p2p/<peer id>"),
        ([], {"INTELLECT_NODE_BOOTSTRAP": "garbage"}, "'garbage' is not a multiaddr"),
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


def test_a_config_built_in_code_ignores_the_environment(monkeypatch):
    """Only ``load_config`` reads the environment; a ``NodeConfig(...)`` built in code is
    exactly its arguments over the defaults."""
    monkeypatch.setenv("INTELLECT_NODE_SPOT_CHECK", "0.5")
    assert NodeConfig().spot_check == 1.0
    assert load_config(environ={"INTELLECT_NODE_SPOT_CHECK": "0.5"}).spot_check == 0.5
    assert load_config().spot_check == 0.5  # os.environ, through load_config


def test_a_flag_says_its_default_once() -> None:
    """A description that states the default (``--data-dir``: ~/.intellect-node/<name>) is
    not followed by "Default: none"; every other one ends with its default."""
    from node.cli.flags import flag_help

    for name, field in NodeConfig.model_fields.items():
        text = flag_help(name, field)
        assert "Default: none" not in text or "default" not in (field.description or "").lower()
        assert "default" in text.lower(), name
    data_dir = flag_help("data_dir", NodeConfig.model_fields["data_dir"])
    assert "~/.intellect-node/<name>" in data_dir and "Default: none" not in data_dir
    threads = flag_help("torch_threads", NodeConfig.model_fields["torch_threads"])
    assert "Default: 0." in threads  # its description names torch's default, not its own
