"""What every configuration section shares: a pydantic model that refuses unknown keys and
checks an assignment as it checks a load.

A field may say, in ``json_schema_extra``, three things the generated surfaces read:
``metavar`` (its placeholder in ``--help``), ``flag`` (a short command-line flag beside the
dotted one, for the few settings people type every day) and ``was`` (its name when every
setting was flat, where that differs from its own; ``None``: it never was one). Without
``was`` a section's field had its own name as a flat setting, so ``node.config.places``
derives the old-to-new map from the model itself: no list of names is kept twice.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict
from pydantic_settings import NoDecode

# a list from the environment is comma-separated text, not JSON (``split_commas``)
Multiaddrs = Annotated[list[str], NoDecode]
PeerIds = Annotated[list[str], NoDecode]


class Section(BaseModel):
    """One ``[section]`` of the configuration (its docstring is the section's help)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def split_commas(v: Any) -> Any:
    """``"a, b"`` -> ``["a", "b"]`` (a list's spelling in the environment)."""
    if isinstance(v, str):
        return [p.strip() for p in v.split(",") if p.strip()]
    return v
