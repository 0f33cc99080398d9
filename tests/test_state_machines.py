import pytest
import trio

from node.net.delivery import Inbox, Outbox
from node.net.metrics import Metrics
from node.net.pacing import TokenBucket
from node.net.peers import PeerTable


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


def test_metrics_render():
    m = Metrics()
    m.inc("rejected", reason="replay", protocol="/x")
    m.inc("rejected", 2, reason="oversized", protocol="/x")
    m.inc("bytes", 10, direction="in")
    assert m.by_label("rejected", "reason") == {"replay": 1, "oversized": 2}
    text = m.render({"peers": {(("role", "trainer"),): 3.0}})
    assert 'intellect_rejected_total{protocol="/x",reason="oversized"} 2' in text
    assert 'intellect_peers{role="trainer"} 3' in text
    assert "# TYPE intellect_bytes_total counter" in text
