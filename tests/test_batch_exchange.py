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


# ---- served first: the run's validators and trainer (SPEC §13) ------------------------

CHAIN_ID, CONTRACT = 1337, "0x" + "11" * 20


def test_a_voucher_names_one_account_for_one_peer_on_one_chain_and_contract():
    from eth_account import Account

    from ledger.vouchers import sign_voucher, voucher_signer

    account = Account.create()
    voucher = sign_voucher(account, CHAIN_ID, CONTRACT, "peer-a")
    assert len(voucher) == 65
    assert voucher_signer(voucher, CHAIN_ID, CONTRACT.upper().replace("0X", "0x"), "peer-a") == (
        account.address
    )
    for chain_id, contract, peer in [
        (CHAIN_ID, CONTRACT, "peer-b"),  # copied by another peer
        (CHAIN_ID + 1, CONTRACT, "peer-a"),  # another chain
        (CHAIN_ID, "0x" + "22" * 20, "peer-a"),  # another run's contract
    ]:
        assert voucher_signer(voucher, chain_id, contract, peer) != account.address
    assert voucher_signer(voucher[:64], CHAIN_ID, CONTRACT, "peer-a") is None
    assert voucher_signer(b"", CHAIN_ID, CONTRACT, "peer-a") is None


async def test_first_served_are_the_trainer_and_vouched_validators_one_chain_read_per_peer(
    autojump_clock,
):
    import trio
    from eth_account import Account

    from ledger.vouchers import sign_voucher
    from node.roles.io.exchange import FirstServed

    validator, other = Account.create(), Account.create()
    asked = []

    def is_validator(account):
        asked.append(account)
        if account == "down":
            raise ConnectionError("the chain is down")
        return account == validator.address

    first = FirstServed("trainer", is_validator, chain_id=CHAIN_ID, contract=CONTRACT, ttl=60)
    assert await first("trainer", b"")  # by its peer id: no voucher, no chain read
    assert not await first("stranger", b"") and asked == []
    ours = sign_voucher(validator, CHAIN_ID, CONTRACT, "validator-peer")
    assert await first("validator-peer", ours)
    assert not await first("copycat", ours)  # the voucher names another peer
    assert not await first("other-peer", sign_voucher(other, CHAIN_ID, CONTRACT, "other-peer"))
    assert len(asked) == 3
    for _ in range(5):  # kept: whatever a peer sends next, no more chain reads
        assert await first("validator-peer", b"junk")
        assert not await first("copycat", ours)
    assert len(asked) == 3
    await trio.sleep(61)  # then asked again
    assert await first("validator-peer", ours) and len(asked) == 4

    flaky = FirstServed(None, lambda a: is_validator("down"), chain_id=CHAIN_ID, contract=CONTRACT)
    assert not await flaky("validator-peer", ours)  # served as anyone, not remembered
    assert not await flaky("validator-peer", ours) and asked.count("down") == 2


async def test_strangers_holding_every_open_slot_cannot_keep_a_validator_from_a_batch(tmp_path):
    """Two strangers ask for a large batch and never read: they hold the worker's two open
    upload slots, and a stranger's fetch is refused busy. A validator whose voucher the
    chain backs still gets the batch (a slot kept for the run's validators and trainer);
    without its voucher, or with it copied by a stranger, busy. A slot held without reading
    is lost within the read deadline: then the stranger is served too."""
    import trio
    from eth_account import Account

    from ledger.vouchers import sign_voucher
    from node.roles.io.exchange import FirstServed

    names = ("holder", "hog-1", "hog-2", "validator", "stranger")
    async with net.some_nodes(tmp_path, names, run__id=RUN) as nodes:
        holder, hog1, hog2, validator, stranger = nodes
        batch = a_batch(holder.identity)
        envelope = seal(holder.identity, type(batch)(**{**batch.__dict__, "run_id": RUN}))
        store = BatchStore(tmp_path / "store")
        key, junk_key = store.put(envelope), bytes(range(32))
        junk = os.urandom(24 << 20)  # more than a stalled reader's windows and buffers take

        class Served:
            def get(self, work_key, peer=None):
                return junk if work_key == junk_key else store.get(work_key)

        account = Account.create()
        first = FirstServed(
            None, lambda a: a == account.address, chain_id=CHAIN_ID, contract=CONTRACT
        )
        serve_batches(holder, Served(), slots=2, kept=1, first=first)
        voucher = sign_voucher(account, CHAIN_ID, CONTRACT, validator.peer_id)

        async def hold(hog, task_status=trio.TASK_STATUS_IGNORED):
            req = BatchRequest(**hog.header(), work_key=junk_key)
            async with hog.open_request(holder.peer_id, ids.BATCH, req, BatchReply):
                task_status.started()
                await trio.sleep_forever()  # never reads a frame

        async with trio.open_nursery() as hogs:
            await hogs.start(hold, hog1)
            await hogs.start(hold, hog2)
            with pytest.raises(RemoteRefusal) as busy:
                await fetch_batch(stranger, holder.peer_id, key)
            assert busy.value.reason == Reason.BUSY.value
            for who, sent in [(validator, b""), (stranger, voucher)]:
                with pytest.raises(RemoteRefusal) as busy:
                    await fetch_batch(who, holder.peer_id, key, voucher=sent)
                assert busy.value.reason == Reason.BUSY.value
            got, raw = await fetch_batch(validator, holder.peer_id, key, voucher=voucher)
            assert raw == envelope
            with trio.fail_after(30):  # the hogs' uploads stall past the read deadline (3 s)
                while True:
                    try:
                        await fetch_batch(stranger, holder.peer_id, key)
                        break
                    except RemoteRefusal:
                        await trio.sleep(0.5)
            hogs.cancel_scope.cancel()


async def test_a_validators_ledger_voucher_is_first_served_by_the_contracts_word():
    """The real path on the embedded chain: a validator's ``LedgerClient.voucher`` for its
    peer id is served first by a worker whose ``FirstServed`` reads ``is_validator`` from
    the contract; the same voucher from the worker's own account (not a validator), or sent
    by another peer, is not."""
    from ledger.chain import connect
    from node.roles.io.exchange import FirstServed
    from tests.helpers.ledger import Ledger

    run = Ledger(connect("embedded"))
    as_worker = run.client(run.worker)
    first = FirstServed(
        None, as_worker.is_validator, chain_id=run.chain.chain_id, contract=run.address
    )
    voucher = run.client(run.v2).voucher("validator-peer")
    assert await first("validator-peer", voucher)
    assert not await first("worker-peer", as_worker.voucher("worker-peer"))
    assert not await first("copycat", voucher)
