"""A trainer that starts after its DiLoCo group is running joins it (SPEC §21, §22).

Both objectives (``node/roles/services/grouptrainer.py``, ``node/roles/services/pretrainer.py``) enter a group
the same way. A member with no state of its own (no outer step taken, no roster recorded)
that is not the leader:

1. finds the leader in the DHT (``node/diloco/finding.py``: the group's provider records);
2. asks it once whether the group runs (``join`` for a boundary ≥ 1): ``wait`` — it has not
   formed yet, the member takes part in its formation as before; ``ready`` — the leader
   expects it at outer step ``s`` (the all-reduce that makes version ``s``), its roster of
   that step waits for it, and the reply names the group's last roster (that of version
   ``s − 1``);
3. pulls over SHARDCAST (``node/diloco/statecast.py``) the state the leader offers at that
   boundary: version ``s − 1``'s θ, outer momentum, inner AdamW state, step and data
   position, signed by the leader and checked shard by shard; if the group moved past the
   boundary meanwhile it asks again;
4. its child process loads it into both parameter copies (the model and θ), writes it as
   its checkpoint ``s − 1`` and packs it again: that hash equals the donor's when every part
   was taken over (``Recovered``, in the member's first ``metrics.jsonl`` line).

Its first outer step is then ``s − 1 → s`` and it arrives for it with a zero pseudo-gradient:
the batches (GRPO) or shards (pretraining) of version ``s − 1`` were split over a roster
without it. From version ``s`` on, the roster that admitted it splits the work. The leader
offers its state at every boundary it reaches (``offer``): the snapshot keyed ``n + 1``
holds version ``n``, the start of the outer step whose all-reduce is step ``n + 1``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import trio

from node.diloco.group import DilocoGroup, GroupError
from node.diloco.recovery import JoinRefused, ask_join
from node.diloco.state import state_hash
from node.diloco.statecast import StateTransferError
from node.roles.children.grouppolicy import PackState, Recover, Recovered
from node.roles.children.offload import Offload

log = logging.getLogger("intellect.trainer")
POLL_S = 0.5


def came_too_late(exc: GroupError) -> bool:
    """The leader refused a joiner's first outer step because it formed, or moved on,
    without it (it recovered for longer than the leader's ``diloco.join_timeout``): having
    taken nothing of its own yet, the joiner joins again."""
    return exc.why in ("late", "stale")


@dataclass(frozen=True)
class Joined:
    """A member that recovered the group's state at version ``version``."""

    version: int
    roster: list[str]  # the group's roster of ``version`` (the leader's, without us)
    record: dict[str, Any]  # what the member's first metrics line says of its recovery


async def offer(group: DilocoGroup, policy: Offload, version: int) -> str:
    """The leader: offer joiners its state at version ``version`` (the start of outer step
    ``version + 1``); its hash."""
    data: bytes = await policy.call(PackState())
    group.snapshot = (version + 1, data)
    digest = state_hash(data)
    log.info("DiLoCo: offering the state of version %d to joiners (%s)", version, digest[:16])
    return digest


async def _ask(group: DilocoGroup, at_least: int) -> Any:
    """The leader's reply to ``join`` (transport failures asked again, within the group's
    ``step_timeout``)."""
    try:
        with trio.fail_after(group.cfg.step_timeout):
            while True:
                reply = await ask_join(group.node, group.cfg.leader, at_least)
                if reply is not None:
                    return reply
                await trio.sleep(POLL_S)
    except JoinRefused as exc:
        raise GroupError(str(exc)) from exc
    except trio.TooSlowError:
        raise GroupError("the group's leader did not answer a join request") from None


async def enter(group: DilocoGroup, policy: Offload) -> Joined | None:
    """A fresh member: join the group if it runs already (``None``: it has not formed yet;
    the member takes part in its formation)."""
    found = await group.find_leader()
    if group.cfg.leader not in found:
        log.warning("DiLoCo: the DHT did not name the leader: asking it at the address we know")
    reply = await _ask(group, 1)
    if reply.state != "ready":
        return None
    return await join(group, policy, reply)


async def join(group: DilocoGroup, policy: Offload, reply: Any = None) -> Joined:
    """Recover the group's state at the boundary the leader expects us at (see the module
    docstring); ``reply``: the leader's ``ready`` answer if we have one."""
    while True:
        while reply is None or reply.state != "ready":
            if reply is not None:
                await trio.sleep(POLL_S)
            reply = await _ask(group, 1)
        step, roster = int(reply.step), list(reply.members)
        log.info(
            "DiLoCo: joining the running group at outer step %d: pulling version %d's state "
            "from the leader over SHARDCAST",
            step,
            step - 1,
        )
        try:
            pulled = await group.pull_state(step)
        except StateTransferError as exc:
            raise GroupError(f"the leader's state could not be pulled: {exc}") from exc
        except trio.TooSlowError:
            raise GroupError(f"the leader did not offer its state of step {step}") from None
        if pulled is None:  # the group moved past that boundary meanwhile: ask again
            reply = None
            continue
        group.feedback.reset()  # what we held back belongs to a state we leave (SPEC §15)
        try:
            got: Recovered = await policy.call(Recover(pulled.data, step - 1))
        except Exception as exc:  # the child refused it (another model, a bad state)
            raise GroupError(f"the leader's state does not fit our model: {exc}") from exc
        record = {
            "version": got.version,
            "from": pulled.signer,
            "donor_state_hash": state_hash(pulled.data),
            "state_hash": got.state_hash,
            "params_hash": got.params_hash,
            "position": got.position,
            "bytes": len(pulled.data),
            "shards": pulled.shards,
            "via": pulled.via,
        }
        log.info(
            "DiLoCo: recovered version %d (%d bytes in %d shards, state %s, params %s); "
            "expected at outer step %d",
            got.version,
            len(pulled.data),
            pulled.shards,
            got.state_hash[:16],
            got.params_hash[:16],
            step,
        )
        return Joined(got.version, roster, record)
