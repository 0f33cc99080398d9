"""Issue #10's attacks on the WorkLedger, each performed as an attacker would and shown to
fail or not to pay, on the embedded chain, the served chain and anvil.

Case numbers follow the issue: 1 pool drain, 2 claim before the reject, 3 profitable false
slash, 4 owner rug, 5 withdraw before the reject, 6 key squatting, 7 claim out of gas (in
test_ledger_cli.py and test_ledger_client.py), 8 contract wallets, 9 stale policy version.
"""

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from crypto.identity import Identity
from ledger.client import LedgerRevert, Params
from ledger.registration import registration_message
from tests.helpers.ledger import (  # noqa: F401
    ETH,
    PARAMS,
    VALIDATOR_BOND,
    key,
    ledger_fixture,
    paid,
)

RATE = PARAMS.reward_per_unit
WALLET = Path(__file__).parent / "fixtures" / "SmartWallet.vy"


def collateral(units: int, p: Params = PARAMS) -> int:
    return units * p.reward_per_unit * p.collateral_bps // 10_000


# ---- 1. pool drain ----------------------------------------------------------------


def test_1_pool_drain_is_capped_by_units_and_stake_and_unjudged_work_never_pays(ledger):
    """A worker at the minimum stake claims the whole pool: refused; it then claims as much
    as its stake lets it and nobody checks the batches (or they were never published): at
    maturity a stranger settles them and nothing is paid."""
    attacker = ledger.register(ledger.worker, PARAMS.min_stake)
    me = ledger.worker.address
    pool = attacker.reward_pool()
    with pytest.raises(LedgerRevert, match="units above max_units"):
        attacker.submit_work(key(1), pool // RATE, 0)
    # within the units cap, the collateral (2 x the reward) must fit in the free stake
    fits = PARAMS.min_stake // collateral(1)  # 500 units at 1 ETH
    with pytest.raises(LedgerRevert, match="free stake below this work's collateral"):
        attacker.submit_work(key(1), fits + 1, 0)
    attacker.submit_work(key(1), fits // 2, 0)
    attacker.submit_work(key(2), fits // 2, 0)
    with pytest.raises(LedgerRevert, match="free stake below this work's collateral"):
        attacker.submit_work(key(3), 1, 0)  # all of its stake backs unsettled claims
    assert attacker.worker(me).locked == PARAMS.min_stake
    assert attacker.reward_pool() == pool - fits * RATE  # at most stake / 2 is reserved

    # an honest worker is still paid: the pool holds its reward from submission on
    honest = ledger.register(ledger.stranger, 2 * ETH)
    honest.submit_work(key(9), 10, 0)
    ledger.client(ledger.v1).accept(ledger.stranger.address, key(9))

    ledger.mature()
    before = ledger.balance(ledger.worker)
    ledger.client(ledger.v3).settle(me)  # anyone may settle
    assert ledger.balance(ledger.worker) == before
    assert attacker.claimable(me) == 0
    with pytest.raises(LedgerRevert, match="nothing to claim"):
        attacker.claim()
    assert attacker.reward_pool() == pool - 10 * RATE  # the unjudged claims went back
    assert attacker.worker(me).locked == 0  # (its collateral is free again: no reward, no loss)
    before = ledger.balance(ledger.stranger)
    receipt = honest.claim()
    assert ledger.balance(ledger.stranger) == before + 10 * RATE - paid(receipt)


# ---- 2. claim before the reject ---------------------------------------------------


def test_2_a_reward_cannot_be_claimed_before_a_quorum_can_reject_it(ledger):
    """Accepted, then found bad by two other validators within the challenge period: the
    worker could not claim in between, ends up slashed and unpaid, and the books stay
    right for its other work."""
    w = ledger.register(ledger.worker, 2 * ETH)
    me = ledger.worker.address
    w.submit_work(key(1), 100, 0)
    w.submit_work(key(2), 10, 0)
    ledger.client(ledger.v1).accept(me, key(1))
    ledger.client(ledger.v1).accept(me, key(2))
    ledger.chain.advance_time(PARAMS.verdict_window + 1)  # the window is over
    with pytest.raises(LedgerRevert, match="nothing to claim"):
        w.claim()
    # one validator alone cannot overturn another's accept
    ledger.client(ledger.v2).reject(me, key(1), "invalid")
    assert w.submission(me, key(1)).status == "accepted"
    ledger.client(ledger.v3).reject(me, key(1), "invalid")  # quorum of two
    s = w.submission(me, key(1))
    assert (s.status, s.final, s.reject_votes) == ("rejected", True, 2)
    assert w.pending(me) == 10 * RATE  # pending() still works

    ledger.chain.advance_time(PARAMS.reward_lock)
    before = ledger.balance(ledger.worker)
    receipt = w.claim()
    assert ledger.balance(ledger.worker) == before + 10 * RATE - paid(receipt)
    assert w.worker(me).stake == 2 * ETH - collateral(100)
    assert w.worker(me).locked == 0
    # the share went to the first rejecter, v2; its bond is free again
    share = collateral(100) * PARAMS.validator_share_bps // 10_000
    assert w.claimable(ledger.v2.address) == share
    assert w.worker(ledger.v2.address).locked == 0


def test_2_a_claim_at_max_units_can_be_rejected_and_one_worker_cannot_lock_up_the_pool(ledger):
    """A claim whose collateral exceeded every validator's free stake could not be rejected
    (an accomplice's accept of it then stood and was paid), and a rich worker reserved the
    whole pool with such claims at no risk. Now a validator votes only while its stake covers
    the largest collateral (validator_bond), only a reject that is the first verdict locks a
    bond (so a quorum can always overturn an accept), and one worker reserves at most a tenth
    of the funded pool."""
    big = PARAMS.max_units
    c = collateral(big)  # 20 ETH: more than the whole of a 10 ETH validator bond
    assert ledger.as_owner.validator_bond() == c
    rich = ledger.register(ledger.worker, 3 * c)
    other = ledger.register(ledger.stranger, 2 * c)
    me, them = ledger.worker.address, ledger.stranger.address
    pool = rich.reward_pool()
    rich.submit_work(key(1), big, 0)  # 10 ETH: a tenth of the 100 ETH pool
    with pytest.raises(LedgerRevert, match="above its share of the pool"):
        rich.submit_work(key(2), 1, 0)
    other.submit_work(key(1), big, 0)

    # a validator whose stake does not cover the collateral has no vote at all
    v1, v2, v3 = (ledger.client(v) for v in (ledger.v1, ledger.v2, ledger.v3))
    v3.unbond(VALIDATOR_BOND - c + 1)
    with pytest.raises(LedgerRevert, match="validator stake below the validator bond"):
        v3.accept(them, key(1))
    v3.add_stake(ETH)

    v2.reject(them, key(1), "invalid")  # a bonded validator rejects a claim at max_units
    assert v2.worker(ledger.v2.address).locked == c
    v1.accept(me, key(1))  # an accomplice accepts the other
    # v2's free stake (5 ETH) is below that claim's collateral, yet it votes to overturn:
    # a reject that overturns an accept locks no bond
    v2.reject(me, key(1), "invalid")
    v3.reject(me, key(1), "invalid")
    s = rich.submission(me, key(1))
    assert (s.status, s.final) == ("rejected", True)

    ledger.mature()
    rich.settle(me)
    rich.settle(them)
    assert rich.worker(me).stake == 2 * c and other.worker(them).stake == c
    assert rich.reward_pool() == pool  # nothing was paid
    assert v2.worker(ledger.v2.address).locked == 0
    assert v2.claimable(ledger.v2.address) == 2 * c * PARAMS.validator_share_bps // 10_000


# ---- 3. profitable false slash ----------------------------------------------------


def test_3_repeated_false_slash_costs_the_validator_and_not_the_worker(ledger):
    """One validator rejects ten honest 1-unit batches. Each reject can take only that
    batch's collateral (not a fifth of the whole stake), locks as much of the validator's
    own bond, and two other validators overturn it: the worker loses nothing and is paid,
    the false slasher loses ten collaterals and earns nothing."""
    w = ledger.register(ledger.worker, 5 * ETH)
    me = ledger.worker.address
    keys = [key(100 + i) for i in range(10)]
    w.submit_work_many([(k, 1, 0) for k in keys])
    liar = ledger.client(ledger.v1)
    liar.send_many([("reject", (me, k, 1)) for k in keys])
    assert liar.worker(ledger.v1.address).locked == 10 * collateral(1)
    for v in (ledger.v2, ledger.v3):
        ledger.client(v).send_many([("accept", (me, k)) for k in keys])
    assert all(w.submission(me, k).status == "accepted" for k in keys)
    assert liar.worker(ledger.v1.address).stake == VALIDATOR_BOND - 10 * collateral(1)

    ledger.mature()
    before = ledger.balance(ledger.worker)
    receipt = w.claim()
    assert ledger.balance(ledger.worker) == before + 10 * RATE - paid(receipt)
    info = w.worker(me)
    assert (info.stake, info.slashed, info.accepted, info.rejected) == (5 * ETH, 0, 10, 0)
    assert liar.claimable(ledger.v1.address) == 0
    assert liar.worker(ledger.v1.address).locked == 0


def test_3_an_unchallenged_false_slash_takes_only_that_batchs_collateral(ledger):
    w = ledger.register(ledger.worker, 5 * ETH)
    me = ledger.worker.address
    w.submit_work_many([(key(100 + i), 1, 0) for i in range(10)])
    ledger.client(ledger.v1).send_many([("reject", (me, key(100 + i), 1)) for i in range(10)])
    ledger.mature()
    w.settle(me)
    assert w.worker(me).stake == 5 * ETH - 10 * collateral(1)  # 0.02 ETH, not 4.46 ETH
    gain = 10 * collateral(1) * PARAMS.validator_share_bps // 10_000
    assert w.claimable(ledger.v1.address) == gain


# ---- 4. owner rug -----------------------------------------------------------------

RUG = replace(
    PARAMS,
    reward_per_unit=0,
    collateral_bps=100_000,
    validator_share_bps=5_000,
    verdict_window=60,
    fetch_deadline=30,
    reward_lock=3_600,  # the shortest challenge period the contract allows
    unbonding_delay=60 + 3_600 + 3_600,
)


def test_4_parameter_changes_wait_out_every_pending_claim_and_unbonding(ledger):
    """The owner proposes the worst parameters it may (no reward, 10x collateral, half of
    each slash to the validator, shortest window and lock) and appoints itself validator:
    nothing applies before a timelock longer than maturity plus unbonding, so the worker's
    pending work is judged and paid on the terms it was submitted under, and it can leave
    with all its stake before the change."""
    w = ledger.register(ledger.worker, 3 * ETH)
    me = ledger.worker.address
    owner = ledger.as_owner
    w.submit_work(key(1), 100, 0)
    owner.propose_params(RUG)
    owner.propose_validator(ledger.owner.address)
    _, eta = owner.proposed_params()
    now = ledger.chain.w3.eth.get_block("latest")["timestamp"]
    assert eta - now > PARAMS.unbonding_delay + PARAMS.verdict_window + PARAMS.reward_lock
    with pytest.raises(LedgerRevert, match="timelock not over"):
        owner.apply_params()
    assert not owner.is_validator(ledger.owner.address)
    with pytest.raises(LedgerRevert, match="only a validator"):
        owner.reject(me, key(1), "invalid")
    w.submit_work(key(2), 100, 0)  # submitted while the proposal waits: old terms too

    ledger.client(ledger.v1).accept(me, key(1))
    ledger.client(ledger.v1).accept(me, key(2))
    ledger.mature()
    before = ledger.balance(ledger.worker)
    receipt = w.claim()
    assert ledger.balance(ledger.worker) == before + 200 * RATE - paid(receipt)
    w.unbond(3 * ETH)  # leaving: everything is free again
    ledger.chain.advance_time(PARAMS.unbonding_delay + 1)
    w.withdraw()
    assert ledger.chain.w3.eth.get_block("latest")["timestamp"] < eta

    ledger.chain.advance_time(eta - ledger.chain.w3.eth.get_block("latest")["timestamp"] + 1)
    owner.apply_params()
    assert owner.params() == RUG and owner.is_validator(ledger.owner.address)
    s = w.submission(me, key(2))  # what was recorded stays recorded
    assert (s.reward, s.collateral, s.validator_share_bps) == (
        100 * RATE,
        collateral(100),
        PARAMS.validator_share_bps,
    )


def test_4_pending_work_keeps_its_recorded_terms_across_a_change(ledger):
    """Work submitted just before the change applies: the new window, lock, share and
    collateral do not reach it (the window cannot be shrunk to settle it early nor grown
    to reopen it)."""
    w = ledger.register(ledger.worker, 3 * ETH)
    me = ledger.worker.address
    ledger.as_owner.propose_params(RUG)
    _, eta = ledger.as_owner.proposed_params()
    ledger.chain.advance_time(eta - ledger.chain.w3.eth.get_block("latest")["timestamp"] - 5)
    w.submit_work(key(1), 100, 0)
    ledger.chain.advance_time(10)
    ledger.as_owner.apply_params()
    s = w.submission(me, key(1))
    assert s.unlock_at - s.submitted_at == PARAMS.verdict_window + PARAMS.reward_lock
    ledger.chain.advance_time(RUG.verdict_window + 1)  # past the new, shorter window
    ledger.client(ledger.v1).accept(me, key(1))  # still within its own
    ledger.chain.advance_time(PARAMS.verdict_window + PARAMS.reward_lock)
    before = ledger.balance(ledger.worker)
    receipt = w.claim()
    assert ledger.balance(ledger.worker) == before + 100 * RATE - paid(receipt)
    assert w.worker(me).stake == 3 * ETH


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"validator_share_bps": 10_000}, "validator_share_bps above bound"),
        ({"collateral_bps": 5_000}, "collateral_bps out of bounds"),
        ({"max_units": 2**29}, "max_units out of bounds"),
        ({"reward_per_unit": 10**19}, "reward_per_unit above bound"),
        ({"unbonding_delay": 3600 + 3600}, "unbonding_delay too short"),
        ({"verdict_window": 10**8}, "verdict_window out of bounds"),
        ({"fetch_deadline": 3600}, "fetch_deadline must be in the window"),
        ({"quorum": 1}, "quorum out of bounds"),
        ({"min_stake": 0}, "min_stake is zero"),
        # recorded with each submission (issue #33): bounded so that it fits its word
        ({"min_stake": 10**24 + 1}, "min_stake above bound"),
        # a first verdict at t0 + W leaves the quorum at least an hour to overturn it
        ({"reward_lock": 3_599}, "reward_lock out of bounds"),
        ({"reward_lock": 30 * 86_400 + 1}, "reward_lock out of bounds"),
        ({"unbonding_delay": 180 * 86_400 + 1}, "unbonding_delay above bound"),
        ({"max_staleness": 10**6 + 1}, "max_staleness above bound"),
    ],
)
def test_4_parameters_have_hard_bounds(ledger, change, reason):
    with pytest.raises(LedgerRevert) as exc:
        ledger.as_owner.propose_params(replace(PARAMS, **change))
    assert exc.value.reason == reason


