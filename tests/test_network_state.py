"""The network's pure state machines (``node/net/``): discovery back-off (on trio's MockClock),
provide refreshes, connection watermarks, the peer table, paced publishing, once-only
delivery of announcements, metrics, and the convergence rule."""

import random

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from node.net.connections import IN_USE_S, ConnectionPlan, LinkUse
from node.net.convergence import problems
from node.net.delivery import Inbox, Outbox
from node.net.metrics import Metrics
from node.net.pacing import TokenBucket
from node.net.peers import PeerTable
from node.net.schedules import NEEDS, LookupSchedule, ProvideSchedule


async def _drive(schedule: LookupSchedule, roles_at, until: float) -> list[float]:
    """Run the schedule the way the runtime does (a 1 s tick); return the virtual times of
    lookup rounds. ``roles_at(t)``: the roles with a live peer in the table at time t."""
    rounds = []
    while trio.current_time() < until:
        now = trio.current_time()
        schedule.observe(now, roles_at(now))
        if schedule.is_due(now):
            rounds.append(now)
            schedule.looked_up(now, roles_at(now))
        await trio.sleep(1.0)
    return rounds


async def test_lookups_back_off_once_found_and_return_when_a_role_disappears(autojump_clock):
    s = LookupSchedule(NEEDS["inference"], base=5, longest=80, longest_missing=20)
    both = {"trainer", "validator", "inference"}

    def roles_at(t):  # found at 12 s, the validator gone from 300 s to 400 s
        if t < 12:
            return set()
        return both - {"validator"} if 300 <= t < 400 else both

    rounds = await _drive(s, roles_at, until=600)
    # knowing nobody: every 5 s (0, 5, 10); found at 12: the round at 15 sees both roles,
    # then the interval doubles up to 80: 25, 45, 85, 165, 245
    # at 300 the validator is gone: a round at once, then 5, 10, 20, 20 ... while missing
    # at 400 it is back: the round at 415 doubles on to 40, 80
    assert rounds == [0, 5, 10, 15, 25, 45, 85, 165, 245, 300, 305, 315, 335, 355, 375, 395,
                      415, 455, 535]  # fmt: skip
    gaps = [b - a for a, b in zip(rounds, rounds[1:], strict=False)]
    assert max(gaps) == 80 and gaps[-1] == 80


async def test_a_bootstrap_needs_no_role_and_settles_at_the_longest(autojump_clock):
    s = LookupSchedule(NEEDS["bootstrap"], base=5, longest=60, longest_missing=10)
    rounds = await _drive(s, lambda t: {"inference"}, until=300)
    assert rounds == [0, 5, 15, 35, 75, 135, 195, 255]


async def test_a_node_that_knows_nobody_does_not_back_off(autojump_clock):
    s = LookupSchedule(NEEDS["inference"], base=5, longest=80, longest_missing=20)
    rounds = await _drive(s, lambda t: set() if t < 30 else {"bootstrap"}, until=100)
    assert rounds == [0, 5, 10, 15, 20, 25, 30, 40, 60, 80]


def test_lookup_schedule_rejects_a_base_above_its_caps():
    with pytest.raises(ValueError, match="base"):
        LookupSchedule(frozenset(), base=10, longest=5, longest_missing=5)


def test_provide_at_first_peer_again_when_the_table_doubles_and_at_republish():
    p = ProvideSchedule(republish=1000, retry=20, k=8)
    assert not p.is_due(0, 0)  # nobody to store the record on
    assert p.is_due(1, 1)
    p.provided(1, 1, ok=False)  # reached nobody: wait before trying again
    assert not p.is_due(10, 1) and p.is_due(21, 1)
    p.provided(21, 3, ok=True)
    assert not p.is_due(22, 7)  # doubled, but fewer than k peers: the walk asked the network
    assert p.is_due(22, 8)
    p.provided(22, 8, ok=True)
    assert not p.is_due(23, 15)  # grew, not doubled
    assert p.is_due(23, 16)
    p.provided(23, 16, ok=True)
    assert not p.is_due(1022, 31) and p.is_due(1023, 31)  # the DHT's republish interval


