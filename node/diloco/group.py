"""A DiLoCo group over libp2p: the outer-step sync with the leader and the ring's chunks.

This is the I/O around two pure parts: ``Membership`` (the leader's rosters) and
``ring.all_reduce`` (the arithmetic of the ring). One protocol, ``/intellect/diloco/1.0.0``
(``protocol/diloco.py``), carries three requests: ``sync`` (ask the leader for the roster
of an outer step and attempt; repeated every ``poll_interval`` until it is formed),
``leave``, and ``chunk`` (the right neighbour pulls what we offer for a ring round:
``node/diloco/chunks.py``).

An attempt fails on any error of a pull (a dead neighbour resets the stream or lets the
deadline pass; an abandoned neighbour refuses with ``aborted``; a chunk that does not
decode, breaks the declared norms or is not the bytes its digest declares, for which we
blame the neighbour: the leader refuses it for the rest of the step; in the sparse
all-gather, a closing digest other than ours, for which we blame no one): we abandon it (our
own offers answer ``aborted`` from then on, so the failure runs round the ring at once) and
ask the leader for the roster of the next attempt, which holds the survivors.
``step_timeout`` bounds the whole outer step (past it, a ``GroupError`` that says so: a
leader gone for good is asked until then). Only the peers of a roster the leader signed
may pull from us, and only our right neighbour in it: an outsider is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import trio

from node.diloco import finding, recovery, statecast
from node.diloco.chunks import Attempt, pull_chunk, pulled_sizes, serve_chunk
from node.diloco.codecs import compressor
from node.diloco.membership import Key, Membership, Refused
from node.diloco.quant import Compressor, Int8
from node.diloco.ring import BadChunk, Outbox, all_reduce, norm_limits
from node.diloco.sparse import ErrorFeedback
from node.net.requests import RemoteRefusal, Responder
from node.net.runtime import Node
from protocol.diloco import DILOCO, DilocoRequest, DilocoRoster, group_key
from protocol.errors import Reason, WireError
from protocol.shardcast import DEFAULT_SHARD

if TYPE_CHECKING:
    from node.config import DilocoConfig

log = logging.getLogger("intellect.diloco")

# a test hook: awaited before each pull with (step, attempt, phase, round)
BeforePull = Callable[[int, int, str, int], Awaitable[None]]


PULL_RETRIES = 3  # transient stream failures tolerated per ring round


def _transient(exc: Exception) -> bool:
    """A stream that failed or ended before the reply (a lost simultaneous dial, a slow
    peer): worth one more try. A refusal or a bad reply is not."""
    if isinstance(exc, WireError):
        return exc.reason in (Reason.TRUNCATED, Reason.TIMEOUT)
    return not isinstance(exc, (RemoteRefusal, BadChunk))


class GroupError(Exception):
    """This member cannot take part in the outer step (refused, or out of time); ``why``:
    the leader's reason when it refused us (``Membership``'s: ``late``, ``stale``, ...)."""

    def __init__(self, message: str, why: str = "") -> None:
        super().__init__(message)
        self.why = why


@dataclass(frozen=True)
class GroupConfig:
    leader: str  # the run's trainer_peer_id
    compressor: Compressor = field(default_factory=Int8)  # of pseudo-gradient chunks
    min_members: int = 1  # the first roster waits for this many
    sync_timeout: float = 600.0  # a new step waits this long for members still training
    resync_timeout: float = 10.0  # a retry waits this long for the survivors
    join_timeout: float = 120.0  # announced joiners, once every member is there
    round_timeout: float = 30.0  # one ring round, including a slow neighbour
    step_timeout: float = 900.0  # one outer step, all attempts together
    poll_interval: float = 0.1
    admit: frozenset[str] | None = None  # the leader admits only these (None: any)
    provide_every: float = 30.0  # seconds between DHT provides of the group's key
    find_timeout: float = 60.0  # a joiner looks the leader up in the DHT this long
    state_shard: int = DEFAULT_SHARD  # shard size of the state offered to joiners

    @classmethod
    def of_run(
        cls, leader: str, diloco: DilocoConfig, sync_timeout: float, step_timeout: float
    ) -> GroupConfig:
        """The group a trainer of the run is in: led by ``leader`` (the run's
        trainer_peer_id), with the node's ``[diloco]`` section."""
        return cls(
            leader=leader,
            compressor=compressor(diloco.quant, diloco.sparse_k),
            min_members=diloco.members,
            admit=frozenset(diloco.admit) or None,
            join_timeout=diloco.join_timeout,
            sync_timeout=sync_timeout,
            step_timeout=step_timeout,
        )

    @property
    def encoding(self) -> str:
        """The compressor's wire name (the roster's ``encoding``)."""
        return self.compressor.wire


