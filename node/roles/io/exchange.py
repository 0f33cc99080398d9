"""Serving and fetching rollout batches over ``/intellect/batch/1.0.0`` (SPEC §13).

Where a rollout is on this hop: the worker (``node/roles/services/inference.py``) stored the signed
batch in its ``BatchStore`` and serves it from there; a validator
(``node/roles/services/validator.py``) fetches it with ``fetch_batch``, which checks the size before
reading (against what the peer announced and what the submitted units allow), every frame
under the read deadline, and that what arrived is a ``RolloutBatch``
of this run, signed by the peer that served it, with the work key asked for (a signed batch
that does not hash to it is a failed fetch like any other, whoever signed it). Each batch
fetched whole is timed in ``/metrics`` (``intellect_batch_fetch_seconds``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from ledger.vouchers import voucher_signer
from node.net.requests import Responder
from node.net.runtime import Node
from node.roles.decisions.clock import StepClock
from node.rollouts.store import BatchStore, BatchStoreError
from protocol import ids
from protocol.batches import (
    BATCH_FRAME,
    BATCH_TOPIC,
    MAX_BATCH_ENVELOPE,
    STEP_TOPIC,
    BatchNotice,
    BatchReply,
    BatchRequest,
    StepNotice,
)
from protocol.errors import Reason, WireError
from protocol.rollouts import RolloutBatch
from protocol.wire import open_message

log = logging.getLogger("intellect.batches")
TRANSFER_DEADLINE_S = 120.0  # a whole batch, however large (every frame has its own too)
# and a batch's frames once its size is known: 10 s plus 256 KiB/s. A peer that sent a small
# batch a byte a frame (each within the read deadline) held a fetch for the whole 120 s
# (validators and the trainer fetch 4 at once, at most one per worker)
FRAMES_BASE_S, MIN_RATE = 10.0, 256 * 1024


def follow_notices(node: Node, on_notice: Callable[[str, BatchNotice], None]) -> None:
    """Call ``on_notice(sender, notice)`` for every batch notice ``node`` hears (where a
    batch can be fetched); a malformed one is counted."""

    def handle(msg: Any) -> None:
        try:
            notice = BatchNotice.decode(msg.body)
        except WireError as err:
            node.reject("announce/batches", msg.sender, err)
            return
        on_notice(msg.sender, notice)

    node.subscribe(BATCH_TOPIC, handle)


class Served(Protocol):
    """What is served to whom: a view of the worker's batches whose answer may depend on
    the peer asking (a ``BatchStore`` serves every peer alike)."""

    def get(self, work_key: bytes, peer: str | None = None) -> bytes | None: ...


class FirstServed:
    """Which peers a worker's uploads serve first (SPEC §13): the run's trainer, and every
    peer whose voucher (``ledger/vouchers.py``) recovers to an account the contract says
    is a validator. ``is_validator(account)`` reads the chain (blocking: it runs in a
    thread); each peer's answer is kept ``ttl`` seconds, whatever voucher it sends next,
    so a peer costs at most one chain read per ``ttl`` and a flood of made-up vouchers
    from one peer costs nothing more. At most ``max_peers`` answers are kept."""

    def __init__(
        self,
        trainer: str | None,
        is_validator: Callable[[str], bool],
        *,
        chain_id: int,
        contract: str,
        ttl: float = 300.0,
        max_peers: int = 4096,
    ) -> None:
        self.trainer = trainer
        self.is_validator = is_validator
        self.chain_id, self.contract = chain_id, contract
        self.ttl, self.max_peers = ttl, max_peers
        self._known: dict[str, tuple[bool, float]] = {}  # peer -> (first?, until)

    async def __call__(self, peer: str, voucher: bytes) -> bool:
        if peer == self.trainer:
            return True
        now = trio.current_time()
        known = self._known.get(peer)
        if known is not None and known[1] > now:
            return known[0]
        if not voucher:  # no claim to check: not kept, a later voucher is read at once
            return False
        account = voucher_signer(voucher, self.chain_id, self.contract, peer)
        first = False
        if account is not None:
            try:
                first = await trio.to_thread.run_sync(self.is_validator, account)
            except Exception as exc:  # the chain did not answer: served as anyone, asked again
                log.warning("cannot check a validator voucher of %s: %s", peer[-8:], exc)
                return False
        if len(self._known) >= self.max_peers:
            self._known = {p: k for p, k in self._known.items() if k[1] > now}
            if len(self._known) >= self.max_peers:
                self._known.pop(next(iter(self._known)))
        self._known[peer] = (first, now + self.ttl)
        return first


def serve_batches(
    node: Node,
    store: Served | BatchStore,
    *,
    slots: int = 4,
    kept: int = 4,
    first: Callable[[str, bytes], Awaitable[bool]] | None = None,
    per_peer: int | None = 2,
) -> None:
    """Answer batch requests from ``store``; at most ``slots`` uploads at a time for
    anyone, and ``kept`` more only for the peers ``first(peer, voucher)`` names (the run's
    validators and trainer: strangers holding every open slot cannot make a validator
    find an honest batch unavailable); at most ``per_peer`` streams of one peer (SPEC §6:
    its concurrent fetches leave room for others; None: no cap of this protocol's own).
    An upload whose reader takes no frame within the read deadline ends and frees its
    slot."""
    uploads = trio.Semaphore(slots)
    kept_uploads = trio.Semaphore(kept) if first is not None and kept else None

    def take_slot(served_first: bool) -> trio.Semaphore:
        if served_first and kept_uploads is not None:
            try:
                kept_uploads.acquire_nowait()
                return kept_uploads
            except trio.WouldBlock:
                pass
        try:
            uploads.acquire_nowait()
        except trio.WouldBlock:
            raise WireError(Reason.BUSY, "every upload slot is taken") from None
        return uploads

    async def handle(req: BatchRequest, responder: Responder) -> None:
        try:
            envelope = (
                store.get(req.work_key)
                if isinstance(store, BatchStore)
                else store.get(req.work_key, responder.peer)
            )
        except BatchStoreError as exc:
            log.error("cannot serve %s: %s", req.work_key.hex()[:16], exc)
            raise WireError(Reason.INTERNAL, "stored batch is damaged") from exc
        if envelope is None:
            raise WireError(Reason.NOT_FOUND, "no batch with this work key here")
        served_first = first is not None and await first(responder.peer, req.voucher)
        slot = take_slot(served_first)
        try:
            await responder.send(
                BatchReply(**node.header(), work_key=req.work_key, size=len(envelope))
            )
            for start in range(0, len(envelope), BATCH_FRAME):
                await responder.write(envelope[start : start + BATCH_FRAME])
            node.metrics.inc("batches_served")
        finally:
            slot.release()

    node.serve_requests(
        ids.BATCH, BatchRequest, handle, deadline=TRANSFER_DEADLINE_S, per_peer=per_peer
    )


async def fetch_batch(
    node: Node,
    peer: str,
    work_key: bytes,
    *,
    expected_size: int | None = None,
    max_size: int | None = None,
    voucher: bytes = b"",
) -> tuple[RolloutBatch, bytes]:
    """The batch ``work_key`` from ``peer`` and its envelope; ``WireError`` (counted as a
    rejection under the batch protocol) when what arrives is not that batch.
    ``expected_size``: what ``peer`` announced; ``max_size``: the most its submitted units
    allow (``protocol.rollouts.max_envelope_size``); a reply declaring more than either is
    refused before a byte of the batch is read. ``voucher``: a validator's (served first)."""
    request = BatchRequest(**node.header(), work_key=work_key, voucher=voucher)
    started = trio.current_time()
    try:
        with trio.fail_after(TRANSFER_DEADLINE_S):
            await node.direct_path(peer)  # over a relay only if hole punching cannot help
            async with node.open_request(peer, ids.BATCH, request, BatchReply) as exchange:
                reply: BatchReply = exchange.reply
                if reply.work_key != work_key:
                    raise WireError(Reason.MALFORMED, "reply names another work key")
                if expected_size is not None and reply.size > expected_size:
                    raise WireError(
                        Reason.OVERSIZED, f"{reply.size} bytes > {expected_size} announced"
                    )
                limit = min(MAX_BATCH_ENVELOPE, max_size or MAX_BATCH_ENVELOPE)
                if reply.size > limit:
                    what = "its submitted units allow" if limit == max_size else "a batch takes"
                    raise WireError(
                        Reason.OVERSIZED, f"{reply.size} bytes > {limit}, the most {what}"
                    )
                data = bytearray()
                with trio.fail_after(FRAMES_BASE_S + reply.size / MIN_RATE):
                    while len(data) < reply.size:
                        try:
                            frame = await exchange.reader.read_frame(
                                min(BATCH_FRAME, reply.size - len(data)), node.cfg.net.read_timeout
                            )
                        except EOFError as exc:
                            raise WireError(Reason.TRUNCATED, "the batch ended early") from exc
                        data += frame
    except trio.TooSlowError as exc:
        raise WireError(
            Reason.TIMEOUT, "no stream, or no whole batch, within the deadline"
        ) from exc
    envelope = bytes(data)
    try:  # off the trio thread: up to 48 MiB to check, decode and hash, sized by the peer
        opened = await trio.to_thread.run_sync(opened_batch, envelope, peer, node.cfg.run.id)
        if opened.work_key != work_key:  # even signed by the worker: a failed fetch, since
            # only this fetcher saw it and the chain cannot check an Ed25519 signature (SPEC
            # §19.1, key_mismatch: a bonded reject for it could be overturned by the others)
            raise WireError(Reason.MALFORMED, "the batch does not hash to its work key")
    except WireError as err:
        node.reject(ids.BATCH, peer, err)
        raise
    node.metrics.observe("batch_fetch_seconds", trio.current_time() - started)
    return opened.message, envelope


@dataclass(frozen=True)
class Opened:
    message: RolloutBatch
    work_key: bytes


def opened_batch(envelope: bytes, peer: str, run_id: str) -> Opened:
    """The batch in ``envelope``, served by ``peer``, with its work key (blocking)."""
    batch = open_message(envelope, RolloutBatch)
    if batch.sender != peer:
        raise WireError(Reason.SENDER_MISMATCH, "the batch is not signed by the peer serving it")
    if batch.run_id != run_id:
        raise WireError(Reason.WRONG_RUN, f"batch of run {batch.run_id!r}")
    return Opened(batch, batch.work_key())


def follow_steps(node: Node, clock: StepClock) -> None:
    """Feed ``clock`` every step notice ``node`` hears; a malformed one is counted."""

    def on_step(msg: Any) -> None:
        try:
            clock.observe(msg.sender, StepNotice.decode(msg.body))
        except WireError as err:
            node.reject("announce/steps", msg.sender, err)

    node.subscribe(STEP_TOPIC, on_step)