def test_a_provide_that_keeps_failing_is_retried_ever_less_often():
    p = ProvideSchedule(republish=1000, retry=20)
    now, waits = 0.0, []
    for _ in range(8):
        assert p.is_due(now, 5)
        p.provided(now, 5, ok=False)
        wait = p.retry_at - now
        assert not p.is_due(now + wait - 0.1, 5)
        waits.append(wait)
        now += wait
    assert waits == [20, 40, 80, 160, 320, 640, 1000, 1000]  # doubling, capped at republish
    p.provided(now, 5, ok=True)
    p.provided(now + 1, 5, ok=False)  # a success resets the back-off
    assert p.retry_at == now + 1 + 20


def test_connections_close_the_surplus_down_to_low_sparing_peers_in_use_and_new_ones():
    c = ConnectionPlan(low=3, high=6, grace=3, cooldown=60, keep_per_role=1)
    conns = {f"w{i}": "inference" for i in range(8)} | {"b": "bootstrap", "x": None}
    c.update(0, {p: conns[p] for p in ["b", "w0"]})  # the oldest links
    c.update(10, conns)
    assert c.to_close(11) == []  # the new ones are inside their grace period: not counted
    assert c.protected() == {"b", "w0"}  # one per role, the longest-connected
    closing = c.to_close(13)
    # down to halfway between the watermarks (3 + 6) // 2
    assert len(closing) == 10 - 4 and "b" not in closing and "w0" not in closing
    assert closing[0] == "x"  # unknown role first
    remaining = {p: r for p, r in conns.items() if p not in closing}
    assert c.update(14, remaining) == []  # what we closed is not a drop
    assert c.to_close(14) == [] and c.to_dial(14, conns, random.Random(0)) == []
    # what we closed is not dialed again during the cooldown, even below low
    c.update(20, {"b": "bootstrap"})
    assert set(c.to_dial(20, conns, random.Random(0))) <= set(remaining)


def test_pinned_links_are_never_closed_even_of_a_crowded_role_or_transient():
    c = ConnectionPlan(low=1, high=2, grace=0, cooldown=60, keep_per_role=1)
    conns = {f"w{i}": "inference" for i in range(5)} | {"r1": "bootstrap", "r2": None}
    c.update(0, conns)
    c.pin({"r1", "r2"})  # the relays a node behind NAT holds reservations on
    closing = c.to_close(1, transient={"r2"})
    assert set(closing) == {"w1", "w2", "w3", "w4"}  # w0 and r1: the peers in use
    c.pin(set())  # reservations given up: ordinary links again
    c.update(2, {p: conns[p] for p in ("w0", "r1", "r2")})
    assert "r2" in c.to_close(3, transient={"r2"})


def test_links_carrying_data_are_not_closed_until_their_exchanges_rest():
    """A weights query or a shard in flight (``LinkUse``, fed by the request layer) keeps
    its link above the high watermark: closing it cut the transfer, and the next holdings
    refresh dialled the peer again. Ten seconds after its last exchange it is closable."""
    use = LinkUse()
    c = ConnectionPlan(low=1, high=2, grace=0, cooldown=60, keep_per_role=0)
    conns = {f"w{i}": "inference" for i in range(5)}
    c.update(0, conns)
    use.began("w1")  # a shard being served
    use.began("w2")  # a holdings query, soon over
    use.finished("w2", 1.0)
    assert use.peers(2.0) == {"w1", "w2"}
    closing = c.to_close(2.0, in_use=use.peers(2.0))
    # neither closed nor counted: three idle links above high (2), closed down to 1
    assert "w1" not in closing and "w2" not in closing and len(closing) == 2
    assert c.settled(2.0, use.peers(2.0)) == 1 and c.settled(2.0) == 3  # w4; w1, w2
    c.update(3.0, {p: conns[p] for p in ("w1", "w2")})
    assert use.peers(1.0 + IN_USE_S) == {"w1"}  # w2 rested long enough
    use.began("w3")
    use.began("w3")
    use.finished("w3", 12.0)  # one of its two exchanges is still open
    assert use.peers(30.0) == {"w1", "w3"}
    use.finished("w1", 30.0)
    use.finished("w3", 30.0)
    assert use.peers(30.0 + IN_USE_S) == set()


