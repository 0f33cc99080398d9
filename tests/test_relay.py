"""Circuit relay v2 and hole punching (SPEC §17, issue #29 items 2-3), on 127.0.0.1: a node
that calls itself private reserves on a relay it found through the DHT, advertises its
circuit address, and is dialed through it; the relay's limits refuse and cut, and count
what they did. Through real NATs (no fake reachability) in ``test_nat.py``."""

from __future__ import annotations

from contextlib import asynccontextmanager
from types import SimpleNamespace

import multiaddr
import pytest
import trio
from libp2p.custom_types import TProtocol
from libp2p.network.stream.exceptions import StreamError
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.resources import RelayLimits
from libp2p.relay.circuit_v2.transport import CircuitV2Transport
from libp2p.tools.anyio_service import background_trio_service

from crypto.identity import Identity
from node.config import NodeConfig, load_config
from node.net.circuits import CountingRelay, dial_circuit, reserve
from node.net.host import build_host, parse_addrs
from node.net.metrics import Metrics
from node.net.reachability import PRIVATE, PUBLIC
from node.net.runtime import Node

ECHO = TProtocol("/test/echo/1.0.0")


async def _start(nursery, tmp_path, name, role, **flags):
    cfg = load_config(
        environ={},
        flags={
            "role": role,
            "net.listen": ["/ip4/127.0.0.1/tcp/0"],
            "data_dir": tmp_path / name,
            "net.read_timeout": 3.0,
            "net.connect_timeout": 3.0,
            "net.discovery_interval": 0.5,
            "net.heartbeat_interval": 0.5,
            "net.peer_ttl": 6.0,
            **flags,
        },
    )
    return await nursery.start(Node(cfg, Identity.generate()).serve)


def _info(node, addrs=None):
    return PeerInfo(ID.from_base58(node.peer_id), parse_addrs(addrs or node.addrs))


async def _until(check, seconds, what):
    with trio.fail_after(seconds):
        while not check():  # noqa: ASYNC110 (polls the nodes' state)
            await trio.sleep(0.1)
    return what


@pytest.mark.timeout(180)
async def test_a_private_node_reserves_on_a_relay_found_in_the_dht_and_is_reached_through_it(
    tmp_path,
):
    async with trio.open_nursery() as nursery:
        relay = await _start(nursery, tmp_path, "relay", "bootstrap")
        relay.reachability.state = lambda: PUBLIC  # its AutoNAT peers: see test_reachability
        home = await _start(nursery, tmp_path, "home", "inference")
        home.reachability.state = lambda: PRIVATE
        dialer = await _start(nursery, tmp_path, "dialer", "validator")
        for n in (home, dialer):
            await n.connect(_info(relay))
        assert relay.relays.serving and not home.relays.serving

        await _until(lambda: home.relays.held, 60, "a reservation")
        st = home.status()["relay"]
        assert list(st["reservations"]) == [relay.peer_id] and st["reservations"][relay.peer_id] > 0
        circuit = f"/p2p/{relay.peer_id}/p2p-circuit"
        assert [a for a in home.addrs if circuit in a] == st["circuit_addrs"] != []
        # every place our addresses go: identify, signed peer record, DHT provider records
        assert any(circuit in str(a) for a in home.network.host.get_addrs())
        assert relay.status()["relay"]["reservations_held_for_others"] == 1
        assert relay.status()["relay"]["counts"]["reservations accepted"] >= 1
        # the relay's connection is pinned: never trimmed by the watermarks
        assert home.discovery.links.pinned == {relay.peer_id}
        assert relay.peer_id in home.discovery.links.protected()

        # a circuit through the relay (on one machine the dialer may also have dialed the
        # home node directly meanwhile: the DHT's walks do; through real NATs in test_nat)
        target = f"{st['circuit_addrs'][0]}/p2p/{home.peer_id}"
        await dialer.network.circuit_dialer(target)
        counts = relay.status()["relay"]["counts"]
        assert counts.get("circuits opened") == 1 and counts["relayed_bytes"] > 0, counts
        # dialing through a relay takes no reservation on it: only the home node's
        assert relay.status()["relay"]["reservations_held_for_others"] == 1
        assert relay.status()["relay"]["circuits_open"] == 1
        reply = await dialer.ping(home.peer_id)
        assert reply.get("role") == "inference", reply

        # public again: the reservation is given up and the circuit address withdrawn
        home.reachability.state = lambda: PUBLIC
        await _until(lambda: not home.network.circuit_addrs, 30, "no circuit address")
        assert not any(circuit in str(a) for a in home.network.host.get_addrs())
        assert home.discovery.links.pinned == set()
        for n in (relay, home, dialer):
            n.request_stop()
        nursery.cancel_scope.cancel()


