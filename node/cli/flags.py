"""``intellect-node start``'s flags, generated from ``NodeConfig``'s sections and fields.

One flag per setting: ``--<section>.<name with dashes>`` (``--net.heartbeat-interval``), a
top-level key's without a section (``--role``), and a short one beside it where the field
declares it (``--bootstrap``); its type, choices or repeatability from the field's
annotation, its help from the field's description, default and environment variable, under
a heading per section. A setting is declared once (``node/config/``); this parser and the
configuration reference (``scripts/config_reference.py``) both read it from there. Every
flag defaults to None (not given), so ``load_config`` can put flags over the environment
and the TOML file; pydantic checks the bounds and reports by setting place. An old flat
flag (``--heartbeat-interval``) is accepted by the parser only so that ``load_config`` can
answer it with its new place, in one line.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from node.config import Setting, moved, section_models, settings

TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
METAVARS: dict[Any, str] = {int: "INT", float: "NUM", str: "TEXT", Path: "PATH"}
OLD = "moved:"  # the destination prefix of an old flat flag


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


def _default_text(setting: Setting) -> str:
    value = setting.field.get_default(call_default_factory=True)
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ", ".join(value) or "none"
    return str(value)


def flag_help(setting: Setting) -> str:
    """The field's description, its default and its environment variable (``%`` escaped
    for argparse)."""
    field = setting.field
    text = (field.description or "").rstrip()
    if typing.get_origin(field.annotation) is list:
        text += " Repeatable."
    unset = field.get_default(call_default_factory=True) is None
    if not (unset and "default" in text.lower()):  # not "Default: none" after the real one
        text += f" Default: {_default_text(setting)}."
    text += f" Env: {setting.env}."
    return text.replace("%", "%%")


def flag_strings(setting: Setting) -> list[str]:
    """The setting's flags: the dotted one first, then its short one if it has one."""
    short = setting.short_flag
    return [setting.flag, short] if short else [setting.flag]


class _OldFlag(argparse.Action):
    """An old flat flag: remembered (with its value, if any) for ``load_config`` to refuse."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, True)


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per setting, in the model's order, under a heading per section."""
    groups: dict[str | None, Any] = {None: parser}
    docs = {
        name: (model.__doc__ or "").split("\n\n")[0] for name, model in section_models().items()
    }
    for setting in settings():
        section = setting.section
        if section is not None and section not in groups:
            note = " ".join(docs[section].split())
            groups[section] = parser.add_argument_group(f"[{section}] settings", note)
        kind = _argument_kind(setting.path, setting.field.annotation)
        if "metavar" in setting.extra:
            kind["metavar"] = setting.extra["metavar"]
        groups[section].add_argument(
            *flag_strings(setting),
            dest=setting.path,
            default=None,
            help=flag_help(setting),
            **kind,
        )
    taken = {s.short_flag for s in settings()} | {s.flag for s in settings()}
    for old in moved():
        flag = "--" + old.replace("_", "-")
        if flag not in taken:
            parser.add_argument(
                flag, dest=OLD + old, nargs="?", action=_OldFlag, help=argparse.SUPPRESS
            )


def flags_given(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given as flags, by place (``net.heartbeat_interval``; None: not given,
    so a lower layer decides), and any old flat flag by its old name (``load_config``
    refuses it, naming the new place)."""
    paths = {s.path for s in settings()}
    given = {k: v for k, v in vars(args).items() if k in paths and v is not None}
    given.update(
        {k.removeprefix(OLD): True for k, v in vars(args).items() if k.startswith(OLD) and v}
    )
    return given


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
