"""Reachability (SPEC §16, issue #29 item 1): AutoNAT verdicts add up to public / private /
unknown; a dial-back is a fresh connection that proves the asker's peer id on the asker's
own IP only; questions that are garbage or about another peer are refused and change
nothing. Real nodes on 127.0.0.1 here; through a real NAT in ``test_nat.py``."""

import socket
from types import SimpleNamespace

import multiaddr
import pytest
import trio
from libp2p.host.autonat.pb.autonat_pb2 import Message
from libp2p.peer.id import ID
from libp2p.utils import encode_varint_prefixed, read_varint_prefixed_bytes_limited

from crypto.identity import Identity
from node.net.metrics import Metrics
from node.net.reachability import (
    MAX_PORTS,
    PRIVATE,
    PROTOCOL,
    PUBLIC,
    QUESTION_TIMEOUT,
    QUESTIONS_PER_PEER,
    UNKNOWN,
    Reachability,
    Verdicts,
    _question,
    _watch_observations,
    dial_back_targets,
)
from tests.helpers.net import two_nodes


def test_verdicts_need_two_agreeing_peers_and_expire():
    v = Verdicts(confirmations=2, ttl=100)
    assert v.state(0) == UNKNOWN
    v.record("a", True, 0)
    assert v.state(0) == UNKNOWN  # one peer is not enough
    v.record("b", True, 1)
    assert v.state(1) == PUBLIC
    v.record("a", False, 2)  # a's newer answer replaces its older one
    assert v.counts(2) == (1, 1) and v.state(2) == UNKNOWN
    v.record("c", False, 3)
    assert v.state(3) == UNKNOWN  # two failed, but one reached us: not private
    assert v.state(102) == PRIVATE  # b's success (t=1) expired; a and c failed
    assert v.state(500) == UNKNOWN  # everything expired


def b(addr):
    return multiaddr.Multiaddr(addr).to_bytes()


def test_dial_back_targets_are_the_askers_own_ip_only():
    got = dial_back_targets(
        [b("/ip4/10.0.0.5/tcp/4001"), b("/ip4/192.0.2.9/tcp/5555"), b("/ip4/10.0.0.5/tcp/4001")],
        "198.51.100.7",
    )
    assert got == ["/ip4/198.51.100.7/tcp/4001", "/ip4/198.51.100.7/tcp/5555"]
    assert dial_back_targets([b("/ip4/10.0.0.5/tcp/4001")], None) == []
    assert dial_back_targets([b"\xff\x00garbage", b("/ip4/1.2.3.4/udp/9")], "1.2.3.4") == []
    many = [b(f"/ip4/1.2.3.4/tcp/{4000 + i}") for i in range(50)]
    assert len(dial_back_targets(many, "1.2.3.4")) == MAX_PORTS
    assert dial_back_targets([b("/ip4/1.2.3.4/tcp/7")], "::1") == ["/ip6/::1/tcp/7"]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_of(node) -> str:
    return multiaddr.Multiaddr(node.addrs[0]).value_for_protocol("tcp")


async def test_two_nodes_on_loopback_dial_each_other_back(tmp_path):
    async with two_nodes(tmp_path, ("a", "b")) as (a, b_):
        with trio.fail_after(60):
            assert await a.reachability.ask(b_.peer_id) is True
            assert await b_.reachability.ask(a.peer_id) is True
        assert a.reachability.verdicts.counts(trio.current_time()) == (1, 0)
        assert b_.reachability.answered.get("reached") == 1
        st = a.status()["reachability"]
        assert st["state"] == UNKNOWN and st["reached_by"] == 1  # one peer is not enough
        assert st["advertised"] == a.addrs
        # identify told each where the other saw its connection come from
        assert any(o.startswith("/ip4/127.0.0.1/tcp/") for o in b_.reachability.observed.values())


async def test_a_dial_back_is_a_fresh_connection_that_proves_the_askers_id(tmp_path):
    async with two_nodes(tmp_path, ("a", "b")) as (a, b_):
        async with two_nodes(tmp_path, ("c", "d")) as (c, _d):
            host = a.network.host
            with trio.fail_after(60):
                # nothing listens there: b holds a connection to a, which must not count
                status = await _question(
                    host, b_.peer_id, [b(f"/ip4/127.0.0.1/tcp/{closed_port()}")]
                )
                assert status == Message.E_DIAL_ERROR
                # c listens there: the handshake proves c, not a
                status = await _question(host, b_.peer_id, [b(f"/ip4/127.0.0.1/tcp/{port_of(c)}")])
                assert status == Message.E_DIAL_ERROR
                # another IP with a's port: only a's own IP is dialed, so a is reached there
                status = await _question(host, b_.peer_id, [b(f"/ip4/192.0.2.1/tcp/{port_of(a)}")])
                assert status == Message.OK
            assert b_.reachability.answered == {"not reached": 2, "reached": 1}
            assert b_.metrics.get("autonat_answers", outcome="not reached") == 2