def test_4_removing_validators_while_work_is_pending_lets_no_false_verdict_stand(ledger):
    """The owner removes the honest validators while work is pending, so that an
    accomplice's false reject of honest work, or its accept of fraud, would stand (or removes
    them all to void the pending work). A removal takes effect only after the timelock, on
    work submitted from then on, so both verdicts are overturned and the pending work is
    still judged; with fewer than quorum + 1 validators left to vote on new work, none is
    taken; and a removed validator cannot be brought back (issue #33 has the rest)."""
    w = ledger.register(ledger.worker, 5 * ETH)
    me = ledger.worker.address
    w.submit_work(key(1), 100, 0)  # honest
    w.submit_work(key(2), 100, 0)  # fraud
    w.submit_work(key(3), 10, 0)  # honest, not judged yet
    accomplice = ledger.client(ledger.v1)
    accomplice.reject(me, key(1), "invalid")
    accomplice.accept(me, key(2))
    for v in (ledger.v2, ledger.v3):
        ledger.as_owner.remove_validator(v.address)
    for v in (ledger.v2, ledger.v3):
        ledger.client(v).accept(me, key(1))
        ledger.client(v).reject(me, key(2), "invalid")
    ledger.client(ledger.v2).accept(me, key(3))
    s1, s2 = w.submission(me, key(1)), w.submission(me, key(2))
    assert (s1.status, s1.final, s2.status, s2.final) == ("accepted", True, "rejected", True)

    with pytest.raises(LedgerRevert, match="fewer than quorum \\+ 1 validators"):
        w.submit_work(key(4), 10, 0)
    with pytest.raises(LedgerRevert, match="a removed validator cannot return"):
        ledger.as_owner.propose_validator(ledger.v2.address)

    ledger.mature()
    before = ledger.balance(ledger.worker)
    receipt = w.claim()
    assert ledger.balance(ledger.worker) == before + 110 * RATE - paid(receipt)
    assert w.worker(me).stake == 5 * ETH - collateral(100)  # the fraud's collateral only
    assert w.worker(ledger.v1.address).stake == VALIDATOR_BOND - collateral(100)  # bond burned