async def _echo(stream):
    try:
        while data := await stream.read(1 << 16):
            await stream.write(data)
    except Exception:
        pass


@asynccontextmanager
async def relay_lab(limits, per_peer):
    """A counting relay, a target holding a reservation on it, a dialer and one more host
    (plain py-libp2p hosts, no DCUtR: every circuit stays a circuit)."""
    metrics = Metrics()
    relay_host, target, dialer, other = (build_host(Identity.generate()) for _ in range(4))
    lo = [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]
    async with (
        relay_host.run(lo),
        target.run(lo),
        dialer.run(lo),
        other.run(lo),
        trio.open_nursery() as nursery,
    ):
        relay = CountingRelay(relay_host, limits, True, per_peer, metrics)
        protos = {h: CircuitV2Protocol(h, limits=limits) for h in (target, dialer, other)}
        cfg = RelayConfig(roles=RelayRole.STOP, limits=limits)
        transports = {h: CircuitV2Transport(h, protos[h], cfg) for h in protos}
        async with (
            background_trio_service(relay),
            background_trio_service(protos[target]),
            background_trio_service(protos[dialer]),
            background_trio_service(protos[other]),
        ):
            target.set_stream_handler(ECHO, _echo)
            relay_addr = relay_host.get_addrs()[0]

            async def reserve_on_relay(h):
                await h.connect(PeerInfo(relay_host.get_id(), [relay_addr]))
                return await reserve(h, transports[h], relay_host.get_id()) is not None

            assert await reserve_on_relay(target)
            circuit = multiaddr.Multiaddr(f"{relay_addr}/p2p-circuit/p2p/{target.get_id()}")
            yield SimpleNamespace(
                relay=relay,
                metrics=metrics,
                reserve=reserve_on_relay,
                target=target,
                dialer=dialer,
                other=other,
                dial=lambda: dial_circuit(dialer, transports[dialer], circuit, target.get_id()),
            )
        nursery.cancel_scope.cancel()


@pytest.mark.timeout(120)
async def test_relay_limits_refuse_and_cut_and_count():
    """A relay allowing 1 reservation, 1 circuit per peer, 64 KiB per circuit: a second
    reservation is refused, a second circuit from one peer refused, a circuit carrying more
    than 64 KiB cut, and its slot released for the next circuit; each counted."""
    limits = RelayLimits(
        duration=600, data=64 * 1024, max_circuit_conns=4, max_reservations=1, reservation_ttl=60
    )
    async with relay_lab(limits, per_peer=1) as lab:
        metrics, relay = lab.metrics, lab.relay
        assert not await lab.reserve(lab.other)  # the one reservation is taken
        assert metrics.get("relay_reservations", outcome="refused") == 1

        await lab.dial()
        stream = await lab.dialer.new_stream(lab.target.get_id(), [ECHO])
        await stream.write(b"x" * 1000)
        assert len(await stream.read(1 << 16)) == 1000
        assert metrics.get("relay_circuits", outcome="opened") == 1
        assert relay.open_from == {lab.dialer.get_id(): 1}

        with pytest.raises(ConnectionError):  # a second circuit from one peer at once
            await lab.dial()
        assert metrics.get("relay_circuits", outcome="refused: circuits per peer") == 1

        async def flood():
            for _ in range(200):
                await stream.write(b"y" * 4096)
                await stream.read(1 << 16)

        with trio.fail_after(20), pytest.raises(StreamError):  # cut past 64 KiB
            await flood()
        assert metrics.get("relay_circuits", outcome="cut: bytes") == 1
        await _until(lambda: not relay.open_from, 20, "the cut circuit's slot released")
        reservation = relay.resource_manager.get_reservation(lab.target.get_id())
        assert reservation is not None and reservation.active_connections == 0
        assert 64 * 1024 <= metrics.get("relay_bytes") < 64 * 1024 + 256 * 1024


