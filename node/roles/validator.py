"""The validator role: fetch every submitted batch, judge it, post the verdict on-chain.

Where the rollout comes from: a worker (``node/roles/inference.py``) submitted a work key
on-chain and announced the batch on the ``batches`` topic. The validator learns of
submissions from the chain (``WorkSubmitted``) and of holders from the announcements, and
``JudgingQueue`` (``node/roles/judging.py``) decides what to fetch next, when to retry and
when a batch is unavailable. A fetched batch (``node/roles/exchange.py``) is judged in a
worker thread, cheapest checks first:

1. the batch is the worker's: signed by the peer key the worker registered on-chain, with a
   valid registration signature (SPEC §12; the EVM cannot check Ed25519);
2. its step and policy version are inside the async window of the trainer's clock, and the
   version is the one submitted on-chain;
3. the on-chain ``units`` are the batch's generated tokens;
4. the tasks are the worker's assigned ones (SPEC §13) and every reward is what the task's
   verifier gives the completion;
5. the proofs: one prefill per rollout (``recompute_batch``) and the per-batch verdict of
   ``crypto.verdict.check_batch`` under the run's verification profile (``spot_check`` < 1
   recomputes a random share of the rollouts).

Where it goes next: ``accept`` or ``reject`` (reason ``invalid``, ``mismatch`` or, for a
batch nobody served by the fetch deadline, ``unavailable``) on-chain
(``ledger/client.py``), once per key; the trainer takes accepted batches from there.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

import trio

from node.config import NodeConfig
from node.net.runtime import Node, RemoteRefusal
from node.roles.chain import ChainSetupError, Submission, SubmissionWatcher, open_ledger
from node.roles.clock import StepClock, follow_steps
from node.roles.exchange import fetch_batch, follow_notices
from node.roles.inference import idle_share
from node.roles.judging import JudgingQueue, Key
from node.roles.offload import Offload, OffloadError
from protocol.batches import BatchNotice
from protocol.errors import Reason, WireError
from protocol.rollouts import RolloutBatch, unpack_tokens

log = logging.getLogger("intellect.validator")
POLL_S = 1.0
WEIGHTS_WAIT_S = 300.0
POST_ATTEMPTS = 30  # a verdict the chain refused is posted again, this many times at most
POST_RETRY_S = 2.0  # a batch's policy version is waited for this long


@dataclass(frozen=True)
class Judgement:
    passed: bool
    reason: str  # ledger reason on reject: invalid, mismatch
    detail: str
    rollouts: int = 0  # recomputed
    seconds: float = 0.0


class ValidatorRole:
    def __init__(self, node: Node, cfg: NodeConfig, weights: Any = None) -> None:
        if cfg.model is None:
            raise ChainSetupError("the validator role needs the run's model (--model DIR)")
        if cfg.trainer_peer_id is None:
            raise ChainSetupError("the validator role needs the run's trainer_peer_id")
        self.node, self.cfg, self.weights = node, cfg, weights
        self.clock = StepClock(cfg.trainer_peer_id, cfg.async_level)
        self.queue = JudgingQueue()
        self.notices: dict[Key, BatchNotice] = {}
        self.submissions: dict[Key, Submission] = {}
        self.clock_at: dict[Key, tuple[int | None, int]] = {}  # the clock when submitted
        self.verdicts: Counter[str] = Counter()  # accepted, invalid, mismatch, unavailable
        self.recent: deque[dict[str, Any]] = deque(maxlen=20)
        self.fetch_failures = 0
        self.judge_seconds = 0.0
        self.serving_since: float | None = None
        self.busy_s = 0.0  # fetching, judging, posting
        self.unposted: dict[Key, tuple[Judgement, float, int]] = {}  # verdict, retry at, tries
        self.until = 0  # when this validator was removed on-chain (0: it was not)
        self.not_ours = 0  # submissions after the removal, left to the other validators
        self.ledger: Any = None
        self.address = ""
        self.watcher: SubmissionWatcher | None = None
        self.checker: Any = None

    def _setup(self) -> None:
        self.ledger = open_ledger(self.cfg)
        self.address = self.ledger.address.lower()
        if not self.ledger.is_validator(self.address):
            self.until = self.ledger.validator_until(self.address)
            if not self.until:
                raise ChainSetupError(f"{self.address} is not a validator of this run's ledger")
            log.warning(
                "%s was removed as a validator: it judges only work submitted up to its "
                "removal (timestamp %d)",
                self.address,
                self.until,
            )
        self.queue.fetch_deadline_s = float(self.ledger.params().fetch_deadline)
        self.watcher = SubmissionWatcher(self.ledger, self.cfg.contract_block)

    def status(self) -> dict[str, Any]:
        judged = sum(self.verdicts.values())
        return {
            "address": self.address,
            "step": self.clock.step,
            "judged": judged,
            "accepted": self.verdicts["accepted"],
            "rejected": judged - self.verdicts["accepted"],
            "rejected_by_reason": {k: v for k, v in self.verdicts.items() if k != "accepted"},
            "fetch_failures": self.fetch_failures,
            "unposted": len(self.unposted),
            "removed_at": self.until or None,
            "not_ours": self.not_ours,
            "judge_seconds": round(self.judge_seconds, 3),
            "idle_share": idle_share(self.busy_s, self.serving_since),
            "waiting": sum(1 for e in self.queue.entries.values() if not e.done),
            "recent": list(self.recent),
        }

    # ---- inputs ------------------------------------------------------------------------

    def on_notice(self, sender: str, notice: BatchNotice) -> None:
        key = (notice.worker, notice.work_key)
        self.queue.noticed(key, sender, trio.current_time())
        if key in self.queue.entries:
            self.notices.setdefault(key, notice)

    async def _watch_chain(self) -> None:
        assert self.watcher is not None
        while True:
            try:
                for sub in await trio.to_thread.run_sync(self.watcher.poll):
                    if self.until and await trio.to_thread.run_sync(self._after_removal, sub):
                        self.not_ours += 1  # not ours to judge: submitted after our removal
                        continue
                    key = (sub.worker, sub.key)
                    self.submissions[key] = sub
                    self.clock_at[key] = (self.clock.step, self.clock.policy_version)
                    self.queue.submitted(key, sub.units, sub.policy_version, trio.current_time())
            except Exception as exc:  # the chain may be briefly unreachable: try again
                log.warning("reading submissions failed: %s", exc)
            await trio.sleep(POLL_S)

    def _after_removal(self, sub: Submission) -> bool:
        block = self.ledger.w3.eth.get_block(sub.block)
        return int(block["timestamp"]) > self.until

    # ---- judging -----------------------------------------------------------------------

    async def serve(
        self, *, task_status: trio.TaskStatus[ValidatorRole] = trio.TASK_STATUS_IGNORED
    ) -> None:
        await trio.to_thread.run_sync(self._setup)
        async with Offload(
            "node.roles.validator:BatchChecker",
            self.cfg.async_level + 2,
            self.cfg.taskset,
            self.cfg.verify_profile,
            self.cfg.spot_check,
        ) as self.checker:
            await self._serve(task_status)

    async def _serve(self, task_status: trio.TaskStatus[ValidatorRole]) -> None:
        follow_steps(self.node, self.clock)
        follow_notices(self.node, self.on_notice)
        self.node.add_status("validator", self.status)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_chain)
            self.serving_since = time.monotonic()
            task_status.started(self)
            while True:
                now = trio.current_time()
                for key in self.queue.unavailable(now):
                    await self._post(
                        key, Judgement(False, "unavailable", "nobody served the batch")
                    )
                for key, (judgement, due, _) in list(self.unposted.items()):
                    if due <= now:
                        await self._post(key, judgement)
                got = self.queue.next_fetch(now)
                if got is None:
                    wake = self.queue.wake_at(now)
                    await trio.sleep(POLL_S if wake is None else max(0.05, min(POLL_S, wake - now)))
                    continue
                began = time.monotonic()
                await self._fetch_and_judge(*got)
                self.busy_s += time.monotonic() - began

    async def _fetch_and_judge(self, key: Key, peer: str) -> None:
        notice = self.notices.get(key)
        try:
            batch, envelope = await fetch_batch(
                self.node, peer, key[1], expected_size=notice.size if notice else None
            )
        except Exception as exc:  # refused, timed out, or any of py-libp2p's dial errors
            self.fetch_failures += 1
            what = exc if isinstance(exc, WireError | RemoteRefusal) else repr(exc)
            log.info("fetching %s from %s failed: %s", key[1].hex()[:16], peer[-8:], what)
            self.queue.fetch_failed(key, trio.current_time())
            if isinstance(exc, WireError) and exc.reason is Reason.TIMEOUT:
                await self.node.disconnect(peer)  # a stuck connection: dial afresh next time
            return
        self.queue.fetched(key)
        judgement = await trio.to_thread.run_sync(self.judge, batch, self.submissions[key])
        if judgement is None:  # the cheap checks passed: tasks, rewards and proofs
            model_dir = await self._model_dir(batch.policy_version)
            if model_dir is None:
                log.error(
                    "no weights of version %d: %s left unjudged",
                    batch.policy_version,
                    key[1].hex()[:16],
                )
                return
            try:
                judgement = Judgement(
                    *await self.checker.call(model_dir, batch.policy_version, envelope)
                )
            except OffloadError as exc:
                log.error("checking %s failed: %s", key[1].hex()[:16], exc)
                return
        await self._post(key, judgement)

    async def _model_dir(self, version: int) -> str | None:
        """The weights a batch was generated with: the base model for version 0, else the
        version from SHARDCAST (pulled if it is not here yet, waited for while it downloads,
        at most ``WEIGHTS_WAIT_S``)."""
        if version == 0:
            return str(self.cfg.model)
        if self.weights is None:
            return None
        with trio.move_on_after(WEIGHTS_WAIT_S):
            asked = False
            while (path := self.weights.model_dir(version)) is None:
                if not asked:
                    try:
                        await self.weights.pull(version)
                        asked = True
                    except ValueError as exc:  # no manifest yet: gossip brings it
                        log.debug("policy version %d not available yet: %s", version, exc)
                await trio.sleep(0.5)
            return str(path)
        return None

    async def _post(self, key: Key, j: Judgement) -> None:
        worker, work_key = key
        try:
            if j.passed:
                await trio.to_thread.run_sync(self.ledger.accept, worker, work_key)
            else:
                await trio.to_thread.run_sync(self.ledger.reject, worker, work_key, j.reason)
        except Exception as exc:
            attempts = self.unposted.get(key, (j, 0.0, 0))[2] + 1
            if attempts < POST_ATTEMPTS:  # e.g. the chain's clock lags ours: try again
                self.unposted[key] = (j, trio.current_time() + POST_RETRY_S, attempts)
            else:
                self.unposted.pop(key, None)
            log.error(
                "posting the verdict on %s failed (attempt %d of %d): %s",
                work_key.hex()[:16],
                attempts,
                POST_ATTEMPTS,
                exc,
            )
            return
        self.unposted.pop(key, None)
        verdict = "accepted" if j.passed else j.reason
        self.verdicts[verdict] += 1
        self.node.metrics.inc("verdicts", verdict=verdict)
        self.judge_seconds += j.seconds
        entry = {
            "worker": worker,
            "key": work_key.hex()[:16],
            "verdict": verdict,
            "detail": j.detail[:200],
        }
        self.recent.append(entry)
        (log.info if j.passed else log.warning)("verdict %s", entry)

    def judge(self, batch: RolloutBatch, sub: Submission) -> Judgement | None:
        """Checks 1-3 of the module docstring (blocking: ledger reads); None when they pass
        and the batch goes on to ``BatchChecker``."""
        from crypto.identity import public_key_of_peer_id

        if batch.worker != sub.worker:
            return Judgement(False, "mismatch", "the batch names another worker")
        peer_key, _ = self.ledger.registration(sub.worker)
        if peer_key != public_key_of_peer_id(batch.sender) or not self.ledger.registration_valid(
            sub.worker
        ):
            return Judgement(False, "invalid", "not signed by the worker's registered peer key")
        at = self.clock_at.get((sub.worker, sub.key))
        if why := self.clock.window(batch.step, batch.policy_version, at):
            return Judgement(False, "invalid", why)
        if batch.policy_version != sub.policy_version:
            return Judgement(False, "mismatch", "policy version differs from the submission")
        if batch.num_tokens != sub.units:
            return Judgement(
                False, "mismatch", f"units {sub.units} on-chain, {batch.num_tokens} tokens"
            )
        return None


class BatchChecker:
    """In the role's child process (``Offload``): the model, tokenizer and task set; checks
    4 and 5 of the module docstring on a batch envelope (already verified by the node)."""

    def __init__(self, keep: int, taskset: str, verify_profile: str, spot_check: float) -> None:
        from node.tasks import load_taskset

        self.models: dict[int, tuple[str, Any, Any, Any]] = {}  # version -> (dir, model, tok, cfg)
        self.keep = keep
        self.taskset = load_taskset(taskset)
        self.profile = verify_profile
        self.spot_check = spot_check

    def _use(self, model_dir: str, version: int) -> None:
        """The model of ``version`` (loaded once; the newest ``keep`` versions stay loaded)."""
        from crypto.verdict import profile
        from node.engine.calibration import model_layers
        from node.engine.models import load_model

        if version not in self.models or self.models[version][0] != model_dir:
            loaded = load_model(model_dir)
            config = profile(self.profile).for_layers(model_layers(loaded.model))
            self.models[version] = (model_dir, loaded.model, loaded.tokenizer, config)
            for old in sorted(self.models)[: -self.keep]:
                del self.models[old]
        _, self.model, self.tokenizer, self.config = self.models[version]

    def __call__(
        self, model_dir: str, version: int, envelope: bytes
    ) -> tuple[bool, str, str, int, float]:
        from protocol.wire import open_message

        self._use(model_dir, version)
        batch = open_message(envelope, RolloutBatch)
        if why := self._check_tasks(batch):
            return False, "invalid", why, 0, 0.0
        j = self._check_proofs(batch)
        return j.passed, j.reason, j.detail, j.rollouts, j.seconds

    def _check_tasks(self, batch: RolloutBatch) -> str | None:
        from node.engine.models import prompt_ids
        from node.tasks import assign

        if batch.taskset != self.taskset.name:
            return f"task set {batch.taskset!r} is not the run's"
        tasks = assign(self.taskset, batch.worker, batch.step, len(batch.groups))
        for n, (group, task) in enumerate(zip(batch.groups, tasks, strict=True)):
            if group.index != n or group.task_id != task.task_id:
                return f"group {n} is not the assigned task"
            if unpack_tokens(group.prompt) != prompt_ids(self.tokenizer, task.prompt):
                return f"group {n}: prompt differs from the task's"
            for s in group.samples:
                text = self.tokenizer.decode(unpack_tokens(s.tokens), skip_special_tokens=True)
                if task.reward(text) != s.reward:
                    due = task.reward(text)
                    return f"group {n} sample {s.sample}: reward {s.reward} claimed, {due} due"
        return None

    def _check_proofs(self, batch: RolloutBatch) -> Judgement:
        from crypto.verdict import RolloutClaim, check_batch
        from node.engine.torch_engine import recompute_batch

        started = time.perf_counter()
        samples = [(g, s) for g in batch.groups for s in g.samples]
        if self.spot_check < 1:
            count = max(1, round(self.spot_check * len(samples)))
            samples = random.SystemRandom().sample(samples, count)  # unpredictable to workers
        claims = [
            RolloutClaim(
                tokens=unpack_tokens(s.tokens),
                proofs=list(s.proofs),
                seed=s.seed,
                finish_reason=s.finish_reason,
                max_new_tokens=batch.max_new_tokens,
                temperature=batch.temperature,
                top_p=batch.top_p,
            )
            for _, s in samples
        ]
        recomputed = recompute_batch(
            self.model, [unpack_tokens(g.prompt) for g, _ in samples], [c.tokens for c in claims]
        )
        verdict = check_batch(
            claims, recomputed, eos_token_id=int(self.tokenizer.eos_token_id), config=self.config
        )
        return Judgement(
            verdict.passed,
            "invalid",
            verdict.reason,
            rollouts=len(claims),
            seconds=time.perf_counter() - started,
        )


async def run(
    node: Node,
    cfg: NodeConfig,
    weights: Any = None,
    *,
    task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The role as a service the runtime starts."""
    await ValidatorRole(node, cfg, weights).serve(task_status=task_status)
