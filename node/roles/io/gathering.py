"""The trainer's batches: every accepted batch it may still train on, fetched from its
worker into the trainer's inbox (``BatchStore``).

Where the rollout comes from: a validator accepted its batch on-chain
(``node/roles/services/validator.py``); the trainer's ``WorkBook`` says which accepted batches a
step may still use. Only the worker's registered peer can serve a batch that passes (the
server must be its signer): it is asked, and the peers that announced the batch only when
the chain cannot name it (at most 4 each, for the newest ``MAX_HOLDERS`` keys). A reply
larger than the submitted units allow is not read (``max_envelope_size``). Up to
``FETCHES`` batches are fetched at once, at most one per worker: a worker that serves the
trainer slowly holds one fetch, not the others'. A fetch that fails is asked again after
``FetchRetry``'s wait, until the batch leaves the window. Where it goes next: the trainer
role (``node/roles/services/trainer.py``) trains on the inbox's batches.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import trio

from node.net.runtime import Node
from node.roles.decisions.work import Key
from node.roles.decisions.workbook import FetchRetry, WorkBook
from node.roles.io.exchange import fetch_batch
from node.rollouts.store import BatchStore, BatchStoreError
from protocol.batches import BatchNotice
from protocol.errors import WireError
from protocol.rollouts import RolloutBatch, max_envelope_size
from protocol.wire import open_message

log = logging.getLogger("intellect.trainer")
MAX_HOLDERS = 4096  # batches whose announcers are remembered
FETCHES = 4  # batches fetched at once, at most one per worker
POLL_S = 0.5


class Gatherer:
    def __init__(
        self,
        node: Node,
        inbox: BatchStore,
        book: WorkBook,
        *,
        registered: Callable[[str], str | None],
        proofs: tuple[int, int],
    ) -> None:
        """``registered(worker)``: the peer the worker registered on-chain (blocking; None
        when the chain cannot say); ``proofs``: the run's proof chunk size and top-k."""
        self.node, self.inbox, self.book = node, inbox, book
        self.registered, self.proofs = registered, proofs
        self.holders: dict[Key, list[str]] = {}  # peers that announced a batch

    def on_notice(self, sender: str, notice: BatchNotice) -> None:
        """Who announced a batch: asked only when the chain cannot name the worker's peer
        (the oldest of ``MAX_HOLDERS`` keys go: notices of keys never submitted cost none)."""
        peers = self.holders.setdefault((notice.worker, notice.work_key), [])
        if sender not in peers and len(peers) < 4:
            peers.append(sender)
        while len(self.holders) > MAX_HOLDERS:
            del self.holders[next(iter(self.holders))]

    async def run(self, wanted: Callable[[], list[Key]]) -> None:
        """Fetch the batches ``wanted()`` names (accepted, still usable, this trainer's)
        into the inbox, for ever."""
        for work_key in self.inbox.keys():  # after a restart: what was fetched before
            self.file(work_key)
        retry, fetching = FetchRetry(), set[str]()  # the workers fetched from now
        async with trio.open_nursery() as nursery:
            while True:
                for key in retry.due(wanted(), time.monotonic()):
                    if len(fetching) >= FETCHES:
                        break
                    if key[0] not in fetching:
                        fetching.add(key[0])
                        nursery.start_soon(self._fetch_one, key, retry, fetching)
                await trio.sleep(POLL_S)

    async def _fetch_one(self, key: Key, retry: FetchRetry, fetching: set[str]) -> None:
        try:
            if await self.fetch(key):
                retry.fetched(key)
            else:
                retry.failed(key, time.monotonic())
        finally:
            fetching.discard(key[0])

    def file(self, work_key: bytes) -> None:
        """A batch of the inbox, as fetched (a damaged one is deleted: fetched again)."""
        try:
            envelope = self.inbox.get(work_key)
            if envelope is None:
                return
            batch = open_message(envelope, RolloutBatch)
        except (BatchStoreError, WireError):
            self.inbox.delete(work_key)
            return
        self.book.fetched[(batch.worker, work_key)] = batch.policy_version

    async def fetch(self, key: Key) -> bool:
        """Fetch ``key``'s batch into the inbox; False when no peer served it."""
        worker, work_key = key
        registered = await trio.to_thread.run_sync(self.registered, worker)
        # only the worker's registered peer can serve its batch (the server is the signer)
        peers = [registered] if registered else list(self.holders.get(key, []))
        sub = self.book.submitted.get(key)
        units = sub.units if sub is not None else None
        most = max_envelope_size(units, *self.proofs) if units is not None else None
        for peer in peers:
            try:
                batch, envelope = await fetch_batch(self.node, peer, work_key, max_size=most)
            except Exception as exc:
                log.debug("fetching %s from %s failed: %s", work_key.hex()[:16], peer[-8:], exc)
                continue
            if batch.worker != worker or (units is not None and batch.num_tokens != units):
                log.warning("batch %s does not match its submission", work_key.hex()[:16])
                continue
            self.inbox.put(envelope)
            self.book.fetched[key] = batch.policy_version
            self.holders.pop(key, None)
            return True
        return False
