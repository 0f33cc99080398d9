"""Issue #54's attacks on the WorkLedger's registry and validator set, each performed as
an attacker would and shown to cost what SPEC section 19 says, on the embedded chain, the
served chain and anvil: squatting a peer key (the validators' own revocation code votes
the squatter out), a working validator's free false rejects, and the 65th appointment.
"""

import dataclasses

import pytest
from eth_account import Account

from crypto.identity import Identity
from ledger.client import LedgerRevert
from node.roles.io.docket import Docket
from tests.helpers.ledger import (  # noqa: F401
    ETH,
    PARAMS,
    VALIDATOR_BOND,
    Ledger,
    key,
    ledger_fixture,
    paid,
)


def collateral(units: int) -> int:
    return units * PARAMS.reward_per_unit * PARAMS.collateral_bps // 10_000


def dockets(ledger, *validators) -> list[Docket]:
    """The validator role's view of the chain (``node/roles/io/docket.py``), one per
    validator, from the contract's block."""
    out = []
    for v in validators:
        d = Docket()
        d.open(ledger.client(v), ledger.block)
        out.append(d)
    return out


def judge(dockets_: list[Docket]) -> list[list[str]]:
    """One chain read of each validator, then its revocation votes (what its role does)."""
    voted = []
    for d in dockets_:
        d.read()
        voted.append(d.revoke_squats())
    return voted


def test_54_squatting_costs_min_stake_each_time_even_unbonded_at_once(ledger):
    """A squatter registers the worker's peer key with an invalid signature and unbonds
    all of its stake in the same minute: the revocation fee used to come from free stake
    only, so four squats cost nothing, and no node ever voted. Now the validators' roles
    vote every invalid registration out, and the fee comes from unbonding stake too: four
    squats cost four times min_stake, and a valid registration is never voted on."""
    them, me = ledger.stranger.address, ledger.worker.address
    squatter = ledger.client(ledger.stranger)
    honest = ledger.register(ledger.worker, 2 * ETH)  # a valid registration: no vote
    validators = dockets(ledger, ledger.v1, ledger.v2)
    burned = squatter.total_burned()
    for _ in range(4):
        victim = Identity.generate()
        squatter.register(victim.public_bytes, bytes(64), PARAMS.min_stake)
        squatter.unbond(PARAMS.min_stake)  # nothing free is left for the fee
        assert squatter.worker(them).stake == 0
        assert judge(validators) == [[them.lower()], [them.lower()]]
        assert not squatter.worker(them).registered
        assert squatter.peer_owner(victim.public_bytes) == "0x" + "00" * 20
        assert squatter.worker(them).unbonding == 0
    assert squatter.total_burned() == burned + 4 * PARAMS.min_stake
    assert honest.worker(me).registered and honest.worker(me).stake == 2 * ETH
    ledger.chain.advance_time(PARAMS.unbonding_delay + 1)
    with pytest.raises(LedgerRevert, match="nothing unbonding"):
        squatter.withdraw()


