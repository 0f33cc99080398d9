"""Reachability through a real NAT (SPEC §19, issue #29 item 1): a worker at home behind
an nftables masquerade finds out it is private, and sees the router's public address as
its observed address, while the public nodes that answered it find themselves public.
Skips, with the reason, only where network namespaces cannot be built."""

import time

import pytest

from node.cli.devnet import wait_ready
from tests.helpers.netns import HOME_IP, PUBLIC_IP, WAN_IP, HomeNat, NsNode, nat_reason

REASON = nat_reason()
FLAGS = ["--heartbeat-interval", "0.5", "--peer-ttl", "6", "--discovery-interval", "0.5"]


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