async def ask_raw(host, peer: str, payload: bytes) -> Message:
    stream = await host.new_stream(ID.from_base58(peer), [PROTOCOL])
    try:
        await stream.write(payload)
        answer = Message()
        answer.ParseFromString(await read_varint_prefixed_bytes_limited(stream, 4096))
        return answer
    finally:
        await stream.close()


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (encode_varint_prefixed(b"\x08\x07\xff\xff\x01garbage"), "not an AutoNAT message"),
        (encode_varint_prefixed(b"\xff" * 40), "not an AutoNAT message"),
        ("other-peer", "dial-back only for the asking peer"),
        ("response", "dial-back only for the asking peer"),
    ],
)
async def test_garbage_and_questions_about_other_peers_are_refused(tmp_path, payload, reason):
    async with two_nodes(tmp_path, ("a", "b")) as (a, b_):
        if payload == "other-peer":  # ask b to dial b itself (a third party, to b)
            q = Message(type=Message.DIAL)
            q.dial.peer.id = ID.from_base58(b_.peer_id).to_bytes()
            q.dial.peer.addrs.append(b(b_.addrs[0]))
            payload = encode_varint_prefixed(q.SerializeToString())
        elif payload == "response":
            payload = encode_varint_prefixed(
                Message(type=Message.DIAL_RESPONSE).SerializeToString()
            )
        with trio.fail_after(60):
            answer = await ask_raw(a.network.host, b_.peer_id, payload)
        assert answer.dialResponse.status == Message.E_BAD_REQUEST
        assert answer.dialResponse.statusText == reason
        # the node still answers a good question afterwards
        with trio.fail_after(60):
            assert await a.reachability.ask(b_.peer_id) is True


async def test_an_oversized_question_is_cut_off_and_the_node_keeps_answering(tmp_path):
    async with two_nodes(tmp_path, ("a", "b")) as (a, b_):
        stream = await a.network.host.new_stream(ID.from_base58(b_.peer_id), [PROTOCOL])
        with trio.fail_after(60):
            await stream.write(encode_varint_prefixed(b"\x00" * 100_000))
            try:
                answer = await read_varint_prefixed_bytes_limited(stream, 4096)
            except Exception:  # closed without an answer
                answer = None
            assert answer is None, answer
            await stream.close()
            assert await a.reachability.ask(b_.peer_id) is True


async def test_dial_backs_go_to_every_port_at_once_so_a_slow_port_does_not_hide_the_asker(
    tmp_path, monkeypatch
):
    """Three ports that accept TCP but never answer the handshake come first: tried one after
    another they would take 3 × 10 s, past the 15 s deadline; all at once, the asker's real
    port answers at once."""
    import node.net.reachability as reach

    monkeypatch.setattr(reach, "DIAL_BACK_TIMEOUT", 10.0)
    silent = [socket.socket() for _ in range(3)]
    try:
        for s in silent:
            s.bind(("127.0.0.1", 0))
            s.listen(8)
        ports = [s.getsockname()[1] for s in silent]
        async with two_nodes(tmp_path, ("a", "b")) as (a, b_):
            candidates = [b(f"/ip4/127.0.0.1/tcp/{p}") for p in [*ports, port_of(a)]]
            with trio.fail_after(15):
                status = await _question(a.network.host, b_.peer_id, candidates)
            assert status == Message.OK
            assert b_.reachability.answered == {"reached": 1}
    finally:
        for s in silent:
            s.close()


class _Conn:
    """A swarm connection as the reachability code sees it: its addresses, its peer."""

    def __init__(self, peer_id, relayed: bool):
        self.muxed_conn = SimpleNamespace(peer_id=peer_id)
        via = f"/ip4/203.0.113.1/tcp/4001/p2p/{peer_id.to_base58()}/p2p-circuit" if relayed else ""
        self.addrs = [multiaddr.Multiaddr(via or "/ip4/127.0.0.1/tcp/4001")]

    def get_transport_addresses(self):
        return self.addrs


class _Stream:
    """One inbound AutoNAT stream carrying ``question``, from ``peer_id`` at 127.0.0.1."""

    def __init__(self, peer_id, question: bytes, relayed: bool):
        self.swarm_conn = _Conn(peer_id, relayed)
        self.muxed_conn = self.swarm_conn.muxed_conn
        self.inbox, self.sent = bytearray(question), bytearray()

    async def read(self, n=None):
        n = len(self.inbox) if n is None else n
        out, self.inbox[:n] = bytes(self.inbox[:n]), b""
        return out

    async def write(self, data):
        self.sent += data

    async def close(self):
        pass

    def get_remote_address(self):
        return ("127.0.0.1", 4001)


