"""A peer on the node's ban list (``node/net/bans.py``) is refused ``banned`` on every
request protocol, before its request is read (SPEC §2's bans, #53): two real hosts on
127.0.0.1, each protocol served by its real handler."""

from __future__ import annotations

import time

import pytest
import trio

from crypto.identity import Identity
from node.net.bans import Ban, PeerBans
from node.net.requests import RemoteRefusal
from node.net.runs import RunManifests, ask_manifest
from node.roles.io.exchange import fetch_batch, serve_batches
from node.rollouts.store import BatchStore
from node.shardcast.service import WeightService
from protocol import ids
from protocol.manifest import RunManifest, run_id_of
from protocol.shardcast import ShardRequest, WeightsHolding, WeightsQuery
from protocol.wire import seal
from tests.helpers import net
from tests.helpers.manifests import run_terms

TRAINER = Identity.generate()


def a_manifest() -> bytes:
    terms = run_terms(TRAINER.peer_id)
    m = RunManifest(run_id=run_id_of(terms), sender=TRAINER.peer_id, seq=1, ts_ms=1, terms=terms)
    return seal(TRAINER, m)


async def test_a_banned_peers_requests_are_refused_on_every_protocol(tmp_path):
    run = "test-run"
    async with net.two_nodes(tmp_path, ("holder", "asker"), run__id=run) as (holder, asker):
        envelope = a_manifest()
        async with trio.open_nursery() as nursery:
            await nursery.start(RunManifests(holder, envelope).serve)
            await nursery.start(WeightService(holder, holder.cfg).serve)
            serve_batches(holder, BatchStore(tmp_path / "store"))
            bans = PeerBans()
            holder.refuse_banned(bans)

            async def ask_all() -> dict[str, object]:
                """What each of the holder's protocols answers the asker: the reply's
                type, or the refusal's reason."""
                got: dict[str, object] = {}
                asks = {
                    "manifest": lambda: ask_manifest(asker, holder.peer_id),
                    "holdings": lambda: asker.request(
                        holder.peer_id,
                        ids.WEIGHTS,
                        WeightsQuery(**asker.header(), version=0, with_manifest=False),
                        WeightsHolding,
                    ),
                    "shard": lambda: asker.request(
                        holder.peer_id,
                        ids.SHARDCAST,
                        ShardRequest(**asker.header(), version=1, index=0),
                        WeightsHolding,
                    ),
                    "batch": lambda: fetch_batch(asker, holder.peer_id, bytes(32)),
                }
                for name, ask in asks.items():
                    try:
                        reply = await ask()
                        got[name] = type(reply).__name__
                    except RemoteRefusal as exc:
                        got[name] = exc.reason
                return got

            before = await ask_all()
            assert before["manifest"] == "bytes" and before["holdings"] == "WeightsHolding"
            assert before["shard"] == before["batch"] == "not_found"
            bans.ban(asker.peer_id, "served a bad shard of version 3", time.time())
            assert await ask_all() == dict.fromkeys(before, "banned")
            refused = {
                p: holder.metrics.get("rejected", reason="banned", protocol=p)
                for p in (ids.MANIFEST, ids.WEIGHTS, ids.SHARDCAST, ids.BATCH)
            }
            assert refused == dict.fromkeys(refused, 1)
            # the reason travels in the refusal
            with pytest.raises(RemoteRefusal, match="banned: served a bad shard of version 3"):
                await ask_manifest(asker, holder.peer_id)
            # a ban that ended refuses nothing
            holder.refuse_banned(PeerBans({asker.peer_id: Ban("old", time.time() - 1)}))
            assert await ask_all() == before
            nursery.cancel_scope.cancel()
