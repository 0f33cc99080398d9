"""Reachability through a real NAT (SPEC §16, issue #29 item 1): a worker at home behind
an nftables masquerade finds out it is private, and sees the router's public address as
its observed address, while the public nodes that answered it find themselves public;
relays, their limits and hole punching between homes (SPEC §17, items 2-3); the work loop
with workers, and with the validator, at home (item 4). Skips, with the reason, only where
network namespaces cannot be built."""

import time

import pytest

from node.cli.devnet import wait_ready
from tests.helpers.natloop import nat_work_loop
from tests.helpers.net import wait_until
from tests.helpers.netns import (
    HOME_IP,
    PUBLIC_IP,
    WAN_IP,
    HomeNat,
    NatLab,
    NsNode,
    joining,
    nat_reason,
)

REASON = nat_reason()
FLAGS = [
    "--net.heartbeat-interval",
    "0.5",
    "--net.peer-ttl",
    "6",
    "--net.discovery-interval",
    "0.5",
]


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
@pytest.mark.timeout(600)
def test_a_worker_behind_nat_knows_it_is_private_and_public_nodes_know_they_are_public(
    tmp_path,
):
    nat = HomeNat()
    nodes: list[NsNode] = []
    try:
        boot = NsNode.start(nat.public, "bootstrap", tmp_path, "bootstrap", PUBLIC_IP, FLAGS)
        nodes.append(boot)
        entry = joining(boot, FLAGS)
        for name, role in (("validator", "validator"), ("trainer", "trainer")):
            nodes.append(NsNode.start(nat.public, name, tmp_path, role, PUBLIC_IP, entry))
        home = NsNode.start(nat.home, "worker", tmp_path, "inference", "0.0.0.0", entry)
        nodes.append(home)
        for n in nodes:
            wait_ready(n, 120)

        def states() -> dict[str, dict]:
            return {n.name: (n.status() or {}).get("reachability", {}) for n in nodes}

        deadline = time.monotonic() + 240
        seen = states()
        while time.monotonic() < deadline:
            seen = states()
            if seen["worker"].get("state") == "private" and all(
                seen[n.name].get("state") == "public" for n in nodes if n is not home
            ):
                break
            time.sleep(2)
        assert seen["worker"].get("state") == "private", seen
        for n in nodes:
            if n is not home:
                assert seen[n.name]["state"] == "public", (n.name, seen)
        # the worker listens at home and is seen from outside at the router's address
        assert any(f"/ip4/{HOME_IP}/tcp/" in a for a in seen["worker"]["advertised"]), seen
        assert any(a.startswith(f"/ip4/{WAN_IP}/tcp/") for a in seen["worker"]["observed"]), seen
        assert seen["worker"]["not_reached_by"] >= 2 and seen["worker"]["reached_by"] == 0
        # the answerers' counts were read before the worker's: read them again until they
        # caught up with the answers the worker holds (each counts before it replies)
        public = [n for n in nodes if n is not home]

        def tried() -> int:
            answered = ((n.status() or {}).get("reachability", {}) for n in public)
            return sum(a.get("answered", {}).get("not reached", 0) for a in answered)

        wait_until(lambda: tried() >= 2, 30, "two public nodes that dialled back and failed")
    finally:
        codes = {n.name: n.stop(grace=20) for n in nodes}
        nat.close()
    assert all(c == 0 for c in codes.values()), codes


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
@pytest.mark.timeout(900)
@pytest.mark.slow
def test_workers_at_home_reserve_on_two_relays_and_cone_homes_punch_a_direct_path(tmp_path):
    """Two relays in public (the bootstrap by default, the validator with --relay.enabled), and
    three workers at home: two behind port-preserving NATs, one behind a NAT that maps
    ports at random. Routers drop unsolicited connections, as home routers do (tests/
    helpers/netns.py says why TCP hole punching needs it). Each worker finds it is private,
    reserves on both relays and advertises circuit addresses; the workers meet through the
    relays; the two cone homes end up joined directly by hole punching; the random home
    stays reachable through a relay only, and its hole punches are counted as failed."""
    lab = NatLab(["cone", "cone", "random"], drop_unsolicited=True)
    nodes: list[NsNode] = []
    try:
        boot = NsNode.start(lab.public, "bootstrap", tmp_path, "bootstrap", PUBLIC_IP, FLAGS)
        nodes.append(boot)
        entry = joining(boot, FLAGS)
        nodes.append(
            NsNode.start(
                lab.public,
                "validator",
                tmp_path,
                "validator",
                PUBLIC_IP,
                [*entry, "--relay.enabled", "true"],
            )
        )
        nodes.append(NsNode.start(lab.public, "trainer", tmp_path, "trainer", PUBLIC_IP, entry))
        workers = [
            NsNode.start(home.ns, f"worker{i}", tmp_path, "inference", "0.0.0.0", entry)
            for i, home in enumerate(lab.homes, start=1)
        ]
        nodes += workers
        ids = {n.name: wait_ready(n, 120)["peer_id"] for n in nodes}
        relays = {ids["bootstrap"], ids["validator"]}
        cone1, cone2, rand = workers

        def relay_of(n: NsNode) -> dict:
            return (n.status() or {}).get("relay", {})

        def settled() -> bool:
            seen = {w.name: relay_of(w) for w in workers}
            if any(set(s.get("reservations", {})) != relays for s in seen.values()):
                return False
            punched = ids[cone2.name] not in seen[cone1.name]["relayed_peers"] and (
                seen[cone1.name]["direct_upgrades"] + seen[cone2.name]["direct_upgrades"] >= 1
            )
            rand_relayed = ids[rand.name] in seen[cone1.name]["relayed_peers"]
            failed = sum(s["punches_failed"] for s in seen.values())
            return punched and rand_relayed and failed >= 1

        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not settled():
            time.sleep(2)
        seen = {n.name: n.status() or {} for n in nodes}
        for w in workers:
            rs = seen[w.name]["relay"]
            assert seen[w.name]["reachability"]["state"] == "private", (w.name, seen[w.name])
            assert set(rs["reservations"]) == relays, (w.name, rs)
            assert len(rs["circuit_addrs"]) == 2 and all(
                "/p2p-circuit" in a for a in rs["circuit_addrs"]
            )
            assert seen[w.name]["addrs"][:2] == rs["circuit_addrs"]  # what presence carries
        for name in ("bootstrap", "validator"):
            rs = seen[name]["relay"]
            assert rs["serving"] and rs["reservations_held_for_others"] == 3, (name, rs)
        assert not seen["trainer"]["relay"]["serving"]
        # the cone homes: joined directly, by a hole punch (no route joins homes otherwise)
        c1, c2 = seen[cone1.name]["relay"], seen[cone2.name]["relay"]
        assert ids[cone1.name] in {
            p["peer_id"] for p in seen[cone2.name]["peers"] if p["connected"]
        }
        assert ids[cone2.name] not in c1["relayed_peers"], c1
        assert ids[cone1.name] not in c2["relayed_peers"], c2
        assert c1["direct_upgrades"] + c2["direct_upgrades"] >= 1, (c1, c2)
        # the random home: through a relay only; its punches failed and were counted
        assert ids[rand.name] in c1["relayed_peers"], c1
        failed = sum(seen[n.name]["relay"]["punches_failed"] for n in workers)
        assert failed >= 1, {n.name: seen[n.name]["relay"] for n in workers}
        circuits = sum(
            seen[r]["relay"]["counts"].get("circuits opened", 0) for r in ("bootstrap", "validator")
        )
        assert circuits >= 2, {r: seen[r]["relay"]["counts"] for r in ("bootstrap", "validator")}
    finally:
        codes = {n.name: n.stop(grace=20) for n in nodes}
        lab.close()
    assert all(c == 0 for c in codes.values()), codes


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
@pytest.mark.timeout(900)
@pytest.mark.slow
def test_workers_behind_nat_get_batches_judged_and_paid_and_pull_new_weights(
    tmp_path, tiny_model_dir
):
    """The work loop through real NATs (issue #29 item 4): the chain, the bootstrap, the
    validator (a second relay) and the trainer in public; an honest worker in each of two
    cone homes and one random-port home. Each worker's batches are fetched by the
    validator, accepted on-chain, and its account credited; the trainer steps on them and
    every worker pulls the new weights over SHARDCAST; the cone homes, joined by a hole
    punch, stay joined directly and pull shards from each other, and no shard crosses a
    relay."""
    with nat_work_loop(tmp_path, tiny_model_dir) as loop:
        wait_until(loop.looped, 600, "every NATed worker paid and holding new weights", interval=5)
        cone1, cone2, _rand = loop.workers

        def reach() -> dict[str, dict]:
            return {w.name: (w.status() or {}).get("reachability", {}) for w in loop.workers}

        # the answers behind "private" are dial-backs the routers drop, each waited out
        deadline, r = time.monotonic() + 120, reach()
        while not all(s.get("state") == "private" for s in r.values()):
            assert time.monotonic() < deadline, r
            time.sleep(3)
            r = reach()
        assert all(s["reached_by"] == 0 for s in r.values()), r
        # busy workers may mistime their first punches; they are given more (SPEC §17)
        wait_until(
            lambda: loop.joined_directly(cone1, cone2), 300, "the cone homes direct", interval=3
        )
        # ... and pulling shards from each other (a version published once they are direct)
        traded = wait_until(
            lambda: loop.traded(cone1, cone2), 300, "the cone homes trading shards", interval=3
        )
        seen = {n.name: n.status() or {} for n in loop.nodes}
        ids, workers = loop.ids, loop.workers
        for w in workers:
            inf = seen[w.name]["inference"]
            assert seen[w.name]["reachability"]["state"] == "private", (w.name, reach())
            assert inf["accepted"] >= 1 and inf["rejected"] == 0, (w.name, inf)
            assert inf["pending_wei"] + inf["claimable_wei"] > 0, (w.name, inf)  # paid
            assert seen[w.name]["weights"]["current"] >= 1, (w.name, seen[w.name]["weights"])
            assert seen[w.name]["weights"]["downloaded_bytes"] > 0
        v = seen["validator"]["validator"]
        assert v["accepted"] >= len(workers) and v["rejected"] == 0, v
        assert seen["trainer"]["trainer"]["step"] >= 1
        # the cone homes: joined directly by a hole punch
        c1, c2 = seen[cone1.name]["relay"], seen[cone2.name]["relay"]
        assert ids[cone2.name] not in c1["relayed_peers"], c1
        assert ids[cone1.name] not in c2["relayed_peers"], c2
        assert c1["direct_upgrades"] + c2["direct_upgrades"] >= 1, (c1, c2)
        # SHARDCAST did not ride the relays: no worker fetched a shard byte from a peer that
        # only a relay joins it to, and the relays moved less than half the weights' bytes
        # (their bytes are gossip, presence and DHT traffic with the random home)
        bulk = loop.bulk(seen)
        assert bulk["relayed_shard_bytes"] == 0, bulk
        print(f"relayed {bulk['relay_bytes']} B; shards fetched {bulk['shard_bytes']} B: {bulk}")
        print(f"between the cone homes: {traded}")
        assert bulk["relay_bytes"] < bulk["shard_bytes"] / 2, bulk
    assert all(c == 0 for c in loop.codes.values()), loop.codes


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
@pytest.mark.timeout(900)
@pytest.mark.slow
def test_a_validator_behind_nat_judges_batches_from_a_cone_home_and_through_a_relay(
    tmp_path, tiny_model_dir
):
    """The validator at home (issue #29 item 4): in a cone home of its own, the trainer the
    second relay, one worker behind a cone NAT and one behind a random one. The validator
    finds it is private and reserves on both relays; it fetches and judges both workers'
    batches, which are accepted on-chain and paid: the random home's through a relay (no
    direct path can join a random NAT to a router that drops unsolicited connections), the
    cone home's over the path a hole punch made."""
    with nat_work_loop(
        tmp_path, tiny_model_dir, nats=("cone", "random"), validator_at="cone"
    ) as loop:
        wait_until(loop.looped, 600, "both NATed workers paid and holding new weights", interval=5)
        validator = loop.node("validator")
        cone, rand = loop.workers
        wait_until(
            lambda: loop.joined_directly(cone, validator), 300, "cone home direct", interval=3
        )
        seen = {n.name: n.status() or {} for n in loop.nodes}
        ids, v = loop.ids, seen["validator"]
        assert v["reachability"]["state"] == "private", v["reachability"]
        assert set(v["relay"]["reservations"]) == {ids["bootstrap"], ids["trainer"]}, v["relay"]
        assert v["validator"]["accepted"] >= 2 and v["validator"]["rejected"] == 0, v["validator"]
        for w in loop.workers:
            inf = seen[w.name]["inference"]
            assert inf["accepted"] >= 1 and inf["rejected"] == 0, (w.name, inf)
            assert inf["pending_wei"] + inf["claimable_wei"] > 0, (w.name, inf)  # paid
        # the random home and the validator: only ever joined through a relay
        assert ids[rand.name] in v["relay"]["relayed_peers"], v["relay"]
        circuits = sum(seen[r]["relay"]["counts"].get("circuits opened", 0) for r in loop.relays)
        assert circuits >= 1, {r: seen[r]["relay"]["counts"] for r in loop.relays}
        assert ids[cone.name] not in v["relay"]["relayed_peers"], v["relay"]
    assert all(c == 0 for c in loop.codes.values()), loop.codes


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
@pytest.mark.timeout(600)
def test_a_relay_past_its_reservation_limit_refuses_a_home_and_counts_it(tmp_path):
    """The relay limits through real NATs: the bootstrap relays with room for one
    reservation; of two workers at home, each private, one holds it and the other is
    refused, and the relay counts the refusal. (Every limit, on 127.0.0.1: test_relay.)"""
    lab = NatLab(["cone", "cone"], drop_unsolicited=True)
    nodes: list[NsNode] = []
    try:
        boot = NsNode.start(
            lab.public,
            "bootstrap",
            tmp_path,
            "bootstrap",
            PUBLIC_IP,
            [*FLAGS, "--relay.max-reservations", "1"],
        )
        nodes.append(boot)
        entry = joining(boot, FLAGS)
        # a second public peer: a worker is private once two peers failed to dial it back
        nodes.append(NsNode.start(lab.public, "trainer", tmp_path, "trainer", PUBLIC_IP, entry))
        workers = [
            NsNode.start(home.ns, f"worker{i}", tmp_path, "inference", "0.0.0.0", entry)
            for i, home in enumerate(lab.homes, start=1)
        ]
        nodes += workers
        ids = {n.name: wait_ready(n, 120)["peer_id"] for n in nodes}

        def settled() -> dict | None:
            seen = {n.name: n.status() or {} for n in nodes}
            relay = seen["bootstrap"].get("relay", {})
            holders = [
                w.name
                for w in workers
                if ids["bootstrap"] in seen[w.name].get("relay", {}).get("reservations", {})
            ]
            refused = relay.get("counts", {}).get("reservations refused", 0)
            return seen if len(holders) == 1 and refused >= 1 else None

        seen = wait_until(settled, 240, "one reservation held and one refused", interval=2)
        for w in workers:
            assert seen[w.name]["reachability"]["state"] == "private", seen[w.name]
        relay = seen["bootstrap"]["relay"]
        assert relay["reservations_held_for_others"] == 1, relay
        assert relay["counts"]["reservations accepted"] >= 1, relay
        assert relay["limits"]["max_reservations"] == 1, relay["limits"]
    finally:
        codes = {n.name: n.stop(grace=20) for n in nodes}
        lab.close()
    assert all(c == 0 for c in codes.values()), codes