@pytest.mark.timeout(120)
async def test_an_idle_circuit_is_cut_at_its_duration_and_its_slot_released():
    """py-libp2p checks a circuit's duration only when bytes flow; ours ends it anyway."""
    limits = RelayLimits(
        duration=2, data=1 << 30, max_circuit_conns=1, max_reservations=4, reservation_ttl=60
    )
    async with relay_lab(limits, per_peer=4) as lab:
        await lab.dial()
        assert lab.relay.open_from == {lab.dialer.get_id(): 1}
        assert lab.target.get_network().get_connections(lab.dialer.get_id())
        await _until(lambda: not lab.relay.open_from, 30, "the idle circuit cut")
        assert lab.metrics.get("relay_circuits", outcome="cut: duration") == 1
        # both ends were reset: the target's relayed connection to the dialer ended too
        await _until(
            lambda: not lab.target.get_network().get_connections(lab.dialer.get_id()),
            30,
            "the far end closed",
        )
        reservation = lab.relay.resource_manager.get_reservation(lab.target.get_id())
        assert reservation is not None and reservation.active_connections == 0


class _Host:
    """Records what ``Network.connect`` dials directly; holds no connection."""

    def __init__(self):
        self.dialed = []

    def get_connected_peers(self):
        return []

    async def connect(self, info):
        self.dialed.append([str(a) for a in info.addrs])


async def test_a_peer_with_circuit_addresses_is_dialed_through_its_relays_first(tmp_path):
    from node.net.network import Network

    cfg = load_config(environ={}, flags={"data_dir": tmp_path, "net.connect_timeout": 1.0})
    net = Network(cfg, Identity.generate())
    net.host = host = _Host()
    peer, relay_a, relay_b = (Identity.generate().peer_id for _ in range(3))
    lan = f"/ip4/198.18.1.2/tcp/4001/p2p/{peer}"
    via_a = f"/ip4/203.0.113.1/tcp/4001/p2p/{relay_a}/p2p-circuit"
    via_b = f"/ip4/203.0.113.2/tcp/4001/p2p/{relay_b}/p2p-circuit/p2p/{peer}"
    circuits = []

    async def dial(circuit):
        circuits.append(circuit)
        if relay_a in circuit:
            raise ConnectionError("relay a refused")

    net.circuit_dialer = dial
    await net.connect(PeerInfo(ID.from_base58(peer), parse_addrs([lan, via_a, via_b])))
    assert circuits == [f"{via_a}/p2p/{peer}", via_b]  # a refused, b reached it
    assert host.dialed == []  # its LAN address is never tried once a relay reached it

    async def refuse(circuit):
        raise ConnectionError("no relay")

    net.circuit_dialer = refuse  # every relay failing: its other addresses, without circuits
    await net.connect(PeerInfo(ID.from_base58(peer), parse_addrs([lan, via_a])))
    assert host.dialed == [[lan]]
    await net.connect(PeerInfo(ID.from_base58(peer), parse_addrs([lan])))  # no circuit
    assert host.dialed == [[lan], [lan]]


class _Relayed:
    """A network with one peer joined only by a relay; a DCUtR that records new budgets."""

    def __init__(self, peer):
        self.peer, self.relayed_now, self.budgets = peer, True, []

    def connected_peers(self):
        return {self.peer}

    def relayed(self, peer):
        return self.relayed_now

    def try_again(self, pid):
        self.budgets.append(trio.current_time())
        return True


async def test_a_peer_still_relayed_gets_new_hole_punches_later_and_less_often(
    tmp_path, autojump_clock
):
    from node.net.relay import PUNCH_RETRY, Relays

    cfg = load_config(environ={}, flags={"data_dir": tmp_path})
    fake = _Relayed(Identity.generate().peer_id)
    relays = Relays(cfg, fake, None, Metrics(), pin=lambda peers: None)
    relays.dcutr = fake
    start = trio.current_time()
    for _ in range(int(8 * PUNCH_RETRY)):  # one upkeep round a second, for 8 minutes
        relays._punch_again()
        await trio.sleep(1)
    gaps = [round(b - a) for a, b in zip([start, *fake.budgets], fake.budgets, strict=False)]
    assert gaps == [60, 120, 240], gaps  # 60 s after meeting it relayed, then doubling
    fake.relayed_now = False  # direct at last: left alone
    for _ in range(int(10 * PUNCH_RETRY)):
        relays._punch_again()
        await trio.sleep(1)
    assert len(fake.budgets) == 3


