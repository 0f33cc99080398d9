"""The network simulator (bench/simulation/): it spreads a version, it accounts for the
origin's bytes, it is driven by the node's own schedule (change the schedule and its
figures change), and a link's rate sets the time exactly in a case small enough to work
out by hand. Also the schedule faults it found (node/shardcast/schedule.py)."""

import math

import pytest

from bench.simulation.baselines import relay_tree, shared_finish_times, single_origin
from bench.simulation.derived import dht_lookup_hops, gossip_delivery
from bench.simulation.links import Link
from bench.simulation.swarm import SwarmConfig, run_swarm
from node.shardcast import schedule
from node.shardcast.schedule import FAILING, DownloadPlan

MB = 1e6


def swarm(n, *, up=2 * MB, shards=16, shard=MB, seed=0, origin_up=None):
    cfg = SwarmConfig(shards=shards, shard_bytes=int(shard), seed=seed)
    origin = Link(up=origin_up or up, down=1e12)
    return run_swarm(cfg, origin, [Link(up=up, down=1e12) for _ in range(n)])


def test_every_downloader_ends_with_the_whole_version():
    r = swarm(8)
    assert len(r.done_at) == 8
    assert all(t is not None and t > 0 for t in r.done_at)
    # every byte a downloader holds was uploaded by someone
    assert r.uploaded >= 8 * r.total_bytes


def test_the_origin_sends_at_least_one_copy_and_the_peers_the_rest():
    r = swarm(8, seed=3)
    assert r.origin_uploaded >= r.total_bytes
    # rarest first, origin last and origin shares: near one copy, never eight
    assert r.origin_uploaded <= 2.0 * r.total_bytes


def test_one_downloader_takes_exactly_size_over_the_uplink():
    """Two nodes, no latency, no piece cost: the downloader holds two fetches from the
    origin at once (per_peer), which share its uplink, back to back: size / uplink."""
    shards, shard = 12, MB
    fast = swarm(1, up=4 * MB, shards=shards, shard=shard)
    slow = swarm(1, up=2 * MB, shards=shards, shard=shard)
    assert fast.done_at[0] == pytest.approx(shards * shard / (4 * MB), rel=1e-9)
    assert slow.done_at[0] == pytest.approx(shards * shard / (2 * MB), rel=1e-9)
    assert fast.origin_uploaded == slow.origin_uploaded == shards * shard


def test_a_slow_downlink_sets_the_pace_when_it_is_the_narrower_end():
    cfg = SwarmConfig(shards=8, shard_bytes=int(MB))
    r = run_swarm(cfg, Link(up=10 * MB, down=1e12), [Link(up=1e6, down=1 * MB)])
    assert r.done_at[0] == pytest.approx(8.0, rel=1e-9)


def test_latency_adds_a_round_trip_per_back_to_back_fetch():
    """One fetch at a time (one download slot): each shard costs one RTT more."""
    cfg = SwarmConfig(shards=5, shard_bytes=int(MB), download_slots=1)
    origin = Link(up=1 * MB, down=1e12, rtt=0.05)
    r = run_swarm(cfg, origin, [Link(up=1 * MB, down=1e12, rtt=0.05)])
    assert r.done_at[0] == pytest.approx(5 * (1.0 + 0.1), rel=1e-9)


def test_the_simulator_runs_the_real_schedule(monkeypatch):
    """Break the node's origin-last rule (take the origin whenever it has the shard) and
    the simulated origin sends a copy to nearly every downloader."""
    before = swarm(8, seed=3).origin_uploaded
    real_pick = DownloadPlan._pick

    def origin_first(self, now):
        got = real_pick(self, now)
        if got is None:
            return None
        shard, _ = got
        if self.origin in self.peers and shard in self.peers[self.origin].have:
            return shard, self.origin
        return got

    monkeypatch.setattr(DownloadPlan, "_pick", origin_first)
    after = swarm(8, seed=3).origin_uploaded
    assert before <= 2.0 * 16 * MB
    assert after >= 5.0 * 16 * MB