def test_connections_dial_up_to_low_a_missing_role_first_and_cool_peers_that_dropped_us():
    c = ConnectionPlan(low=3, high=6, grace=3, cooldown=60)
    known = {"b": "bootstrap", "t": "trainer", "w1": "inference", "w2": "inference"}
    c.update(0, {"w1": "inference", "b": "bootstrap"})
    assert c.update(5, {"w1": "inference"}) == ["b"]  # b dropped us
    dial = c.to_dial(5, known, random.Random(1))
    assert dial[0] == "t" and "b" not in dial and len(dial) == 2
    assert "b" in c.to_dial(66, known, random.Random(1))  # cooled down


def test_an_isolated_node_dials_cooling_peers_rather_than_none():
    c = ConnectionPlan(low=2, high=4)
    c.update(0, {"b": "bootstrap"})
    c.update(1, {})
    assert c.to_dial(1, {"b": "bootstrap"}, random.Random(0)) == ["b"]


def test_links_of_a_dht_round_are_closed_first_and_young_links_do_not_count():
    c = ConnectionPlan(low=2, high=4, grace=5)
    settled = {"a": "inference", "b": "inference", "c": "inference", "d": "bootstrap"}
    c.update(0, settled)
    c.update(10, settled | {"q1": "inference", "q2": "inference"})  # a query's links
    assert c.settled(11) == 4 and c.settled(15) == 6
    assert c.to_close(11) == []  # 4 settled: at the watermark, the young ones do not count
    assert c.to_close(11, transient={"q1", "q2"}) == ["q1", "q2", "c"]


def test_a_link_inside_its_grace_is_not_closed_even_when_the_settled_ones_are_too_many():
    # a greeting may be running on it: closing the newest link first would cut it
    c = ConnectionPlan(low=1, high=2, grace=5, keep_per_role=0)
    c.update(0, {"a": "inference", "b": "inference", "c": "inference"})
    c.update(10, {"a": "inference", "b": "inference", "c": "inference", "young": "inference"})
    closing = c.to_close(11)
    assert closing and "young" not in closing


def test_connection_plan_needs_ordered_watermarks():
    with pytest.raises(ValueError, match="low"):
        ConnectionPlan(low=5, high=4)


def test_peer_table_holds_at_most_per_role_replacing_the_least_recently_heard():
    t = PeerTable("me", ttl=100, per_role=3)
    for i in range(3):
        t.seen(f"w{i}", "inference", [], now=i)
    t.seen("w0", "inference", [], now=10)  # heard again: w1 is now the stalest
    t.seen("v", "validator", [], now=11)
    assert t.seen("w3", "inference", [], now=12)
    assert set(t.peers) == {"w0", "w2", "w3", "v"}
    assert t.silent(105) == ["w2"] and t.forget("w2") and not t.forget("w2")


def _st(peer, role, by_role, count, low=2, high=4):
    return {
        "peer_id": peer,
        "role": role,
        "peers_by_role": by_role,
        "connections": {"count": count + 1, "settled": count, "low": low, "high": high},
    }


def test_converged_needs_a_live_peer_of_every_other_role_and_connections_in_range():
    sts = [
        _st("b", "bootstrap", {"inference": 2}, 2),
        _st("w1", "inference", {"bootstrap": 1, "inference": 1}, 2),
        _st("w2", "inference", {"bootstrap": 1, "inference": 1}, 3),
    ]
    assert problems(sts) == []
    sts[1]["peers_by_role"] = {"bootstrap": 1}
    sts[2]["connections"]["settled"] = 5
    sts[0]["connections"]["count"] = 1
    assert problems(sts) == [
        "b holds 1 connections, fewer than 2",
        "w1 (inference) knows no live inference",
        "w2 holds 5 settled connections, more than 4",
    ]
    # two nodes: low is capped at the one other node there is
    assert problems([_st("b", "bootstrap", {"inference": 1}, 1), _st("w", "inference", {"bootstrap": 1}, 1)]) == []  # fmt: skip


