"""The run's clock as a node sees it: the trainer's step notices, and the async window.

The step decides which tasks a worker must do (SPEC §12), so it is never the worker's
choice: only ``StepNotice`` announcements signed by the run's trainer (``trainer_peer_id``)
move the clock, and only forward. A batch is admissible while its step and its policy
version are within ``async_level`` of the newest ones (the same window the SHARDCAST
retention and the trainer use). Pure: the role feeds it announcements.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.batches import StepNotice


@dataclass
class StepClock:
    trainer: str  # the trainer's peer id (the run's trust root)
    async_level: int = 2
    step: int | None = None
    policy_version: int = 0
    ignored: int = 0  # notices from anyone else, or older than what we have

    def observe(self, sender: str, notice: StepNotice) -> bool:
        """Take a notice; True when it moved the clock: a newer step, or the same step with
        a newer policy version (the trainer announces step n + 1 when it starts training
        step n, and again once version n + 1 is published)."""
        newer = self.step is None or (notice.step, notice.policy_version) > (
            self.step,
            self.policy_version,
        )
        if sender != self.trainer or not newer or notice.step < self.step_or(-1):
            self.ignored += 1
            return False
        self.step = notice.step
        self.policy_version = max(self.policy_version, notice.policy_version)
        return True

    def step_or(self, default: int) -> int:
        return default if self.step is None else self.step

    def oldest_version(self) -> int:
        """The oldest policy version a batch may be generated with now."""
        return max(0, self.step_or(0) - self.async_level)

    def ahead(self, step: int, policy_version: int) -> str | None:
        """Why a batch of ``step`` made with ``policy_version`` is ahead of what this clock
        knows of the trainer (None: it is not): a matter of when, not of the batch."""
        if self.step is None:
            return "no step announced by the trainer yet"
        if step > self.step or policy_version > self.policy_version:
            return f"step {step} / version {policy_version} is ahead of the trainer's"
        return None

    def window(
        self, step: int, policy_version: int, at: tuple[int | None, int] | None = None
    ) -> str | None:
        """None when a batch of ``step`` made with ``policy_version`` is admissible, else
        why not. ``at`` = (step, version) as the clock stood when the batch was submitted:
        staleness is judged against it (a validator judging later must not count its own
        delay against the worker), while "ahead of the trainer" is judged against the clock
        now (gossip may have brought the step to the worker before it reached us)."""
        if why := self.ahead(step, policy_version):
            return why
        assert self.step is not None  # ahead() said so
        then, version_then = self.step, self.policy_version
        if at is not None and at[0] is not None:
            then, version_then = at[0], at[1]
        if policy_version + self.async_level < step:
            return f"policy version {policy_version} is older than step {step} - {self.async_level}"
        if step + self.async_level < then:
            return f"step {step} is older than {then} - {self.async_level}"
        if policy_version + self.async_level < version_then:
            return f"policy version {policy_version} is older than the window allows"
        return None
