"""Where each setting lives and how it is spelled, derived from ``NodeConfig``: its TOML
place (``[net] heartbeat_interval``), environment variable
(``INTELLECT_NODE_NET__HEARTBEAT_INTERVAL``), flag (``--net.heartbeat-interval``, and a
short one where the field declares it) and the flat name it had before the sections came
(the one-line answer to an old key: ``moved``)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from pydantic.fields import FieldInfo

from node.config.node import ENV_NESTED, ENV_PREFIX, NodeConfig
from node.config.section import Section


@dataclass(frozen=True)
class Setting:
    """One setting: ``section`` None for a top-level key (``role``)."""

    section: str | None
    name: str
    field: FieldInfo

    @property
    def extra(self) -> dict[str, Any]:
        extra = self.field.json_schema_extra
        return extra if isinstance(extra, dict) else {}

    @property
    def path(self) -> str:
        """``net.heartbeat_interval``: how errors and flags' destinations name it."""
        return f"{self.section}.{self.name}" if self.section else self.name

    @property
    def toml(self) -> str:
        return f"[{self.section}] {self.name}" if self.section else self.name

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.path.replace(".", ENV_NESTED).upper()

    @property
    def flag(self) -> str:
        return "--" + self.path.replace("_", "-")

    @property
    def short_flag(self) -> str | None:
        short = self.extra.get("flag")
        return str(short) if short else None

    @property
    def was(self) -> str | None:
        """Its flat name before the sections (a section's field: its own name unless it
        declares ``was``); None for a top-level key, which never moved."""
        if self.section is None:
            return None
        was = self.extra.get("was", self.name)
        return str(was) if was else None

    def moved_line(self, spelled: str) -> str:
        """The one line that answers an old key, ``spelled`` as the user wrote it."""
        return f"{spelled} moved: {self.toml} ({self.flag}, {self.env})"


def section_models() -> dict[str, type[Section]]:
    """Section name -> its model, in the order TOML prints them."""
    out: dict[str, type[Section]] = {}
    for name, field in NodeConfig.model_fields.items():
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, Section):
            out[name] = kind
    return out


@cache
def settings() -> tuple[Setting, ...]:
    """Every setting: the top-level keys, then each section's fields, in the model's order."""
    sections = section_models()
    top = [Setting(None, n, f) for n, f in NodeConfig.model_fields.items() if n not in sections]
    nested = [
        Setting(s, n, f) for s, model in sections.items() for n, f in model.model_fields.items()
    ]
    return (*top, *nested)


@cache
def by_path() -> dict[str, Setting]:
    return {s.path: s for s in settings()}


@cache
def moved() -> dict[str, Setting]:
    """Old flat name -> the setting it became (derived: nothing here is kept by hand)."""
    return {s.was: s for s in settings() if s.was is not None}
