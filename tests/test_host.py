"""What every node puts on its py-libp2p host (node/host.py): wire-byte counting on an
in-memory stream, the cache of the host's advertised addresses, gossip peer records
verified once, and yamux window updates in batches."""

from __future__ import annotations

import os

import pytest
import trio
import trio.testing
from libp2p.io.trio import TrioTCPStream

from node.host import (
    RECORD_RECHECK,
    WIRE,
    batch_yamux_window_updates,
    cache_addrs,
    count_wire_bytes,
    verify_records_once,
)


@pytest.mark.trio
async def test_every_byte_is_counted_once_each_way_and_arrives_in_order():
    count_wire_bytes()
    count_wire_bytes()  # idempotent: wrapping twice would count bytes twice
    left, right = trio.testing.memory_stream_pair()
    payload = os.urandom(300_000)
    reader = TrioTCPStream(right)  # type: ignore[arg-type]
    writer = TrioTCPStream(left)  # type: ignore[arg-type]
    wire_in, wire_out = WIRE["in"], WIRE["out"]
    got = bytearray()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.write, payload)
            while len(got) < len(payload):
                got += await reader.read(65_536)
    assert bytes(got) == payload
    assert WIRE["in"] - wire_in == len(payload)
    assert WIRE["out"] - wire_out == len(payload)


class FakeHost:
    def __init__(self) -> None:
        self.calls = 0
        self.addrs: list[str] = []

    def get_addrs(self) -> list[str]:
        self.calls += 1
        return list(self.addrs)


def test_advertised_addresses_are_kept_for_the_ttl_once_there_are_some(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("node.host.time.monotonic", lambda: now[0])
    host = FakeHost()
    cache_addrs(host, ttl=5.0)  # type: ignore[arg-type]
    assert host.get_addrs() == [] and host.get_addrs() == []
    assert host.calls == 2  # not listening yet: an empty answer is never kept
    host.addrs = ["/ip4/127.0.0.1/tcp/4001/p2p/me"]
    for _ in range(10):
        assert host.get_addrs() == host.addrs
    assert host.calls == 3  # computed once, then kept
    got = host.get_addrs()
    got.append("changed by a caller")  # callers get a copy, never the kept list
    assert host.get_addrs() == host.addrs
    now[0] += 5.5
    host.addrs = ["/ip4/10.0.0.1/tcp/4001/p2p/me"]
    assert host.get_addrs() == host.addrs and host.calls == 4  # past the ttl: recomputed


class Rpc:
    """The one thing of a gossip RPC the record check reads."""

    def __init__(self, record: bytes | None) -> None:
        self.senderRecord = record or b""
        self._has = record is not None

    def HasField(self, name: str) -> bool:
        assert name == "senderRecord"
        return self._has


def test_a_gossip_peer_record_is_verified_once_until_it_changes_or_ages():
    calls: list[bytes] = []
    verdicts = {b"good": True, b"good2": True, b"forged": False}

    def consume(msg, host, peer_id):  # py-libp2p's check: verify, store in the peerstore
        calls.append(bytes(msg.senderRecord))
        return verdicts.get(bytes(msg.senderRecord), True)

    now = [0.0]
    once = verify_records_once(consume, clock=lambda: now[0])
    host, other_host = object(), object()
    assert once(Rpc(b"good"), host, "A") and once(Rpc(b"good"), host, "A")
    assert calls == [b"good"]  # the same record from the same peer: checked once
    assert once(Rpc(b"good"), host, "B") and once(Rpc(b"good"), other_host, "A")
    assert calls == [b"good"] * 3  # another peer, another host: checked again
    assert once(Rpc(b"good2"), host, "A") and calls[-1] == b"good2"  # a changed record
    # a forged record is never remembered: refused every time
    assert not once(Rpc(b"forged"), host, "C") and not once(Rpc(b"forged"), host, "C")
    assert calls[-2:] == [b"forged", b"forged"]
    n = len(calls)
    now[0] = RECORD_RECHECK + 1  # old enough: checked again (the peerstore's copy ages)
    assert once(Rpc(b"good2"), host, "A") and len(calls) == n + 1
    assert once(Rpc(None), host, "A") and len(calls) == n + 2  # no record: py-libp2p decides


def test_yamux_grants_window_back_in_batches_in_a_node():
    batch_yamux_window_updates()
    from libp2p.stream_muxer.yamux.yamux import _yamux_release_on_read

    assert not _yamux_release_on_read()