def test_4_ownership_moves_in_two_steps(ledger):
    owner, new = ledger.as_owner, ledger.client(ledger.stranger)
    owner.transfer_ownership(ledger.stranger.address)
    assert owner.owner() == ledger.owner.address  # not yet
    with pytest.raises(LedgerRevert, match="only the pending owner"):
        ledger.client(ledger.v1).accept_ownership()
    new.accept_ownership()
    assert owner.owner() == ledger.stranger.address
    with pytest.raises(LedgerRevert, match="only the owner"):
        owner.set_policy_version(1)
    new.set_policy_version(1)


# ---- 5. withdraw before the reject ------------------------------------------------


def test_5_stake_backing_pending_work_cannot_be_withdrawn_before_the_reject(ledger):
    w = ledger.register(ledger.worker, 2 * ETH)
    me = ledger.worker.address
    w.submit_work(key(1), 500, 0)  # collateral 1 ETH
    with pytest.raises(LedgerRevert, match="amount above free stake"):
        w.unbond(2 * ETH)
    w.unbond(ETH)  # the free part only
    assert PARAMS.unbonding_delay > PARAMS.verdict_window + PARAMS.reward_lock
    ledger.client(ledger.v1).reject(me, key(1), "invalid")
    ledger.mature()
    w.settle(me)
    ledger.chain.advance_time(PARAMS.unbonding_delay + 1)
    before = ledger.balance(ledger.worker)
    receipt = w.withdraw()
    assert ledger.balance(ledger.worker) == before + ETH - paid(receipt)
    info = w.worker(me)
    assert (info.stake, info.slashed) == (ETH - collateral(500), collateral(500))