def test_the_simulator_runs_the_real_rarest_first(monkeypatch):
    """Sort shards commonest first instead of rarest first (the node's own ``_pick``, its
    one ``list(...)`` made a list whose ``sort`` runs backwards) and the downloaders chase
    the same shards: the version spreads more slowly."""
    real = swarm(12, seed=5, shards=24)

    class Backwards(list):
        def sort(self, *, key=None, reverse=False):
            super().sort(key=key, reverse=not reverse)

    monkeypatch.setattr(schedule, "list", Backwards, raising=False)
    mutated = swarm(12, seed=5, shards=24)
    assert max(mutated.done_at) > 1.1 * max(real.done_at)


# ---- the schedule faults the simulator found ---------------------------------------------


def test_a_peer_failing_all_day_backs_off_without_overflowing():
    plan = DownloadPlan(4, origin="o")
    plan.update_peer("p", {0})
    for i in range(2000):  # 2 ** 1024 does not fit a float: this ended the download
        plan.failed(0, "p", float(i))
    assert plan.peers["p"].backoff_until == pytest.approx(1999 + plan.max_backoff)


def test_a_peer_whose_fetches_only_failed_is_not_taken_before_a_measured_one():
    plan = DownloadPlan(8, origin="o", explore=0.0, max_inflight=1)
    plan.update_peer("fast", set(range(8)))
    plan.update_peer("stalls", set(range(8)))
    plan.completed(0, "fast", 1_000_000, 1.0)
    plan.done.discard(0)
    plan.failed(0, "stalls", 0.0)
    got = plan.assign(now=100.0)  # the backoff is long over
    assert [peer for _, peer in got] == ["fast"]


def test_a_failing_direct_peer_does_not_keep_the_origin_away_for_good():
    plan = DownloadPlan(1, origin="o", me="me")
    plan.update_peer("o", {0})
    plan.update_peer("bad", {0})
    for i in range(FAILING):
        plan.failed(0, "bad", float(i))
    assert plan.assign(now=1000.0) == [(0, "o")]


def test_a_peer_that_failed_once_is_still_preferred_to_the_origin():
    plan = DownloadPlan(1, origin="o", me="me")
    plan.update_peer("o", {0})
    plan.update_peer("p", {0})
    plan.failed(0, "p", 0.0)
    assert plan.assign(now=1000.0) == [(0, "p")]


# ---- baselines and the derived figures ---------------------------------------------------


def test_a_single_origin_shares_its_uplink_among_every_worker():
    times = single_origin(100.0, 10.0, [100.0] * 5)
    assert times == pytest.approx([50.0] * 5)
    # a worker whose own link is narrower than its share finishes at its own pace
    mixed = shared_finish_times(100.0, 10.0, [1.0, 100.0, 100.0])
    assert mixed == pytest.approx([100.0, 100 / 4.5, 100 / 4.5])


def test_a_relay_tree_is_no_faster_than_its_relays_receive():
    times = relay_tree(100.0, 10.0, 2, 1000.0, [1000.0] * 4)
    assert min(times) == pytest.approx(20.0)  # each relay gets half the trainer's uplink


def test_gossip_reaches_everyone_and_dht_lookups_take_few_hops():
    import random

    links = [Link(up=1.0, down=1.0, rtt=0.01) for _ in range(200)]
    delivery = gossip_delivery(links, random.Random(0), hop_s=0.0)
    assert all(math.isfinite(t) for t in delivery)
    assert max(delivery) >= 0.01  # at least one hop of half of two access RTTs
    hops = dht_lookup_hops(500, random.Random(0), lookups=20)
    assert 1 <= max(hops) <= 6


def test_downloaders_joining_at_odd_times_all_complete():
    """Refresh ticks fall on each downloader's own phase: one landing on the current time
    after rounding was scheduled again at that same time, for ever (found at 20 nodes)."""
    import random

    rng = random.Random(0)
    starts = sorted(rng.uniform(0, 30) for _ in range(20))
    cfg = SwarmConfig(shards=32, shard_bytes=1 << 20, piece_overhead=0.004, until=3000)
    r = run_swarm(cfg, Link(up=MB, down=1e12), [Link(up=MB, down=1e12, start=s) for s in starts])
    assert all(t is not None for t in r.done_at)
