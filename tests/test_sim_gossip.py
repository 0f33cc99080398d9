"""The simulator's gossip model (``bench/simulation/gossip.py``) and its check against real
nodes (``bench/simulation/gossipcheck.py``)."""

import dataclasses
import math
import os
import random
import signal
import statistics

import pytest

from bench.simulation import gossipcheck
from bench.simulation.gossip import GossipCost, copies, deliver, gossip_mesh
from bench.simulation.gossipcheck import (
    PRESENCE_WINDOW_S,
    WIDE,
    Delivery,
    announcements,
    calibrate,
    costs,
    draws_for,
    measure,
    network_costs,
    nodes_by_tag,
    on_path,
    pieces,
    predict,
    presence,
    quantile,
    sent,
    uncertainty,
    upkeep,
)


def test_the_mesh_keeps_the_configured_degrees():
    for n in (2, 7, 30, 300):
        mesh = gossip_mesh(n, random.Random(n))
        assert all(
            i not in peers and all(i in mesh[j] for j in peers) for i, peers in enumerate(mesh)
        )
        assert min(len(p) for p in mesh) >= min(4, n - 1)  # degree_low, after any pruning
        assert max(len(p) for p in mesh) <= 12  # degree_high
        assert statistics.mean(len(p) for p in mesh) >= min(6, n - 1)  # grafted to degree


def test_a_complete_mesh_is_one_hop_and_the_publisher_sends_one_copy_after_another():
    n = 8
    mesh = gossip_mesh(n, random.Random(0), degree=n - 1)
    assert all(len(p) == n - 1 for p in mesh)
    got = deliver(mesh, GossipCost(send_s=1.0, recv_s=1.0))
    # the k-th copy leaves the publisher after k sends and is checked in one receive
    assert sorted(got[1:]) == [k + 1.0 for k in range(1, n)]


def test_delivery_grows_with_the_mesh_diameter():
    cost = GossipCost(send_s=0.0, recv_s=0.0, first_s=1.0)  # first_s counts the hops
    mean = {n: statistics.mean(predict(n, cost, seeds=3)) for n in (7, 30, 300, 1000)}
    assert mean[7] == 1.0  # everyone is the publisher's mesh peer
    assert mean[7] < mean[30] < mean[300] < mean[1000]
    assert max(predict(1000, cost, seeds=2)) <= 7  # a degree-6 mesh: log_5(1000) + slack


def test_a_larger_hop_cost_scales_delivery():
    a = predict(30, GossipCost.from_hop(0.004), seeds=3)
    b = predict(30, GossipCost.from_hop(0.012), seeds=3)
    assert b == pytest.approx([3 * t for t in a])


def test_nodes_on_shared_cores_wait_their_turn():
    pair = gossip_mesh(2, random.Random(0))
    assert deliver(pair, GossipCost(1.0, 1.0))[1] == 2.0
    assert deliver(pair, GossipCost(1.0, 1.0, cores=1))[1] == 2.0  # nobody else waits
    mesh = gossip_mesh(30, random.Random(0))
    free = deliver(mesh, GossipCost(1.0, 1.0))
    two = deliver(mesh, GossipCost(1.0, 1.0, cores=2))
    assert statistics.mean(two[1:]) > 2 * statistics.mean(free[1:])  # 29 receivers, 2 cores


def test_a_node_keeps_its_processor_for_a_slice_while_others_wait():
    """A publisher and ten leaves on one core, each copy 1 s to send and to receive and
    0.5 s on the wire."""
    star = [set(range(1, 11))] + [{0} for _ in range(10)]
    cost = GossipCost(1.0, 1.0, cores=1, wire_s=0.5)
    # runs to completion: the publisher's ten sends, then the leaves in the order they woke
    whole = deliver(star, dataclasses.replace(cost, slice_s=math.inf))
    assert whole[1:] == [10.0 + k for k in range(1, 11)]
    # one job a turn: the publisher's next send, then the leaf that woke meanwhile
    turns = deliver(star, dataclasses.replace(cost, slice_s=0.0))
    assert turns[1:] == [2.0 * k + 1 for k in range(1, 10)] + [20.0]
    # a slice of 2.5 s: three sends a turn (the third begins inside the slice), then the
    # leaves that woke meanwhile
    sliced = deliver(star, dataclasses.replace(cost, slice_s=2.5))
    assert sliced[1:6] == [4.0, 5.0, 9.0, 10.0, 11.0]
    # the slice ends at the first tick after it ran out: a 1 s slice and a tick every 4 s
    # give the publisher four sends before the first leaf; the tick 2 s later, two
    ticked = dataclasses.replace(cost, slice_s=1.0, tick_s=4.0)
    assert deliver(star, ticked)[1] == 5.0
    assert deliver(star, dataclasses.replace(ticked, tick_phase_s=2.0))[1] == 3.0