# ---- 6. key squatting -------------------------------------------------------------


def test_6_a_squatted_work_key_neither_blocks_the_worker_nor_pays_the_squatter(ledger):
    w = ledger.register(ledger.worker, 2 * ETH)
    squatter = ledger.register(ledger.stranger, 2 * ETH)
    me, them = ledger.worker.address, ledger.stranger.address
    squatter.submit_work(key(7), 900, 0)  # front-runs the worker's key with inflated units
    w.submit_work(key(7), 10, 0)  # the worker's own submission still goes in
    assert w.submission(me, key(7)).units == 10
    v = ledger.client(ledger.v1)
    v.accept(me, key(7))
    v.reject(them, key(7), "mismatch")  # the batch names another worker and 10 units
    assert w.submission(them, key(7)).reason == 3
    ledger.mature()
    before = ledger.balance(ledger.worker)
    receipt = w.claim()
    assert ledger.balance(ledger.worker) == before + 10 * RATE - paid(receipt)
    squatter.settle(them)
    assert squatter.worker(them).stake == 2 * ETH - collateral(900)


# ---- 8. contract wallets ----------------------------------------------------------


@pytest.fixture(scope="module")
def wallet_artifact():
    """The test wallet, compiled with the vyper that compiles the ledger."""
    vyper = Path(sys.executable).parent / "vyper"
    out = subprocess.run(
        [str(vyper), "--evm-version", "cancun", "-f", "abi,bytecode", str(WALLET)],
        capture_output=True,
        text=True,
        check=True,
    )
    abi, bytecode = out.stdout.strip().split("\n")
    return json.loads(abi), bytecode.strip()


