"""Fetching a batch from a peer over libp2p: the honest path, and every way a peer can serve
something else (two real runtimes in this process, on 127.0.0.1)."""

import os

import pytest

from crypto.identity import Identity
from node.net.requests import RemoteRefusal
from node.roles.io.exchange import fetch_batch, serve_batches
from node.rollouts.store import BatchStore
from protocol import ids
from protocol.batches import BatchReply, BatchRequest
from protocol.errors import Reason, WireError
from protocol.wire import seal
from tests.helpers import net
from tests.helpers.batches import a_batch

RUN = "test-run"


def two_nodes(tmp_path):
    return net.two_nodes(tmp_path, ("holder", "fetcher"), run__id=RUN)


def rejected(node, reason):
    return node.metrics.get("rejected", reason=reason.value, protocol=ids.BATCH)


async def test_an_honest_batch_is_fetched_and_an_unknown_key_refused(tmp_path):
    async with two_nodes(tmp_path) as (holder, fetcher):
        store = BatchStore(tmp_path / "store")
        batch = a_batch(holder.identity)
        batch = type(batch)(**{**batch.__dict__, "run_id": RUN})
        envelope = seal(holder.identity, batch)
        key = store.put(envelope)
        serve_batches(holder, store)
        got, raw = await fetch_batch(fetcher, holder.peer_id, key, expected_size=len(envelope))
        assert got == batch and raw == envelope
        with pytest.raises(RemoteRefusal) as exc:
            await fetch_batch(fetcher, holder.peer_id, bytes(32))
        assert exc.value.reason == Reason.NOT_FOUND.value
        assert holder.metrics.get("batches_served") == 1
        # the fetch time of the whole batch, once (the refused fetch is not timed)
        timed = fetcher.metrics.registry.get_sample_value
        assert timed("intellect_batch_fetch_seconds_count") == 1
        assert 0 < timed("intellect_batch_fetch_seconds_sum") < 120


def serve_this(holder, body_for, size_for=len, send=None, deadline=None):
    """The holder answers every request with ``body_for(key)`` (announced as
    ``size_for(body)`` bytes), or with what ``send`` writes (within ``deadline`` s, or the
    node's own handler deadline)."""

    async def handle(req, responder):
        body = body_for(req.work_key)
        await responder.send(
            BatchReply(**holder.header(), work_key=req.work_key, size=size_for(body))
        )
        await (send(responder, body) if send else responder.write(body))

    extra = {} if deadline is None else {"deadline": deadline}
    holder.serve_requests(ids.BATCH, BatchRequest, handle, **extra)


@pytest.mark.parametrize(
    "case", ["other_batch", "other_run", "other_signer", "garbage", "oversized", "truncated"]
)
async def test_a_peer_serving_something_else_is_refused_with_a_counted_reason(tmp_path, case):
    async with two_nodes(tmp_path) as (holder, fetcher):
        mine = a_batch(holder.identity)
        mine = type(mine)(**{**mine.__dict__, "run_id": RUN})
        key = mine.work_key()
        expected_size = 10_000
        reason = Reason.MALFORMED
        if case == "other_batch":  # a valid batch of the holder's, but not the one asked for
            other = a_batch(holder.identity, reward=0.0)
            other = type(other)(**{**other.__dict__, "run_id": RUN})
            serve_this(holder, lambda k: seal(holder.identity, other))
        elif case == "other_run":
            foreign = type(mine)(**{**mine.__dict__, "run_id": "another-run"})
            key = foreign.work_key()
            serve_this(holder, lambda k: seal(holder.identity, foreign))
            reason = Reason.WRONG_RUN
        elif case == "other_signer":  # someone else's batch relayed as if it were the holder's
            stranger = Identity.generate()
            theirs = type(mine)(**{**mine.__dict__, "sender": stranger.peer_id})
            key = theirs.work_key()
            serve_this(holder, lambda k: seal(stranger, theirs))
            reason = Reason.SENDER_MISMATCH
        elif case == "garbage":
            serve_this(holder, lambda k: os.urandom(3000))
        elif case == "oversized":  # more than the notice announced: refused before reading
            serve_this(
                holder, lambda k: seal(holder.identity, mine), size_for=lambda b: expected_size + 1
            )
            reason = Reason.OVERSIZED
        else:  # announces more than it sends, then closes

            async def half(responder, body):
                await responder.write(body[: len(body) // 2])

            serve_this(holder, lambda k: seal(holder.identity, mine), send=half)
            reason = Reason.TRUNCATED
        before = rejected(fetcher, reason)
        with pytest.raises(WireError) as exc:
            await fetch_batch(fetcher, holder.peer_id, key, expected_size=expected_size)
        assert exc.value.reason is reason, exc.value
        if case not in ("oversized", "truncated"):  # data that arrived whole is counted
            assert rejected(fetcher, reason) == before + 1
        # the fetcher goes on working: the holder's honest answer is taken next
        store = BatchStore(tmp_path / "store")
        good = store.put(seal(holder.identity, mine))
        serve_batches(holder, store)
        got, _ = await fetch_batch(fetcher, holder.peer_id, good)
        assert got == mine


async def test_a_batch_sent_a_byte_at_a_time_is_cut_off_at_its_size_deadline(tmp_path, monkeypatch):
    """Every frame within the read deadline, a small batch a byte per frame held the fetch
    (and a validator's only judging loop) for the whole 120 s. Once the size is known, the
    frames get ``FRAMES_BASE_S`` plus ``size / MIN_RATE``."""
    import trio

    from node.roles.io import exchange

    monkeypatch.setattr(exchange, "FRAMES_BASE_S", 1.0)
    async with two_nodes(tmp_path) as (holder, fetcher):
        mine = a_batch(holder.identity)
        mine = type(mine)(**{**mine.__dict__, "run_id": RUN})

        async def trickle(responder, body):
            for i in range(len(body)):
                await responder.write(body[i : i + 1])
                await trio.sleep(0.1)

        serve_this(holder, lambda k: seal(holder.identity, mine), send=trickle, deadline=3600)
        with trio.fail_after(30), pytest.raises(WireError) as exc:  # 120 s before
            await fetch_batch(fetcher, holder.peer_id, mine.work_key())
        assert exc.value.reason is Reason.TIMEOUT


async def test_a_batch_larger_than_its_units_allow_is_refused_before_it_is_read(tmp_path):
    """A worker announced (and served) 45 MiB for one submitted unit: the validator read and
    decoded all of it before the units check rejected it (4.7 s of a thread for one unit of
    collateral). The reply's size is now checked against what the units allow."""
    import trio

    async with two_nodes(tmp_path) as (holder, fetcher):
        mine = a_batch(holder.identity)
        mine = type(mine)(**{**mine.__dict__, "run_id": RUN})
        envelope = seal(holder.identity, mine)
        serve_this(holder, lambda k: envelope + bytes(40 << 20))
        with trio.fail_after(30), pytest.raises(WireError) as exc:
            await fetch_batch(fetcher, holder.peer_id, mine.work_key(), max_size=38_000)
        # refused on the reply's size: read whole, it would have failed to decode instead
        assert exc.value.reason is Reason.OVERSIZED
        assert "the most its submitted units allow" in str(exc.value)
        # the honest batch, within what its units allow, is taken whole
        store = BatchStore(tmp_path / "store")
        key = store.put(envelope)
        serve_batches(holder, store)
        got, raw = await fetch_batch(fetcher, holder.peer_id, key, max_size=len(envelope))
        assert got == mine and raw == envelope