def test_a_first_receipt_and_a_duplicate_cost_apart():
    """Three nodes on one core, each running to completion: B checks A's copy (10 s) and
    forwards it to C; C checks A's copy, forwards it to B, and reads B's as a duplicate."""
    triangle = [{1, 2}, {0, 2}, {0, 1}]
    cost = GossipCost(send_s=1.0, recv_s=1.0, first_s=10.0, cores=1, slice_s=math.inf)
    assert deliver(triangle, cost) == [0.0, 12.0, 23.0]
    assert deliver(triangle, dataclasses.replace(cost, first_s=None)) == [0.0, 3.0, 5.0]
    # the publisher's own work comes before its first copy
    assert deliver(triangle, dataclasses.replace(cost, publish_s=5.0)) == [0.0, 17.0, 28.0]


def test_other_messages_share_the_processors():
    """A pair on one core: a presence heartbeat the receiver publishes as the announcement
    goes out takes its turn first (its publish and its send), then the announcement's
    copy is read; one a minute later changes nothing."""
    pair = [{1}, {0}]
    cost = GossipCost(1.0, 1.0, cores=1, slice_s=math.inf, interleave=False)
    assert deliver(pair, cost) == [0.0, 2.0]
    assert deliver(pair, cost, others=[(0.0, 1, pair)]) == [0.0, 3.0]
    assert deliver(pair, cost, others=[(60.0, 1, pair)]) == [0.0, 2.0]
    # in turn, the copy (it came while the heartbeat was published) is read before the
    # heartbeat's send
    assert deliver(pair, dataclasses.replace(cost, interleave=True), others=[(0.0, 1, pair)]) == [
        0.0,
        2.0,
    ]
    # the processors are shared, not the meshes: a heartbeat between two other nodes
    # delays the announcement on one core, and not on two
    line = [{1}, {0}, {3}, {2}]
    other = [set(), set(), {3}, {2}]
    assert deliver(line, cost, others=[(0.0, 2, other)])[1] == 3.0
    assert deliver(line, dataclasses.replace(cost, cores=2), others=[(0.0, 2, other)])[1] == 2.0


def test_a_node_wakes_once_for_the_work_that_comes_while_it_has_some():
    """One core, each node running to completion, a wake-up 0.5 s: B wakes and checks A's
    copy, then forwards it to C; C waited for the core meanwhile, so A's copy and B's
    come to it in one wake-up. The publisher's delay starts after it woke."""
    triangle = [{1, 2}, {0, 2}, {0, 1}]
    cost = GossipCost(send_s=1.0, recv_s=1.0, cores=1, slice_s=math.inf, wake_s=0.5)
    assert deliver(triangle, cost) == [0.0, 3.5, 6.0]
    assert deliver([{1}, {0}], cost) == [0.0, 2.5]


def test_the_nodes_other_work_takes_its_turn():
    """A pair: the receiver has 5 s of its own work from the publish on; on one core the
    publisher sends first and the receiver's copy waits behind that work, on two it waits
    for that work alone; work a minute later changes nothing. A burst brings its own
    wake-up, and the copy that comes meanwhile needs none."""
    pair = [{1}, {0}]
    cost = GossipCost(1.0, 1.0, cores=1, slice_s=math.inf, wake_s=0.5)
    assert deliver(pair, cost, busy=[(0.0, 1, 5.0)]) == [0.0, 7.0]
    assert deliver(pair, dataclasses.replace(cost, cores=2), busy=[(0.0, 1, 5.0)]) == [0.0, 6.0]
    assert deliver(pair, cost, busy=[(60.0, 1, 5.0)]) == [0.0, 2.5]


