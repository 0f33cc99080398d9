"""DiLoCo group messages (``/intellect/diloco/1.0.0``): outer-step sync and ring chunks.

One request type, ``DilocoRequest``, with an ``op``:
- ``sync``: a member is ready for outer step ``step``, attempt ``attempt`` (asked of the
  leader, the run's ``trainer_peer_id``, and repeated until the roster is formed); the reply
  is a ``DilocoRoster`` signed by the leader: ``state`` ``wait`` (ask again) or ``ready``
  with the ring's members in order. Only the peers it names take part in that attempt.
- ``leave``: a member leaves the group now (reply: the roster as it stands).
- ``join``: a peer asks the leader to be expected at outer step ``step`` or later; the reply
  names in ``step`` the boundary at which it is expected (``state`` ``wait``: not yet).
- ``state``: the whole state of a member at the start of outer step ``step`` (live
  recovery): a ``DilocoChunk`` reply, then ``size`` bytes in raw frames of at most 4 MiB.
- ``chunk``: the right neighbour pulls what we offer in ``phase`` (``rs`` reduce-scatter,
  ``ag`` all-gather) round ``round`` of (``step``, ``attempt``); the reply is a
  ``DilocoChunk`` naming ``size`` (< 2³¹, else it does not decode) and ``digest`` (sha256)
  of the one raw frame that follows; the puller refuses a ``size`` other than the chunk
  length it expects (``node/diloco/group.py``) before it reads the frame.
The chunk byte formats are in ``node/diloco/quant.py``, ``node/diloco/sparse.py`` and SPEC.md
section 15.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from protocol.errors import Reason, WireError
from protocol.ids import PEER_ID_PATTERN, check_run_id
from protocol.messages import Header
from protocol.schema import FieldSpec, blob, f64, listof, text, u64

DILOCO = "/intellect/diloco/1.0.0"
# live recovery over SHARDCAST (node/diloco/statecast.py): SHARDCAST's messages
# (WeightsQuery/WeightsHolding, ShardRequest/ShardReply) for the leader's state, apart
# from the policy weights' /intellect/weights and /intellect/shardcast
DILOCO_STATE = "/intellect/diloco-state/1.0.0"
DILOCO_SHARD = "/intellect/diloco-shard/1.0.0"
STATE_FILE = "diloco-state.safetensors"  # the one file a state manifest lists
MAX_MEMBERS = 64
MAX_CHUNK = 2**31 - 1  # bytes of one raw chunk frame
MAX_STATE = 2**40  # bytes of a member's whole state
STATE_FRAME = 4 << 20
DIGEST_SIZE = 32
OPS = ("sync", "leave", "chunk", "join", "state")
PHASES = ("", "rs", "ag")
ENCODINGS = ("int8", "fp32")  # and sparse-<k>: top-k of every 4096 values, 1 ≤ k ≤ 4096
ENCODING_PATTERN = r"int8|fp32|sparse-[1-9][0-9]{0,3}"


def group_key(run_id: str, leader: str = "") -> str:
    """DHT provider key under which every member of the DiLoCo group of ``run_id`` led by
    ``leader`` (the run's ``trainer_peer_id``) provides itself; without ``leader``, the
    key of the run's groups in general (provided by none: kept for callers of the old form)."""
    if leader and not re.fullmatch(PEER_ID_PATTERN, leader):
        raise ValueError(f"not a peer id: {leader!r}")
    base = f"/intellect/{check_run_id(run_id)}/diloco"
    return f"{base}/{leader}" if leader else base


@dataclass(frozen=True)
class DilocoRequest(Header):
    TYPE = "intellect/diloco-request/1"
    MAX_SIZE = 1024

    op: str = text(8, choices=OPS)
    step: int = u64()
    attempt: int = u64(0, 1_000_000)
    phase: str = text(2, choices=PHASES)
    round: int = u64(0, MAX_MEMBERS)
    layout: str = text(32, pattern=r"[0-9a-f]{0,32}")  # sync: the parameter layout hash
    norm: float = f64(0.0, 1e30)  # sync: the L2 norm of the sender's pseudo-gradient
    state: str = text(64, pattern=r"[0-9a-f]{0,64}")  # sync: hash of the outer parameters
    blame: str = text(64, pattern=f"(?:{PEER_ID_PATTERN})?")  # sync: sent us a bad chunk


@dataclass(frozen=True)
class DilocoRoster(Header):
    TYPE = "intellect/diloco-roster/1"
    MAX_SIZE = MAX_MEMBERS * 82 + 1024

    step: int = u64()
    attempt: int = u64(0, 1_000_000)
    state: str = text(8, choices=("wait", "ready"))
    encoding: str = text(11, pattern=ENCODING_PATTERN)
    members: list[str] = listof(FieldSpec(str, max_len=64, pattern=PEER_ID_PATTERN), MAX_MEMBERS)
    norms: list[float] = listof(FieldSpec(float, lo=0.0, hi=1e30), MAX_MEMBERS)


@dataclass(frozen=True)
class DilocoChunk(Header):
    TYPE = "intellect/diloco-chunk/1"
    MAX_SIZE = 512

    step: int = u64()
    attempt: int = u64(0, 1_000_000)
    phase: str = text(2, choices=PHASES)
    round: int = u64(0, MAX_MEMBERS)
    size: int = u64(0, MAX_STATE)  # a ring chunk (phase rs | ag): at most MAX_CHUNK
    digest: bytes = blob(DIGEST_SIZE, exact_len=DIGEST_SIZE)

    def check(self) -> None:
        """A ring chunk is one raw frame: at most ``MAX_CHUNK`` bytes (the ``MAX_STATE`` bound
        of the field is for the reply to ``state``, whose bytes come in 4 MiB frames)."""
        if self.phase in ("rs", "ag") and self.size > MAX_CHUNK:
            raise WireError(Reason.MALFORMED, f"a ring chunk of {self.size} B > {MAX_CHUNK}")
