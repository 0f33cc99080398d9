"""The NAT lab itself (tests/helpers/netns.py), checked with plain sockets before any node
relies on it: a home dials out and is seen at its router's public address, nobody dials
into a home, a cone router keeps a connection's source port and a random one does not.
Skips, with the reason, only where network namespaces cannot be built."""

import subprocess
import sys

import pytest

from tests.helpers import netns
from tests.helpers.netns import PUBLIC_IP, NatLab, nat_reason

REASON = nat_reason()
pytestmark = [
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
    pytest.mark.timeout(120),
]
PORT = 7000
SOURCE_PORTS = list(range(41000, 41008))

# accepts connections and prints, per connection, the port the client bound and the
# address:port it arrived from; "ready" once it listens
LISTENER = """
import socket, sys
srv = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
for _ in range(int(sys.argv[3])):
    conn, (ip, port) = srv.accept()
    print(conn.recv(16).decode(), ip, port, flush=True)
    conn.close()
"""
# connects once from each given source port, sending that port
DIALER = """
import socket, sys
for src in sys.argv[3:]:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), 5, ("0.0.0.0", int(src))) as s:
        s.sendall(src.encode())
        s.recv(1)
"""


@pytest.fixture(scope="module")
def lab():
    lab = NatLab(["cone", "random"])
    yield lab
    lab.close()


def run_in(ns: str, code: str, *args: object, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ip", "netns", "exec", ns, sys.executable, "-S", "-c", code, *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=check)


def namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def seen_from(lab: NatLab, home_index: int) -> list[tuple[int, str, int]]:
    """(bound source port, address seen by public, port seen by public) per connection
    from the home to a listener in the public namespace."""
    listener = subprocess.Popen(
        ["ip", "netns", "exec", lab.public, sys.executable, "-S", "-c", LISTENER,
         PUBLIC_IP, str(PORT), str(len(SOURCE_PORTS))],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert listener.stdout is not None
        assert listener.stdout.readline().strip() == "ready"
        run_in(lab.homes[home_index].ns, DIALER, PUBLIC_IP, PORT, *SOURCE_PORTS)
        out, _ = listener.communicate(timeout=30)
    finally:
        listener.kill()
        listener.wait()
    rows = [line.split() for line in out.splitlines()]
    return [(int(src), ip, int(port)) for src, ip, port in rows]


def test_a_home_reaches_public_and_is_seen_at_its_routers_address(lab):
    for i, home in enumerate(lab.homes):
        seen = seen_from(lab, i)
        assert [src for src, _, _ in seen] == SOURCE_PORTS
        assert {ip for _, ip, _ in seen} == {home.wan_ip}, (home, seen)


def test_a_cone_router_keeps_source_ports_and_a_random_one_does_not(lab):
    cone = seen_from(lab, 0)
    assert all(src == port for src, _, port in cone), cone
    rand = seen_from(lab, 1)
    # a random mapping hits the bound port with odds of about 1 in 64,000 per connection
    assert sum(src == port for src, _, port in rand) <= 1, rand


def test_nobody_dials_into_a_home(lab):
    probe = "import socket,sys; socket.create_connection((sys.argv[1], 22), 3)"
    for home in lab.homes:
        res = run_in(lab.public, probe, home.ip, check=False)
        assert res.returncode != 0 and "unreachable" in res.stderr, res.stderr
    first, second = lab.homes
    for a, b in ((first, second), (second, first)):
        res = run_in(a.ns, probe, b.ip, check=False)
        assert res.returncode != 0 and "unreachable" in res.stderr, (a, b, res.stderr)


def test_a_router_refuses_unsolicited_syns_or_drops_them_when_built_to(lab):
    dial = "import socket,sys; socket.create_connection((sys.argv[1], 7), 1)"
    res = run_in(lab.public, dial, lab.homes[0].wan_ip, check=False)
    assert "ConnectionRefusedError" in res.stderr, res.stderr
    quiet = NatLab(["cone"], drop_unsolicited=True)
    try:
        res = run_in(quiet.public, dial, quiet.homes[0].wan_ip, check=False)
        assert "TimeoutError" in res.stderr, res.stderr
        # the drop is for new connections only: the home still dials out
        assert seen_from(quiet, 0)[0][1] == quiet.homes[0].wan_ip
    finally:
        quiet.close()


def test_close_removes_every_namespace():
    lab = NatLab(["cone"])
    names = [lab.public, lab.homes[0].ns, lab.homes[0].router]
    assert all(n in namespaces() for n in names)
    lab.close()
    assert not any(n in namespaces() for n in names)


def test_a_build_that_fails_half_way_leaves_nothing(monkeypatch):
    real_sh = netns.sh

    def sh(*cmd: str, **kw):
        if cmd[0] == "nft" and kw.get("ns", "").startswith("rtr2_"):
            raise RuntimeError("nft refused")
        return real_sh(*cmd, **kw)

    monkeypatch.setattr(netns, "sh", sh)
    before = namespaces()
    with pytest.raises(RuntimeError, match="nft refused"):
        NatLab(["cone", "random"])
    assert namespaces() == before