async def test_gap_repair_gives_gossip_time_when_the_heartbeat_came_on_gossip(
    autojump_clock, tmp_path
):
    """A heartbeat on gossip can overtake the announcements it counts: the receiver asks the
    publisher for the missing ones only SYNC_GRACE s later (more while gossip still brings
    that publisher's announcements, SYNC_PATIENCE at most), and only for those still missing
    then; a heartbeat from a presence exchange (a new contact) is acted on at once."""
    from crypto.identity import Identity
    from node.config import NodeConfig
    from node.net.announcements import SYNC_GRACE, SYNC_PATIENCE
    from node.net.runtime import Node
    from protocol.messages import SyncReply

    publisher = Node(NodeConfig(data_dir=tmp_path / "p"), Identity.generate())
    for i in range(5):
        publisher.announcements.outbox.add(i, b"signed announcement %d" % i)
    receiver = Node(NodeConfig(data_dir=tmp_path / "r"), Identity.generate())
    asked: list[tuple[float, list[int]]] = []

    async def request(peer, protocol, req, reply_type):
        assert peer == publisher.peer_id
        asked.append((trio.current_time(), list(req.indices)))
        return SyncReply(**publisher.header(), items=[])

    receiver.requests.request = request
    session = publisher.announcements.session
    async with trio.open_nursery() as nursery:
        receiver.announcements._nursery = nursery
        start = trio.current_time()
        receiver.presence.heard(publisher.node_info(), via="gossip")
        await trio.sleep(SYNC_GRACE / 2)
        assert asked == []  # not yet: gossip may still bring them
        for i in (0, 1, 3):  # gossip delivers three of the five meanwhile
            assert receiver.announcements.inbox.add(publisher.peer_id, session, i)
        for i in (5, 6):  # and the publisher announces two more, counted by a new heartbeat
            publisher.announcements.outbox.add(i, b"signed announcement %d" % i)
        receiver.presence.heard(publisher.node_info(), via="gossip")
        await trio.sleep(SYNC_GRACE)
        assert asked == []  # gossip made progress in the grace period: it gets another
        await trio.sleep(SYNC_GRACE)
        assert asked == [(start + 2 * SYNC_GRACE, [2, 4, 5, 6])]  # none in that one: ask

        asked.clear()
        start = trio.current_time()
        receiver.presence.heard(publisher.node_info(), via="direct")
        await trio.sleep(SYNC_GRACE * 2)
        assert asked == [(start, [2, 4, 5, 6])]

        # gossip that keeps bringing them (one a second) is waited for, SYNC_PATIENCE at most
        asked.clear()
        for i in range(7, 20):
            publisher.announcements.outbox.add(i, b"signed announcement %d" % i)
        start = trio.current_time()
        receiver.presence.heard(publisher.node_info(), via="gossip")
        for i in (2, 4, 5, 6, 7, 8, 9, 10, 11):
            await trio.sleep(1.0)
            assert receiver.announcements.inbox.add(publisher.peer_id, session, i)
        await trio.sleep(SYNC_PATIENCE)
        assert asked == [(start + SYNC_PATIENCE, list(range(12, 20)))]


async def test_heartbeats_from_many_new_keys_start_a_bounded_number_of_syncs(
    autojump_clock, tmp_path
):
    """Keys cost nothing: a flood of heartbeats, each from a new "publisher" claiming
    announcements, started one sync task (and one dial) per key. At most ``MAX_SYNCS``
    run at once; the others are counted and asked at their next heartbeat."""
    from crypto.identity import Identity
    from node.config import NodeConfig
    from node.net.announcements import MAX_SYNCS
    from node.net.runtime import Node
    from protocol.messages import SyncReply

    receiver = Node(NodeConfig(data_dir=tmp_path / "r"), Identity.generate())
    asked, answer = [], trio.Event()

    async def request(peer, protocol, req, reply_type):
        asked.append(peer)
        await answer.wait()
        return SyncReply(**receiver.header(), items=[])

    receiver.requests.request = request
    flood = [Identity.generate().peer_id for _ in range(100)]
    syncs = receiver.announcements
    async with trio.open_nursery() as nursery:
        syncs._nursery = nursery
        for sender in flood:
            syncs.heard(sender, session=1, announced=5, via="direct")
        await trio.sleep(1)
        assert sorted(asked) == sorted(flood[:MAX_SYNCS]) and len(syncs._syncing) == MAX_SYNCS
        assert receiver.metrics.get("syncs_deferred") == len(flood) - MAX_SYNCS
        answer.set()  # those end: the next heartbeats of the others are acted on
        await trio.sleep(1)
        assert syncs._syncing == {}
        for sender in flood[MAX_SYNCS:]:
            syncs.heard(sender, session=1, announced=5, via="direct")
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert sorted(asked) == sorted(flood[: 2 * MAX_SYNCS])


