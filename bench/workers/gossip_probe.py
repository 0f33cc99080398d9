"""The real node binary with a probe in place of a role, for ``bench/simulation/gossipcheck.py``
(not a benchmark):

    python -m bench.workers.gossip_probe start ...   (the same flags as ``intellect-node start``)

The node is ``intellect-node start`` unchanged (its network, gossipsub settings, paced
publisher, admin endpoint); instead of a role it runs ``probe``, which only watches:

- every announcement on ``TOPIC`` that the node delivers (``Node.subscribe``: gossip's topic
  validator, or a sync repair) is stamped with ``time.time()`` when its handler runs;
- every ``Node.announce`` on ``TOPIC`` (the admin endpoint's ``POST /announce`` calls it) is
  stamped when it is called, before the paced publisher takes it: a delay measured from
  there is what a role announcing something sees, pacing and signing included;
- the node's gossipsub meshes on the announce and the presence topics (peer ids), read
  from the router;
- a series of announcements on request (``SERIES``), timed inside the node;
- for each arrival, the time and the processor time (``time.thread_time``: the node is
  one thread) since the process last woke from a wait of its event loop (trio's epoll
  wrapped: a ``poll`` with a timeout that blocked over 0.3 ms), and when that was: how
  much of a delay was the node's own work on the copy, and how much came before it woke;
- every burst of work (``BURSTS``, the latest): from a wake-up until the event loop next
  waits, when it woke (``time.time()``), its processor time and elapsed time, and the
  gossip messages it took in (pubsub's ``push_msg``: every copy that arrived, first or
  duplicate) on the announce topic and on others, how many of those were first receipts
  delivered to the probe's handler, when in the burst pubsub took each copy in (its
  elapsed and processor time since the wake-up), the control RPCs it read (the router's
  ``handle_rpc``: IHAVE, IWANT, GRAFT, PRUNE; the node speaks gossipsub 1.1, so no
  IDONTWANT; it counted none in the runs of 2026-12-06, not looked into), and the RPCs it
  wrote (pubsub's ``write_msg``), those with an announcement (a publish or a forward)
  apart from the rest; and for each copy taken in, its forwarder and message (``tag``,
  ``message``);
- every copy of a gossip message written (``writes``, the latest ``WRITES``): when, to
  whom and which message. With the takes-in it tells when each copy left its sender: on
  one machine's loopback, when it came (``gossipcheck.upkeep``).
- every control RPC read or written (``controls``, the latest ``CONTROLS``): when, in or
  out, the peer, and how many GRAFTs, PRUNEs, IHAVEs and IWANTs it carried: what a
  network's mesh maintenance and gossip did, and when.

- every burst of over ``STALL_S`` of processor time (``stalls``, the latest ``STALLS``): its
  burst record and what the node was doing, sampled every ``SAMPLE_S`` by a thread that
  reads the event loop thread's stack (``sys._current_frames``) while a burst runs; the
  commonest innermost frames, with their counts (only with ``GOSSIP_PROBE_SAMPLE`` set in
  the environment: its wake-ups cost the node; a number there is the threshold in ms). The sampler needs the interpreter lock,
  which a busy thread yields every 5 ms, so a sample lands about every 5 ms of its work.

- every garbage collection of over ``GC_S`` (``gc``: the node's own ``Collections``,
  ``node/net/collector.py``, told to keep the shorter ones too).

All of these appear in ``/status`` under ``gossip_probe``. Every process runs on one machine,
so the publisher's and the receivers' ``time.time()`` share one clock.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from collections import Counter, deque
from typing import Any

import trio

import node.roles
from node.cli.main import main
from protocol import ids
from protocol.messages import Announcement

TOPIC = "bench-gossip"
# an announcement on TOPIC whose body is ``series <count> <spacing>`` is not announced: the
# probe announces ``a0-0``, ``a1-0``, ... ``count`` times, ``spacing`` s apart, itself, so
# that the publisher's CPU over them is the gossip's (no admin request per announcement)
SERIES = b"series "
BURSTS = 20_000  # bursts kept, the latest: a node at 30 nodes has tens a second
STALL_S, STALLS, SAMPLE_S = 0.05, 200, 0.002  # bursts sampled: this much processor time
FRAMES = 6  # innermost frames a sample keeps
GC_S = 0.005  # garbage collections this long are kept (``gc``)
WRITES = 200_000  # copies written kept, the latest (30 nodes: about 20 a second a node)
CONTROLS = 50_000  # control RPCs kept, the latest
SAMPLE_ENV = "GOSSIP_PROBE_SAMPLE"  # set (to anything): the stall sampler runs


def tag(peer_id: bytes) -> str:
    """A short name for a peer among a bench's nodes: its id's last 6 bytes (of its public
    key), in hex."""
    return peer_id[-6:].hex()


def message(msg: Any) -> str:
    """A gossip message's short name: its origin's ``tag`` and its sequence number."""
    return tag(msg.from_id) + msg.seqno.hex()


def stack(frame: Any) -> str:
    """The innermost ``FRAMES`` frames of ``frame``: ``file:function`` each, innermost first."""
    out = []
    while frame is not None and len(out) < FRAMES:
        code = frame.f_code
        out.append(f"{'/'.join(code.co_filename.rsplit('/', 2)[-2:])}:{code.co_name}")
        frame = frame.f_back
    return " < ".join(out)


async def probe(
    node: Any, cfg: Any, weights: Any, *, task_status: Any = trio.TASK_STATUS_IGNORED
) -> None:
    published: dict[str, float] = {}  # body -> when Node.announce was called
    arrived: dict[str, float] = {}  # "sender body" -> when the handler ran

    woke = [0.0, 0.0, 0.0]  # when the process last woke from a wait: wall, cpu, perf
    since: dict[str, list[float]] = {}  # "sender body" -> [wall, cpu since woke, woke]
    # the burst since ``woke``: copies on the announce topic, on others, first receipts
    burst = [0, 0, 0]
    # and the other RPCs: control messages in (IHAVE, IWANT, GRAFT, PRUNE), and writes
    # out: of an announcement (a publish or a forward), and any other (control, presence)
    rpcs = [0, 0, 0]
    # when in the burst pubsub took each copy in: [elapsed, processor, forwarder, message]
    marks: list[list[Any]] = []
    # every copy of a gossip message written: (time.time(), receiver, message), the latest
    writes: deque[tuple[float, str, str]] = deque(maxlen=WRITES)
    # every control RPC read or written: (time.time(), "in" or "out", peer, GRAFTs,
    # PRUNEs, IHAVEs, IWANTs)
    controls: deque[tuple[float, str, str, int, int, int, int]] = deque(maxlen=CONTROLS)
    # [woke, processor s, elapsed s, announce copies, other copies, first receipts, marks,
    #  control in, announcement writes, other writes]
    bursts: deque[tuple[Any, ...]] = deque(maxlen=BURSTS)
    stalls: deque[dict[str, Any]] = deque(maxlen=STALLS)
    samples: list[list[str]] = [[]]  # the running burst's stack samples (the sampler's)
    running = [False]  # a burst runs: the event loop is not waiting
    main_thread = threading.get_ident()

    def sampler() -> None:
        while True:
            time.sleep(SAMPLE_S)
            if running[0] and (frame := sys._current_frames().get(main_thread)) is not None:
                samples[0].append(stack(frame))

    # the variable's value, if a number, is the threshold in ms instead of STALL_S
    asked = os.environ.get(SAMPLE_ENV, "")
    stall_s = float(asked) / 1000 if asked.replace(".", "", 1).isdigit() else STALL_S
    if asked:  # its wake-ups cost the node: only when asked
        threading.Thread(target=sampler, name="stall-sampler", daemon=True).start()
    node.collections.keep_over_s = GC_S  # the node's own timing keeps the shorter ones too

    def heap() -> dict[str, int]:
        """The commonest types among the objects the collector tracks, with their counts."""
        kinds = Counter(type(o).__qualname__ for o in gc.get_objects())
        return dict(kinds.most_common(25)) | {"total": sum(kinds.values())}

    io = trio._core._run.GLOBAL_RUN_CONTEXT.runner.io_manager  # trio's own, private

    class Stamped:
        def __init__(self, epoll: Any) -> None:
            self.epoll = epoll

        def __getattr__(self, name: str) -> Any:
            return getattr(self.epoll, name)

        def poll(self, timeout: float, maxevents: int) -> Any:
            t0, cpu0 = time.perf_counter(), time.thread_time()
            running[0] = False
            out = self.epoll.poll(timeout, maxevents)
            running[0] = True
            t1 = time.perf_counter()
            if timeout != 0 and t1 - t0 > 0.0003:  # it waited: a burst ended at t0
                if woke[0]:
                    # tuples of numbers: the collector stops tracking them, so 20,000 of
                    # them add nothing to its walks (node/net/collector.py)
                    copies = tuple(tuple(m) for m in marks)
                    took = (woke[0], cpu0 - woke[1], t0 - woke[2], *burst, copies, *rpcs)
                    bursts.append(took)
                    if cpu0 - woke[1] > stall_s:
                        top = Counter(samples[0]).most_common(4)
                        stalls.append({"burst": took, "samples": len(samples[0]), "top": top})
                burst[:] = [0, 0, 0]
                rpcs[:] = [0, 0, 0]
                marks.clear()
                samples[0] = []
                woke[:] = [time.time(), time.thread_time(), t1]
            return out

    io._epoll = Stamped(io._epoll)
    pubsub = node.network.pubsub
    push_msg, announce_topic = pubsub.push_msg, ids.announce_topic(cfg.run.id)

    async def counted(forwarder: Any, msg: Any) -> None:
        burst[0 if announce_topic in msg.topicIDs else 1] += 1
        elapsed, cpu = time.perf_counter() - woke[2], time.thread_time() - woke[1]
        marks.append([elapsed, cpu, tag(forwarder.to_bytes()), message(msg)])
        await push_msg(forwarder, msg)

    pubsub.push_msg = counted  # pubsub starts a task on ``self.push_msg`` per copy read
    router, write_msg = pubsub.router, pubsub.write_msg
    handle_rpc = router.handle_rpc

    def kept(direction: str, peer: Any, rpc: Any) -> None:
        c = rpc.control
        kinds = (len(c.graft), len(c.prune), len(c.ihave), len(c.iwant))
        if any(kinds):
            controls.append((time.time(), direction, tag(peer.to_bytes()), *kinds))

    async def control(rpc: Any, sender: Any) -> None:
        rpcs[0] += 1
        kept("in", sender, rpc)
        await handle_rpc(rpc, sender)

    async def written(stream: Any, rpc: Any) -> bool:
        rpcs[1 if any(announce_topic in m.topicIDs for m in rpc.publish) else 2] += 1
        if rpc.HasField("control"):
            kept("out", stream.muxed_conn.peer_id, rpc)
        if rpc.publish:
            now, to = time.time(), tag(stream.muxed_conn.peer_id.to_bytes())
            writes.extend((now, to, message(m)) for m in rpc.publish)
        return await write_msg(stream, rpc)

    router.handle_rpc = control  # pubsub awaits ``self.router.handle_rpc`` per control RPC
    pubsub.write_msg = written  # every RPC out: the sending loops and the router's writes

    def heard(msg: Announcement) -> None:
        key = f"{msg.sender} {msg.body.decode()}"
        arrived[key] = now = time.time()
        since[key] = [now - woke[0], time.thread_time() - woke[1], woke[0]]
        burst[2] += 1

    announce = node.announce
    series_send, series_recv = trio.open_memory_channel[tuple[int, float]](4)

    def timed_announce(topic: str, body: bytes) -> None:
        if topic == TOPIC and body.startswith(SERIES):
            count, spacing = body[len(SERIES) :].split()
            series_send.send_nowait((int(count), float(spacing)))
            return
        if topic == TOPIC:
            published[body.decode()] = time.time()
        announce(topic, body)

    def mesh(topic: str) -> list[str]:
        router = node.network.pubsub.router
        return sorted(p.to_base58() for p in router.mesh.get(topic, ()))

    node.subscribe(TOPIC, heard)
    node.announce = timed_announce  # the admin endpoint calls node.announce at request time
    node.add_status(
        "gossip_probe",
        lambda: {
            "published": published,
            "arrived": arrived,
            "mesh": mesh(ids.announce_topic(cfg.run.id)),
            "presence_mesh": mesh(ids.presence_topic(cfg.run.id)),
            "since": since,
            "bursts": list(bursts),
            "writes": list(writes),
            "controls": list(controls),
            "tag": tag(node.network.host.get_id().to_bytes()),
            "stalls": list(stalls),
            "gc": list(node.collections.long),
            "heap": heap() if asked else {},
        },
    )
    task_status.started(None)
    async for count, spacing in series_recv:
        for k in range(count):
            timed_announce(TOPIC, f"a{k}-0".encode())
            await trio.sleep(spacing)


node.roles.role_service = lambda *args, **kw: probe  # type: ignore[assignment]

if __name__ == "__main__":
    sys.exit(main())
