"""Real node processes on 127.0.0.1: discovery, departure, gossip, frozen peers."""

import os
import signal
import time

import pytest

from tests.helpers.net import (
    Cluster,
    addr_of,
    counter,
    dump_logs,
    metrics,
    peer_roles,
    post,
    status,
    wait_until,
)

ROLES = ["bootstrap", "trainer", "validator", "inference", "inference", "inference"]


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.close()


def start_chain(cluster, roles, **overrides):
    """Each node knows only its predecessor."""
    procs, stats = [], []
    for role in roles:
        boot = [addr_of(stats[-1])] if stats else []
        p, st = cluster.start(role, boot, **overrides)
        procs.append(p)
        stats.append(st)
    return procs, stats


def test_six_node_chain_discovery_sigkill_and_sigterm(cluster):
    procs, stats = start_chain(cluster, ROLES, net__peer_ttl="6")
    ids = [s["peer_id"] for s in stats]
    expected = {pid: role for pid, role in zip(ids, ROLES, strict=True)}

    def everyone_knows_everyone():
        return all(
            peer_roles(p) == {k: v for k, v in expected.items() if k != ids[i]}
            for i, p in enumerate(procs)
        )

    wait_until(everyone_knows_everyone, 45, "all six nodes to learn every other node and its role")
    # the DHT itself found peers, not only presence relayed by gossip: every node provides
    # its role key, every node but the bootstrap looks up the roles it works with and its
    # own (three keys a round), and provider records name other nodes
    workers = procs[1:]

    def found_through_the_dht(p):
        d = status(p)["discovery"]
        return d["dht_providers"] >= 2 and d["dht_lookups"] >= 3

    wait_until(
        lambda: all(found_through_the_dht(p) for p in workers),
        30,
        "every node to find providers through the DHT, three keys a round",
    )
    for p in procs:
        d = status(p)["discovery"]
        assert d["dht_provides"] >= 1, d
    # node 5 knew only node 4, node 0 knew nobody: discovery was transitive
    assert ids[0] in peer_roles(procs[5]) and ids[5] in peer_roles(procs[0])

    # SIGKILL: no goodbye; forgotten by everyone within the TTL (6 s) plus slack
    procs[5].proc.send_signal(signal.SIGKILL)
    procs[5].proc.wait()
    killed_at = time.monotonic()
    assert any(ids[5] in peer_roles(p) for p in procs[:5]), "forgotten before any TTL could pass"
    wait_until(
        lambda: all(ids[5] not in peer_roles(p) for p in procs[:5]),
        6 + 6,
        "the killed node to expire",
    )
    assert time.monotonic() - killed_at > 6 - 0.5 - 1.5, (
        "a SIGKILLed node must be forgotten by TTL, not earlier"
    )

    # SIGTERM: announces leaving; forgotten at once, well before the 6 s TTL
    procs[4].proc.send_signal(signal.SIGTERM)
    termed_at = time.monotonic()
    try:
        wait_until(
            lambda: all(ids[4] not in peer_roles(p) for p in procs[:4]),
            3,
            "the departed node to be dropped",
        )
    except AssertionError as exc:
        still = [p.name for p in procs[:4] if ids[4] in peer_roles(p)]
        raise AssertionError(f"{exc}; still known by {still}\n{dump_logs(procs)}") from None
    assert procs[4].proc.wait(10) == 0
    assert time.monotonic() - termed_at < 6


