"""Bad input on every protocol of a real node process, sent by a real libp2p host.

Each bad input must be rejected with its own counted reason, answered (where the stream
still works) with a signed Refusal naming that reason, and the node must go on serving
the next valid request.
"""

import os
import time
from contextlib import AsyncExitStack, asynccontextmanager

import msgpack
import multiaddr
import pytest
import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.security.insecure.transport import PLAINTEXT_PROTOCOL_ID, InsecureTransport
from libp2p.tools.anyio_service import background_trio_service

from crypto.identity import Identity
from node.net.host import build_host, build_pubsub, key_pair_of
from protocol import ids
from protocol.framing import HEADER, read_frame
from protocol.messages import Announcement, NodeInfo, Refusal, SyncReply, SyncRequest
from protocol.wire import open_message, seal
from tests.helpers.net import Cluster, addr_of, counter, metrics, peer_roles, status, wait_until

RUN = "test-run"


@pytest.fixture
def target(tmp_path):
    c = Cluster(tmp_path, run_id=RUN)
    node, st = c.start("validator", net__read_timeout="1.5")
    yield node, st
    c.close()


class Client:
    def __init__(self, identity, host, peer):
        self.identity = identity
        self.host = host
        self.peer = peer
        self.seq = time.time_ns() // 1000

    def header(self, run_id=RUN):
        self.seq += 1
        return dict(
            run_id=run_id, sender=self.identity.peer_id, seq=self.seq, ts_ms=int(time.time() * 1000)
        )

    def node_info(self, run_id=RUN):
        return NodeInfo(
            **self.header(run_id), role="inference", state="up", addrs=[], session=1, announced=0
        )

    def announcement(self, run_id=RUN, index=0):
        return Announcement(
            **self.header(run_id), topic="test", session=1, index=index, body=b"hello"
        )

    def sync_request(self, run_id=RUN):
        return SyncRequest(**self.header(run_id), session=1, indices=[0, 1])

    async def send_raw(self, protocol, raw, *, half_close=True):
        """Write ``raw`` on a fresh stream; return the reply frame, or None if there is none."""
        stream = await self.host.new_stream(self.peer, [protocol])
        try:
            await stream.write(raw)
            if half_close:
                await stream.close_write()
            try:
                return await read_frame(stream, 1 << 20, deadline=10)
            except EOFError:
                return None
        finally:
            await stream.reset()


def frame(body):
    return HEADER.pack(len(body)) + body


@asynccontextmanager
async def connected_client(st, *, with_pubsub=False):
    identity = Identity.generate()
    host = build_host(identity)
    async with host.run([multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]), AsyncExitStack() as stack:
        client = Client(identity, host, None)
        if with_pubsub:  # py-libp2p's pubsub only sees connections made after it started
            client.pubsub = build_pubsub(host)
            await stack.enter_async_context(background_trio_service(client.pubsub))
            await client.pubsub.wait_until_ready()
        info = info_from_p2p_addr(multiaddr.Multiaddr(addr_of(st)))
        with trio.fail_after(10):
            await host.connect(info)
        client.peer = info.peer_id
        yield client


def refusal_reason(reply):
    assert reply is not None, "expected a Refusal frame"
    msg = open_message(reply, Refusal, NodeInfo, SyncReply)
    assert isinstance(msg, Refusal), msg
    return msg.reason


async def read_metrics(node):
    return await trio.to_thread.run_sync(metrics, node)


@pytest.mark.parametrize(
    ("protocol", "valid_request", "reply_type"),
    [(ids.PRESENCE, "node_info", NodeInfo), (ids.SYNC, "sync_request", SyncReply)],
)
async def test_bad_input_on_request_protocols(target, protocol, valid_request, reply_type):
    node, st = target
    async with connected_client(st) as client:
        make = getattr(client, valid_request)

        async def expect(raw, reason, *, half_close=True, refusal=True):
            before = counter(
                await read_metrics(node),
                "intellect_rejected_total",
                protocol=protocol,
                reason=reason,
            )
            reply = await client.send_raw(protocol, raw, half_close=half_close)
            if refusal:
                assert refusal_reason(reply) == reason
            after = counter(
                await read_metrics(node),
                "intellect_rejected_total",
                protocol=protocol,
                reason=reason,
            )
            assert after == before + 1, (reason, before, after)
            # the node is still up and serves the next valid request
            ok = await client.send_raw(protocol, frame(seal(client.identity, make())))
            assert isinstance(open_message(ok, reply_type), reply_type)

        await expect(frame(os.urandom(200)), "malformed")
        await expect(HEADER.pack(2**31) + os.urandom(64), "oversized")
        await expect(HEADER.pack(500) + b"\x81\xa1d" + os.urandom(20), "truncated", refusal=True)
        await expect(frame(msgpack.packb([1, 2, 3])), "malformed")
        env = msgpack.unpackb(seal(client.identity, make()))
        await expect(
            frame(msgpack.packb({"d": env["d"], "p": env["p"], "k": env["k"]})), "malformed"
        )
        env["s"] = bytes(64)
        await expect(frame(msgpack.packb(env)), "bad_signature")
        await expect(frame(seal(Identity.generate(), make())), "sender_mismatch")
        await expect(frame(seal(client.identity, make(run_id="another-run"))), "wrong_run")
        replayed = frame(seal(client.identity, make()))
        first = await client.send_raw(protocol, replayed)
        assert isinstance(open_message(first, reply_type), reply_type)
        await expect(replayed, "replay")
        # a frozen peer: half a frame, then nothing; the node gives up at its read deadline
        await expect(HEADER.pack(100) + b"\x81", "timeout", half_close=False, refusal=True)