def test_idle_work_is_replayed_piece_by_piece_around_an_instant():
    """A burst's pieces: the wake-up until the first copy, then each copy until the next;
    ``upkeep`` replays every node's bursts near an instant of an idle window, each piece
    at its own time from that instant, but a burst that took in announcement copies (the
    topic the model runs itself: a storm of duplicates after the series is not upkeep)."""
    b = [100.0, 1.0, 2.0, 1, 1, 0, [[0.2, 0.1], [0.5, 0.4]]]
    assert [x for piece in pieces(b) for x in piece] == pytest.approx([0, 0.1, 0.2, 0.3, 0.5, 0.6])
    assert pieces([100.0, 0.3, 0.3, 0, 0, 0, []]) == [(0.0, 0.3)]
    # two idle windows, 0-10 s and 20-30 s, each with one node's burst at its middle; with
    # a 5 s reach the instant is each window's middle
    early, late = [5.0, 1.0, 2.0, 0, 1, 0, [[0.5, 0.25]]], [25.5, 0.25, 0.25, 0, 0, 0, []]
    storm = [25.2, 4.0, 40.0, 800, 1700, 0, [[0.1, 0.05]]]  # node 0, announce copies
    real = Delivery(2, 1, [0.1], 0, {}, [[1], [0]], [0], 0.1)
    real.extra = {"windows": [0.0, 10.0, 20.0, 30.0], "bursts": [[early, storm], [late]]}
    drawn = {tuple(upkeep(real, random.Random(seed), window=5.0)) for seed in range(20)}
    assert drawn == {((0.0, 0, 0.25), (0.5, 0, 0.75)), ((0.5, 1, 0.25),)}


def test_idle_work_is_replayed_where_each_copy_was_sent():
    """With the probes' writes, a copy's piece comes when its sender wrote it (a loopback
    write is the arrival), not where the receiver took it in: node 1 took in node 0's copy
    ``m`` 0.4 s into a burst that woke at 5.0, node 0 wrote it at 5.1. A write earlier
    than the wake-up counts from the wake-up, one later than the take-in from the
    take-in, a copy no one is seen to write where it was taken in; the first write of a
    copy sent twice counts."""
    b = [
        5.0,
        0.5,
        0.6,
        0,
        3,
        0,
        [[0.4, 0.1, "aa", "m"], [0.45, 0.2, "aa", "x"], [0.5, 0.3, "aa", "z"]],
    ]
    real = Delivery(2, 1, [0.1], 0, {}, [[1], [0]], [0], 0.1)
    real.extra = {
        "windows": [0.0, 10.0, 20.0, 30.0],
        "bursts": [[], [b]],
        "tags": ["aa", "bb"],
        "writes": [[[5.1, "bb", "m"], [5.3, "bb", "m"], [4.0, "bb", "x"], [5.2, "cc", "z"]], []],
    }
    came = sent(real)
    assert came == {(0, 1, "m"): 5.1, (0, 1, "x"): 4.0, (0, -1, "z"): 5.2}
    drawn = [upkeep(real, random.Random(s), window=5.0, came=came) for s in range(20)]
    got = {tuple((round(t, 6), i, round(c, 6)) for t, i, c in d) for d in drawn if d}
    # the instant is 5.0 (the first window's middle): the wake-up's piece at 0, m's at 0.1
    # (written), x's at 0 (written before the wake-up), z's where taken in (0.5)
    assert got == {((0.0, 1, 0.1), (0.1, 1, 0.1), (0.0, 1, 0.1), (0.5, 1, 0.2))}
    taken = {tuple(d) for s in range(20) if (d := upkeep(real, random.Random(s), window=5.0))}
    assert {tuple(round(t, 6) for t, _, _ in d) for d in taken} == {(0.0, 0.4, 0.45, 0.5)}
    assert sent(Delivery(2, 1, [0.1], 0, {}, [[1], [0]], [0], 0.1)) == {}  # an older run


def test_presence_heartbeats_come_at_the_configured_rate():
    """``n / max(5, n / 2)`` a second around the publish: 0.8 from 4 nodes, 2 from 30."""
    rng = random.Random(1)
    for n, rate in ((4, 0.8), (30, 2.0)):
        mesh = gossip_mesh(n, rng)
        draws = [presence(n, mesh, rng) for _ in range(3000)]
        per_second = statistics.mean(len(d) for d in draws) / (2 * PRESENCE_WINDOW_S)
        assert per_second == pytest.approx(rate, rel=0.08)
        times = [t for d in draws for t, _, _ in d]
        assert -PRESENCE_WINDOW_S <= min(times) < -0.4 and 0.4 < max(times) <= PRESENCE_WINDOW_S
        assert {by for d in draws for _, by, m in d if m is mesh} == set(range(n))


