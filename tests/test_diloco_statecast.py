"""A DiLoCo state over SHARDCAST between two real libp2p runtimes in this process (on
127.0.0.1): the honest pull, a manifest not signed by the leader, a corrupted shard; and
finding a group's leader through the DHT provider records of ``group_key``."""

import pytest
import trio

from crypto.identity import Identity
from node.diloco import finding
from node.diloco.statecast import StateServer, StateTransferError, build_offer, pull_state
from protocol.diloco import DILOCO_SHARD, group_key
from protocol.errors import Reason, WireError
from protocol.shardcast import MIN_SHARD
from tests.helpers import net

RUN = "test-run"
STATE = bytes(range(256)) * 1000  # 256,000 bytes: four shards of 64 KiB


def two_nodes(tmp_path):
    return net.two_nodes(tmp_path, ("leader", "joiner"), role="trainer", run__id=RUN)


def serve(node, snapshot, *, offers=True):
    server = StateServer(node, lambda: snapshot, offers=offers, shard_size=MIN_SHARD)
    server.register()
    return server


async def test_a_joiner_pulls_the_leaders_state_shard_by_shard(tmp_path):
    async with two_nodes(tmp_path) as (leader, joiner):
        server = serve(leader, (3, STATE))
        with trio.fail_after(60):
            pulled = await pull_state(joiner, leader.peer_id, leader.peer_id, 3)
        assert pulled is not None and pulled.data == STATE
        assert (pulled.step, pulled.signer, pulled.shards) == (3, leader.peer_id, 4)
        assert pulled.via == "shardcast" and pulled.banned == []
        assert server.uploaded == len(STATE)
        # it asked for no more shards at once than the leader lets one peer hold
        limited = leader.metrics.get("peer_limited", limit="protocol", protocol=DILOCO_SHARD)
        assert limited == 0
        with trio.fail_after(60):  # the leader is past step 2: the joiner must ask again
            assert await pull_state(joiner, leader.peer_id, leader.peer_id, 2) is None


async def test_a_state_not_signed_by_the_leader_is_refused(tmp_path):
    async with two_nodes(tmp_path) as (donor, joiner):
        serve(donor, (1, STATE))  # the donor signs: it is not the group's leader
        someone = Identity.generate().peer_id
        with trio.fail_after(60), pytest.raises(StateTransferError, match="signed by"):
            await pull_state(joiner, donor.peer_id, someone, 1)


class Corrupting(StateServer):
    """A donor that flips one bit of the second shard on the way out."""

    def read(self, offer, start, end):
        data = bytearray(super().read(offer, start, end))
        if start <= MIN_SHARD + 7 < end:
            data[MIN_SHARD + 7 - start] ^= 1
        return bytes(data)


async def test_a_corrupted_shard_is_caught_and_its_server_banned(tmp_path):
    async with two_nodes(tmp_path) as (leader, joiner):
        Corrupting(leader, lambda: (1, STATE), offers=True, shard_size=MIN_SHARD).register()
        with trio.fail_after(60), pytest.raises(StateTransferError, match="bad shard"):
            await pull_state(joiner, leader.peer_id, leader.peer_id, 1)
        rejected = joiner.metrics.get(
            "rejected", reason=Reason.BAD_SHARD.value, protocol=DILOCO_SHARD
        )
        assert rejected == 1


class MovedOn(StateServer):
    """A donor that reached the next boundary once the joiner had the manifest."""

    async def on_shard(self, req, r):
        raise WireError(Reason.NOT_FOUND, f"state v{req.version} not offered here")


async def test_a_donor_that_moves_on_during_the_transfer_sends_the_joiner_back(tmp_path):
    async with two_nodes(tmp_path) as (leader, joiner):
        MovedOn(leader, lambda: (1, STATE), offers=True, shard_size=MIN_SHARD).register()
        with trio.fail_after(60):  # not a wait for ever: None, so it announces itself again
            assert await pull_state(joiner, leader.peer_id, leader.peer_id, 1) is None


async def test_a_member_that_only_offers_nothing_answers_version_0(tmp_path):
    async with two_nodes(tmp_path) as (member, joiner):
        serve(member, (1, STATE), offers=False)  # not the leader: it offers nothing
        with trio.move_on_after(2) as scope:
            await pull_state(joiner, member.peer_id, member.peer_id, 1)
        assert scope.cancelled_caught  # still waiting for an offer, nothing accepted


