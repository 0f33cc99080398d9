"""The network simulator (bench/simulation/): it spreads a version, it accounts for the
origin's bytes, it is driven by the node's own schedule (change the schedule and its
figures change), and a link's rate sets the time exactly in a case small enough to work
out by hand. Also the schedule faults it found (node/shardcast/schedule.py)."""

import math

import pytest

from bench.simulation.baselines import relay_tree, shared_finish_times, single_origin
from bench.simulation.derived import dht_lookup_hops, gossip_delivery
from bench.simulation.gossip import GossipCost
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
    real = swarm(12, seed=5, shards=48)

    class Backwards(list):
        def sort(self, *, key=None, reverse=False):
            super().sort(key=key, reverse=not reverse)

    monkeypatch.setattr(schedule, "list", Backwards, raising=False)
    mutated = swarm(12, seed=5, shards=48)
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
    delivery = gossip_delivery(links, random.Random(0), GossipCost(0.0, 0.0))
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


# ---- the judging queue (bench/simulation/judging.py) -------------------------------------


def judging(workers=1, *, cost=0.46, v=1, horizon=3600.0, window=600.0, **kw):
    from bench.simulation.judging import JudgingConfig, run_judging

    cfg = JudgingConfig(
        workers,
        v,
        cost,
        horizon_s=horizon,
        verdict_window=window,
        fetch_deadline=window / 6,
        **kw,
    )
    return run_judging(cfg)


def test_one_batch_is_judged_in_the_time_its_steps_take():
    """One worker, no jitter: the submission's block, 10 confirmations of 2 s, the next
    read (0.25 s), the fetch (RTT 0.031 s + 1 MB at 1 MB/s), half a minute judging (0.5 of
    the worker's 60 s), the next block: 52 s from the submission's block, every batch."""
    from bench.simulation.judging import JudgingConfig, run_judging

    cfg = JudgingConfig(1, 1, 0.5, jitter=0.0, batch_bytes=1_000_000, loss=0.0, horizon_s=600)
    r = run_judging(cfg, links=[Link(up=1 * MB, down=1e12)])
    assert len(r.batches) >= 9
    assert r.latencies() == [52.0] * len(r.batches)
    assert r.lost() == 0 and r.bounded()


def test_a_validator_slower_than_the_worker_falls_behind_and_more_of_them_do_not_help():
    """A check costing 1.5x the batch's making: the backlog grows until the batches it
    gets to are past their window (the workers no longer serve them: unavailable), p99
    passes the window and keys are lost. Every validator judges every batch (the node's
    Docket, as ``judge = "all"``): three are as far behind as one. Split among three (one
    each), they keep up; so do twelve judging as ``judge = "assigned"`` (three judges a
    batch: each validator gets a quarter of them), and six do not (half: 1.5 x 1/2)."""
    from bench.simulation.judging import keeps_up

    alone = judging(2, cost=1.5)
    assert not keeps_up(alone)
    assert alone.backlog_at(alone.horizon_s) > 10
    assert alone.percentile(0.99) > alone.verdict_window
    assert alone.lost() > 0
    three = judging(2, cost=1.5, v=3)
    assert not keeps_up(three)
    assert three.percentile(0.99) > three.verdict_window
    # (a window of an hour: keeps_up asks the split's p99 to come before the first
    # backup's time, half the window, and that of the assigned, a quarter)
    split = judging(2, cost=1.5, v=3, judges=1, symmetric=True, window=3600.0)
    assert keeps_up(split)
    assert split.backlog_at(split.horizon_s) <= 6
    assigned = judging(2, cost=1.5, v=12, judges=3, window=3600.0)
    assert keeps_up(assigned) and assigned.backups_taken == 0
    assert assigned.backlog_at(assigned.horizon_s) <= 6
    assert not keeps_up(judging(2, cost=1.5, v=6, judges=3, window=3600.0))


def test_assigned_judging_takes_the_batches_of_validators_that_are_down_as_backups():
    """Six validators judging as ``judge = "assigned"`` (three judges, three backups, the
    node's own ranking and duty), three of them down: the batches whose three judges are
    all down wait for a backup, a quarter of the window after their submission, and every
    batch still gets its verdict. Backups that never take anything lose those batches."""
    import bench.simulation.judging as sim

    up = judging(2, cost=0.5, v=6, judges=3, horizon=1800.0)
    down = judging(2, cost=0.5, v=6, judges=3, down=3, horizon=1800.0)
    assert up.backups_taken == 0 and up.lost() == 0
    assert down.backups_taken > 0 and down.lost() == 0
    late = [t for t in down.latencies() if t >= 600 / 4]
    assert len(late) == down.backups_taken
    assert max(up.latencies()) < 600 / 4
    real_duty = sim.duty
    try:
        sim.duty = lambda rank, quorum, window: 0 if rank <= quorum else None  # no backups
        assert judging(2, cost=0.5, v=6, judges=3, down=3, horizon=1800.0).lost() > 0
    finally:
        sim.duty = real_duty