def test_what_of_a_hop_takes_no_processor_is_on_the_wire():
    cost = GossipCost(send_s=0.002, recv_s=0.002, cores=2, wire_s=0.006)
    assert deliver(gossip_mesh(2, random.Random(0)), cost)[1] == pytest.approx(0.010)
    # the wire's part takes no processor: a publisher and ten receivers on one core are
    # through once its 20 copies' processor time is, and the wire's 6 ms at most after
    star = [set(range(1, 11))] + [{0} for _ in range(10)]
    got = deliver(star, dataclasses.replace(cost, cores=1))
    assert 20 * 0.002 <= max(got) <= 20 * 0.002 + 0.006 + 1e-9


def test_copies_count_every_forward_but_back_to_the_forwarder():
    star = [{1, 2, 3}, {0}, {0}, {0}]
    assert copies(star) == 3  # leaves forward to nobody
    ring = [{1, 3}, {0, 2}, {1, 3}, {2, 0}]
    assert copies(ring) == 2 + 3  # the publisher's two, then one each onward


def burst(
    at: float,
    cpu: float,
    copies: int = 0,
    other: int = 0,
    first: int = 0,
    sent: int = 0,
    other_writes: int = 0,
) -> list:
    """A probe's burst (``gossip_probe.py``): its copies taken in evenly over it, no control
    RPC, ``sent`` announcement copies and ``other_writes`` other RPCs written."""
    marks = [[cpu * k / (copies + other + 1)] * 2 for k in range(1, copies + other + 1)]
    return [at, cpu, cpu, copies, other, first, marks, 0, sent, other_writes]


def probed(
    n: int, node_s: list[float], first_s: float, woke_after_s: float, wake_s: float = 0.0001
) -> Delivery:
    """A complete mesh of ``n`` nodes whose counters gave ``node_s`` per announcement, and
    whose receivers' probes saw three announcements each, woken ``woke_after_s`` after
    the publish and at their handler ``first_s`` of processor time later (the third one
    slower: the medians are taken); each receiver also woke for 1, 2 and 3 duplicates
    alone, a wake-up ``wake_s`` and a duplicate 0.2 ms (and once for a presence copy,
    once for a first receipt and once while idle, which the fit leaves out). The
    publisher's bursts that announced took 0.6 ms and 0.1 a mesh peer (the one that also
    took in a presence copy, and the one while idle, do not count)."""
    mesh = [[j for j in range(n) if j != i] for i in range(n)]
    published = [10.0, 20.0, 30.0]
    normal = [[first_s, first_s, at + woke_after_s] for at in published[:2]]
    since = [normal + [[9.0, 9.0, 30.0 + 9.0]] for _ in range(n - 1)]
    delays = [woke_after_s + first_s] * (n - 1)
    dups = [burst(11.0 + d, wake_s + 0.0002 * d, copies=d) for d in (1, 2, 3)]
    noise = [burst(15.0, 0.05, copies=1, other=1), burst(16.0, 0.05, copies=2, first=1)]
    noise.append(burst(1.0, 0.05, copies=3))
    announced = [burst(10.0 + k, 0.0006 + 0.0001 * (n - 1), copies=1) for k in range(3)]
    bursts = [announced + noise] + [dups + noise for _ in range(n - 1)]
    extra = {"cpu": {"node_s": node_s}, "since": since, "published": published}
    extra |= {"windows": [0.0, 5.0, 35.0, 40.0], "bursts": bursts}
    return Delivery(n, 3, delays, 0, {}, mesh, [0], 0.1, extra)


