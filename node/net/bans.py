"""Peers this node refuses for a while: one ban list for every path that catches a peer
lying (a forged run manifest, a shard whose bytes do not match their hash).

``PeerBans`` is pure (it is given the time): a ban names the peer, the reason (one line)
and when it ends; a banned peer is not asked again (for a manifest, for shards) until then.
``load_bans`` / ``save_bans`` keep the list in ``<data_dir>/bans.json`` (written
atomically), so a ban made while a joining node looked for its run's manifest holds in
the node of the run it starts next, and across a restart.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from node.files import write_atomic

log = logging.getLogger("intellect.node")
BAN_SECONDS = 3600.0  # how long a peer caught lying is refused
BANS_FILE = "bans.json"


@dataclass(frozen=True)
class Ban:
    """One banned peer: why (one line), and until when (Unix seconds)."""

    reason: str
    until: float


class PeerBans:
    """The banned peers, each until its ban ends; pure (every call is given ``now``)."""

    def __init__(self, bans: dict[str, Ban] | None = None) -> None:
        self._bans: dict[str, Ban] = dict(bans or {})

    def ban(self, peer: str, reason: str, now: float, seconds: float = BAN_SECONDS) -> Ban:
        """Ban ``peer`` for ``seconds`` from ``now`` (a longer ban already held stays)."""
        held = self._bans.get(peer)
        ban = Ban(reason, now + seconds)
        if held is None or held.until < ban.until:
            self._bans[peer] = ban
        return self._bans[peer]

    def banned(self, peer: str, now: float) -> Ban | None:
        """The ban on ``peer`` if one holds at ``now``."""
        ban = self._bans.get(peer)
        return ban if ban is not None and ban.until > now else None

    def active(self, now: float) -> dict[str, Ban]:
        """Every ban that holds at ``now`` (expired ones are forgotten)."""
        self._bans = {p: b for p, b in self._bans.items() if b.until > now}
        return dict(self._bans)

    def view(self, now: float) -> dict[str, dict[str, object]]:
        """``/status``'s ``bans``: peer -> reason and seconds left."""
        return {
            p: {"reason": b.reason, "left_s": round(b.until - now, 1)}
            for p, b in sorted(self.active(now).items())
        }

    def to_json(self, now: float) -> str:
        bans = {p: {"reason": b.reason, "until": b.until} for p, b in self.active(now).items()}
        return json.dumps(bans, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, now: float) -> PeerBans:
        """The bans in ``text`` that still hold at ``now``; ``ValueError`` if it is not a
        ban list."""
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("not a ban list")
        bans = {
            str(p): Ban(str(b["reason"]), float(b["until"]))
            for p, b in raw.items()
            if float(b["until"]) > now
        }
        return cls(bans)


def load_bans(data_dir: Path, now: float) -> PeerBans:
    """The ban list kept in ``data_dir`` (empty if none, or one that does not parse)."""
    path = data_dir / BANS_FILE
    try:
        return PeerBans.from_json(path.read_text(), now)
    except FileNotFoundError:
        return PeerBans()
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring %s: %s", path, exc)
        return PeerBans()


def save_bans(data_dir: Path, bans: PeerBans, now: float) -> None:
    """Keep ``bans`` in ``data_dir`` (atomically); a disk that refuses is logged only."""
    try:
        write_atomic(data_dir / BANS_FILE, bans.to_json(now).encode())
    except OSError as exc:
        log.warning("cannot save the ban list: %s", exc)