def test_start_refuses_a_data_dir_in_use_a_taken_port_and_a_taken_admin_port(cluster, tmp_path):
    """Each a one-line error and exit 1, nothing half up: a second node on a running node's
    data dir (it ran with the same identity and took the first one's admin file), a listen
    port or an admin port another program holds (the node said "up" and listened nowhere)."""
    import socket
    import subprocess

    from node.cli.devnet import free_port
    from tests.helpers.net import CLI

    fixed = free_port()
    first, _ = cluster.start("bootstrap", listen=f"/ip4/127.0.0.1/tcp/{fixed}")

    def start(data_dir, *flags):
        argv = [*CLI, "start", "--role", "bootstrap", "--data-dir", str(data_dir), *flags]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert res.returncode == 1 and "Traceback" not in res.stderr, res.stdout + res.stderr
        assert "intellect-node bootstrap up" not in res.stdout
        return res.stderr.strip().splitlines()[-1]

    said = start(first.data_dir, "--listen", "/ip4/127.0.0.1/tcp/0")
    assert said == (
        f"intellect-node: error: another node (pid {first.proc.pid}) runs with the data dir"
        f" {first.data_dir}: stop it first, or give this one another --data-dir or --name"
    )
    assert status(first)["peer_id"] and (first.data_dir / "admin.json").exists()
    # another node's port: py-libp2p's SO_REUSEPORT let both bind, and dials were split
    said = start(tmp_path / "a", "--listen", f"/ip4/127.0.0.1/tcp/{fixed}")
    assert said == (
        f"intellect-node: error: cannot listen on /ip4/127.0.0.1/tcp/{fixed}: Address already in use"
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        said = start(tmp_path / "b", "--listen", f"/ip4/127.0.0.1/tcp/{port}")
        assert said.startswith(
            f"intellect-node: error: cannot listen on /ip4/127.0.0.1/tcp/{port}: "
        )
        said = start(tmp_path / "c", "--listen", "/ip4/127.0.0.1/tcp/0", "--admin.port", str(port))
        assert said == f"intellect-node: error: admin port {port}: Address already in use"


def test_ping_checks_its_peer_id_and_says_a_failure_in_one_line(cluster):
    """`ping` took any string as a peer id and printed the node's raw exception text as
    JSON: a bad peer id or a multiaddr is now one line and status 2 before the node is
    asked (the admin endpoint refuses one too: 400), a peer that does not answer one line
    and status 1, an answer one line on stdout."""
    import subprocess

    from tests.helpers.net import CLI

    node, first = cluster.start("bootstrap")
    _, second = cluster.start("bootstrap", [addr_of(first)])
    wait_until(lambda: second["peer_id"] in peer_roles(node), 30, "the first to know the second")
    nobody = "12D3KooWNTfKZ37isa5RWx23UwAhoHxHvSb6jxggwB1qqbZBRF4A"

    def ping(peer, code):
        argv = [*CLI, "ping", peer, "--data-dir", str(node.data_dir)]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert res.returncode == code, res.stdout + res.stderr
        out = res.stdout if code == 0 else res.stderr
        assert len(out.strip().splitlines()) == 1 and "Traceback" not in out, out
        return out.strip()

    assert ping("hello", 2) == "intellect-node: ping: 'hello' is not a peer id (12D3KooW...)"
    assert ping(f"/ip4/1.2.3.4/tcp/4001/p2p/{nobody}", 2) == (
        f"intellect-node: ping takes a peer id, not a multiaddr: intellect-node ping {nobody}"
    )
    with pytest.raises(RuntimeError, match="^not an Ed25519 peer id: '12D3Koo'$"):
        post(node, "/ping", {"peer_id": "12D3Koo"})
    assert ping(nobody, 1) == (
        f"intellect-node: error: no answer from {nobody}: No known addresses to peer {nobody}"
    )
    peer = second["peer_id"]
    assert ping(peer, 0).startswith(f"{peer}: bootstrap, ")


def test_commands_on_a_killed_nodes_data_dir_say_no_node_runs(cluster):
    """A SIGKILLed node leaves its admin.json: status, ping and dashboard said "Connection
    refused" (dashboard printed its page's address, status 0); a damaged admin.json gave a
    KeyError traceback. Each is now one line and status 1."""
    import json as _json
    import subprocess

    from tests.helpers.net import CLI

    node, _ = cluster.start("bootstrap")
    pid = node.proc.pid
    node.proc.kill()
    node.proc.wait()
    admin = node.data_dir / "admin.json"
    assert admin.exists()

    def said(*argv):
        argv = [*CLI, *argv, "--data-dir", str(node.data_dir)]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert res.returncode == 1 and res.stdout == "", res.stdout + res.stderr
        assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
        return res.stderr.strip()

    for argv in (["status"], ["ping", "12D3KooWNTfKZ37isa5RWx23UwAhoHxHvSb6jxggwB1qqbZBRF4A"]):
        assert said(*argv) == (
            f"intellect-node: error: no running node found: {admin} is left from node process"
            f" {pid}, which has ended (killed?)"
        )
    assert "which has ended" in said("dashboard", "--no-open")
    info = _json.loads(admin.read_text())
    admin.write_text("{}")
    assert said("status").endswith("is damaged (no port and token): is a node running there?")
    admin.write_text('{"port": 1')
    assert said("status").startswith(f"intellect-node: error: cannot read {admin}: ")
    # a live pid whose port does not answer (this test's own pid, a port nobody holds)
    admin.write_text(_json.dumps({**info, "pid": os.getpid(), "port": 9}))
    assert said("status").startswith(
        f"intellect-node: error: the node of {node.data_dir} does not answer on its admin port 9:"
    )


@pytest.mark.parametrize(
    ("fail", "said"),
    [
        ("disk", "OSError: [Errno 28] No space left on device: "),
        ("bug", "KeyError: 'missing'"),
    ],
)
def test_a_role_that_fails_once_up_stops_its_node_cleanly(cluster, tmp_path, fail, said):
    """A role that fails after the node is up (its disk full, a bug) ends the node the way
    Ctrl-C does: departure announced (its peer drops it at once, not after the TTL), the
    error on one line, the traceback in the log, exit status 1; not a raw traceback of
    trio's exception group."""
    boot, sb = cluster.start("bootstrap")
    trigger = tmp_path / f"fail-{fail}"
    node, sn = cluster.start(
        "inference",
        [addr_of(sb)],
        module="tests.helpers.failing_role",
        env={"INTELLECT_NODE_NETWORK_ONLY": "false", "FAIL": fail, "FAIL_WHEN": str(trigger)},
    )
    wait_until(lambda: sn["peer_id"] in peer_roles(boot), 30, "the bootstrap to know the node")
    assert node.proc.poll() is None  # up, its role running
    trigger.touch()
    failed_at = time.monotonic()
    wait_until(lambda: sn["peer_id"] not in peer_roles(boot), 5, "the failed node to be dropped")
    assert time.monotonic() - failed_at < 6  # its departure, not the 6 s TTL
    assert node.proc.wait(30) == 1, dump_logs([node])
    log = node.log_path.read_text()
    line = f"intellect-node: error: inference role failed: {said}"
    assert line in log, log[-3000:]
    assert "the inference role failed" in log and "Traceback" in log
    assert "Exceptions from Trio nursery" not in log.split(line)[1].split("\n")[0]


@pytest.mark.slow
def test_gossip_three_publishers_300_each_none_lost_none_twice(cluster):
    procs, stats = start_chain(cluster, ROLES)
    ids = [s["peer_id"] for s in stats]
    wait_until(lambda: all(len(status(p)["peers"]) == 5 for p in procs), 45, "full discovery")
    publishers = [1, 3, 5]
    for i in publishers:
        assert (
            post(procs[i], "/announce", {"topic": "test", "count": 300, "body": f"from-{i}-"})[
                "queued"
            ]
            == 300
        )

    def delivered_all():
        for j, p in enumerate(procs):
            got = status(p)["announcements"]["delivered"]
            for i in publishers:
                if i != j and got.get(ids[i], 0) < 300:
                    return False
        return True

    wait_until(delivered_all, 60, "900 announcements to reach every node")

    def arrivals():  # every announcement that reached each node, delivered or duplicate
        out = []
        for p in procs:
            a = status(p)["announcements"]
            out.append(sum(a["delivered_via"].values()) + sum(a["duplicates"].values()))
        return out

    last = arrivals()

    def settled():  # no arrival anywhere for a second: late duplicates would have come
        nonlocal last
        time.sleep(1)
        now = arrivals()
        quiet, last = now == last, now
        return quiet

    wait_until(settled, 30, "arrivals to settle")
    by_gossip = total = 0
    for j, p in enumerate(procs):
        a = status(p)["announcements"]
        got = a["delivered"]
        for i in publishers:
            if i != j:
                assert got[ids[i]] == 300, (j, i, got)
        assert ids[j] not in got  # own announcements are not delivered back to oneself
        # every arrival beyond the first of each was counted as a duplicate, not delivered
        assert sum(a["delivered_via"].values()) == sum(got.values())
        # gossip carried them: the sync-by-request fallback only fills gaps. How much gossip
        # leaves to sync depends on the machine's load (gossip that lags more than a grace
        # period is overtaken): loaded with two busy loops, a node got 51-73% by gossip, and
        # CI's end of the chain 48% once. A node whose gossip is dead gets none.
        via = a["delivered_via"]
        assert via.get("gossip", 0) > 0.25 * sum(got.values()), (j, via)
        by_gossip, total = by_gossip + via.get("gossip", 0), total + sum(got.values())
    assert by_gossip > 0.5 * total, (by_gossip, total)


def test_late_joiner_fetches_announcements_gossip_never_gave_it(cluster):
    ((a, sa),) = [cluster.start("trainer")]
    assert post(a, "/announce", {"count": 40})["queued"] == 40
    wait_until(lambda: status(a)["announcements"]["published"] == 40, 20, "publishing")
    # gossipsub replays its message cache (the last 3 of its 1 s heartbeats) to a new peer
    # and answers IWANT from the last 5: past that, gossip has nothing left to give
    time.sleep(6)
    b, _ = cluster.start("inference", [addr_of(sa)])
    wait_until(
        lambda: status(b)["announcements"]["delivered"].get(sa["peer_id"]) == 40,
        20,
        "the late joiner to sync",
    )
    assert status(b)["announcements"]["delivered_via"] == {"sync": 40}
    assert counter(metrics(b), "intellect_synced_announcements_total") == 40


def test_frozen_peer_does_not_hang_its_counterpart(cluster):
    a, sa = cluster.start("inference", net__read_timeout="1.5", net__connect_timeout="1.5")
    b, sb = cluster.start(
        "inference", [addr_of(sa)], net__read_timeout="1.5", net__connect_timeout="1.5"
    )
    c, sc = cluster.start("validator", [addr_of(sa)])
    wait_until(
        lambda: sa["peer_id"] in peer_roles(b) and sc["peer_id"] in peer_roles(b),
        30,
        "b to know a and c",
    )
    assert post(b, "/ping", {"peer_id": sa["peer_id"]})["ok"]
    os.kill(a.proc.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        result = post(b, "/ping", {"peer_id": sa["peer_id"]}, timeout=30)
        elapsed = time.monotonic() - t0
        assert not result["ok"] and "timeout" in result["error"], result
        assert elapsed < 1.5 + 1.5 + 3, f"ping to a frozen peer took {elapsed:.1f} s"
        # b still serves everyone else
        assert status(b)["peer_id"] == sb["peer_id"]
        r = post(b, "/ping", {"peer_id": sc["peer_id"]})
        assert r["ok"], r
        assert post(c, "/ping", {"peer_id": sb["peer_id"]})["ok"]
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)


def test_announcements_queued_at_shutdown_are_still_sent(cluster):
    a, sa = cluster.start("trainer")
    b, _ = cluster.start("inference", [addr_of(sa)])
    wait_until(lambda: sa["peer_id"] in peer_roles(b), 30, "b to know a")
    assert post(a, "/announce", {"count": 150})["queued"] == 150  # 1.5 s of work at 100/s
    a.proc.send_signal(signal.SIGTERM)
    assert a.proc.wait(20) == 0
    wait_until(
        lambda: status(b)["announcements"]["delivered"].get(sa["peer_id"]) == 150,
        10,
        "all 150 at b",
    )
