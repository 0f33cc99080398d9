"""The TCP stream wrapper every node puts under py-libp2p (node/host.py): read-ahead and
wire-byte counting, on an in-memory stream whose receive calls are counted; and the cache
of the host's advertised addresses."""

from __future__ import annotations

import os

import pytest
import trio
import trio.testing
from libp2p.io.trio import TrioTCPStream

from node.host import READ_AHEAD, WIRE, cache_addrs, tune_tcp_streams


class Counted:
    """A trio stream that counts ``receive_some`` calls (the ``recv`` system calls)."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.receives = 0

    async def receive_some(self, n: int | None = None) -> bytes:
        self.receives += 1
        return await self.inner.receive_some(n)

    async def send_all(self, data: bytes) -> None:
        await self.inner.send_all(data)

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.mark.trio
async def test_small_reads_are_served_from_one_receive_and_every_byte_arrives_in_order():
    tune_tcp_streams()
    tune_tcp_streams()  # idempotent: wrapping twice would count bytes twice
    left, right = trio.testing.memory_stream_pair()
    payload = os.urandom(3 * READ_AHEAD + 12_345)
    counted = Counted(right)
    reader = TrioTCPStream(counted)  # type: ignore[arg-type]
    writer = TrioTCPStream(left)  # type: ignore[arg-type]
    wire_in, wire_out = WIRE["in"], WIRE["out"]
    got = bytearray()
    reads = 0
    # the shape of Noise (2-byte length, body) and yamux (12-byte header, data) reads
    sizes = [2, 65_519, 12, 1, 7, 4096] * 10 + [None]
    with trio.fail_after(30):  # a lost byte would leave the loop waiting for it
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.write, payload)
            while len(got) < len(payload):
                n = sizes[reads % len(sizes)]
                reads += 1
                data = await reader.read(n)
                assert data and (n is None or len(data) <= n)
                got += data
    assert bytes(got) == payload
    assert WIRE["in"] - wire_in == len(payload)  # counted once, when received
    assert WIRE["out"] - wire_out == len(payload)
    # each receive asked for READ_AHEAD bytes or more: far fewer receives than reads
    assert counted.receives <= len(payload) // READ_AHEAD + 2 < reads // 4
    assert await reader.read(0) == b""


@pytest.mark.trio
async def test_bytes_read_ahead_are_served_before_the_end_of_the_stream():
    tune_tcp_streams()
    left, right = trio.testing.memory_stream_pair()
    reader = TrioTCPStream(right)  # type: ignore[arg-type]
    await left.send_all(b"abcdef")
    await left.aclose()
    assert await reader.read(2) == b"ab"
    assert await reader.read(10) == b"cdef"  # the rest of what one receive brought
    assert await reader.read(10) == b""  # then the end of the stream


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
