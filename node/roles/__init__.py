"""The roles a node plays, each a service the runtime starts: ``inference`` generates and
submits rollout batches, ``validator`` judges them, ``trainer`` turns accepted batches
into new policies (alone, or with ``--diloco.enabled`` as one member of a DiLoCo group; with
``--trainer.objective pretrain`` the group pretrains on a text file instead).

Grouped by kind, lowest first (``tests/test_quality.py`` keeps the imports downward):
- ``decisions/``: pure decisions and the words they share (no network, no chain, no clock);
- ``children/``: what runs in a child process, and ``offload``, which starts it;
- ``io/``: the roles' parts that read the chain and talk to peers;
- ``services/``: the roles themselves, trio services with a run loop.
``given.py`` says what a role is given (the ledger, the weights, its child process)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from node.roles.given import RoleRun


def role_service(role: str, *, diloco: bool = False, objective: str = "grpo") -> RoleRun | None:
    """``run(node, cfg, *, task_status)`` of a role, None for the bootstrap (network only);
    ``diloco``: the trainer as a member of a DiLoCo group (``node/roles/services/grouptrainer.py``),
    with ``objective`` ``pretrain`` on a text corpus (``node/roles/services/pretrainer.py``).
    Imported here, on start, so that ``--help`` stays instant."""
    if role == "inference":
        from node.roles.services.inference import run

        return run
    if role == "validator":
        from node.roles.services.validator import run as run_validator

        return run_validator
    if role == "trainer" and diloco and objective == "pretrain":
        from node.roles.services.pretrainer import run as run_pretrainer

        return run_pretrainer
    if role == "trainer" and diloco:
        from node.roles.services.grouptrainer import run as run_group_trainer

        return run_group_trainer
    if role == "trainer":
        from node.roles.services.trainer import run as run_trainer

        return run_trainer
    return None