def test_8_a_contract_wallet_registers_claims_and_withdraws(ledger, wallet_artifact):
    """The wallet's receive function costs more than 2300 gas, so ``send`` would fail;
    payouts forward all gas."""
    from crypto.identity import Identity
    from ledger.client import LedgerClient

    w3 = ledger.chain.w3
    abi, bytecode = wallet_artifact
    owner = ledger.worker
    as_owner = LedgerClient(ledger.chain, ledger.address, owner)
    factory = w3.eth.contract(abi=abi, bytecode=bytecode)

    def transact(tx_fn, value=0):
        tx = tx_fn.build_transaction(
            {
                "from": owner.address,
                "value": value,
                "nonce": w3.eth.get_transaction_count(owner.address),
                "gas": 1_000_000,
                "chainId": ledger.chain.chain_id,
                "maxFeePerGas": 10**11,
                "maxPriorityFeePerGas": 10**9,
            }
        )
        h = w3.eth.send_raw_transaction(owner.sign_transaction(tx).raw_transaction)
        r = w3.eth.wait_for_transaction_receipt(h, poll_latency=0.01)
        assert r.status == 1
        return r

    receipt = transact(factory.constructor())
    wallet = w3.eth.contract(address=receipt.contractAddress, abi=abi)

    def encode(name, *args):
        return as_owner.contract.encode_abi(name, args=list(args))

    ident = Identity.generate()
    sig = ident.sign(registration_message(ledger.chain.chain_id, wallet.address))

    def call(fn: str, value=0):
        data = bytes.fromhex(fn[2:])
        return transact(wallet.functions.execute(ledger.address, value, data), value=value)

    call(encode("register", ident.public_bytes, sig), value=3 * ETH)
    assert as_owner.registration_valid(wallet.address)
    call(encode("submit_work", key(1), 100, 0))
    ledger.client(ledger.v1).accept(wallet.address, key(1))
    ledger.mature()
    held = w3.eth.get_balance(wallet.address)
    call(encode("claim", 256))
    assert w3.eth.get_balance(wallet.address) == held + 100 * RATE
    call(encode("unbond", 3 * ETH))
    ledger.chain.advance_time(PARAMS.unbonding_delay + 1)
    call(encode("withdraw"))
    assert w3.eth.get_balance(wallet.address) == held + 100 * RATE + 3 * ETH
    assert wallet.functions.deposits().call() == 2


# ---- 9. stale policy version ------------------------------------------------------


def test_9_work_on_a_stale_or_unpublished_policy_version_is_refused(ledger):
    w = ledger.register(ledger.worker, 2 * ETH)
    ledger.as_owner.set_policy_version(5)
    with pytest.raises(LedgerRevert, match="stale policy version"):
        w.submit_work(key(1), 10, 2)  # older than 5 - max_staleness
    with pytest.raises(LedgerRevert, match="policy version not published"):
        w.submit_work(key(1), 10, 6)
    w.submit_work(key(1), 10, 3)
    assert w.submission(ledger.worker.address, key(1)).policy_version == 3
    with pytest.raises(LedgerRevert, match="versions only go up"):
        ledger.as_owner.set_policy_version(5)


