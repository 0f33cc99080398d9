"""A trainer's part in its DiLoCo group's rounds: the formation (an all-reduce of a zero
vector, whose roster is the group's first) and each outer step's all-reduce of the
pseudo-gradient (``node/diloco/group.py``). Which member trains on which batch is decided
in ``node/roles/decisions/grouping.py``; joining a running group in ``node/roles/io/joining.py``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from node.diloco.group import DilocoGroup, Reduced
    from node.roles.children.grouppolicy import Delta
    from node.roles.children.offload import Offload

log = logging.getLogger("intellect.trainer")
FORMATION_VALUES = 16  # the zero vector the formation all-reduces


async def reduce(group: DilocoGroup, step: int, vector: torch.Tensor, delta: Delta) -> Reduced:
    """One all-reduce of the group for ``step`` (the member's Δ state and layout beside
    ``vector``); a failure is logged with its step and raised."""
    from node.diloco.group import GroupError

    try:
        return await group.all_reduce(step, vector, delta.state, delta.layout)
    except GroupError as exc:
        log.error("DiLoCo: outer step %d: %s", step, exc)
        raise


async def form(group: DilocoGroup, policy: Offload, step: int) -> Reduced:
    """The group's formation at version ``step``: an all-reduce of a zero vector, whose
    roster is the group's first."""
    import torch

    from node.roles.children.grouppolicy import PseudoGradient

    delta: Delta = await policy.call(PseudoGradient())
    return await reduce(group, step, torch.zeros(FORMATION_VALUES), delta)