async def test_a_spent_hole_punch_budget_is_renewed_and_a_running_one_is_not():
    """``CountingDCUtR.try_again`` (what ``Relays._punch_again`` calls for a peer still
    relayed): the library's own punches stop at ``MAX_HOLE_PUNCH_ATTEMPTS`` and go on only
    after a fresh budget; a budget with tries left is not renewed."""
    from libp2p.relay.circuit_v2.dcutr import MAX_HOLE_PUNCH_ATTEMPTS

    from node.net.circuits import CountingDCUtR

    dials = []

    async def new_stream(peer, protocols):  # each punch the library starts opens one
        dials.append(peer)
        raise ConnectionError("mistimed")

    dcutr = CountingDCUtR(SimpleNamespace(new_stream=new_stream), Metrics())  # type: ignore[arg-type]

    async def no(peer):
        return False

    dcutr._have_direct_connection = no  # type: ignore[method-assign]
    dcutr._try_unilateral_upgrade = no  # type: ignore[method-assign]
    pid = ID.from_base58(Identity.generate().peer_id)
    for _ in range(MAX_HOLE_PUNCH_ATTEMPTS + 2):
        assert await dcutr.initiate_hole_punch(pid) is False
    assert len(dials) == MAX_HOLE_PUNCH_ATTEMPTS  # the budget is spent: no more punches
    assert dcutr.punching(pid) == (False, False)
    assert dcutr.try_again(pid) is True
    assert dcutr.punching(pid) == (False, True)
    await dcutr.initiate_hole_punch(pid)
    assert len(dials) == MAX_HOLE_PUNCH_ATTEMPTS + 1  # the fresh budget punches again
    assert dcutr.try_again(pid) is False  # tries left: nothing to renew
    for _ in range(MAX_HOLE_PUNCH_ATTEMPTS):
        await dcutr.initiate_hole_punch(pid)
    assert len(dials) == 2 * MAX_HOLE_PUNCH_ATTEMPTS  # two budgets, no more


class _Punching:
    """A network where only a relay joins us to a peer until ``direct_at``; a DCUtR whose
    punch to it runs (``running``) or may still run (``tries_left``)."""

    def __init__(self, direct_at, running, tries_left):
        self.direct_at, self.running, self.tries_left = direct_at, running, tries_left

    def relayed(self, peer):
        return trio.current_time() < self.direct_at

    def punching(self, pid):
        return self.running, self.tries_left


@pytest.mark.parametrize(
    ("direct_at", "running", "tries_left", "waited", "direct"),
    [
        (3.0, True, True, 3.0, True),  # a punch under way succeeds: wait for it
        (3.0, True, False, 3.0, True),  # the last one the budget allows, too
        (1e9, True, True, 10.0, False),  # it never does: DIRECT_WAIT, then over the relay
        (3.0, False, True, 3.0, True),  # one still to come (tries left, within the window)
        (1e9, False, False, 0.0, False),  # no punch runs and none is left: at once
        (0.0, True, True, 0.0, True),  # direct already
    ],
)
async def test_a_bulk_transfer_waits_for_a_hole_punch_only_while_one_may_succeed(
    autojump_clock, direct_at, running, tries_left, waited, direct
):
    from node.net.relay import DIRECT_WAIT, Relays

    assert DIRECT_WAIT == 10.0
    relays = Relays.__new__(Relays)  # what ``direct_path`` uses of it: no config needed
    relays.network = relays.dcutr = _Punching(direct_at, running, tries_left)  # type: ignore[assignment]
    relays._relayed_since = {}
    start = trio.current_time()
    assert await relays.direct_path(Identity.generate().peer_id) is direct
    assert trio.current_time() - start == pytest.approx(waited, abs=0.21)  # polled at 5 Hz


async def test_no_hole_punch_is_waited_for_past_the_window_after_meeting_a_peer_relayed(
    autojump_clock,
):
    from node.net.relay import PUNCH_WINDOW, Relays

    relays = Relays.__new__(Relays)
    relays.network = relays.dcutr = _Punching(1e9, False, True)  # type: ignore[assignment]
    relays._relayed_since = {}
    peer = Identity.generate().peer_id
    assert await relays.direct_path(peer, limit=PUNCH_WINDOW + 5) is False
    assert trio.current_time() == pytest.approx(PUNCH_WINDOW, abs=0.21)
    assert await relays.direct_path(peer) is False  # met relayed long ago: at once
    assert trio.current_time() == pytest.approx(PUNCH_WINDOW, abs=0.21)


