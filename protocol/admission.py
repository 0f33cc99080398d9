"""Admission of signed messages: run id, freshness and replay. A pure state machine.

A message that passed ``wire.open_message`` is admitted only if it belongs to this run,
its timestamp is within ``max_skew_ms`` of our clock, and its ``seq`` has not been
accepted before from that sender on that channel. Replay tracking is the IPsec sliding
window: per (sender, channel) the highest ``seq`` seen and a bitmask of the ``window``
sequence numbers below it; anything older than the window is refused as a replay.
Because senders start their counter at their start time in microseconds, a restarted
sender continues above its old values.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from protocol.errors import Reason, WireError
from protocol.messages import Header


@dataclass
class _Window:
    highest: int
    mask: int = 1  # bit i set = (highest - i) seen


@dataclass
class ReplayWindow:
    window: int = 4096
    max_keys: int = 65536
    _keys: OrderedDict[tuple[str, str], _Window] = field(default_factory=OrderedDict)

    def accept(self, key: tuple[str, str], seq: int) -> bool:
        """Record ``seq`` for ``key``; False if it was seen or is older than the window."""
        w = self._keys.get(key)
        if w is None:
            self._keys[key] = _Window(seq)
            if len(self._keys) > self.max_keys:
                self._keys.popitem(last=False)
            return True
        self._keys.move_to_end(key)
        if seq > w.highest:
            shift = seq - w.highest
            w.mask = (
                ((w.mask << shift) | 1) & ((1 << self.window) - 1) if shift < self.window else 1
            )
            w.highest = seq
            return True
        offset = w.highest - seq
        if offset >= self.window or (w.mask >> offset) & 1:
            return False
        w.mask |= 1 << offset
        return True


@dataclass
class Admission:
    run_id: str
    max_skew_ms: int = 300_000
    replay: ReplayWindow = field(default_factory=ReplayWindow)

    def admit(
        self,
        message: Header,
        now_ms: int,
        *,
        remote_peer: str | None = None,
        any_run: bool = False,
    ) -> None:
        """Raise ``WireError`` unless ``message`` may be acted on; records its seq.
        ``any_run``: a message of any run is admitted (the run manifest's exchange, SPEC
        §2, whose asker does not know its run yet)."""
        if message.run_id != self.run_id and not any_run:
            raise WireError(Reason.WRONG_RUN, f"run {message.run_id!r}, expected {self.run_id!r}")
        if remote_peer is not None and message.sender != remote_peer:
            raise WireError(Reason.SENDER_MISMATCH, "sender is not the stream's peer")
        if abs(message.ts_ms - now_ms) > self.max_skew_ms:
            raise WireError(Reason.STALE, f"timestamp off by {message.ts_ms - now_ms} ms")
        if not self.replay.accept((message.sender, message.TYPE), message.seq):
            raise WireError(Reason.REPLAY, f"seq {message.seq} already seen or too old")
