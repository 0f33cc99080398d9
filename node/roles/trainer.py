"""The trainer role: the run's clock (and, with GRPO, the policy).

Workers take their step from the trainer, never from themselves: task assignment depends
on it (SPEC §13). Until training is built this role announces a ``StepNotice`` (step,
policy version 0: the model directory every node was started with) every
``step_interval`` seconds on the ``steps`` topic; the step advances by one each time and
survives a restart (``trainer-state.json`` in the data dir). Workers and validators accept
the notices only under ``trainer_peer_id``.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import trio

from node.config import NodeConfig
from node.files import write_atomic
from node.runtime import Node
from protocol.batches import STEP_TOPIC, StepNotice

log = logging.getLogger("intellect.trainer")
STATE_FILE = "trainer-state.json"


class TrainerRole:
    def __init__(self, node: Node, cfg: NodeConfig) -> None:
        self.node, self.cfg = node, cfg
        self.state_path = cfg.resolved_data_dir / STATE_FILE
        self.step = self._load_step()
        self.policy_version = 0

    def _load_step(self) -> int:
        try:
            return int(json.loads(self.state_path.read_text())["step"]) + 1
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return 0

    def _save_step(self) -> None:
        write_atomic(self.state_path, json.dumps({"step": self.step}).encode())

    def status(self) -> dict[str, Any]:
        return {"step": self.step, "policy_version": self.policy_version}

    async def serve(
        self, *, task_status: trio.TaskStatus[TrainerRole] = trio.TASK_STATUS_IGNORED
    ) -> None:
        if self.cfg.trainer_peer_id not in (None, self.node.peer_id):
            log.warning(
                "this node is not the run's trainer_peer_id: its step notices will be ignored"
            )
        self.node.add_status("trainer", self.status)
        task_status.started(self)
        while True:
            self._save_step()
            notice = StepNotice(step=self.step, policy_version=self.policy_version)
            self.node.announce(STEP_TOPIC, notice.encode())
            log.info("step %d (policy version %d)", self.step, self.policy_version)
            await trio.sleep(self.cfg.step_interval)
            self.step += 1


async def run(
    node: Node, cfg: NodeConfig, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED
) -> None:
    """The role as a service the runtime starts."""
    await TrainerRole(node, cfg).serve(task_status=task_status)