def test_the_judging_simulation_runs_the_real_queue(monkeypatch):
    """Break two of JudgingQueue's decisions and the simulated figures move: a queue
    that never calls a key unavailable loses none as such; one that never retries a
    failed fetch keeps every key it failed once, and its backlog grows."""
    from node.roles.decisions.judging import JudgingQueue

    real = judging(2, cost=1.5)
    assert real.unavailable > 0
    with monkeypatch.context() as m:
        m.setattr(JudgingQueue, "unavailable", lambda self, now: [])
        assert judging(2, cost=1.5).unavailable == 0
    real_failed = JudgingQueue.fetch_failed

    def never_again(self, key, now):
        real_failed(self, key, now)
        self.entries[key].next_try = math.inf

    monkeypatch.setattr(JudgingQueue, "fetch_failed", never_again)
    stuck = judging(2, cost=1.5)
    assert stuck.unavailable == 0
    assert stuck.backlog_at(stuck.horizon_s) > 2 * real.backlog_at(real.horizon_s)


def test_judgements_that_cannot_finish_are_fetched_again_and_given_up_by_the_real_queue():
    """A judgement that cannot finish (``check_fail``) goes to the queue's
    ``check_failed``: fetched and judged again after its back-off, given up after
    ``check_tries`` (3). None: the same run, event for event; a third: later verdicts, a few
    given up (1/27 of the batches expected) and so lost; every one: every batch tried three
    times, none judged."""
    args = dict(cost=0.1, horizon=3600.0, window=3600.0)
    plain = judging(2, **args)
    assert judging(2, check_fail=0.0, **args).events == plain.events
    some = judging(2, check_fail=1 / 3, **args)
    assert some.check_failures > 0 and 0 < some.given_up < len(some.batches) / 8
    assert some.lost() == some.given_up
    assert some.percentile(0.5) > plain.percentile(0.5) or some.percentile(0.9) > plain.percentile(
        0.9
    )
    always = judging(2, check_fail=1.0, **args)
    assert always.given_up == len(always.batches) == always.lost()
    assert always.check_failures == 3 * len(always.batches)


def test_validator_churn_that_never_fires_is_the_same_run():
    from bench.simulation.links import Churn

    plain = judging(3, cost=0.5, v=6, judges=3, horizon=1800.0)
    never = judging(3, cost=0.5, v=6, judges=3, horizon=1800.0, churn=Churn(session_scale=math.inf))
    assert never.events == plain.events and never.summary() == plain.summary()
    assert never.departures == 0


def test_a_validator_back_from_downtime_judges_what_it_was_given_while_away(monkeypatch):
    """One validator judging all, away from about 600 s to 900 s of every 900 (a Weibull of
    shape 50: near fixed lengths): the batches submitted while it was away get their
    verdicts after it is back, because its docket reads the chain from the contract's block;
    none is lost. A return that gave it nothing it missed loses exactly those batches."""
    import bench.simulation.judging as sim
    from bench.simulation.links import Churn

    churn = Churn(session_shape=50, session_scale=600.0, down_shape=50, down_scale=300.0)
    args = dict(cost=0.2, horizon=1800.0, window=3600.0)
    r = judging(4, churn=churn, **args)
    assert r.departures >= 2
    late = [b for b in r.batches if 700 < b.submitted_at < 850]  # away, roughly 600-900 s
    assert late and all(b.verdict_at is not None and b.verdict_at >= 880 for b in late)
    assert r.lost() == 0
    assert max(r.latencies()) > max(judging(4, **args).latencies())  # waited for its return

    monkeypatch.setattr(sim.JudgingSim, "_come_back", forgetful_return(sim.JudgingSim._come_back))
    forgot = judging(4, churn=churn, **args)
    assert forgot.lost() >= len(late)


def forgetful_return(come_back):
    """``_come_back`` with nothing submitted before the return handed out (as if the docket
    read from the newest block)."""

    def wrapped(self, v):
        now = self.loop.now
        hidden = {k: b for k, b in self.batches.items() if b.submitted_at < now}
        for k in hidden:
            del self.batches[k]
        try:
            come_back(self, v)
        finally:
            self.batches.update(hidden)

    return wrapped


def test_validators_needed_searches_the_assigned_and_finds_none_when_all_judge_all():
    from bench.simulation.judging import validators_needed

    v, runs = validators_needed(4, 1.5, judges=None, most=3, horizon_s=1800, verdict_window=600)
    assert v is None and sorted(runs) == [1, 3]
    hour = {"horizon_s": 1800, "verdict_window": 3600, "fetch_deadline": 600}
    v, runs = validators_needed(4, 1.5, judges=1, most=40, **hour)
    assert v is not None and 6 <= v <= 9  # the rate bound is 4 x 1.5 = 6
    assert v - 1 in runs  # one fewer was tried and did not keep up
    v, runs = validators_needed(4, 1.5, judges=3, most=80, **hour)
    # three judges a batch: the rate bound is 18; half an hour of batches resolves ~15 %
    assert v is not None and 15 <= v <= 27
    assert v - 1 in runs


# ---- churn ---------------------------------------------------------------------------------


