"""Protocol ids, gossip topics, DHT keys and roles: the names everything else agrees on."""

from __future__ import annotations

import re

ROLES = ("bootstrap", "inference", "validator", "trainer")

RUN_ID_PATTERN = r"[a-z0-9][a-z0-9._-]{0,63}"
PEER_ID_PATTERN = r"[1-9A-HJ-NP-Za-km-z]{40,64}"

# Request/response protocols (one request frame, one reply frame, then close).
PRESENCE = "/intellect/presence/1.0.0"
SYNC = "/intellect/sync/1.0.0"
# The run manifest (protocol/manifest.py, SPEC §2): answered for any run, since the asker
# does not know its run yet.
MANIFEST = "/intellect/manifest/1.0.0"
ANY_RUN_PROTOCOLS = frozenset({MANIFEST})
# Kademlia under our own prefix; never the public IPFS DHT (/ipfs/kad/1.0.0).
KAD = "/intellect/kad/1.0.0"
KAD_PREFIX = "/intellect"
# Gossipsub router protocol (standard libp2p gossipsub 1.1 wire).
GOSSIPSUB = "/meshsub/1.1.0"


def check_run_id(run_id: str) -> str:
    if not re.fullmatch(RUN_ID_PATTERN, run_id):
        raise ValueError(f"run id must match {RUN_ID_PATTERN}: {run_id!r}")
    return run_id


def presence_topic(run_id: str) -> str:
    """Heartbeats and leave notices (``NodeInfo``)."""
    return f"/intellect/{check_run_id(run_id)}/presence/1"


def announce_topic(run_id: str) -> str:
    """Small announcements that roles make (``Announcement``)."""
    return f"/intellect/{check_run_id(run_id)}/announce/1"


def role_key(run_id: str, role: str) -> str:
    """DHT provider key under which every node of ``role`` in ``run_id`` provides itself."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}")
    return f"/intellect/{check_run_id(run_id)}/role/{role}"


def relay_key(run_id: str) -> str:
    """DHT provider key under which the run's circuit relays provide themselves (SPEC §17)."""
    return f"/intellect/{check_run_id(run_id)}/relay"


# SHARDCAST (protocol/shardcast.py): holdings/manifest queries and the shard exchange.
WEIGHTS = "/intellect/weights/1.0.0"
SHARDCAST = "/intellect/shardcast/1.0.0"


def weights_key(run_id: str, version: int) -> str:
    """DHT provider key under which every holder of ``version`` provides itself."""
    return f"/intellect/{check_run_id(run_id)}/weights/{version}"


# Rollout batch exchange (protocol/batches.py): fetch a worker's batch by work key.
BATCH = "/intellect/batch/1.0.0"