@dataclass
class Reduced:
    """The outcome of one outer step's all-reduce."""

    average: torch.Tensor
    roster: list[str]
    attempts: int
    received: int  # payload bytes we received
    compensated: bool = False  # error feedback added a buffer of earlier steps to ours

    @property
    def alone(self) -> bool:
        """The average is exactly our own pseudo-gradient (``OuterState.apply``'s
        ``alone``): a group of one, with no unsent remainder of earlier steps added."""
        return len(self.roster) == 1 and not self.compensated


class DilocoGroup:
    def __init__(self, node: Node, cfg: GroupConfig, *, before_pull: BeforePull | None = None):
        self.node, self.cfg, self.before_pull = node, cfg, before_pull
        self.me = node.peer_id
        self.leading = self.me == cfg.leader
        self.membership = Membership(
            cfg.leader,
            min_members=cfg.min_members,
            sync_timeout=cfg.sync_timeout,
            resync_timeout=cfg.resync_timeout,
            join_timeout=cfg.join_timeout,
            admit=cfg.admit,
        )
        self.attempts: dict[Key, Attempt] = {}
        self.failures = 0  # attempts we abandoned
        self.feedback = ErrorFeedback()  # what a sparse compressor has not sent yet
        self.snapshot: tuple[int, bytes] | None = None  # (outer step, state) we serve joiners
        self.key = group_key(node.cfg.run.id, cfg.leader)  # our DHT provider key
        self.statecast = statecast.StateServer(
            node, lambda: self.snapshot, offers=self.leading, shard_size=cfg.state_shard
        )

    def register(self) -> None:
        """Serve the group's protocols (``serve`` also advertises the group in the DHT)."""
        self.node.serve_requests(
            DILOCO, DilocoRequest, self._handle, deadline=self.node.cfg.net.read_timeout * 3
        )
        self.statecast.register()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """``register``; provide our DHT key (once in the group) until cancelled."""
        self.register()
        task_status.started()
        every, active = self.cfg.provide_every, lambda: self.leading or bool(self.attempts)
        await finding.advertise(self.node, self.key, every=every, active=active)

    # ---- one outer step ---------------------------------------------------------------

    async def all_reduce(
        self, step: int, vec: torch.Tensor, state: str, layout: str, norm: float | None = None
    ) -> Reduced:
        """The group's average of ``vec`` for outer ``step``; ``state``: the hash of the outer
        parameters we start from (the leader admits only those that match its own);
        ``norm``: the L2 norm we declare (``vec``'s own; tests declare another).

        With error feedback (a sparse compressor) we send ``vec`` plus what earlier steps
        left unsent, declare that sum's norm, and keep what this step leaves unsent."""
        codec = self.cfg.compressor
        compensated = codec.feedback and self.feedback.holds(vec.numel())
        payload, sent = None, vec
        if codec.feedback:  # encoded once for every attempt; ``sent``: what it carries
            vec = self.feedback.compensate(vec)
            payload = codec.encode(vec)
            sent = codec.decode(payload, vec.numel())
        norm = float(vec.norm()) if norm is None else norm
        failures = self.failures
        try:
            with trio.fail_after(self.cfg.step_timeout):
                avg, roster, attempts, received = await self._attempts(
                    step, vec, state, layout, norm, payload
                )
        except trio.TooSlowError:
            raise GroupError(
                f"outer step {step} not done within step_timeout ({self.cfg.step_timeout:g} s):"
                f" {self.failures - failures} attempts failed (the leader unreachable, or"
                " every attempt failed)"
            ) from None
        if codec.feedback:  # alone, the average took all of ``vec``
            self.feedback.keep(vec, vec if len(roster) == 1 else sent)
        return Reduced(avg, roster, attempts, received, compensated)

    async def _attempts(
        self,
        step: int,
        vec: torch.Tensor,
        state: str,
        layout: str,
        norm: float,
        payload: bytes | None,
    ) -> tuple[torch.Tensor, list[str], int, int]:
        """Attempts of ``step``'s exchange until one completes: (the average, its roster, the
        attempts it took, the bytes received)."""
        codec = self.cfg.compressor
        attempt, blame = 0, ""
        while True:
            roster, norms, attempt = await self._sync(step, attempt, state, layout, norm, blame)
            key, rank, n = (step, attempt), roster.index(self.me), len(roster)
            sizes = pulled_sizes(vec.numel(), rank, n, codec)
            current = self.attempts[key] = Attempt(roster, Outbox(), norms, sizes)
            for old in [k for k in self.attempts if k[0] < step - 1]:
                del self.attempts[old]
            try:
                avg, received = await all_reduce(
                    vec,
                    rank,
                    n,
                    codec,
                    current.outbox,
                    self._puller(key, roster),
                    norm_limits(norms, rank, codec.summable),
                    payload=payload,
                )
                return avg, roster, attempt + 1, received
            except BadChunk as exc:
                blame = roster[(rank - 1) % n]
                log.warning("step=%d: bad chunk from %s: %s", step, blame[-8:], exc)
            except Exception as exc:  # any failure of any pull fails the attempt
                # (py-libp2p raises several unrelated types for a dead peer: StreamEOF,
                # StreamFailure, MultiselectClientError, ...)
                log.warning("all-reduce step=%d attempt=%d failed: %r", step, attempt, exc)
            current.outbox.abort()
            self.failures += 1
            attempt += 1

    async def leave(self) -> None:
        """Leave the group now (the leader drops us from the next roster at once)."""
        if self.leading:
            return
        msg = recovery.request(self.node, "leave")
        try:
            await self.node.request(self.cfg.leader, DILOCO, msg, DilocoRoster)
        except Exception as exc:  # leaving is best effort: the heartbeat TTL evicts us anyway
            log.info("leave not delivered: %r", exc)

    async def _sync(
        self, step: int, attempt: int, state: str, layout: str, norm: float, blame: str
    ) -> tuple[list[str], list[float], int]:
        """The roster, its norms, and the attempt they are for: a later attempt of the step
        than we asked for if the group abandoned ours before we got its roster."""
        failed = 0  # asks in a row that got no answer (a leader gone: one per poll)
        while True:
            if self.leading:
                if blame:
                    self.membership.blame(blame, self.me, step, attempt - 1)  # the failed one
                attempt = self.membership.resolve((step, attempt))[1]
                roster = self._arrive(self.me, (step, attempt), layout, state, norm)
                norms = self.membership.norms.get((step, attempt), [])
            else:
                msg = DilocoRequest(
                    **self.node.header(),
                    op="sync",
                    step=step,
                    attempt=attempt,
                    phase="",
                    round=0,
                    layout=layout,
                    norm=norm,
                    state=state,
                    blame=blame,
                )
                try:
                    reply = await self.node.request(self.cfg.leader, DILOCO, msg, DilocoRoster)
                except RemoteRefusal as exc:
                    why = exc.detail.removeprefix("refused: ") if exc.reason == "not_member" else ""
                    raise GroupError(f"the leader refused us: {exc}", why) from exc
                except Exception as exc:  # a slow or lost stream (py-libp2p raises many types)
                    failed += 1  # the first and every 100th at INFO: not ten lines a second
                    level = logging.INFO if failed % 100 == 1 else logging.DEBUG
                    log.log(level, "sync with the leader failed (%d in a row): %r", failed, exc)
                    reply = None
                roster = self._checked(reply, step, attempt)
                norms = list(reply.norms) if reply is not None else []
                if reply is not None:
                    attempt = max(attempt, int(reply.attempt))
            if roster is not None:
                return roster, norms, attempt
            await trio.sleep(self.cfg.poll_interval)

    def _checked(self, reply: DilocoRoster | None, step: int, attempt: int) -> list[str] | None:
        if reply is None or reply.state != "ready":
            return None
        if reply.sender != self.cfg.leader or reply.step != step or reply.attempt < attempt:
            raise GroupError("a roster not from the leader or not for this attempt")
        if self.me not in reply.members or len(set(reply.members)) != len(reply.members):
            raise GroupError("a roster without us (or with a peer twice)")
        if len(reply.norms) != len(reply.members):
            raise GroupError("a roster without a norm for each member")
        if reply.encoding != self.cfg.encoding:
            raise GroupError(f"the group sends {reply.encoding}, we were set up for another")
        return list(reply.members)

    def _arrive(
        self, peer: str, key: Key, layout: str, state: str, norm: float
    ) -> list[str] | None:
        alive, now = set(self.node.known_peers()) | {self.me}, trio.current_time()
        try:
            return self.membership.arrive(peer, key, now, alive, layout, state, norm)
        except Refused as exc:
            if peer == self.me:
                raise GroupError(f"the leader's own roster refused it: {exc}") from exc
            raise WireError(Reason.NOT_MEMBER, f"refused: {exc}") from exc

    # ---- joining (node.diloco.recovery) ------------------------------------------------

    async def announce_join(self, at_least: int = 0) -> int:
        """Ask the leader to expect us; the outer step whose state we must recover."""
        return await recovery.announce_join(self.node, self.cfg.leader, at_least)

    async def find_leader(self) -> set[str]:
        """The group's members found in the DHT (the leader among them unless it timed out)."""
        return await finding.find_leader(
            self.node, self.key, self.cfg.leader, within=self.cfg.find_timeout
        )

    async def pull_state(self, step: int) -> statecast.Pulled | None:
        """The leader's state at the start of ``step`` over SHARDCAST (``None``: moved past)."""
        with trio.fail_after(self.cfg.step_timeout):
            return await statecast.pull_state(self.node, self.cfg.leader, self.cfg.leader, step)

    async def fetch_state(self, donor: str, step: int) -> bytes | None:
        """``donor``'s state over the ``state`` request (joiners use ``pull_state``)."""
        with trio.fail_after(self.cfg.step_timeout):
            return await recovery.fetch_state(self.node, donor, step)

    # ---- pulling ----------------------------------------------------------------------

    def _puller(self, key: Key, roster: list[str]) -> Callable[[str, int], Awaitable[bytes]]:
        left = roster[(roster.index(self.me) - 1) % len(roster)]

        async def pull(phase: str, rnd: int) -> bytes:
            if self.before_pull is not None:
                await self.before_pull(key[0], key[1], phase, rnd)
            errors = 0
            with trio.fail_after(self.cfg.round_timeout):
                while True:
                    try:
                        data = await self._pull_once(left, key, phase, rnd)
                    except Exception as exc:
                        if not _transient(exc) or errors >= PULL_RETRIES:
                            raise
                        errors += 1  # e.g. a stream lost to a simultaneous dial: once more
                        data = None
                    if data is not None:
                        return data
                    await trio.sleep(self.cfg.poll_interval / 2)

        return pull

    async def _pull_once(self, left: str, key: Key, phase: str, rnd: int) -> bytes | None:
        size = self.attempts[key].sizes[(phase, rnd)]
        return await pull_chunk(self.node, left, (*key, phase, rnd), size)

    # ---- serving ----------------------------------------------------------------------

    async def _handle(self, msg: DilocoRequest, responder: Responder) -> None:
        if msg.op == "chunk":
            await serve_chunk(self.node, self.attempts.get((msg.step, msg.attempt)), msg, responder)
            return
        if msg.op == "state":
            await recovery.serve_state(self.node, self.snapshot, msg, responder)
            return
        if not self.leading:
            raise WireError(Reason.NOT_FOUND, "not the group's leader")
        key = (msg.step, msg.attempt)
        if msg.op == "join":
            await recovery.answer_join(
                self.node, self.membership, self.cfg.encoding, msg, responder
            )
            return
        if msg.op == "leave":
            self.membership.leave(msg.sender)
            roster: list[str] | None = self.membership.members
        else:
            if msg.blame:
                self.membership.blame(msg.blame, msg.sender, msg.step, msg.attempt - 1)
            key = self.membership.resolve(key)
            roster = self._arrive(msg.sender, key, msg.layout, msg.state, msg.norm)
        await responder.send(
            DilocoRoster(
                **self.node.header(),
                step=msg.step,
                attempt=key[1],
                state="ready" if roster is not None else "wait",
                encoding=self.cfg.encoding,
                members=list(roster or []),
                norms=self.membership.norms.get(key, []) if roster is not None else [],
            )
        )

    def status(self) -> dict[str, Any]:
        m = self.membership
        return {
            "leader": self.cfg.leader,
            "leading": self.leading,
            "members": list(m.members) if self.leading else None,
            "evicted": dict(m.evicted),
            "refused": dict(m.refused),
            "rejected": dict(m.rejected),
            "failed_attempts": self.failures,
        }
