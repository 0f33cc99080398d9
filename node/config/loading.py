"""``load_config``: defaults < TOML file < environment < command-line flags, merged section
by section; and ``config_toml``, the resolved configuration as that TOML file.

An old flat key (``heartbeat_interval`` in the file, ``INTELLECT_NODE_HEARTBEAT_INTERVAL``
in the environment, ``--heartbeat-interval`` on the command line) is refused with one line
naming its new place in all three spellings (``node.config.places``)."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import EnvSettingsSource, SettingsError, TomlConfigSettingsSource

from node.config.node import ENV_NESTED, ENV_PREFIX, NodeConfig
from node.config.places import by_path, moved, section_models, settings


class ConfigError(ValueError):
    """A configuration that cannot be used, with a message for the user."""


def load_config(
    *,
    file: Path | None = None,
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> NodeConfig:
    """Merge defaults < the TOML ``file`` < the environment (``environ``, default
    ``os.environ``) < ``flags`` (setting path, ``net.heartbeat_interval``, -> value; None =
    not given); a ``ConfigError`` names every setting that is wrong by its dotted place."""
    environ = os.environ if environ is None else environ
    toml = _read_toml(file) if file is not None else {}
    given = {k: v for k, v in (flags or {}).items() if v is not None}
    old = _old_keys(toml, environ, given)
    if old:
        raise ConfigError("\n".join(old))
    env = EnvSettingsSource(NodeConfig)
    env.env_vars = {k.lower(): v for k, v in environ.items()}  # case-insensitive, as os's
    try:
        from_env = env()
    except SettingsError as exc:  # a value pydantic-settings cannot parse
        raise ConfigError(f"invalid configuration in the environment: {exc}") from exc
    from_flags: dict[str, Any] = {}
    for path, value in given.items():
        if path not in by_path():
            raise ConfigError(f"unknown setting: {path}")
        section, _, name = path.rpartition(".")
        (from_flags.setdefault(section, {}) if section else from_flags)[name] = value
    merged: dict[str, Any] = {}
    for layer in (toml, from_env, from_flags):
        for key, value in layer.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
    try:
        # model_validate: exactly these layers (the constructor would read os.environ again)
        return NodeConfig.model_validate(merged)
    except ValidationError as exc:
        lines = [f"  {'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in exc.errors()]
        raise ConfigError("invalid configuration:\n" + "\n".join(lines)) from exc


def _read_toml(file: Path) -> dict[str, Any]:
    if not Path(file).is_file():
        raise ConfigError(f"config file not found: {file}")
    try:
        return TomlConfigSettingsSource(NodeConfig, toml_file=Path(file))()
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {file} is not valid TOML: {exc}") from exc


def _old_keys(
    toml: Mapping[str, Any], environ: Mapping[str, str], flags: Mapping[str, Any]
) -> list[str]:
    """One line per old flat key in the file, the environment or the flags."""
    sections, old = section_models(), moved()
    lines = [
        old[key].moved_line(key)
        for key, value in toml.items()
        if key in old and not (key in sections and isinstance(value, dict))
    ]
    for var in environ:
        rest = var.upper().removeprefix(ENV_PREFIX)
        if rest != var.upper() and ENV_NESTED not in rest and rest.lower() in old:
            lines.append(old[rest.lower()].moved_line(var))
    lines += [old[k].moved_line("--" + k.replace("_", "-")) for k in flags if k in old]
    return lines


def config_toml(cfg: NodeConfig) -> str:
    """The resolved config as TOML (what ``--print-config`` shows): the top-level keys, then
    one table per section; it loads back to the same configuration."""
    lines = []
    current: str | None = None
    for s in settings():
        if s.section != current:
            current = s.section
            lines += ["", f"[{current}]"]
        value = getattr(getattr(cfg, s.section) if s.section else cfg, s.name)
        if s.path == "data_dir":
            value = cfg.resolved_data_dir
        if value is not None:
            lines.append(f"{s.name} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return f"[{', '.join(_toml_value(v) for v in value)}]"
    if isinstance(value, str | Path):
        return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(value)
