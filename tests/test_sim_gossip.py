"""The simulator's gossip model (``bench/simulation/gossip.py``) and its check against real
nodes (``bench/simulation/gossipcheck.py``)."""

import dataclasses
import math
import os
import random
import statistics

import pytest

from bench.simulation.gossip import GossipCost, copies, deliver, gossip_mesh
from bench.simulation.gossipcheck import Delivery, calibrate, measure, predict, quantile


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
    cost = GossipCost(send_s=0.0, recv_s=1.0)  # recv_s counts the hops exactly
    mean = {n: statistics.mean(predict(n, cost, seeds=3)) for n in (7, 30, 300, 1000)}
    assert mean[7] == 1.0  # everyone is the publisher's mesh peer
    assert mean[7] < mean[30] < mean[300] < mean[1000]
    assert max(predict(1000, cost, seeds=2)) <= 7  # a degree-6 mesh: log_5(1000) + slack


def test_a_larger_hop_cost_scales_delivery():
    a = predict(30, GossipCost.from_hop(0.004), seeds=3)
    b = predict(30, GossipCost.from_hop(0.012), seeds=3)
    assert b == pytest.approx([3 * t for t in a])


def test_processes_sharing_cores_slow_each_other():
    pair = gossip_mesh(2, random.Random(0))
    assert deliver(pair, GossipCost(1.0, 1.0))[1] == 2.0
    assert deliver(pair, GossipCost(1.0, 1.0, cores=1, background=1))[1] == 4.0  # half a core
    mesh = gossip_mesh(30, random.Random(0))
    free = deliver(mesh, GossipCost(1.0, 1.0))
    two = deliver(mesh, GossipCost(1.0, 1.0, cores=2))
    assert statistics.mean(two[1:]) > 2 * statistics.mean(free[1:])  # 29 receivers, 2 cores
    assert all(a <= b for a, b in zip(free, two, strict=True))


def test_what_of_a_hop_is_not_processor_time_is_on_the_wire():
    cost = GossipCost.from_hop_and_cpu(0.010, copy_cpu_s=0.002, cores=2)
    assert (cost.send_s, cost.recv_s, cost.wire_s) == (0.002, 0.002, pytest.approx(0.006))
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


def test_the_hop_calibration_reproduces_the_pair_it_came_from():
    pair = Delivery(2, 5, [0.002, 0.003, 0.004, 0.005, 0.009], 0, {}, [[1], [0]], [9], 3.0)
    hop = calibrate(pair)
    assert hop == 0.004
    assert predict(2, GossipCost.from_hop(hop, cores=2), mesh=pair.mesh) == pytest.approx([0.004])
    cost = GossipCost.from_hop_and_cpu(hop, 0.001, cores=2)
    assert predict(2, cost, mesh=pair.mesh) == pytest.approx([0.004])


def test_figures_of_a_delivery():
    d = Delivery(3, 2, [0.01, 0.02, 0.03], 1, {"gossip": 3}, [[1, 2], [0], [0]], [0], 0.5)
    assert d.delivered == 0.75
    assert d.figures() == {"p50_s": 0.02, "p99_s": 0.03, "max_s": 0.03, "delivered": 0.75}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_real_nodes_deliver_every_announcement_by_gossip_and_the_model_predicts_a_delay():
    """Six node processes: every announcement reaches every receiver, by gossip, within
    seconds; the model calibrated on a 2-node network of the same run gives a finite
    prediction. How close it comes is the bench's figure (``validation`` in
    ``bench/sim.py``), not asserted here: on this shared 2-core machine the same network's
    median moved by 2x between runs, and the model is not yet within the issue's 20 %."""
    pair = measure(2, count=10)
    real = measure(6, count=10)
    assert pair.missing == 0 and real.missing == 0, "an announcement never arrived"
    assert len(real.delays) == 5 * 10
    assert real.via.get("sync", 0) == 0, f"gossip lost some ({real.via}): sync brought them"
    assert all(0 < t < 5 for t in real.delays)
    cores = float(os.cpu_count() or 1)
    cost = GossipCost.from_hop(calibrate(pair), cores)
    predicted = quantile(predict(6, cost, mesh=real.mesh), 0.5)
    assert math.isfinite(predicted) and predicted > 0