async def test_providers_nearby_asks_the_closest_connected_peers_once_each(autojump_clock):
    """A lookup among connected peers: the ``limit`` peers closest to the key, one
    GET_PROVIDERS each, in parallel; a peer that fails or hangs costs nothing but its own
    answer; what is found comes back (once per provider) and is cached in the store."""
    from libp2p.kad_dht.kad_dht import _encode_key
    from libp2p.kad_dht.utils import sort_peer_ids_by_distance
    from libp2p.peer.id import ID
    from libp2p.peer.peerinfo import PeerInfo

    from node.net.host import providers_nearby

    key = "/intellect/run/role/trainer"
    raw = _encode_key(key)
    peers = [ID(bytes([0, 36, 8, 1, 18, 32]) + bytes([i]) * 32) for i in range(12)]
    closest = sort_peer_ids_by_distance(raw, peers)[:8]
    trainer = PeerInfo(ID(bytes([0, 36, 8, 1, 18, 32]) + b"\xee" * 32), [])
    asked, cached = [], []

    class Store:
        async def _get_providers_from_peer_with_closers(self, peer, k):
            assert k == raw
            asked.append(peer)
            if peer == closest[1]:
                raise OSError("stream reset")
            if peer == closest[2]:
                await trio.sleep(3600)  # never answers
            return ([trainer] if peer in closest[3:6] else []), peers

        def add_provider(self, k, info):
            cached.append((k, info.peer_id))

    class Dht:
        provider_store = Store()

    start = trio.current_time()
    found = await providers_nearby(Dht(), key, peers, limit=8, per_peer_s=5.0)
    assert sorted(asked, key=str) == sorted(closest, key=str)  # the 8 closest, once each
    assert [i.peer_id for i in found] == [trainer.peer_id]
    assert cached == [(raw, trainer.peer_id)] * 3
    assert trio.current_time() - start == 5.0  # the silent peer was cut at per_peer_s


def test_peer_table_ttl_and_leave():
    t = PeerTable("me", ttl=10)
    assert t.seen("a", "trainer", ["/ip4/1.2.3.4/tcp/1"], now=0)
    assert not t.seen("a", "trainer", [], now=5)  # known; empty addrs keep the old ones
    assert t.peers["a"].addrs == ["/ip4/1.2.3.4/tcp/1"]
    assert not t.seen("me", "inference", [], now=0)  # never ourselves
    t.seen("b", "inference", [], now=1)
    assert t.expire(now=11) == []  # exactly ttl: still kept
    assert t.expire(now=11.5) == ["b"]  # b silent over 10 s, a seen at 5
    assert "a" in t and "b" not in t
    assert t.expire(now=15) == []
    assert t.expire(now=15.01) == ["a"]
    t.seen("c", "validator", [], now=20)
    assert t.leave("c") and not t.leave("c")
    assert t.by_role() == {}


def test_peer_table_late_heartbeat_does_not_move_time_back():
    t = PeerTable("me", ttl=10)
    t.seen("a", "trainer", [], now=8)
    t.seen("a", "trainer", [], now=3)
    assert t.expire(now=17) == []


