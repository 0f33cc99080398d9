"""The roles a node plays, each a service the runtime starts: ``inference`` generates and
submits rollout batches, ``validator`` judges them, ``trainer`` turns accepted batches
into new policies (alone, or with ``--diloco.enabled`` as one member of a DiLoCo group; with
``--trainer.objective pretrain`` the group pretrains on a text file instead). The
decisions each role makes live in small pure classes beside it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def role_service(
    role: str, *, diloco: bool = False, objective: str = "grpo"
) -> Callable[..., Any] | None:
    """``run(node, cfg, *, task_status)`` of a role, None for the bootstrap (network only);
    ``diloco``: the trainer as a member of a DiLoCo group (``node/roles/grouptrainer.py``),
    with ``objective`` ``pretrain`` on a text corpus (``node/roles/pretrainer.py``).
    Imported here, on start, so that ``--help`` stays instant."""
    if role == "inference":
        from node.roles.inference import run

        return run
    if role == "validator":
        from node.roles.validator import run as run_validator

        return run_validator
    if role == "trainer" and diloco and objective == "pretrain":
        from node.roles.pretrainer import run as run_pretrainer

        return run_pretrainer
    if role == "trainer" and diloco:
        from node.roles.grouptrainer import run as run_group_trainer

        return run_group_trainer
    if role == "trainer":
        from node.roles.trainer import run as run_trainer

        return run_trainer
    return None
