"""The validator role: fetch every submitted batch, judge it, post the verdict on-chain.

Where the rollout comes from: a worker (``node/roles/services/inference.py``) submitted a work key
on-chain and announced the batch on the ``batches`` topic. The validator learns of
submissions from the chain (``WorkSubmitted``, read by its ``Docket``,
``node/roles/io/docket.py``: every one, or as ``[validator] judge = "assigned"`` its share
and the backups whose time came, ``node/roles/decisions/assignment.py``) and of holders
from the announcements and
the worker's registered peer (a validator restarted after a batch was announced still
finds it), and
``JudgingQueue`` (``node/roles/decisions/judging.py``) decides what to fetch next, when to retry and
when a batch is unavailable. Up to ``FETCHES`` batches are fetched at once
(``node/roles/io/exchange.py``), at most one per worker, and one judging loop takes them as
they arrive, cheapest checks first: 1-3 here in a worker thread (``cheap_checks``), 4-6 in
the batch checker, a child process (``Offload(BatchChecker, CheckerSpec.of(cfg))``,
``node/roles/children/checking.py``):

1. the batch is the worker's: signed by the peer key the worker registered on-chain, with a
   valid registration signature (SPEC §19; the EVM cannot check Ed25519);
2. its step and policy version are inside the async window of the trainer's clock, and the
   version is the one submitted on-chain (a batch ahead of the step this validator knows
   is judged again later, ``Later``: when it was told is not the worker's fault);
3. the on-chain ``units`` are the batch's generated tokens (a batch larger than its units
   allow, ``max_envelope_size``, is not even read), and its TOPLOC proofs have the chunk
   size and top-k of the run's profile;
4. the tasks are the worker's assigned ones (SPEC §12), every token in the vocabulary;
5. the proofs: one prefill per rollout (``recompute_batch``) and the proof check of
   ``crypto.verdict.check_batch`` (``crypto/verdict.py``, the next hop) under the run's
   verification profile (``spot_check`` < 1 recomputes a share of the rollouts that every
   validator draws alike, ``node/roles/decisions/spotcheck.py``);
6. every reward is what the task's verifier gives the completion (last: a verifier can
   be made slow, and only a batch the model really sampled gets here).

Every check ends in one ``Verdict`` (``node/roles/decisions/work.py``). Where it goes next: ``accept``
or ``reject`` (reason ``invalid``, ``mismatch`` or, for a batch nobody served by the fetch
deadline nor when asked again after it, ``unavailable``) on-chain (``ledger/client.py``), once per key; a post the chain
refuses is tried again (``Votes``, ``node/roles/io/votes.py``). The trainer takes
accepted batches from there.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any

import trio

from crypto.verdict import proof_parameters
from node.config import NodeConfig
from node.net.requests import RemoteRefusal
from node.net.runtime import Node
from node.roles.children.checking import BatchChecker, CheckBatch, CheckerSpec
from node.roles.children.offload import Offload, OffloadError
from node.roles.decisions.busy import BusyTime
from node.roles.decisions.clock import StepClock
from node.roles.decisions.judging import JudgingQueue
from node.roles.decisions.spotcheck import spot_check_seed
from node.roles.decisions.status import ValidatorStatus
from node.roles.decisions.work import Key, Later, Submission, Verdict
from node.roles.given import Checker, Started, Weights
from node.roles.io.chain import ChainSetupError, PacedReads, Registrations, open_ledger
from node.roles.io.docket import Docket
from node.roles.io.exchange import fetch_batch, follow_notices, follow_steps
from node.roles.io.votes import Votes
from protocol.batches import BatchNotice
from protocol.errors import Reason, WireError
from protocol.rollouts import RolloutBatch, max_envelope_size

log = logging.getLogger("intellect.validator")
POLL_S = 1.0  # the judging loop's longest nap (it wakes at once for new work)
# The chain is read for new submissions at once when a batch notice comes (a worker
# announces just before it submits), then again after 0.25 s, 0.5 s, ... up to 4 s while
# nothing new turns up (``PacedReads``): a submission nobody announced is seen within 4 s.
CHAIN_POLL_MIN_S = 0.25
CHAIN_POLL_MAX_S = 4.0
# batches fetched at once (at most one per worker: a worker that sends slowly holds one);
# the judging of one batch overlaps the fetches of the next
FETCHES = 4
WEIGHTS_WAIT_S = 300.0  # a batch's policy version is waited for this long


class ValidatorRole:
    checker = Started[Checker](OffloadError, "the batch checker runs only while the role serves")

    posts = Started[trio.Nursery](RuntimeError, "verdicts are posted while the role serves")

    def __init__(self, node: Node, cfg: NodeConfig, weights: Weights | None = None) -> None:
        if cfg.run.model is None:
            raise ChainSetupError("the validator role needs the run's model (--model DIR)")
        if cfg.run.trainer_peer_id is None:
            raise ChainSetupError("the validator role needs the run's trainer_peer_id")
        self.node, self.cfg, self.weights = node, cfg, weights
        self.clock = StepClock(cfg.run.trainer_peer_id, cfg.run.async_level)
        self.proofs = proof_parameters(cfg.run.verify_profile)  # what the batches must use
        self.queue = JudgingQueue()
        # (key, announcer) -> its notice: the size a fetch from that peer may have (the
        # first announcer's notice, anyone's, once set it for every peer asked)
        self.notices: dict[tuple[Key, str], BatchNotice] = {}
        self.submissions: dict[Key, Submission] = {}
        self.clock_at: dict[Key, tuple[int | None, int]] = {}  # the clock when submitted
        self.fetch_failures = 0
        self.judging: int | None = None  # the policy version of the batch being judged
        self.fetches = 0  # fetches under way, and fetched batches not yet taken to judge
        self.fetching_from: Counter[str] = Counter()  # fetches under way, by peer
        self.busy = BusyTime()  # fetching, judging, posting
        self.votes = Votes()  # its verdicts on-chain (node/roles/io/votes.py)
        self.docket = Docket()  # what the chain gives it to judge (node/roles/io/docket.py)
        self._checker: Checker | None = None  # the child process, while the role serves
        self._posts: trio.Nursery | None = None  # where each verdict is posted, while it serves
        self.chain_reads = PacedReads(CHAIN_POLL_MIN_S, CHAIN_POLL_MAX_S)
        self.work = trio.Event()  # a new submission or notice: the judging loop wakes
        self.voucher = b""  # its account's voucher for its peer id (ledger/vouchers.py)

    def _setup(self) -> None:
        ledger = self.votes.ledger = open_ledger(self.cfg)
        self.node.add_status("chain", ledger.health)  # its RPC URLs' faults, its transactions
        self.voucher = ledger.voucher(self.node.peer_id)  # workers serve it first
        assigned = self.cfg.validator.judge == "assigned"
        self.docket.open(ledger, self.cfg.chain.contract_block, assigned=assigned)
        self.queue.fetch_deadline_s = float(ledger.params().fetch_deadline)

    def status(self) -> ValidatorStatus:
        return ValidatorStatus(
            address=self.docket.address,
            step=self.clock.step,
            fetch_failures=self.fetch_failures,
            unposted=len(self.votes.unposted),
            removed_at=self.docket.until or None,
            not_ours=self.docket.not_ours,
            left_to_others=self.docket.left + self.docket.covered,
            backups_held=len(self.docket.backups),
            backups_taken=self.docket.taken,
            windows_closed=self.docket.closed,
            idle_share=self.busy.idle_share(time.monotonic()),
            waiting=self.queue.waiting(),
            given_up=self.queue.given_up,
            **self.votes.posted.fields(),
        )

    def needed_versions(self) -> set[int]:
        """The policy versions of submitted work not judged yet, and of the batch being
        judged: SHARDCAST keeps their weights however far the run moved on meanwhile (a
        batch this validator gets to late was left unjudged when they were gone)."""
        judging = set() if self.judging is None else {self.judging}
        return self.queue.versions() | judging

    # ---- inputs ------------------------------------------------------------------------

    def on_notice(self, sender: str, notice: BatchNotice) -> None:
        key = (notice.worker, notice.work_key)
        self.queue.noticed(key, sender, trio.current_time())
        entry = self.queue.entries.get(key)
        if entry is not None and sender in entry.peers:
            self.notices.setdefault((key, sender), notice)
            if len(self.notices) > 2 * len(self.queue.entries) + 64:  # judged, expired: gone
                self.notices = {k: n for k, n in self.notices.items() if self._asks(*k)}
        if entry is None or entry.submitted_at is None:
            self.chain_reads.nudge()  # its submission is on its way to the chain: read it now
        self.work.set()

    def _asks(self, key: Key, peer: str) -> bool:
        """Whether ``key`` is still to be fetched and ``peer`` is one it may be fetched from."""
        entry = self.queue.entries.get(key)
        return entry is not None and peer in entry.peers

    async def _watch_chain(self) -> None:
        await self.chain_reads.run(self._read_chain)

    async def _read_chain(self) -> bool:
        """One read of the chain; True when it found submissions."""
        clock = (self.clock.step, self.clock.policy_version)  # kept with backups held
        found, cases, error = await trio.to_thread.run_sync(self.docket.read, clock)
        async with self.votes.posting:  # one transaction of ours at a time (its nonce)
            await trio.to_thread.run_sync(self.docket.revoke_squats)
        for key in self.docket.take_passed():  # assigned to others, or a backup held
            self.queue.passed(key)  # its notices go with the next pruning (on_notice)
        for case in cases:
            sub = case.sub
            key = (sub.worker, sub.key)
            self.clock_at[key] = case.then or (self.clock.step, self.clock.policy_version)
            self.submissions[key] = sub
            self.votes.posted.seen_at[key] = trio.current_time()
            self.queue.submitted(
                key, sub.units, sub.policy_version, trio.current_time(), holder=case.holder
            )
        if error is not None:  # the chain may be briefly unreachable: try again
            log.warning("reading submissions failed: %s", error)
        if found or cases:  # a backup whose time came is new work too
            self.work.set()
        return found

    # ---- judging -----------------------------------------------------------------------

    async def serve(
        self, *, task_status: trio.TaskStatus[ValidatorRole] = trio.TASK_STATUS_IGNORED
    ) -> None:
        await trio.to_thread.run_sync(self._setup)
        async with Offload.of(BatchChecker, CheckerSpec, self.cfg) as checker:
            self.checker = checker
            await self._serve(task_status)

    async def _serve(self, task_status: trio.TaskStatus[ValidatorRole]) -> None:
        follow_steps(self.node, self.clock)
        follow_notices(self.node, self.on_notice)
        self.node.add_status("validator", lambda: self.status().as_dict())
        if self.weights is not None:  # the weights of work still to judge are kept
            self.weights.keep_needed(self.needed_versions)
        fetched, to_judge = trio.open_memory_channel[tuple[Key, RolloutBatch, bytes]](0)
        async with trio.open_nursery() as nursery:
            self.posts = nursery
            nursery.start_soon(self._watch_chain)
            nursery.start_soon(self._judge_fetched, to_judge)
            self.busy.since = time.monotonic()
            task_status.started(self)
            while True:
                now = trio.current_time()
                for key, verdict in self.votes.unposted.due(now):
                    await self._post(key, verdict)
                if self.clock.step is None:
                    # no step announced yet (a restarted validator, or the trainer down):
                    # nothing is judged, nor found unavailable, until the async window can
                    # be checked (found by the chaos run: honest batches rejected for it)
                    await trio.sleep(POLL_S)
                    continue
                for key in self.queue.unavailable(now):
                    await self._post(key, Verdict.reject("unavailable", "nobody served the batch"))
                while self.fetches < FETCHES and (got := self.queue.next_fetch(now)) is not None:
                    self.fetches += 1
                    nursery.start_soon(self._fetch_for_judging, *got, fetched)
                wake = self.queue.wake_at(now, can_fetch=self.fetches < FETCHES)
                with trio.move_on_after(
                    POLL_S if wake is None else max(0.05, min(POLL_S, wake - now))
                ):
                    await self.work.wait()  # new work, or a fetch slot freed, wakes it at once
                self.work = trio.Event()

    async def _fetch_for_judging(
        self, key: Key, peer: str, judge: trio.MemorySendChannel[tuple[Key, RolloutBatch, bytes]]
    ) -> None:
        """One of the ``FETCHES`` slots: fetch ``key`` from ``peer`` and hand it to the
        judging loop (the slot is held until it takes it, so at most ``FETCHES`` fetched
        batches wait in memory)."""
        try:
            with self.busy.working():
                got = await self._fetch(key, peer)
                if got is not None:
                    await judge.send((key, *got))
        finally:
            self.fetches -= 1
            self.work.set()

    async def _judge_fetched(
        self, fetched: trio.MemoryReceiveChannel[tuple[Key, RolloutBatch, bytes]]
    ) -> None:
        """Judge the fetched batches one at a time, as they come (one batch checker)."""
        async for key, batch, envelope in fetched:
            self.judging = batch.policy_version
            try:
                with self.busy.working():
                    await self._judge(key, batch, envelope)
            finally:
                self.judging = None

    async def _fetch(self, key: Key, peer: str) -> tuple[RolloutBatch, bytes] | None:
        """The batch and its envelope; None when the fetch failed (tried again later)."""
        notice, units = self.notices.get((key, peer)), self.submissions[key].units
        self.fetching_from[peer] += 1
        try:
            batch, envelope = await fetch_batch(
                self.node,
                peer,
                key[1],
                expected_size=notice.size if notice else None,
                max_size=max_envelope_size(units, *self.proofs),
                voucher=self.voucher,
            )
        except Exception as exc:  # refused, timed out, any of py-libp2p's dial errors, or a
            # body that does not hash to the key (its signer's, but nothing the chain can
            # check, and the worker may serve the others the real batch: a bonded reject for
            # it was overturned, and this validator's bond burned)
            self.fetch_failures += 1
            what = exc if isinstance(exc, WireError | RemoteRefusal) else repr(exc)
            log.info("fetching %s from %s failed: %s", key[1].hex()[:16], peer[-8:], what)
            self.queue.fetch_failed(key, trio.current_time())
            # a stuck connection: dialled afresh next time, unless other fetches use it
            if isinstance(exc, WireError) and exc.reason is Reason.TIMEOUT:
                if self.fetching_from[peer] == 1:
                    await self.node.disconnect(peer)
            return None
        finally:
            self.fetching_from[peer] -= 1
            if not self.fetching_from[peer]:
                del self.fetching_from[peer]
        self.queue.fetched(key)
        return batch, envelope

    async def _judge(self, key: Key, batch: RolloutBatch, envelope: bytes) -> None:
        sub = self.submissions[key]
        args = (
            batch,
            sub,
            self.docket.registrations,
            self.clock,
            self.clock_at.get(key),
            self.proofs,
        )
        verdict = await trio.to_thread.run_sync(cheap_checks, *args)
        if isinstance(verdict, Later):
            self._not_judged(key, verdict.why)
            return
        if verdict is None:  # they passed: tasks, rewards and proofs
            model_dir = await weights_of(batch.policy_version, self.cfg.run.model, self.weights)
            if model_dir is None:
                self._not_judged(key, f"no weights of version {batch.policy_version} here")
                return
            try:
                seed = spot_check_seed(key[1], sub.block_hash)
                verdict = await self.checker.call(
                    CheckBatch(model_dir, batch.policy_version, envelope, seed)
                )
            except OffloadError as exc:
                if not self.checker.alive():  # every batch would fail so: the node stops
                    raise
                self._not_judged(key, f"checking failed: {exc}")
                return
        self.queue.judged(key)
        # sent now, followed to its confirmations while the next batch is judged
        self.posts.start_soon(self._post, key, verdict)

    def _not_judged(self, key: Key, why: str) -> None:
        """The fetched batch could not be judged now: again later, or given up."""
        now = trio.current_time()
        again = self.queue.check_failed(key, now)
        if again is None:
            log.error("%s: %s; given up, left unjudged", key[1].hex()[:16], why)
        else:
            log.warning("%s: %s; judged again in %.0f s", key[1].hex()[:16], why, again - now)

    async def _post(self, key: Key, v: Verdict) -> None:
        if (posted := await self.votes.post(key, v)) is None:
            return  # posted again later, or given up
        entry, latency = posted
        self.node.metrics.inc("verdicts", verdict=v.reason)
        if latency is not None:
            self.node.metrics.observe("verdict_latency_seconds", latency, verdict=v.reason)
        (log.info if v.accepted else log.warning)("verdict %s", entry)


def cheap_checks(
    batch: RolloutBatch,
    sub: Submission,
    registrations: Registrations | None,
    clock: StepClock,
    at: tuple[int | None, int] | None,
    proofs: tuple[int, int],
) -> Verdict | Later | None:
    """Checks 1-3 of the module docstring (blocking: ledger reads through
    ``registrations``); ``at``: the trainer's clock when the batch was submitted;
    ``proofs``: the run's TOPLOC chunk size and top-k, the only ones its profile checks.
    None when they pass and the batch goes on to ``BatchChecker``; ``Later`` when it is
    ahead of the step this validator knows (judged again later, never rejected for it)."""
    from crypto.identity import public_key_of_peer_id

    assert registrations is not None, "the role reads registrations once it is set up"
    if batch.worker != sub.worker:
        return Verdict.reject("mismatch", "the batch names another worker")
    peer_key, valid = registrations.get(sub.worker, sub.block)  # as of the submission
    if peer_key != public_key_of_peer_id(batch.sender) or not valid:
        return Verdict.reject("invalid", "not signed by the worker's registered peer key")
    if why := clock.ahead(batch.step, batch.policy_version):
        return Later(why)  # a matter of when: judged again once the step is announced
    if why := clock.window(batch.step, batch.policy_version, at):
        return Verdict.reject("invalid", why)
    if batch.policy_version != sub.policy_version:
        return Verdict.reject("mismatch", "policy version differs from the submission")
    if batch.num_tokens != sub.units:
        return Verdict.reject("mismatch", f"units {sub.units} on-chain, {batch.num_tokens} tokens")
    if (batch.proof_chunk, batch.proof_topk) != proofs:
        return Verdict.reject(
            "invalid",
            f"proofs of {batch.proof_chunk}-token chunks, top-{batch.proof_topk}: the run's "
            f"profile checks {proofs[0]}-token chunks, top-{proofs[1]}",
        )
    return None


async def weights_of(version: int, base: Path | None, weights: Weights | None) -> str | None:
    """The weights a batch was generated with: the base model for version 0, else the
    version from SHARDCAST (pulled if it is not here yet, waited for while it downloads,
    at most ``WEIGHTS_WAIT_S``); None when it cannot be had."""
    if version == 0:
        return None if base is None else str(base)
    if weights is None:
        return None
    with trio.move_on_after(WEIGHTS_WAIT_S):
        asked = False
        while (path := weights.model_dir(version)) is None:
            if not asked:
                try:
                    await weights.pull(version)
                    asked = True
                except ValueError as exc:  # no manifest yet: gossip brings it
                    log.debug("policy version %d not available yet: %s", version, exc)
            await trio.sleep(0.5)
        return str(path)
    return None


async def run(
    node: Node,
    cfg: NodeConfig,
    weights: Weights | None = None,
    *,
    task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The role as a service the runtime starts."""
    await ValidatorRole(node, cfg, weights).serve(task_status=task_status)