async def test_the_group_is_found_in_the_dht(tmp_path):
    async with two_nodes(tmp_path) as (leader, joiner):
        key = group_key(RUN, leader.peer_id)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: finding.advertise(leader, key, every=1.0))
            found = await finding.find_leader(joiner, key, leader.peer_id, within=60)
            nursery.cancel_scope.cancel()
        assert leader.peer_id in found
        other = group_key(RUN, Identity.generate().peer_id)  # another group: nobody provides
        assert await finding.find_leader(joiner, other, leader.peer_id, within=2) == set()


def test_group_key_is_derived_from_the_run_and_the_leader():
    leader = Identity.generate().peer_id
    assert group_key(RUN, leader) == f"/intellect/{RUN}/diloco/{leader}"
    with pytest.raises(ValueError, match="not a peer id"):
        group_key(RUN, "not/a peer")
    with pytest.raises(ValueError, match="run id must match"):
        group_key("Bad Run", leader)


def test_a_manifest_names_the_step_and_one_file():
    import dataclasses

    from node.diloco.statecast import check_manifest
    from protocol.shardcast import WeightFile
    from protocol.wire import seal

    ident = Identity.generate()
    header = {"run_id": RUN, "sender": ident.peer_id, "seq": 1, "ts_ms": 1}
    offer = build_offer(ident, header, 5, STATE, MIN_SHARD)
    m = check_manifest(offer.envelope, run_id=RUN, leader=ident.peer_id, step=5)
    assert (m.version, m.step, m.num_shards, m.total_size) == (6, 5, 4, len(STATE))
    with pytest.raises(WireError, match="not step 4"):
        check_manifest(offer.envelope, run_id=RUN, leader=ident.peer_id, step=4)
    with pytest.raises(WireError):
        check_manifest(offer.envelope, run_id="other-run", leader=ident.peer_id, step=5)
    # signed by the leader, but naming other files (a checkpoint, not a member's state)
    half = len(STATE) // 2
    for files in (
        [WeightFile(name="model.safetensors", size=len(STATE), offset=0)],
        [WeightFile(name="a.bin", size=half, offset=0)]
        + [WeightFile(name="b.bin", size=half, offset=half)],
    ):
        other = seal(ident, dataclasses.replace(offer.manifest, files=files))
        with pytest.raises(WireError, match="one file"):
            check_manifest(other, run_id=RUN, leader=ident.peer_id, step=5)


async def test_one_peer_cannot_hold_every_state_upload_slot(tmp_path):
    # a peer that asked for every shard at once and read nothing held all 4 upload slots
    # until the write deadline: a joiner's shard waited, then was refused busy
    from node.net.requests import RemoteRefusal
    from protocol.shardcast import ShardReply, ShardRequest
    from tests.test_peer_limits import limited, three_nodes, until

    shard = 4 << 20  # far beyond what the stream buffers for a reader that stops
    state = bytes(4 * shard)
    async with three_nodes(tmp_path, read_timeout=30.0) as (leader, greedy, honest):
        server = serve(leader, (1, state))
        server.shard_size = shard
        version = (await server.current()).manifest.version
        release, outcomes = trio.Event(), []

        async def grab(index):
            msg = ShardRequest(**greedy.header(), version=version, index=index)
            try:
                async with greedy.open_request(leader.peer_id, DILOCO_SHARD, msg, ShardReply):
                    outcomes.append("held")  # and read nothing of it
                    await release.wait()
            except RemoteRefusal as exc:
                outcomes.append(exc.reason)

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for index in range(4):
                    nursery.start_soon(grab, index)
                await until(lambda: len(outcomes) == 4)
                msg = ShardRequest(**honest.header(), version=version, index=3)
                got = 0
                async with honest.open_request(leader.peer_id, DILOCO_SHARD, msg, ShardReply) as ex:
                    while got < ex.reply.size:
                        got += len(await ex.reader.read_frame(1 << 20, 10.0))
                release.set()
        assert sorted(outcomes) == ["busy", "busy", "held", "held"]
        assert got == shard
        assert limited(leader, "protocol", DILOCO_SHARD) == 2
