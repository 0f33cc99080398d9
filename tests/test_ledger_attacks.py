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

from ledger.client import LedgerRevert, Params
from ledger.registration import registration_message
from tests.ledger_fixtures import (  # noqa: F401
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
    them all to void the pending work). The validators of a submission are those active when
    it was made and they keep their votes on it: both verdicts are overturned and the pending
    work is still judged; removed validators have no vote on work submitted afterwards, and
    cannot be brought back."""
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
        assert not ledger.as_owner.is_validator(v.address)
    for v in (ledger.v2, ledger.v3):
        ledger.client(v).accept(me, key(1))
        ledger.client(v).reject(me, key(2), "invalid")
    ledger.client(ledger.v2).accept(me, key(3))
    s1, s2 = w.submission(me, key(1)), w.submission(me, key(2))
    assert (s1.status, s1.final, s2.status, s2.final) == ("accepted", True, "rejected", True)

    ledger.chain.advance_time(1)  # (work submitted in the second of the removal keeps them)
    w.submit_work(key(4), 10, 0)  # after the removal: v2 and v3 have no say on it
    with pytest.raises(LedgerRevert, match="not a validator when this work was submitted"):
        ledger.client(ledger.v2).accept(me, key(4))
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