def test_the_costs_come_apart_from_two_small_networks():
    """Publish 0.5 ms, a send 0.1, a wake-up 0.1, a first receipt 1.4 after it (1.5 from
    the wake-up; 1.2 in the pair), a duplicate 0.2, as a 2- and a 5-node network's
    counters and probes would give them."""
    pair = probed(2, [0.0006, 0.0012], first_s=0.0012, woke_after_s=0.0006)
    wide = probed(5, [0.0005 + 4 * 0.0001] + [0.0012 + 3 * (0.0001 + 0.0002)] * 4, 0.0015, 0.0009)
    cpu, before = on_path(pair)
    assert cpu == [0.0012, 0.0012, 9.0] and before == pytest.approx([0.0006, 0.0006, 9.0])
    cost, raw = costs(pair, wide, cores=2)
    assert cost.publish_s == pytest.approx(0.0005)
    assert cost.send_s == pytest.approx(0.0001)
    assert cost.first == pytest.approx(0.0014)  # the wide network's, on the path
    assert cost.wake_s == pytest.approx(0.0001)
    assert raw["pair_first_s"] == pytest.approx(0.0012)
    assert cost.recv_s == pytest.approx(0.0002)
    assert raw["duplicate_bursts"] == 3 * 4
    # the counters alone charge the wake-ups to the duplicates: (1.2 + 3 x 0.3) less the
    # pair's 1.2, over 3, less a send
    assert raw["counted_duplicate_s"] == pytest.approx(0.0002)
    assert raw["hop_s"] == calibrate(pair)
    # the pair as the model sees it: the publish, a send, a wake-up, a first receipt
    assert predict(2, cost, mesh=pair.mesh) == pytest.approx([0.0021] * 8)
    # the wake-up and a duplicate come apart whatever the wake-up costs
    slow_wake = probed(5, wide.extra["cpu"]["node_s"], 0.0015, 0.0009, wake_s=0.0008)
    cost, raw = costs(pair, slow_wake, cores=2)
    assert (cost.wake_s, cost.recv_s, cost.first) == pytest.approx((0.0008, 0.0002, 0.0007))
    # with duplicates of one size only, the two cannot come apart
    one_size = [[burst(11.0, 0.0003, copies=1)] * 3] * 5
    flat = dataclasses.replace(wide, extra=wide.extra | {"bursts": one_size})
    with pytest.raises(ValueError, match="too few to part"):
        costs(pair, flat, cores=2)
    assert raw["counted_send_s"] == pytest.approx(0.0001)
    # a negative figure is noise: taken as 0, kept raw
    quick = [[burst(10.0, 0.0005, copies=1)], *wide.extra["bursts"][1:]]
    noisy = dataclasses.replace(wide, extra=wide.extra | {"bursts": quick})
    cost, raw = costs(pair, noisy, cores=2)
    assert raw["send_s"] < 0 and cost.send_s == 0.0
    # without a burst of its own announcements the publisher's sends cannot be had
    silent = [[burst(10.0, 0.0005, copies=1, other=1)], *wide.extra["bursts"][1:]]
    with pytest.raises(ValueError, match="no burst of its own"):
        costs(pair, dataclasses.replace(wide, extra=wide.extra | {"bursts": silent}), cores=2)
    # the arithmetic needs every receiver to have every peer in its mesh
    partial = dataclasses.replace(wide, mesh=[[1, 2], [0, 2], [0, 1], [4], [3]])
    with pytest.raises(ValueError, match="complete meshes"):
        costs(pair, partial, cores=2)