async def test_a_question_over_a_relayed_connection_is_refused_without_dialing(tmp_path):
    """Over a circuit the IP we see is the relay's: dialing it back would test the relay.
    The same question over a direct connection is dialed (to a closed port: not reached)."""
    async with two_nodes(tmp_path, ("a", "b")) as (a, b_):
        asker = ID.from_base58(a.peer_id)
        q = Message(type=Message.DIAL)
        q.dial.peer.id = asker.to_bytes()
        q.dial.peer.addrs.append(b(f"/ip4/127.0.0.1/tcp/{closed_port()}"))
        question = encode_varint_prefixed(q.SerializeToString())
        answers = []
        with trio.fail_after(30):
            for relayed in (True, False):
                stream = _Stream(asker, question, relayed)
                await b_.reachability._answer(stream)
                answer = Message()
                answer.ParseFromString(
                    await read_varint_prefixed_bytes_limited(
                        _Stream(asker, bytes(stream.sent), False), 4096
                    )
                )
                answers.append((answer.dialResponse.status, answer.dialResponse.statusText))
        assert answers == [
            (Message.E_DIAL_REFUSED, "relayed connection"),
            (Message.E_DIAL_ERROR, "not reached"),
        ]
        assert b_.reachability.answered == {"relayed connection": 1, "not reached": 1}


class _Silent(_Stream):
    """A question stream whose asker never sends a byte."""

    async def read(self, n=None):
        await trio.sleep_forever()


async def test_silent_question_streams_of_one_peer_hold_two_tasks_for_five_seconds(
    autojump_clock,
):
    """AutoNAT streams have their own handler, outside the request limits: one peer that
    opened 2,000 streams and sent nothing held 2,000 tasks for 30 s. A peer gets
    ``QUESTIONS_PER_PEER`` open at once (the rest are closed at once and counted), each
    given ``QUESTION_TIMEOUT`` to send its question; another peer is still heard."""
    metrics = Metrics()
    r = Reachability(SimpleNamespace(), metrics)
    flooder = ID.from_base58(Identity.generate().peer_id)
    other = ID.from_base58(Identity.generate().peer_id)
    async with trio.open_nursery() as nursery:
        for _ in range(200):
            nursery.start_soon(r._answer, _Silent(flooder, b"", False))
        nursery.start_soon(r._answer, _Silent(other, b"", False))
        await trio.sleep(1)
        assert len(nursery.child_tasks) == QUESTIONS_PER_PEER + 1
        assert (
            metrics.get("autonat_answers", outcome="too many streams") == 200 - QUESTIONS_PER_PEER
        )
        start = trio.current_time()
    assert trio.current_time() - start == QUESTION_TIMEOUT - 1  # the read deadline
    assert r._questions == {}


def test_observations_over_relayed_connections_are_ignored():
    """Identify over a circuit reports the relay's view of us: not a candidate address."""
    recorded, seen = [], {}
    manager = SimpleNamespace(record_observation=lambda *args: recorded.append(args))
    _watch_observations(SimpleNamespace(_observed_addr_manager=manager), seen.__setitem__)
    peers = [Identity.generate().peer_id for _ in range(2)]
    relay_view = multiaddr.Multiaddr("/ip4/203.0.113.1/tcp/4001")
    router = multiaddr.Multiaddr("/ip4/198.51.100.7/tcp/61234")
    manager.record_observation(_Conn(ID.from_base58(peers[0]), True), relay_view, [])
    manager.record_observation(_Conn(ID.from_base58(peers[1]), False), router, [])
    assert seen == {peers[1]: str(router)}
    assert len(recorded) == 2  # the library still hears both


async def test_only_peers_joined_directly_are_asked():
    peers = {Identity.generate().peer_id for _ in range(4)}
    through_relay = set(sorted(peers)[:2])
    network = SimpleNamespace(
        connected_peers=lambda: set(peers), relayed=lambda p: p in through_relay
    )
    r = Reachability(network, Metrics())
    asked = []

    async def ask(peer):
        asked.append(peer)

    r.ask = ask
    await r.ask_round()
    assert sorted(asked) == sorted(peers - through_relay)


async def test_one_asker_is_dialed_back_once_at_a_time_and_others_meanwhile(monkeypatch):
    """A peer that asks again while its dial-back runs is refused ``busy``: each question
    would otherwise take one of the ``SERVE_AT_ONCE`` dial-backs every asker shares."""
    from trio.testing import wait_all_tasks_blocked

    from node.net import reachability
    from node.net.reachability import Reachability

    release, dialing = trio.Event(), []

    async def first_reached(network, peer, targets):
        dialing.append(peer)
        await release.wait()
        return targets[0]

    monkeypatch.setattr(reachability, "_first_reached", first_reached)
    answering = Reachability(SimpleNamespace(), Metrics())  # type: ignore[arg-type]
    one, other = (ID.from_base58(Identity.generate().peer_id) for _ in range(2))

    def question(peer):
        q = Message(type=Message.DIAL)
        q.dial.peer.id = peer.to_bytes()
        q.dial.peer.addrs.append(b("/ip4/10.0.0.5/tcp/4001"))
        return q.SerializeToString()

    answers = {}

    async def ask(key, peer):
        answers[key] = await answering._dial_back(peer, question(peer), "198.51.100.7")

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, "first", one)
            await wait_all_tasks_blocked()
            await ask("again", one)
            nursery.start_soon(ask, "other", other)
            await wait_all_tasks_blocked()
            release.set()
    assert answers["again"] == (Message.E_DIAL_REFUSED, "busy", None)
    assert answers["first"][:2] == answers["other"][:2] == (Message.OK, "reached")
    assert dialing == [one, other]