# ---- issue #33: the validator set and its bonds turned against honest workers -----------

GRACE = 86_400  # a due parameter proposal may be applied for this long, then it expires


def timelock(p: Params = PARAMS) -> int:
    return p.unbonding_delay + p.verdict_window + p.reward_lock + 3_600


def test_33_1_removing_the_honest_validators_leaves_no_work_to_an_accomplice(ledger):
    """The owner removes the two honest validators at once, so that its accomplice (v1)
    alone judges new work: a false reject of an honest worker's claim at max_units (25 ETH
    of stake down to 5) and Sybils' fraud would stand. Removal waits out the timelock (the
    removed validators keep their vote on work submitted until then), and no work is taken
    while fewer than quorum + 1 validators could vote on it."""
    w = ledger.register(ledger.worker, 25 * ETH)
    me = ledger.worker.address
    for v in (ledger.v2, ledger.v3):
        ledger.as_owner.remove_validator(v.address)
        assert ledger.as_owner.validator_until(v.address) == ledger.now() + timelock()
        assert ledger.as_owner.is_validator(v.address)  # of work submitted until then
    with pytest.raises(LedgerRevert, match="fewer than quorum \\+ 1 validators"):
        w.submit_work(key(1), PARAMS.max_units, 0)
    assert w.worker(me).locked == 0


def test_33_1_a_removal_waits_out_the_timelock(ledger):
    """Four validators; the owner removes an honest one and its accomplice rejects honest
    work submitted right after: the removed validator still votes on it (with the third it
    overturns the reject), and it loses its vote only on work submitted after the timelock."""
    run = type(ledger)(ledger.chain, extra_validators=1)
    w = run.register(run.worker, 25 * ETH)
    me = run.worker.address
    run.as_owner.remove_validator(run.v2.address)
    until = run.as_owner.validator_until(run.v2.address)
    assert until == run.now() + timelock()
    w.submit_work(key(1), PARAMS.max_units, 0)
    run.client(run.v1).reject(me, key(1), "invalid")  # the accomplice
    run.client(run.v2).accept(me, key(1))
    run.client(run.v3).accept(me, key(1))
    s = w.submission(me, key(1))
    assert (s.status, s.final) == ("accepted", True)
    run.chain.advance_time(until - run.now() + 1)
    w.claim()
    assert w.worker(me).stake == 25 * ETH
    v1 = run.client(run.v1)
    assert v1.worker(run.v1.address).stake < v1.validator_bond()  # its lie cost it its vote
    v1.add_stake(collateral(PARAMS.max_units))
    w.submit_work(key(2), 10, 0)  # v1, v3 and the fourth remain: quorum + 1
    with pytest.raises(LedgerRevert, match="not a validator when this work was submitted"):
        run.client(run.v2).accept(me, key(2))


def test_33_1_work_needs_quorum_plus_one_bonded_validators(ledger):
    w = ledger.register(ledger.worker, 5 * ETH)
    v3 = ledger.client(ledger.v3)
    v3.unbond(VALIDATOR_BOND - collateral(PARAMS.max_units) + 1)  # below the bond: no vote
    with pytest.raises(LedgerRevert, match="fewer than quorum \\+ 1 validators"):
        w.submit_work(key(1), 10, 0)
    v3.add_stake(ETH)
    w.submit_work(key(1), 10, 0)


def test_33_1_a_run_needs_quorum_plus_one_validators():
    from eth_account import Account

    from ledger.chain import connect
    from ledger.client import deploy

    chain = connect("embedded")
    owner, v1, v2 = (Account.from_key(chain.dev_keys[i]) for i in (0, 1, 4))
    with pytest.raises(LedgerRevert, match="fewer than quorum \\+ 1 validators"):
        deploy(chain, owner, PARAMS, [v1.address, v2.address])


def test_33_2_a_due_proposal_applied_after_a_false_reject_cannot_disable_the_overturn(ledger):
    """The owner proposes a min_stake above the honest validators' bonds and leaves it
    pending past its due time; its accomplice rejects honest work, then the proposal is
    applied: the submission keeps the bond it was made under, so the honest validators
    still overturn the reject."""
    w = ledger.register(ledger.worker, 25 * ETH)
    me = ledger.worker.address
    ledger.as_owner.propose_params(replace(PARAMS, min_stake=30 * ETH))
    _, eta = ledger.as_owner.proposed_params()
    ledger.chain.advance_time(eta - ledger.now())
    w.submit_work(key(1), PARAMS.max_units, 0)
    ledger.client(ledger.v1).reject(me, key(1), "invalid")
    ledger.as_owner.apply_params()
    assert ledger.as_owner.validator_bond() == 30 * ETH
    ledger.client(ledger.v2).accept(me, key(1))
    ledger.client(ledger.v3).accept(me, key(1))
    s = w.submission(me, key(1))
    assert (s.status, s.final) == ("accepted", True)


