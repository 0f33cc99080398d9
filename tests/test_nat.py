"""Reachability through a real NAT (SPEC §19, issue #29 item 1): a worker at home behind
an nftables masquerade finds out it is private, and sees the router's public address as
its observed address, while the public nodes that answered it find themselves public.
Skips, with the reason, only where network namespaces cannot be built."""

import json
import subprocess
import time

import pytest

from node.cli.devnet import DEVNET_PASSWORD, fund, make_account, start_chain, wait_ready
from tests.helpers.net import wait_until
from tests.helpers.netns import HOME_IP, PUBLIC_IP, WAN_IP, HomeNat, NatLab, NsNode, nat_reason

REASON = nat_reason()
FLAGS = ["--heartbeat-interval", "0.5", "--peer-ttl", "6", "--discovery-interval", "0.5"]
FAST = ["--heartbeat-interval", "1", "--peer-ttl", "8", "--discovery-interval", "1"]  # test_loop's


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
        st = wait_ready(boot, 120)
        addr = next(a for a in st["addrs"] if f"/ip4/{PUBLIC_IP}/" in a)
        entry = ["--bootstrap", f"{addr}/p2p/{st['peer_id']}", *FLAGS]
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
        tried = sum(seen[n.name]["answered"].get("not reached", 0) for n in nodes if n is not home)
        assert tried >= 2, seen
    finally:
        codes = {n.name: n.stop(grace=20) for n in nodes}
        nat.close()
    assert all(c == 0 for c in codes.values()), codes


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
@pytest.mark.timeout(900)
def test_workers_at_home_reserve_on_two_relays_and_cone_homes_punch_a_direct_path(tmp_path):
    """Two relays in public (the bootstrap by default, the validator with --relay), and
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
        st = wait_ready(boot, 120)
        addr = next(a for a in st["addrs"] if f"/ip4/{PUBLIC_IP}/" in a)
        entry = ["--bootstrap", f"{addr}/p2p/{st['peer_id']}", *FLAGS]
        nodes.append(
            NsNode.start(
                lab.public,
                "validator",
                tmp_path,
                "validator",
                PUBLIC_IP,
                [*entry, "--relay", "true"],
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
        assert ids[cone1.name] in {p["peer_id"] for p in seen[cone2.name]["peers"]}
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


def work_env(tmp_path, ledger_env: dict[str, str], model) -> dict[str, str]:
    """The run's settings for every node of the work loop: test_loop's small work, the
    ledger in the public namespace, the trainer's id and the contract owner's key for it."""
    from node.keystore import load_or_create_identity

    return {
        **ledger_env,
        "INTELLECT_NODE_TRAINER_PEER_ID": load_or_create_identity(tmp_path / "trainer").peer_id,
        "INTELLECT_NODE_PASSWORD": DEVNET_PASSWORD,
        "INTELLECT_NODE_STEP_WAIT": "20",
        "INTELLECT_NODE_MODEL": str(model),
        "INTELLECT_NODE_MAX_UNJUDGED": "1",
        "INTELLECT_NODE_TASKS_PER_BATCH": "2",
        "INTELLECT_NODE_GROUP_SIZE": "2",
        "INTELLECT_NODE_MAX_NEW_TOKENS": "24",
        "INTELLECT_NODE_VERIFY_PROFILE": "strict-fp32",
        "INTELLECT_NODE_TORCH_THREADS": "1",
        "INTELLECT_NODE_ASYNC_LEVEL": "5",
    }


def peer_bytes(node: NsNode) -> dict[str, int]:
    """Shard bytes ``node`` fetched from each peer, over every download (``GET /weights``)."""
    out: dict[str, int] = {}
    for job in ((node.get("/weights") or {}).get("downloads") or {}).values():
        for peer, p in job["peers"].items():
            out[peer] = out.get(peer, 0) + p["bytes"]
    return out


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
@pytest.mark.timeout(900)
def test_workers_behind_nat_get_batches_judged_and_paid_and_pull_new_weights(
    tmp_path, tiny_model_dir
):
    """The work loop through real NATs (issue #29 item 4): the chain, the bootstrap, the
    validator (a second relay) and the trainer in public; an honest worker in each of two
    cone homes and one random-port home. Each worker's batches are fetched by the
    validator, accepted on-chain, and its account credited; the trainer steps on them and
    every worker pulls the new weights over SHARDCAST; the cone homes, joined by a hole
    punch, stay joined directly, and no shard crosses a relay."""
    lab = NatLab(["cone", "cone", "random"], drop_unsolicited=True)
    in_public = ["ip", "netns", "exec", lab.public]
    chain = None
    nodes: list[NsNode] = []
    try:
        chain, ledger_env = start_chain(
            tmp_path / "chain", extra=["--host", PUBLIC_IP], prefix=in_public
        )
        info = json.loads((tmp_path / "chain" / "chain.json").read_text())
        assert info["url"].startswith(f"http://{PUBLIC_IP}:")
        env = work_env(tmp_path, ledger_env, tiny_model_dir)
        make_account(tmp_path / "trainer", info["owner_key"])
        make_account(tmp_path / "validator", info["validator_key"])

        def start(ns: str, name: str, role: str, listen_ip: str, args: list[str]) -> NsNode:
            node = NsNode.start(
                ns, name, tmp_path, role, listen_ip, args, network_only=False, env=env
            )
            nodes.append(node)
            return node

        boot = start(lab.public, "bootstrap", "bootstrap", PUBLIC_IP, FAST)
        st = wait_ready(boot, 120)
        addr = next(a for a in st["addrs"] if f"/ip4/{PUBLIC_IP}/" in a)
        entry = ["--bootstrap", f"{addr}/p2p/{st['peer_id']}", *FAST]
        trainer = start(lab.public, "trainer", "trainer", PUBLIC_IP, entry)
        start(lab.public, "validator", "validator", PUBLIC_IP, [*entry, "--relay", "true"])
        workers = []
        for i, home in enumerate(lab.homes, start=1):
            name = f"worker{i}"
            fund(tmp_path / "chain", make_account(tmp_path / name), "10", prefix=in_public)
            workers.append(start(home.ns, name, "inference", "0.0.0.0", entry))
        ids = {n.name: wait_ready(n, 180)["peer_id"] for n in nodes}
        cone1, cone2, rand = workers

        def work(n: NsNode) -> dict:
            return (n.status() or {}).get("inference") or {}

        def looped() -> dict | None:
            seen = {w.name: work(w) for w in workers}
            tr = (trainer.status() or {}).get("trainer") or {}
            held = {
                w.name: ((w.status() or {}).get("weights") or {}).get("current") for w in workers
            }
            ok = (
                all(s.get("accepted", 0) >= 1 for s in seen.values())
                and tr.get("step", 0) >= 1
                and all((v or 0) >= 1 for v in held.values())
            )
            return {"work": seen, "trainer": tr, "held": held} if ok else None

        wait_until(looped, 600, "every NATed worker paid and holding new weights", interval=5)
        seen = {n.name: n.status() or {} for n in nodes}
        for w in workers:
            inf = seen[w.name]["inference"]
            assert seen[w.name]["reachability"]["state"] == "private", (w.name, seen[w.name])
            assert inf["accepted"] >= 1 and inf["rejected"] == 0, (w.name, inf)
            assert inf["pending_wei"] + inf["claimable_wei"] > 0, (w.name, inf)  # paid
            assert seen[w.name]["weights"]["current"] >= 1, (w.name, seen[w.name]["weights"])
            assert seen[w.name]["weights"]["downloaded_bytes"] > 0
        v = seen["validator"]["validator"]
        assert v["accepted"] >= len(workers) and v["rejected"] == 0, v
        assert seen["trainer"]["trainer"]["step"] >= 1
        # the cone homes: joined directly by a hole punch; the random home through a relay
        c1, c2 = seen[cone1.name]["relay"], seen[cone2.name]["relay"]
        assert ids[cone2.name] not in c1["relayed_peers"], c1
        assert ids[cone1.name] not in c2["relayed_peers"], c2
        assert c1["direct_upgrades"] + c2["direct_upgrades"] >= 1, (c1, c2)
        # SHARDCAST did not ride the relays: no worker fetched a shard byte from a peer that
        # only a relay joins it to, and the relays moved less than half the weights' bytes
        # (their bytes are gossip, presence and DHT traffic with the random home)
        fetched = {w.name: peer_bytes(w) for w in workers}
        for w in workers:
            via_relay = {
                p: b
                for p, b in fetched[w.name].items()
                if p in seen[w.name]["relay"]["relayed_peers"]
            }
            assert not any(via_relay.values()), (w.name, via_relay)
        relayed = sum(
            seen[r]["relay"]["counts"]["relayed_bytes"] for r in ("bootstrap", "validator")
        )
        moved = sum(seen[w.name]["weights"]["downloaded_bytes"] for w in workers)
        names = {i: n for n, i in ids.items()}
        by_source = {w: {names[p]: b for p, b in f.items() if b} for w, f in fetched.items()}
        print(f"relayed {relayed} B; shards fetched {moved} B: {json.dumps(by_source)}")
        assert relayed < moved / 2, (relayed, moved, by_source)
    finally:
        codes = {n.name: n.stop(grace=20) for n in nodes}
        if chain is not None and chain.poll() is None:
            chain.terminate()
            try:
                chain.wait(60)
            except subprocess.TimeoutExpired:
                chain.kill()
                chain.wait()
        lab.close()
    assert all(c == 0 for c in codes.values()), codes
