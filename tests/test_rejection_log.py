"""What the log shows of rejected input (``node/net/rejections.py``): a joining node logged
about 200 ``rejected input ... reason=stale`` lines at INFO in its first seconds. Expected
reasons go to DEBUG, summed up at INFO once a minute; every rejection is still counted."""

import logging

from crypto.identity import Identity
from node.config import load_config
from node.net.rejections import RejectionLog
from protocol.errors import Reason, WireError


def test_stale_and_replay_are_summed_up_once_an_interval_and_the_rest_are_not():
    tally = RejectionLog(interval=60)
    assert tally.level(Reason.STALE) == tally.level(Reason.REPLAY) == logging.DEBUG
    assert tally.level(Reason.BUSY) == logging.DEBUG  # every upload slot taken: in volume
    assert tally.level(Reason.MALFORMED) == tally.level(Reason.BAD_SIGNATURE) == logging.INFO
    said = [tally.summary(Reason.STALE, t) for t in range(0, 59)]
    assert said == [None] * 59
    assert tally.summary(Reason.MALFORMED, 70) is None  # its own line: not summed up
    assert tally.summary(Reason.REPLAY, 58.5) is None
    assert tally.summary(Reason.STALE, 61) == (
        "rejected input in the last 61 s: replay=1 stale=60 (each at DEBUG)"
    )
    assert tally.summary(Reason.STALE, 100) is None  # a new interval starts at 100
    assert tally.summary(Reason.STALE, 159) is None
    assert tally.summary(Reason.STALE, 160) == (
        "rejected input in the last 60 s: stale=3 (each at DEBUG)"
    )


def test_a_node_logs_stale_input_at_debug_and_counts_it(tmp_path, caplog):
    from node.net.runtime import Node

    node = Node(load_config(environ={}, flags={"data_dir": tmp_path}), Identity.generate())
    caplog.set_level(logging.DEBUG, logger="intellect.node")
    peer = Identity.generate().peer_id
    for _ in range(200):
        node.reject("gossip-announce", peer, WireError(Reason.STALE, "timestamp off by 1 ms"))
    node.reject("gossip-announce", peer, WireError(Reason.MALFORMED, "not msgpack"))
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "intellect.node"]
    info = [text for level, text in lines if level >= logging.INFO]
    assert len(info) == 1 and "reason=malformed" in info[0]
    assert sum("reason=stale" in text for _, text in lines) == 200  # each at DEBUG
    metrics = node.metrics.exposition().decode()
    assert 'reason="stale"} 200.0' in metrics and 'reason="malformed"} 1.0' in metrics
    caplog.clear()
    node.requests.rejections.since -= 60  # a minute on: the next stale one brings the summary
    node.reject("gossip-announce", peer, WireError(Reason.STALE, "timestamp off by 1 ms"))
    info = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert len(info) == 1 and info[0].startswith("rejected input in the last 6")
    assert info[0].endswith(": stale=201 (each at DEBUG)")
