"""A trainer's part in its DiLoCo group's rounds: the formation (an all-reduce of a zero
vector, whose roster is the group's first) and each outer step's all-reduce of the
pseudo-gradient (``node/diloco/group.py``). Which member trains on which batch is decided
in ``node/roles/decisions/grouping.py``; joining a running group in ``node/roles/io/joining.py``.

With a sparse encoding the group holds back what it did not send (error feedback, SPEC §15):
``keep_feedback`` writes that buffer beside checkpoint ``n`` (``v{n}.feedback``, safetensors,
pruned with the checkpoint), ``resume_feedback`` takes it back when the member restarts from
checkpoint ``n``, so a restart neither loses nor repeats any of it. A joiner's recovery
resets it (``node/roles/io/joining.py``): the leader's remainder is the leader's to send.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from node.files import write_atomic

if TYPE_CHECKING:
    import torch

    from node.diloco.group import DilocoGroup, Reduced
    from node.roles.children.grouppolicy import Delta
    from node.roles.children.offload import Offload

log = logging.getLogger("intellect.trainer")
FORMATION_VALUES = 16  # the zero vector the formation all-reduces
FEEDBACK = "feedback"  # the one tensor of a ``v{n}.feedback`` file


def feedback_path(checkpoints: Path, version: int) -> Path:
    return Path(checkpoints) / f"v{version}.feedback"


async def keep_feedback(group: DilocoGroup, checkpoints: Path, version: int) -> None:
    """Write the group's error-feedback buffer after the outer step that made ``version``
    (nothing without error feedback)."""
    from safetensors.torch import save

    buf = group.feedback.buffer
    if not group.cfg.compressor.feedback or buf is None:
        return
    data = save({FEEDBACK: buf.detach().contiguous()})
    await trio.to_thread.run_sync(write_atomic, feedback_path(checkpoints, version), data)


def resume_feedback(group: DilocoGroup, checkpoints: Path, version: int) -> bool:
    """Take back the buffer written with checkpoint ``version``, if any and sound (flat
    fp32, finite; anything else starts from zero, with a warning)."""
    import torch
    from safetensors.torch import load

    path = feedback_path(checkpoints, version)
    if not group.cfg.compressor.feedback or not path.exists():
        return False
    try:
        buf = load(path.read_bytes())[FEEDBACK]
        if buf.dtype != torch.float32 or buf.dim() != 1 or not bool(torch.isfinite(buf).all()):
            raise ValueError("not a finite flat fp32 tensor")
    except Exception as exc:  # a damaged file: the remainder is lost, never wrong
        log.warning("DiLoCo: error feedback of version %d not taken back: %s", version, exc)
        return False
    group.feedback.buffer = buf
    log.info("DiLoCo: error feedback of version %d taken back (%d values)", version, buf.numel())
    return True


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