def test_a_network_gives_its_own_costs():
    """A wake-up 0.4 ms, a duplicate 0.25 and a first receipt 1.4 (to the handler), as a
    network's bursts and stamps during the series have them: duplicates alone (1, 2 and
    3 of them), first receipts that sent 5 and 8 copies on at 0.1 ms a send, and the
    bursts the costs leave out (those that took in presence or wrote anything else,
    those outside the series, a class of too few bursts). A send is the first receipts'
    slope over the copies they sent on or, where every node sent as many, the publisher's
    bursts against the pair's: 0.85 ms to its two mesh peers, 0.7 to the pair's one (0.15
    a send); the publish stays the small networks'."""
    wake, dup, send, first = 0.0004, 0.00025, 0.0001, 0.0014

    def forwarded(at: float, k: int, stretch: float = 0.0) -> list:
        return burst(at, wake + first + 0.0003 + k * send + stretch, copies=1, first=1, sent=k)

    series = [burst(10.0 + d, wake + dup * d, copies=d) for d in (1, 2, 3) for _ in range(10)]
    series += [forwarded(11.0, 5) for _ in range(10)] + [forwarded(12.0, 8) for _ in range(12)]
    series += [forwarded(12.5, 8, stretch=0.01) for _ in range(3)]  # preempted: medians
    left_out = [burst(13.0, 0.05, copies=1, other=1), burst(14.0, 0.05, copies=2, other_writes=1)]
    left_out += [burst(1.0, 0.05, copies=1)] * 20  # before the series
    left_out += [burst(15.0, 0.05, copies=4)] * ((gossipcheck.MIN_CLASS - 1) // 2)  # too few
    published = [10.0, 20.0, 30.0]
    stamps = [[first + wake, first + wake, at + 0.001] for at in published]
    slow = [[9.0, 9.0, 39.0]]  # one receiver's third: the median is taken
    since = [stamps, stamps[:2] + slow]
    announced = [burst(10.0 + k, 0.00085, copies=1) for k in range(3)]
    announced += [burst(10.5, 0.05, copies=1, other=1), burst(1.0, 0.05, copies=1)]
    extra = {"windows": [0.0, 5.0, 35.0, 40.0], "bursts": [announced] + [series + left_out] * 2}
    extra |= {"since": since, "published": published}
    real = Delivery(3, 3, [0.01] * 6, 0, {}, [[1, 2], [0, 2], [0, 1]], [0], 0.1, extra)
    pair = probed(2, [0.0006, 0.0012], first_s=0.0012, woke_after_s=0.0006)  # 0.7 ms
    small = GossipCost(send_s=0.0002, recv_s=0.9, cores=2, first_s=0.9, publish_s=0.0012)
    cost, raw = network_costs(real, small, pair)
    assert (cost.wake_s, cost.recv_s, cost.first) == pytest.approx((wake, dup, first))
    assert cost.send_s == pytest.approx(send)  # the slope, not the publisher's
    assert (cost.publish_s, cost.cores) == (0.0012, 2)
    assert raw["send_slope_s"] == pytest.approx(send) and raw["small_send_s"] == 0.0002
    assert raw["publisher_send_s"] == pytest.approx(0.00015)
    assert raw["duplicate_bursts"] == 2 * 30
    # a complete mesh: every first receipt sent as many copies on, no slope: the
    # publisher's send, not the small networks'
    even = [[b for b in node if b[8] != 5] for node in extra["bursts"]]
    cost, raw = network_costs(
        dataclasses.replace(real, extra=extra | {"bursts": even}), small, pair
    )
    assert raw["send_slope_s"] is None and cost.send_s == pytest.approx(0.00015)
    # ... which needs the publisher's bursts (and the slope does not)
    mute = [[]] + even[1:]
    with pytest.raises(ValueError, match="no burst of its own announcements"):
        network_costs(dataclasses.replace(real, extra=extra | {"bursts": mute}), small, pair)
    _, raw = network_costs(
        dataclasses.replace(real, extra=extra | {"bursts": [[]] + extra["bursts"][1:]}),
        small,
        pair,
    )
    assert raw["send_slope_s"] == pytest.approx(send) and raw["publisher_send_s"] is None
    # duplicates of one size cannot part a wake-up from a duplicate
    flat = [[burst(10.0, 0.0005, copies=1)] * 10] * 3
    with pytest.raises(ValueError, match="duplicates: bursts of one size only"):
        network_costs(dataclasses.replace(real, extra=extra | {"bursts": flat}), small, pair)


def test_a_measured_figure_spreads_over_the_announcements():
    """Announcements whose delays agree leave a figure no room; a p99 set by two slow
    announcements in a hundred is the fast ones' whenever a resampling draws neither."""
    assert uncertainty([[0.01, 0.02, 0.03]] * 40, 0.5) == (0.02, 0.02)
    assert uncertainty([[0.01] * 5] * 20 + [[0.05] * 5] * 20, 0.5) == (0.01, 0.05)
    rare = [[0.01] * 10] * 98 + [[0.5] * 10] * 2
    assert quantile([d for a in rare for d in a], 0.99) == 0.5
    assert uncertainty(rare, 0.99) == (0.01, 0.5)


def test_a_small_network_rests_on_as_many_deliveries_as_a_larger_one():
    """A p99 rests on its slowest few publishes (each slow for most of its receivers): a
    10-node network, 9 receivers a publish, is measured and simulated more often than a
    30-node one, so that each figure holds at least as many deliveries; a larger network
    keeps the defaults."""
    for n in (3, 10, 30, 50):
        assert announcements(n) * (n - 1) >= gossipcheck.MEASURED
        assert draws_for(n, 2) * 2 * gossipcheck.PHASES * (n - 1) >= gossipcheck.SIMULATED
    assert announcements(10) > announcements(30) == gossipcheck.COUNT == announcements(50)
    assert draws_for(10, 2) > draws_for(50, 2) == gossipcheck.DRAWS
    assert announcements(10, count=500) == 500  # an asked-for count is a floor


def test_the_bench_waits_for_the_mesh_to_stop_growing(monkeypatch):
    """Nodes whose mean mesh degree reads 6, 7, 8, 9, 9.2, 9, 9.2: steady once four reads
    in a row lie within 0.2 of each other, not before; a mesh that never stops growing is
    given up on after ``STEADY_LIMIT``; a complete one is steady at once."""
    reads = [[6] * 5, [7] * 5, [8] * 5, [9] * 5, [9, 9, 9, 9, 10], [9] * 5, [9, 9, 9, 9, 10]]
    lengths = iter(n for read in reads + [[12] * 5] * 9 for n in read)
    now = [0.0]
    monkeypatch.setattr(
        gossipcheck, "probe", lambda node: {"gossip_probe": {"mesh": ["p"] * next(lengths)}}
    )
    monkeypatch.setattr(gossipcheck.time, "sleep", lambda s: now.__setitem__(0, now[0] + s))
    monkeypatch.setattr(gossipcheck.time, "monotonic", lambda: now[0])
    nodes = [None] * 5
    assert gossipcheck.steady(nodes) == [6, 7, 8, 9, 9.2, 9, 9.2]
    assert now[0] == pytest.approx(6 * gossipcheck.STEADY_S / (gossipcheck.STEADY_READS - 1))
    growing = iter(range(10_000))
    monkeypatch.setattr(
        gossipcheck, "probe", lambda node: {"gossip_probe": {"mesh": ["p"] * next(growing)}}
    )
    now[0] = 0.0
    seen = gossipcheck.steady(nodes)
    assert now[0] > gossipcheck.STEADY_LIMIT and seen == sorted(seen) and len(set(seen)) > 4
    # a complete mesh cannot grow: no wait
    monkeypatch.setattr(gossipcheck, "probe", lambda node: {"gossip_probe": {"mesh": ["p"] * 4}})
    now[0] = 0.0
    assert gossipcheck.steady(nodes) == [4] and now[0] == 0.0


def test_figures_of_a_delivery():
    d = Delivery(3, 2, [0.01, 0.02, 0.03], 1, {"gossip": 3}, [[1, 2], [0], [0]], [0], 0.5)
    assert d.delivered == 0.75
    assert d.figures() == {"p50_s": 0.02, "p99_s": 0.03, "max_s": 0.03, "delivered": 0.75}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_real_nodes_deliver_every_announcement_by_gossip_and_the_model_predicts_a_delay():
    """A 2-node and a 5-node network of node processes: every announcement reaches every
    receiver, by gossip, within seconds; their CPU counters give each piece of the work a
    cost (a first receipt costs something), and the model calibrated on them gives a
    finite prediction of the 5-node network's delays. How close it comes is the bench's
    figure (``validation`` in ``bench/sim.py``), not asserted here: it needs a quiet
    machine, which a test cannot count on."""
    pair = measure(2, count=60, spacing=0.05)
    wide = measure(WIDE, count=60, spacing=0.05)
    for real in (pair, wide):
        assert real.missing == 0, "an announcement never arrived"
        assert len(real.delays) == (real.n - 1) * 60
        assert real.via.get("sync", 0) == 0, f"gossip lost some ({real.via}): sync brought them"
        assert all(0 < t < 5 for t in real.delays)
    cost, raw = costs(pair, wide, float(os.cpu_count() or 1))
    assert raw["first_s"] > 0 and raw["hop_s"] > 0, raw
    # each copy a node took in from another names its forwarder and message, and the
    # forwarder's probe saw it written to that node: the replay can put it where it was
    # sent (a node's own publish is taken in too, forwarded by itself)
    came = sent(wide)
    index = nodes_by_tag(wide)
    marks = [
        (index.get(m[2], -1), node, m[3])
        for node, bursts in enumerate(wide.extra["bursts"])
        for b in bursts
        for m in b[6]
        if index.get(m[2]) != node
    ]
    assert len(set(wide.extra["tags"])) == WIDE and len(marks) > 4 * 60
    assert sum(k in came for k in marks) >= 0.95 * len(marks)
    _, own = network_costs(wide, cost, pair)  # the wide network's own bursts part them too
    assert own["first_s"] > 0 and own["duplicate_bursts"] > 0, own
    predicted = quantile(predict(WIDE, cost, mesh=wide.mesh), 0.5)
    assert math.isfinite(predicted) and predicted > 0


def test_a_node_takes_its_tasks_in_turn():
    """A relays the publisher's copy to three leaves (each send and read 1 s) while three
    jobs of its other work come at 2.5 s, as it sends the first: in turn (trio's
    scheduler, a pubsub task a copy), each of them comes before its next send; without,
    its sends go on first."""
    star = [{1}, {0, 2, 3, 4}, {1}, {1}, {1}]
    busy = [(2.5, 1, 1.0)] * 3
    cost = GossipCost(1.0, 1.0)
    assert deliver(star, cost, busy=busy) == [0.0, 2.0, 4.0, 8.0, 9.0]
    alone = dataclasses.replace(cost, interleave=False)
    assert deliver(star, alone, busy=busy) == [0.0, 2.0, 4.0, 5.0, 6.0]
    assert deliver(star, cost) == deliver(star, alone) == [0.0, 2.0, 4.0, 5.0, 6.0]


# a bench stand-in: it starts one gossip probe node the way the validation does, then waits
BENCH = """
import sys, time
from pathlib import Path
from bench.simulation.gossipcheck import spawn

node = spawn(Path(sys.argv[1]), "n0", [])
print(node.proc.pid, flush=True)
time.sleep(120)
"""


def test_a_bench_killed_outright_leaves_no_node_behind(tmp_path):
    """Killed with SIGKILL (no ``finally`` runs), the bench's nodes get SIGTERM from the
    kernel: before, a killed ``bench/sim.py`` left its swarm's nodes running."""
    from tests.helpers.net import wait_until
    from tests.helpers.procs import gone, parent_and_child

    with parent_and_child(BENCH, str(tmp_path)) as (bench, node):
        assert not gone(node)
        os.kill(bench.pid, signal.SIGKILL)
        bench.wait(10)
        wait_until(lambda: gone(node), 30, "the node to go with its bench")


def test_the_swarm_bench_ties_its_nodes_to_it(tmp_path, monkeypatch):
    """``bench/shardcast.py`` (the validation's real swarm) starts every node tied to it."""
    import bench.shardcast as shardcast

    asked: list[bool] = []

    def spawn_node(*args, **kwargs):
        asked.append(kwargs.get("die_with_parent", False))
        raise RuntimeError("stop here")

    monkeypatch.setattr(shardcast, "spawn_node", spawn_node)
    for run in (
        lambda: shardcast.swarm(tmp_path, tmp_path, 1, 2, 1.0),
        lambda: shardcast.single(tmp_path, tmp_path, 1),
    ):
        with pytest.raises(RuntimeError, match="stop here"):
            run()
    assert asked == [True, True]


def test_a_saved_run_loads_as_it_was_and_a_foreign_file_is_refused(tmp_path):
    """``--save`` / ``--load``: the measured networks come back field for field (the model
    can be checked again against one measurement), and a file that does not begin with
    the calibration's 2-node and ``WIDE``-node networks is refused, not predicted."""
    pair = Delivery(2, 2, [0.002, 0.003], 0, {"gossip": 2}, [[1], [0]], [0, 1], 0.4)
    wide = Delivery(WIDE, 1, [0.01] * 4, 0, {"gossip": 4}, [[1], [0]], [2], 0.9)
    ten = Delivery(10, 1, [0.02] * 9, 0, {"gossip": 9}, [[1], [0]], [3], 1.2)
    ten.extra = {"windows": [1.0, 2.0, 3.0, 4.0], "bursts": [[[1.5, 0.001, 0.002, 1]]]}
    path = tmp_path / "run.json"
    gossipcheck.dump(path, [pair, wide, ten])
    assert gossipcheck.load(path) == [pair, wide, ten]
    gossipcheck.dump(path, [ten, wide])
    with pytest.raises(ValueError, match="not a gossipcheck run"):
        gossipcheck.load(path)


@pytest.mark.parametrize("content", [None, "not json", '[{"n": 2}]'])
def test_a_load_of_a_missing_or_broken_file_is_a_clear_error(tmp_path, content):
    import subprocess
    import sys

    path = tmp_path / "run.json"
    if content is not None:
        path.write_text(content)
    cmd = [sys.executable, "-m", "bench.simulation.gossipcheck", "--load", str(path)]
    got = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert got.returncode == 2, got.stderr
    assert "--load:" in got.stderr and "Traceback" not in got.stderr, got.stderr
