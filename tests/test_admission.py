import random

import pytest

from crypto.identity import Identity
from protocol.admission import Admission, ReplayWindow
from protocol.errors import Reason, WireError
from protocol.messages import NodeInfo

IDENT = Identity.generate()


def info(seq, run_id="run-1", ts_ms=1_000_000):
    return NodeInfo(
        run_id=run_id,
        sender=IDENT.peer_id,
        seq=seq,
        ts_ms=ts_ms,
        role="trainer",
        state="up",
        addrs=[],
        session=0,
        announced=0,
    )


def test_replay_window_accepts_each_seq_once_in_any_order():
    w = ReplayWindow(window=64)
    seqs = list(range(1000, 1064))
    random.Random(1).shuffle(seqs)
    assert all(w.accept(("a", "t"), s) for s in seqs)
    assert not any(w.accept(("a", "t"), s) for s in seqs)


def test_replay_window_refuses_older_than_window_and_keeps_keys_apart():
    w = ReplayWindow(window=8)
    assert w.accept(("a", "t"), 100)
    assert not w.accept(("a", "t"), 92)  # 8 behind: outside
    assert w.accept(("a", "t"), 93)  # 7 behind: inside, unseen
    assert w.accept(("b", "t"), 100)  # another sender
    assert w.accept(("a", "u"), 100)  # another channel
    assert w.accept(("a", "t"), 10_000)  # a big jump clears the window
    assert not w.accept(("a", "t"), 100)
    assert not w.accept(("a", "t"), 10_000)


def test_replay_window_exhaustive_against_a_set():
    rng = random.Random(7)
    w, seen, highest = ReplayWindow(window=32), set(), None
    for _ in range(5000):
        s = rng.randrange(0, 300)
        expected = s not in seen and (highest is None or s > highest - 32)
        assert w.accept(("k", "t"), s) == expected, s
        if expected:
            seen.add(s)
            highest = s if highest is None else max(highest, s)


def test_replay_window_bounds_memory():
    w = ReplayWindow(window=8, max_keys=3)
    for k in "abcd":
        w.accept((k, "t"), 1)
    assert len(w._keys) == 3


def test_admission_reasons():
    adm = Admission("run-1", max_skew_ms=1000)
    adm.admit(info(1), now_ms=1_000_000)

    def reason(msg, **kw):
        with pytest.raises(WireError) as exc:
            adm.admit(msg, now_ms=1_000_000, **kw)
        return exc.value.reason

    assert reason(info(1)) == Reason.REPLAY
    assert reason(info(2, run_id="run-2")) == Reason.WRONG_RUN
    assert reason(info(3, ts_ms=1_000_000 + 1001)) == Reason.STALE
    assert reason(info(4, ts_ms=1_000_000 - 1001)) == Reason.STALE
    assert reason(info(5), remote_peer=Identity.generate().peer_id) == Reason.SENDER_MISMATCH
    adm.admit(info(6, ts_ms=1_000_000 + 1000), now_ms=1_000_000)
    # rejected messages did not consume their seq
    adm.admit(info(3), now_ms=1_000_000)
