"""``intellect-node start``'s flags, generated from ``NodeConfig``'s fields.

One flag per setting: ``--<name with dashes>``, its type, choices or repeatability from the
field's annotation, its help from the field's description, default and environment
variable. A setting is declared once (``node/config.py``); this parser and the
configuration reference (``scripts/config_reference.py``) both read it from there. Every
flag defaults to None (not given), so ``load_config`` can put flags over the environment
and the TOML file; pydantic checks the bounds and reports by setting name.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo

from node.config import ENV_PREFIX, NodeConfig

TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
METAVARS: dict[Any, str] = {int: "INT", float: "NUM", str: "TEXT", Path: "PATH"}


def flag_name(setting: str) -> str:
    """``heartbeat_interval`` -> ``--heartbeat-interval``."""
    return "--" + setting.replace("_", "-")


def parse_bool(text: str) -> bool:
    """``true``/``false`` (also 1/0, yes/no, on/off), as the environment takes them."""
    if text.lower() in TRUE:
        return True
    if text.lower() in FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _argument_kind(setting: str, annotation: Any) -> dict[str, Any]:
    """argparse keywords for a field's type; ``X | None`` is treated as ``X``."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        (annotation,) = [a for a in typing.get_args(annotation) if a is not type(None)]
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return {"choices": list(typing.get_args(annotation))}
    if origin is list:
        item = typing.get_args(annotation)[0]
        return {"action": "append", "type": item, "metavar": METAVARS[item]}
    if annotation is bool:  # --flag alone means true; --flag false turns a default off
        return {"nargs": "?", "const": True, "type": parse_bool, "metavar": "true|false"}
    if annotation in (int, float, str, Path):
        return {"type": annotation, "metavar": METAVARS[annotation]}
    raise TypeError(f"no command-line flag for setting {setting!r} of type {annotation!r}")


def _default_text(field: FieldInfo) -> str:
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ", ".join(value) or "none"
    return str(value)


def flag_help(setting: str, field: FieldInfo) -> str:
    """The field's description, its default and its environment variable (``%`` escaped
    for argparse)."""
    text = (field.description or "").rstrip()
    if typing.get_origin(field.annotation) is list:
        text += " Repeatable."
    unset = field.get_default(call_default_factory=True) is None
    if not (unset and "default" in text.lower()):  # not "Default: none" after the real one
        text += f" Default: {_default_text(field)}."
    text += f" Env: {ENV_PREFIX}{setting.upper()}."
    return text.replace("%", "%%")


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per ``NodeConfig`` field, in the model's order."""
    for setting, field in NodeConfig.model_fields.items():
        kind = _argument_kind(setting, field.annotation)
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        if "metavar" in extra:
            kind["metavar"] = extra["metavar"]
        parser.add_argument(
            flag_name(setting),
            dest=setting,
            default=None,
            help=flag_help(setting, field),
            **kind,
        )


def flags_given(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given as flags (None: not given, so a lower layer decides)."""
    return {k: v for k, v in vars(args).items() if k in NodeConfig.model_fields and v is not None}


def at_least(lo: int) -> Callable[[str], int]:
    """An argparse type: an integer ``lo`` or more (the error before any model loads)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"must be {lo} or more, got {value}")
        return value

    return parse