def test_33_2_a_proposal_not_applied_soon_after_it_is_due_expires(ledger):
    ledger.as_owner.propose_params(replace(PARAMS, min_stake=2 * ETH))
    _, eta = ledger.as_owner.proposed_params()
    ledger.chain.advance_time(eta - ledger.now() + GRACE + 1)
    with pytest.raises(LedgerRevert, match="proposal expired"):
        ledger.as_owner.apply_params()
    assert ledger.as_owner.params() == PARAMS


def test_33_3_selective_serving_does_not_burn_an_honest_validators_bond(ledger):
    """A worker serves v1 nothing (v1 rejects it, unavailable) and v2, v3 the batch (they
    overturn). The overturn used to burn v1's 20 ETH, leaving it no vote, and a Sybil's
    fraud accepted by a colluding v2 then stood. An unavailable reject locks and risks no
    bond (nor earns a share), so v1 keeps its bond and, with v3, overturns the fraud; and a
    validator re-checking accepted work (a lone reject vote) risks nothing either."""
    w = ledger.register(ledger.worker, 25 * ETH)
    me = ledger.worker.address
    w.submit_work(key(1), PARAMS.max_units - 10, 0)  # 19.98 ETH of collateral
    ledger.chain.advance_time(PARAMS.fetch_deadline)
    v1, v2, v3 = (ledger.client(v) for v in (ledger.v1, ledger.v2, ledger.v3))
    v1.reject(me, key(1), "unavailable")
    assert v1.worker(ledger.v1.address).locked == 0
    v2.accept(me, key(1))
    v3.accept(me, key(1))
    assert w.submission(me, key(1)).status == "accepted"
    assert v1.worker(ledger.v1.address).stake == VALIDATOR_BOND

    sybil = ledger.register(ledger.stranger, 25 * ETH)
    them = ledger.stranger.address
    sybil.submit_work(key(2), PARAMS.max_units, 0)
    v2.accept(them, key(2))  # colluding
    v1.reject(them, key(2), "invalid")
    v3.reject(them, key(2), "invalid")
    s = w.submission(them, key(2))
    assert (s.status, s.final) == ("rejected", True)
    w.submit_work(key(3), 10, 0)
    v2.accept(me, key(3))
    v3.reject(me, key(3), "invalid")  # a spot check that finds no quorum
    ledger.mature()
    w.claim()
    sybil.settle(them)
    assert w.worker(me).stake == 25 * ETH
    assert sybil.worker(them).stake == 25 * ETH - collateral(PARAMS.max_units)
    assert v3.worker(ledger.v3.address).stake == VALIDATOR_BOND


def test_33_3_an_unavailable_reject_that_stands_earns_the_rejecter_nothing(ledger):
    """So a false 'unavailable', which risks no bond, gains its validator nothing."""
    w = ledger.register(ledger.worker, 2 * ETH)
    me = ledger.worker.address
    w.submit_work(key(1), 100, 0)
    ledger.chain.advance_time(PARAMS.fetch_deadline)
    ledger.client(ledger.v1).reject(me, key(1), "unavailable")
    burned = w.total_burned()
    ledger.mature()
    w.settle(me)
    assert w.worker(me).stake == 2 * ETH - collateral(100)
    assert w.claimable(ledger.v1.address) == 0
    assert w.total_burned() == burned + collateral(100)


def squat(ledger, stake: int = 2 * ETH):
    """The stranger registers the worker-to-be's peer key with an invalid signature."""
    victim = Identity.generate()
    squatter = ledger.client(ledger.stranger)
    squatter.register(victim.public_bytes, bytes(64), stake)
    return squatter, victim


def test_33_4_a_squatter_cannot_reset_revocation_votes_by_rotating(ledger):
    squatter, victim = squat(ledger)
    them = ledger.stranger.address
    ledger.client(ledger.v1).revoke_registration(them)
    with pytest.raises(LedgerRevert, match="same peer key"):
        squatter.change_peer_key_signed(victim.public_bytes, bytes(64))
    other = Identity.generate()
    squatter.change_peer_key_signed(other.public_bytes, bytes(64))  # another invalid binding
    squatter.change_peer_key_signed(victim.public_bytes, bytes(64))  # and back
    ledger.client(ledger.v2).revoke_registration(them)  # the second vote: quorum
    assert not squatter.worker(them).registered