def test_peer_table_late_heartbeat_after_leave_is_ignored_until_a_newer_one():
    t = PeerTable("me", ttl=10)
    t.seen("a", "trainer", [], now=0, seq=10)
    assert t.leave("a", seq=12)
    assert not t.seen("a", "trainer", [], now=1, seq=11)  # sent before leaving, arrived after
    assert "a" not in t
    assert t.seen("a", "trainer", [], now=2, seq=13)  # restarted
    assert "a" in t and "a" not in t.departed


def test_token_bucket_exact_times():
    b = TokenBucket(rate=10, burst=2)
    assert b.delay(0) == 0
    b.take(0)
    b.take(0)
    assert b.delay(0) == pytest.approx(0.1)
    with pytest.raises(RuntimeError):
        b.take(0.05)
    assert b.delay(0.1) == 0
    b.take(0.1)
    with pytest.raises(ValueError, match="rate"):
        TokenBucket(rate=0, burst=1)


async def test_paced_sends_happen_at_exact_virtual_times(autojump_clock):
    bucket = TokenBucket(rate=4, burst=1)
    times = []
    for _ in range(5):
        await trio.sleep(bucket.delay(trio.current_time()))
        bucket.take(trio.current_time())
        times.append(trio.current_time())
    start = times[0]
    assert [round(t - start, 6) for t in times] == [0, 0.25, 0.5, 0.75, 1.0]


def test_outbox_keeps_the_last_capacity_items():
    o = Outbox(session=5, capacity=3)
    for i in range(5):
        o.add(o.next_index(), f"e{i}".encode())
    assert o.count == 5
    assert o.get(5, [0, 1, 2, 3, 4]) == [b"e2", b"e3", b"e4"]
    assert o.get(6, [4]) == []  # another session
    with pytest.raises(ValueError, match="expected 5"):
        o.add(7, b"x")


def test_inbox_at_most_once_and_gap_detection():
    ib = Inbox(horizon=100)
    assert ib.add("p", 1, 0)
    assert not ib.add("p", 1, 0)
    assert ib.add("p", 1, 2)
    assert ib.add("p", 1, 5)
    assert ib.missing("p", 1, published=7, limit=10) == [1, 3, 4, 6]
    assert ib.missing("p", 1, published=7, limit=2) == [1, 3]
    assert ib.add("p", 1, 1)
    assert not ib.add("p", 1, 2)
    assert ib.missing("p", 1, published=3, limit=10) == []
    # a restarted publisher (newer session) starts afresh; an older session is ignored
    assert ib.add("p", 2, 0)
    assert not ib.add("p", 1, 4)
    assert ib.missing("p", 1, published=9, limit=10) == []
    assert ib.missing("p", 2, published=3, limit=10) == [1, 2]


def test_inbox_never_asks_beyond_the_horizon():
    ib = Inbox(horizon=10)
    assert ib.missing("q", 1, published=1000, limit=100) == list(range(990, 1000))


def test_metrics_counts_and_exposes_through_prometheus_client():
    m = Metrics()
    m.inc("rejected", reason="replay", protocol="/x")
    m.inc("rejected", 2, reason="oversized", protocol="/x")
    m.inc("bytes", 10, direction="in", protocol="/x")
    assert m.by_label("rejected", "reason") == {"replay": 1, "oversized": 2}
    assert m.get("rejected", protocol="/x") == 3
    assert m.get("rejected", reason="oversized") == 2
    with pytest.raises(KeyError):
        m.inc("no_such_counter")
    with pytest.raises(ValueError, match="label"):
        m.inc("rejected", reason="replay")  # a declared counter's labels are fixed
    families = {f.name: f for f in text_string_to_metric_families(m.exposition().decode())}
    assert families["intellect_rejected"].type == "counter"
    series = {
        tuple(sorted(s.labels.items())): s.value
        for s in families["intellect_rejected"].samples
        if s.name == "intellect_rejected_total"
    }
    assert series == {
        (("protocol", "/x"), ("reason", "oversized")): 2,
        (("protocol", "/x"), ("reason", "replay")): 1,
    }
    assert "process_cpu_seconds" in families  # the process collector, on this node's registry
    assert Metrics().get("rejected") == 0  # each node has a registry of its own