class _RelayNet:
    """What ``Relays`` upkeep uses of the network: connected to ``relays``, which the DHT
    names as relays; ``found``: how many lookups were made."""

    def __init__(self, relays):
        self.relays, self.found, self.circuit_addrs = relays, 0, []
        self.identity, self.host = SimpleNamespace(peer_id="me"), object()

    def connected_peers(self):
        return set(self.relays)

    async def find_providers(self, key):
        self.found += 1
        return set(self.relays)

    def direct_addr(self, relay):
        return f"/ip4/192.0.2.1/tcp/{4000 + self.relays.index(relay)}"

    def set_circuit_addrs(self, addrs):
        self.circuit_addrs = addrs


def _upkeep(monkeypatch, relays, state, now=1000.0):
    """``Relays`` (without a config) whose reachability says ``state``; every reservation
    is accepted for 600 s (``reserved``: on which relays)."""
    from node.net import relay as relay_module
    from node.net.relay import Relays

    reserved = []

    async def reserve(host, transport, relay):
        reserved.append(relay.to_base58())
        return now + 600

    monkeypatch.setattr(relay_module, "reserve", reserve)
    r = Relays.__new__(Relays)
    r.cfg = NodeConfig(run={"id": "run"}, net={"read_timeout": 1.0})
    r.network, r.reachability = _RelayNet(relays), SimpleNamespace(state=lambda: state)
    r.clock, r.pin, r.transport, r.dcutr, r.serving = (
        lambda: now,
        lambda peers: None,
        object(),
        None,
        False,
    )
    r.held, r._last_find, r._retried, r._relayed_since = {}, -1e18, {}, {}
    return r, reserved


async def test_reservations_are_renewed_before_they_expire_and_new_ones_made_only_private(
    monkeypatch,
):
    from node.net.relay import RENEW_BEFORE, RESERVE_ON

    relays = [Identity.generate().peer_id for _ in range(3)]
    r, reserved = _upkeep(monkeypatch, relays, PUBLIC)
    await r._tend()  # public: nobody needs a circuit to us
    assert r.network.found == 0 and r.held == {}
    r.reachability = SimpleNamespace(state=lambda: "unknown")
    await r._tend()  # unknown: nothing new reserved (it may well be public)
    assert r.network.found == 0 and r.held == {} and reserved == []
    r.reachability = SimpleNamespace(state=lambda: PRIVATE)
    await r._tend()
    assert len(r.held) == RESERVE_ON == len(reserved) and r.network.found == 1
    assert len(r.network.circuit_addrs) == RESERVE_ON
    soon, later = sorted(r.held)
    r.held[soon] = (1000.0 + RENEW_BEFORE - 1, r.held[soon][1])  # close to expiry
    r.held[later] = (1000.0 + RENEW_BEFORE + 100, r.held[later][1])
    reserved.clear()
    await r._tend()
    assert reserved == [soon] and r.held[soon][0] == 1600.0  # renewed, the other left alone
    r.reachability = SimpleNamespace(state=lambda: "unknown")
    r.held[soon] = (1000.0 + RENEW_BEFORE - 1, r.held[soon][1])
    del r.held[later]  # one short of RESERVE_ON, and the last lookup long ago
    r._last_find = -1e18
    reserved.clear()
    await r._tend()  # unknown again: what it holds is kept alive, nothing new reserved
    assert reserved == [soon] and r.network.found == 1 and list(r.held) == [soon]


async def test_a_peer_relayed_again_after_a_direct_spell_starts_its_punch_schedule_anew(
    autojump_clock,
):
    from node.net.relay import PUNCH_RETRY, Relays

    fake = _Relayed(Identity.generate().peer_id)
    relays = Relays.__new__(Relays)  # what ``_punch_again`` uses of it: no config needed
    relays.network = relays.dcutr = fake  # type: ignore[assignment]
    relays._retried, relays._relayed_since = {}, {}

    async def rounds(seconds):
        for _ in range(seconds):  # one upkeep round a second
            relays._punch_again()
            await trio.sleep(1)

    start = trio.current_time()
    await rounds(int(4 * PUNCH_RETRY))
    assert [round(t - start) for t in fake.budgets] == [60, 180]  # the gap doubled
    fake.relayed_now = False  # a punch made it direct ...
    await rounds(10)
    fake.relayed_now, again = True, trio.current_time()  # ... and it is relayed again
    fake.budgets.clear()
    await rounds(int(2 * PUNCH_RETRY))
    assert [round(t - again) for t in fake.budgets] == [60]  # 60 s, not 240 s from before