def test_33_4_a_revoked_squatter_pays_to_register_again(ledger):
    """Revoked, a squatter kept its stake and registered the key again at once; now each
    revocation burns min_stake of it, so every squat costs min_stake."""
    squatter, victim = squat(ledger, PARAMS.min_stake)
    them = ledger.stranger.address
    burned = squatter.total_burned()
    ledger.client(ledger.v1).revoke_registration(them)
    ledger.client(ledger.v2).revoke_registration(them)
    assert squatter.worker(them).stake == 0
    assert squatter.total_burned() == burned + PARAMS.min_stake
    with pytest.raises(LedgerRevert, match="stake below minimum"):
        squatter.register(victim.public_bytes, bytes(64), PARAMS.min_stake - 1)


def test_33_4_revocation_votes_need_the_bond(ledger):
    squat(ledger)
    v3 = ledger.client(ledger.v3)
    v3.unbond(VALIDATOR_BOND - collateral(PARAMS.max_units) + 1)
    with pytest.raises(LedgerRevert, match="validator stake below the validator bond"):
        v3.revoke_registration(ledger.stranger.address)


def sybils(ledger, n: int, stake: int) -> list:
    """``n`` fresh registered accounts, each funded by the owner."""
    from eth_account import Account

    out = []
    for _ in range(n):
        acct = Account.create()
        tx = {
            "to": acct.address,
            "value": stake + ETH,
            "nonce": ledger.chain.w3.eth.get_transaction_count(ledger.owner.address),
            "gas": 21_000,
            "chainId": ledger.chain.chain_id,
            "maxFeePerGas": 10**11,
            "maxPriorityFeePerGas": 10**9,
        }
        signed = ledger.owner.sign_transaction(tx)
        h = ledger.chain.w3.eth.send_raw_transaction(signed.raw_transaction)
        ledger.chain.w3.eth.wait_for_transaction_receipt(h, poll_latency=0.01)
        out.append((acct, ledger.register(acct, stake)))
    return out


def test_33_5_sybils_reserving_the_whole_pool_lose_k_times_it_per_cycle(ledger):
    """Ten accounts each reserve their tenth of the pool (all of it) with claims at
    max_units: the honest validators' bonds (25 ETH each) cover one such reject each, but a
    reject beyond the free bond goes in unbonded, so every claim is rejected and the Sybils
    lose k x the pool per cycle (SPEC section 19: 200 ETH for locking a 100 ETH pool for
    W + L), not what the validators' bonds happened to cover."""
    pool = ledger.as_owner.reward_pool()
    c = collateral(PARAMS.max_units)
    accounts = sybils(ledger, 10, c)
    for _, s in accounts:
        s.submit_work(key(1), PARAMS.max_units, 0)
    assert ledger.as_owner.reward_pool() == 0
    vs = [ledger.client(v) for v in (ledger.v1, ledger.v2, ledger.v3)]
    for i, (acct, _) in enumerate(accounts):
        vs[i % 3].reject(acct.address, key(1), "invalid")
    burned = ledger.as_owner.total_burned()
    ledger.mature()
    for acct, s in accounts:
        s.settle(acct.address)
        assert s.worker(acct.address).stake == 0
    assert ledger.as_owner.reward_pool() == pool
    share = sum(ledger.as_owner.claimable(v.address) for v in (ledger.v1, ledger.v2, ledger.v3))
    assert (
        share + ledger.as_owner.total_burned() - burned
        == 10 * c
        == PARAMS.collateral_bps * pool // 10_000
    )


def test_33_5_a_colluding_quorum_takes_at_most_a_tenth_of_the_pool_per_account(ledger):
    """v1 and v2 collude with two Sybil accounts: their fraud stands (v3 alone cannot
    overturn it) and pays at most a tenth of the funded pool per account per cycle."""
    pool = ledger.as_owner.reward_pool()
    accounts = sybils(ledger, 2, 2 * collateral(PARAMS.max_units))
    for acct, s in accounts:
        s.submit_work(key(1), PARAMS.max_units, 0)
        with pytest.raises(LedgerRevert, match="above its share of the pool"):
            s.submit_work(key(2), 1, 0)
        ledger.client(ledger.v1).accept(acct.address, key(1))
        ledger.client(ledger.v3).reject(acct.address, key(1), "invalid")
    ledger.mature()
    for _, s in accounts:
        s.claim()
    assert pool - ledger.as_owner.reward_pool() == 2 * pool // 10


def test_33_6_submit_work_costs_at_most_160k_gas(ledger):
    w = ledger.register(ledger.worker, 5 * ETH)
    first = w.submit_work(key(1), 64, 0).gasUsed
    second = w.submit_work(key(2), 64, 0).gasUsed
    assert max(first, second) <= 160_000, (first, second)