@pytest.mark.parametrize("channel", ["presence", "announce"])
async def test_bad_gossip_is_rejected_and_counted(target, channel):
    node, st = target
    async with connected_client(st, with_pubsub=True) as client:
        pubsub = client.pubsub
        topic = ids.presence_topic(RUN) if channel == "presence" else ids.announce_topic(RUN)
        make = client.node_info if channel == "presence" else client.announcement
        await pubsub.subscribe(topic)
        await pubsub.wait_for_peer(client.peer, timeout=10)
        await pubsub.wait_for_subscription(client.peer, topic, timeout=10)
        proto = f"gossip-{channel}"
        good = seal(client.identity, make())
        env = msgpack.unpackb(seal(client.identity, make()))
        env["s"] = bytes(64)
        wrong_type = client.announcement() if channel == "presence" else client.node_info()
        cases = [
            (os.urandom(100), "malformed"),
            (msgpack.packb({"a": 1}), "malformed"),
            (good[: len(good) // 2], "malformed"),
            (b"\x00" * 80_000, "oversized"),
            (msgpack.packb(env), "bad_signature"),
            (seal(client.identity, wrong_type), "wrong_type"),
            (seal(client.identity, make(run_id="another-run")), "wrong_run"),
            (good, None),  # accepted
            (good, "replay"),  # same envelope again (gossip gives it a new msg id)
        ]
        expected: dict[str, int] = {}
        for data, reason in cases:
            await pubsub.publish(topic, data)
            await trio.sleep(0.2)  # paced, as our own publisher does
            if reason:
                expected[reason] = expected.get(reason, 0) + 1

        def counts():
            text = metrics(node)
            return {
                r: counter(text, "intellect_rejected_total", protocol=proto, reason=r)
                for r in expected
            }

        await trio.to_thread.run_sync(
            lambda: wait_until(lambda: counts() == expected, 15, f"gossip rejections {expected}")
        )
        after = await trio.to_thread.run_sync(status, node)
        if channel == "presence":
            assert {p["peer_id"]: p["role"] for p in after["peers"]}.get(
                client.identity.peer_id
            ) == "inference"
        else:  # the one good announcement was delivered once
            assert after["announcements"]["delivered"] == {client.identity.peer_id: 1}
        assert (await trio.to_thread.run_sync(status, node))["peer_id"] == st["peer_id"]


async def test_garbage_on_the_gossipsub_stream_drops_that_stream_not_the_node(target):
    """py-libp2p's pubsub reads each varint-prefixed RPC and parses it with protobuf; a
    frame protobuf cannot parse raised ``DecodeError`` out of its stream handler, and a
    worker of the matrix died of it. The node must count it, drop that peer's stream, and
    go on gossiping with everyone else."""
    from libp2p.utils.varint import encode_varint_prefixed

    node, st = target
    async with connected_client(st) as client:
        for garbage in (b"\x0a\xff\xff\xff\xff\x0f", bytes([0xFF] * 40)):
            stream = await client.host.new_stream(client.peer, [ids.GOSSIPSUB])
            await stream.write(encode_varint_prefixed(garbage))
            with trio.move_on_after(10):  # the node resets it: the read ends
                try:
                    while await stream.read(1024):
                        pass
                except Exception:  # noqa: S110 - a reset is the expected end
                    pass
    text = await read_metrics(node)
    assert counter(text, "intellect_rejected_total", protocol="gossip-rpc", reason="malformed") == 2
    # still up, and its gossip still works: a new peer's heartbeat reaches it
    async with connected_client(st, with_pubsub=True) as other:
        topic = ids.presence_topic(RUN)
        await other.pubsub.subscribe(topic)
        await other.pubsub.wait_for_subscription(other.peer, topic, timeout=10)
        await other.pubsub.publish(topic, seal(other.identity, other.node_info()))
        await trio.to_thread.run_sync(
            lambda: wait_until(
                lambda: other.identity.peer_id in peer_roles(node), 15, "the heartbeat to arrive"
            )
        )


def odd_rpcs(topic):
    """Gossipsub RPCs that parse but hold what no honest peer sends (seeded)."""
    import random

    from libp2p.pubsub.pb import rpc_pb2 as pb

    r = random.Random(7).randbytes
    msg, ctl = pb.Message, pb.ControlMessage
    return {
        "empty message": pb.RPC(publish=[msg()]),
        "no sender": pb.RPC(publish=[msg(data=b"x", topicIDs=[topic])]),
        # a key that is no public key: py-libp2p's signature check raised DecodeError in
        # a task of the pubsub service, and one such message stopped the node
        "garbage key": pb.RPC(
            publish=[msg(from_id=r(38), seqno=r(8), data=r(50), topicIDs=[topic], signature=r(64))]
        ),
        "long seqno": pb.RPC(publish=[msg(from_id=r(38), seqno=r(4000), topicIDs=[topic])]),
        "many topics": pb.RPC(publish=[msg(from_id=r(38), seqno=r(8), topicIDs=[topic] * 500)]),
        "subscriptions": pb.RPC(
            subscriptions=[pb.RPC.SubOpts(subscribe=True, topicid=r(10).hex()) for _ in range(50)]
        ),
        "ihave": pb.RPC(
            control=ctl(ihave=[pb.ControlIHave(topicID=topic, messageIDs=[r(30), b"", b"\xff"])])
        ),
        "iwant": pb.RPC(control=ctl(iwant=[pb.ControlIWant(messageIDs=[r(30)] * 200)])),
        "graft": pb.RPC(control=ctl(graft=[pb.ControlGraft(topicID=t) for t in (topic, "", "z")])),
        "prune": pb.RPC(
            control=ctl(
                prune=[
                    pb.ControlPrune(
                        topicID=topic,
                        peers=[pb.PeerInfo(peerID=r(38), signedPeerRecord=r(100)), pb.PeerInfo()],
                        backoff=2**63,
                    )
                ]
            )
        ),
        "sender record": pb.RPC(senderRecord=r(200)),
    }


async def test_gossip_rpcs_that_parse_but_make_no_sense_never_stop_the_node(target):
    from libp2p.utils.varint import encode_varint_prefixed

    node, st = target
    rpcs = odd_rpcs(ids.presence_topic(RUN))
    rpcs["garbage key"].publish[0].key = os.urandom(36)
    async with connected_client(st) as client:
        for name, rpc in rpcs.items():
            stream = await client.host.new_stream(client.peer, [ids.GOSSIPSUB])
            await stream.write(encode_varint_prefixed(rpc.SerializeToString()))
            await trio.sleep(0.3)
            await stream.reset()
            alive = await trio.to_thread.run_sync(node.status)
            assert alive is not None, f"{name}: {node.log_path.read_text()[-3000:]}"
        text = await read_metrics(node)
        assert counter(text, "intellect_rejected_total", protocol="gossip-rpc") >= 1
        reply = await client.send_raw(
            ids.PRESENCE, frame(seal(client.identity, client.node_info()))
        )
        assert open_message(reply, NodeInfo).sender == st["peer_id"]


async def test_plaintext_dialer_is_refused(target):
    node, st = target
    identity = Identity.generate()
    key_pair = key_pair_of(identity)
    from libp2p import new_host

    plain = new_host(
        key_pair=key_pair, sec_opt={PLAINTEXT_PROTOCOL_ID: InsecureTransport(key_pair)}
    )
    info = info_from_p2p_addr(multiaddr.Multiaddr(addr_of(st)))
    async with plain.run([multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        with pytest.raises(Exception) as exc:  # noqa: PT011 - py-libp2p raises several dial error types
            with trio.fail_after(15):
                await plain.connect(info)
        assert not isinstance(exc.value, trio.TooSlowError), "the dial hung instead of failing"
        assert ID.from_base58(st["peer_id"]) not in plain.get_connected_peers()
    # the node is still up, and a Noise dialer still gets in
    async with connected_client(st) as client:
        reply = await client.send_raw(
            ids.PRESENCE, frame(seal(client.identity, client.node_info()))
        )
        assert open_message(reply, NodeInfo).sender == st["peer_id"]


async def test_dht_speaks_only_our_kad_protocol(target):
    node, st = target
    async with connected_client(st) as client:
        stream = await client.host.new_stream(client.peer, [ids.KAD])
        assert stream.get_protocol() == ids.KAD
        await stream.reset()
        with pytest.raises(Exception) as exc:  # noqa: PT011 - py-libp2p wraps the refusal
            with trio.fail_after(10):
                await client.host.new_stream(client.peer, ["/ipfs/kad/1.0.0"])
        causes, e = [], exc.value
        while e is not None:
            causes.append(str(e))
            e = e.__cause__ or e.__context__
        assert any("not supported" in c for c in causes), causes


def test_admin_endpoint_requires_the_token_for_actions(target):
    import json as _json
    import urllib.error
    import urllib.request

    from node.net.adminfile import read_admin_file

    node, _ = target
    port = read_admin_file(node.data_dir)["port"]
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/announce", data=b'{"count": 5}', method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=10)
    assert exc.value.code == 401
    token = read_admin_file(node.data_dir)["token"]
    for wrong in (f"Bearer {token[:-1]}x", "Bearer ", f"Bearer {token}x", f"Basic {token}", token):
        req.headers["Authorization"] = wrong
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(req, timeout=10)
        assert exc.value.code == 401, wrong
    req.headers["Authorization"] = f"Bearer {token}"  # the right one is accepted
    assert _json.loads(urllib.request.urlopen(req, timeout=10).read())["queued"] == 5
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/nothing", timeout=10)
    assert exc.value.code == 404
    wait_until(lambda: status(node)["announcements"]["published"] == 5, 10, "ours to go out")
    assert status(node)["announcements"]["published"] == 5  # ours only: nothing unauthorized


async def test_rejected_gossip_is_not_forwarded(tmp_path):
    """B rejects bad gossip before relaying it: C, which hears the client only through B,
    never sees the bad messages, but does get the client's valid one."""
    c = Cluster(tmp_path, run_id=RUN)
    try:
        b_node, sb = c.start("validator")
        c_node, sc = c.start("inference", [addr_of(sb)])
        await trio.to_thread.run_sync(
            lambda: wait_until(
                lambda: sc["peer_id"] in peer_roles(b_node) and sb["peer_id"] in peer_roles(c_node),
                30,
                "b and c to meet",
            )
        )
        async with connected_client(sb, with_pubsub=True) as client:
            topic = ids.presence_topic(RUN)
            await client.pubsub.subscribe(topic)
            await client.pubsub.wait_for_subscription(client.peer, topic, timeout=10)
            env = msgpack.unpackb(seal(client.identity, client.node_info()))
            env["s"] = bytes(64)
            bad = [
                os.urandom(80),
                msgpack.packb(env),
                seal(client.identity, client.node_info(run_id="another-run")),
            ]
            for data in bad:
                await client.pubsub.publish(topic, data)
                await trio.sleep(0.2)
            await client.pubsub.publish(topic, seal(client.identity, client.node_info()))

            def relayed():
                return client.identity.peer_id in peer_roles(c_node)

            await trio.to_thread.run_sync(
                lambda: wait_until(relayed, 15, "the valid message to reach c through b")
            )
        b_text, c_text = await trio.to_thread.run_sync(lambda: (metrics(b_node), metrics(c_node)))
        assert counter(b_text, "intellect_rejected_total", protocol="gossip-presence") == 3
        assert counter(c_text, "intellect_rejected_total", protocol="gossip-presence") == 0
    finally:
        c.close()


async def test_a_request_in_flight_when_the_peer_freezes_times_out_and_others_are_served(target):
    """The node asks a peer that took the request and then froze (no dial involved: the
    connection is up). The node's read deadline ends the request; while it is pending,
    the node answers others."""
    from tests.helpers.net import post

    node, st = target  # read_timeout 1.5 s
    async with connected_client(st) as frozen, connected_client(st) as other:
        took_request = trio.Event()

        async def take_and_freeze(stream):
            await read_frame(stream, 1 << 20, deadline=10)
            took_request.set()
            await trio.sleep_forever()

        frozen.host.set_stream_handler(ids.PRESENCE, take_and_freeze)
        result = {}

        async def ping_frozen():
            started = trio.current_time()
            result["reply"] = await trio.to_thread.run_sync(
                lambda: post(node, "/ping", {"peer_id": frozen.identity.peer_id}, timeout=30)
            )
            result["elapsed"] = trio.current_time() - started

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ping_frozen)
            with trio.fail_after(10):
                await took_request.wait()  # the request is in flight now
            reply = await other.send_raw(
                ids.PRESENCE, frame(seal(other.identity, other.node_info()))
            )
            assert isinstance(open_message(reply, NodeInfo), NodeInfo)  # served meanwhile
            assert "reply" not in result  # and the frozen request is still pending
        assert not result["reply"]["ok"] and "timeout" in result["reply"]["error"], result
        assert 1.0 < result["elapsed"] < 1.5 + 4, result