def churning(churn, n=20, seed=1, until=1e6):
    import random

    from bench.simulation.links import Churn  # noqa: F401

    rng = random.Random(seed)
    cfg = SwarmConfig(shards=16, shard_bytes=int(MB), seed=seed, churn=churn, until=until)
    downs = [Link(up=rng.choice([1, 2, 4]) * MB, down=1e12, rtt=0.02) for _ in range(n)]
    return run_swarm(cfg, Link(up=2 * MB, down=1e12), downs)


def test_churn_that_never_fires_is_the_same_run():
    from bench.simulation.links import Churn

    plain = churning(None)
    never = churning(Churn(session_scale=math.inf))
    assert never.done_at == plain.done_at
    assert never.origin_uploaded == plain.origin_uploaded
    assert never.events == plain.events and never.departures == 0
    assert never.online_spread(0.9) == plain.percentile(0.9)


def test_with_churn_fetches_fail_and_every_worker_still_completes(monkeypatch):
    """Sessions of ~20 s: holders leave mid-transfer (their clients' plans are told the
    fetch failed, as transfer.py tells them), come back with what they stored, and
    everyone ends with the version."""
    from bench.simulation.links import Churn

    plain = churning(None)
    told = []
    real_failed = DownloadPlan.failed

    def failed(self, shard, peer, now):
        told.append(peer)
        real_failed(self, shard, peer, now)

    monkeypatch.setattr(DownloadPlan, "failed", failed)
    r = churning(Churn(session_scale=20.0, down_scale=20.0))
    assert r.departures > 20
    assert r.churn_failed > 0
    assert len(told) == r.churn_failed + r.stalled
    assert all(t is not None for t in r.done_at)
    assert max(r.done_at) > max(plain.done_at)
    assert math.isfinite(r.online_spread(1.0))


def test_a_complete_holder_gone_away_is_dropped_once_a_fetch_from_it_fails(monkeypatch):
    """As pulling.py does, a refresh does not ask a peer the plan knows holds every shard
    (``DownloadPlan.asks_holdings``): a finished downloader that left keeps its bitmap in
    the plans that know it until a fetch from it fails, and the next refresh drops it."""
    import random

    from bench.simulation.links import Churn

    dropped = []  # (held every shard, failures in a row) of each peer a plan dropped
    real_remove = DownloadPlan.remove_peer

    def remove_peer(self, peer):
        p = self.peers.get(peer)
        if p is not None and p.joined:
            dropped.append((len(p.have) == self.num_shards, p.failures))
        real_remove(self, peer)

    monkeypatch.setattr(DownloadPlan, "remove_peer", remove_peer)
    rng = random.Random(2)  # downloaders joining over 30 s: the first finish and leave early
    cfg = SwarmConfig(
        shards=16, shard_bytes=int(MB), seed=2, churn=Churn(session_scale=60.0, down_scale=30.0)
    )
    downs = [
        Link(up=rng.choice([1, 2, 4]) * MB, down=1e12, rtt=0.02, start=rng.uniform(0, 30))
        for _ in range(30)
    ]
    r = run_swarm(cfg, Link(up=2 * MB, down=1e12), downs)
    assert all(t is not None for t in r.done_at)
    complete = [failures for whole, failures in dropped if whole]
    assert len(complete) >= 5 and all(failures > 0 for failures in complete)
    assert any(not whole for whole, _ in dropped)  # a partial holder: dropped when it left


def test_the_bench_says_by_how_much_the_swarm_trails_the_relay_tree_and_why():
    from bench.sim import versus

    def spread(p90: float) -> dict[str, float]:
        return {"p50": p90 / 2, "p90": p90, "p100": p90 * 2}

    result = {
        "spread_s": {"slow": spread(3000.0), "fast": spread(600.0)},
        "relay_tree_spread_s": {"slow": spread(2000.0), "fast": spread(800.0)},
        "single_origin_spread_s": {"slow": spread(6000.0), "fast": spread(1200.0)},
    }
    out = versus(result)
    assert out["slow"]["swarm_over_relay_tree_p90"] == 1.5
    assert out["slow"]["swarm_over_single_origin_p90"] == 0.5
    assert "1.50x slower than the relay tree" in out["slow"]["says"]
    assert "uplink the swarm does not have" in out["slow"]["says"]  # and why
    assert out["fast"]["swarm_over_relay_tree_p90"] == 0.75
    assert "slower" not in out["fast"]["says"]


def test_the_swarm_bench_reads_the_machines_busy_processor_time():
    """``bench/shardcast.py``'s ``busy_seconds``: the machine's processor seconds spent
    busy since boot, as psutil reads ``/proc/stat`` (less idle and I/O wait); the
    validation prints it beside the swarm's spread (a CPU-bound swarm holds every core)."""
    import psutil

    from bench.shardcast import busy_seconds

    before = psutil.cpu_times()
    ours = busy_seconds()
    after = psutil.cpu_times()
    expect = [sum(t) - t.idle - t.iowait - t.guest - t.guest_nice for t in (before, after)]
    assert expect[0] - 0.05 <= ours <= expect[1] + 0.05