def test_54_a_squatter_of_a_worker_with_locked_and_unbonding_stake_pays_only_min_stake(ledger):
    """The fee takes free stake first, then unbonding stake, and never more than
    min_stake; locked stake (backing unsettled work) is never touched."""
    them = ledger.stranger.address
    squatter = ledger.client(ledger.stranger)
    squatter.register(Identity.generate().public_bytes, bytes(64), 3 * ETH)
    squatter.submit_work(key(1), 500, 0)  # locks 1 ETH
    squatter.unbond(ETH // 2 * 3)  # 1.5 ETH unbonding, 0.5 ETH free
    judge(dockets(ledger, ledger.v1, ledger.v2))
    info = squatter.worker(them)
    assert (info.stake, info.locked, info.unbonding) == (ETH, ETH, ETH)


def test_54_a_working_validators_first_reject_is_bonded_from_stake_its_work_cannot_lock(
    ledger,
):
    """A validator that also works locked its free stake with its own claims, so its false
    first reject of an honest batch went in unbonded: it cost nothing when overturned. Now
    an appointed validator's work can lock only stake above the validator bond, so the bond
    is there for its reject, and the overturn burns it."""
    ledger = Ledger(ledger.chain, extra_validators=1)  # work needs q + 1 others than v1
    liar = ledger.register(ledger.v1, ETH)  # 26 ETH; its bond is 20 ETH (max_units)
    bond = ledger.as_owner.validator_bond()
    assert bond == collateral(PARAMS.max_units) == 20 * ETH
    with pytest.raises(LedgerRevert, match="free stake below this work's collateral"):
        liar.submit_work(key(1), PARAMS.max_units, 0)  # would leave 6 ETH free
    above_bond = (VALIDATOR_BOND + ETH - bond) // collateral(1)
    with pytest.raises(LedgerRevert, match="free stake below this work's collateral"):
        liar.submit_work(key(1), above_bond + 1, 0)
    liar.submit_work(key(1), above_bond, 0)  # all it may lock: 6 ETH

    honest = ledger.register(ledger.worker, 12 * ETH)
    me = ledger.worker.address
    units = PARAMS.max_units // 2  # 10 ETH of collateral: more than 6, less than the bond
    honest.submit_work(key(2), units, 0)
    liar.reject(me, key(2), "invalid")
    assert liar.worker(ledger.v1.address).locked == 6 * ETH + collateral(units)  # bonded
    for v in (ledger.v2, ledger.v3):
        ledger.client(v).accept(me, key(2))
    s = honest.submission(me, key(2))
    assert (s.status, s.final) == ("accepted", True)
    assert liar.worker(ledger.v1.address).stake == VALIDATOR_BOND + ETH - collateral(units)

    ledger.mature()
    before = ledger.balance(ledger.worker)
    receipt = honest.claim()
    assert ledger.balance(ledger.worker) == before + units * PARAMS.reward_per_unit - paid(receipt)
    assert honest.worker(me).stake == 12 * ETH and honest.worker(me).slashed == 0


def test_54_removed_validators_leave_the_list_and_the_65th_appointment_succeeds(ledger):
    """The validator list held every validator ever appointed, so the 65th appointment of
    a run reverted however many had been removed. A removed validator leaves it (it never
    counts toward voters() again); apply_params still recounts those that are left."""
    o = ledger.as_owner
    for i in range(61):  # with the three at deployment: 64 appointments, 61 removed
        address = "0x" + (0x5000 + i).to_bytes(20, "big").hex()
        o.propose_validator(address)
        o.remove_validator(address)
    o.propose_validator("0x" + (0x6000).to_bytes(20, "big").hex())  # the 65th
    o.propose_validator("0x" + (0x6001).to_bytes(20, "big").hex())
    assert o.reads.view("voters") == 3
    o.propose_params(PARAMS)
    ledger.chain.advance_time(o.reads.view("timelock"))
    o.apply_params()
    assert o.reads.view("voters") == 3


def test_54_the_stake_revoke_command_votes_only_against_an_invalid_registration(ledger):
    """``intellect-node stake revoke ADDRESS``: a validator's vote by hand, e.g. when a
    worker finds its own peer key squatted; a valid registration is never voted on."""
    from node.cli.ledger import revoke_squat

    squatter = ledger.client(ledger.stranger)
    victim = Identity.generate()
    squatter.register(victim.public_bytes, bytes(64), PARAMS.min_stake)
    ledger.register(ledger.worker, PARAMS.min_stake)
    v1, v2 = ledger.client(ledger.v1), ledger.client(ledger.v2)
    with pytest.raises(ValueError, match="signature is valid"):
        revoke_squat(v1, None, ledger.worker.address)
    assert v1.peer_owner(victim.public_bytes) == ledger.stranger.address
    for v in (v1, v2):
        revoke_squat(v, None, v.peer_owner(victim.public_bytes))
    assert not squatter.worker(ledger.stranger.address).registered
    with pytest.raises(ValueError, match="not registered"):
        revoke_squat(v1, None, ledger.stranger.address)


def test_54_a_worker_whose_key_is_squatted_names_the_squatter_and_registers_once_freed(
    ledger, tmp_path
):
    """The inference role's registration (what a worker node does at start) finds its own
    peer key held by another account: it stops with one line naming the squatter and the
    command, and registers once the validators voted the squat out."""
    from node.roles.io.chain import ChainSetupError
    from tests.test_roles import a_role, worker_node

    identity = Identity.generate()
    role = a_role(tmp_path, worker_node(identity, []))
    role.chain.ledger = w = ledger.client(ledger.worker)
    role.chain.address = me = ledger.worker.address
    ledger.client(ledger.stranger).register(identity.public_bytes, bytes(64), PARAMS.min_stake)
    with pytest.raises(ChainSetupError, match=f"registered by {ledger.stranger.address}"):
        role.register(w.worker(me))
    judge(dockets(ledger, ledger.v1, ledger.v2))
    role.register(w.worker(me))
    assert w.worker(me).peer_key == identity.public_bytes


def test_54_a_bond_raise_recounts_a_list_past_64_in_parts_and_takes_no_work_meanwhile(ledger):
    """More validators than ``apply_params`` counts again in one transaction (64): the rest
    wait for ``recount_validators`` (anyone), and no work is taken until the last is counted.
    Here the three bonded validators past the 64th would still count under the old bond, so
    a submission during the recount would be judged by fewer than quorum + 1; a removal
    during it moves the list's last entry before the recount's place, and it is counted at
    once."""
    o = ledger.as_owner
    fillers = ["0x" + (0x7000 + i).to_bytes(20, "big").hex() for i in range(61)]  # unbonded
    for address in fillers:
        o.propose_validator(address)  # entries 3 to 63
    late = [Account.from_key(ledger.chain.dev_keys[i]) for i in (6, 7, 8)]  # entries 64-66
    for v in late:
        o.propose_validator(v.address)
        ledger.client(v).add_stake(VALIDATOR_BOND)
    raised = dataclasses.replace(PARAMS, max_units=PARAMS.max_units * 3 // 2)  # bond 30 ETH
    o.propose_params(raised)
    ledger.chain.advance_time(o.reads.view("timelock"))
    for v in late:
        o.count_validator(v.address)
    assert o.reads.view("voters") == 6
    w = ledger.register(ledger.worker, 10 * ETH)

    o.tx.transact("apply_params")  # v1-v3 (25 ETH) stop counting; the late three, not yet
    assert o.recount_left() == 3 and o.reads.view("voters") == 3  # a stale count
    with pytest.raises(LedgerRevert, match="fewer than quorum \\+ 1 validators"):
        w.submit_work(key(1), 100, 0)
    o.remove_validator(fillers[7])  # entry 10: the last (late[2]) takes its place
    assert o.recount_left() == 2 and o.reads.view("voters") == 2
    ledger.client(ledger.stranger).recount_validators(1)
    assert o.recount_left() == 1 and o.reads.view("voters") == 1
    receipt = ledger.client(ledger.stranger).recount_validators()
    assert o.recount_left() == 0 and o.reads.view("voters") == 0
    print("recount_validators of 1 entry:", receipt.gasUsed, "gas")
    with pytest.raises(LedgerRevert, match="fewer than quorum \\+ 1 validators"):
        w.submit_work(key(1), 100, 0)  # rightly: none of the six holds the new bond
    for v in (ledger.v1, ledger.v2, ledger.v3):
        ledger.client(v).add_stake(5 * ETH)  # counted again as their stake changes
    w.submit_work(key(1), 100, 0)
    assert ledger.client(ledger.stranger).recount_left() == 0


def test_54_the_owner_client_applies_params_and_finishes_the_recount(ledger):
    """``LedgerClient.apply_params`` sends ``recount_validators`` until none is left: work
    is taken again after the one call."""
    o = ledger.as_owner
    for i in range(70):
        o.propose_validator("0x" + (0x8000 + i).to_bytes(20, "big").hex())
    o.propose_params(PARAMS)
    ledger.chain.advance_time(o.reads.view("timelock"))
    receipts = o.apply_params()
    assert len(receipts) == 2 and o.recount_left() == 0 and o.reads.view("voters") == 3
    print(
        "apply_params, 64 entries:",
        receipts[0].gasUsed,
        "gas;",
        "recount_validators, 9:",
        receipts[1].gasUsed,
    )
    ledger.register(ledger.worker, 2 * ETH).submit_work(key(1), 100, 0)
