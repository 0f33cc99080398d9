"""The WorkLedger contract and its client on a real EVM: life cycle, access control,
registration. Attacks are in test_ledger_attacks.py, client failure paths in
test_ledger_client.py; every test taking ``ledger`` runs on the embedded chain, the served
chain and anvil."""

import pytest
from eth_account import Account

from crypto.identity import Identity
from ledger.build import compile_contract, load_artifact
from ledger.chain import decode_revert_data
from ledger.client import LedgerClient, LedgerError, LedgerRevert
from ledger.registration import registration_message, verify_registration
from tests.helpers.ledger import ETH, PARAMS, key, ledger_fixture, paid  # noqa: F401

RATE = PARAMS.reward_per_unit


def collateral(units: int) -> int:
    return units * RATE * PARAMS.collateral_bps // 10_000


def test_artifact_is_what_the_source_compiles_to():
    assert compile_contract() == load_artifact()


def test_full_life_cycle(ledger):
    w = ledger.register(ledger.worker, 5 * ETH)
    v1, v2 = ledger.client(ledger.v1), ledger.client(ledger.v2)
    me = ledger.worker.address
    info = w.worker(me)
    assert info.registered and info.stake == 5 * ETH and info.locked == 0
    assert info.peer_key == ledger.identities[me].public_bytes

    pool = w.reward_pool()
    w.submit_work(key(1), 100, 0)  # accepted
    w.submit_work(key(2), 50, 0)  # rejected
    w.submit_work(key(3), 10, 0)  # never judged
    s = w.submission(me, key(1))
    assert (s.units, s.policy_version, s.status, s.reward, s.collateral) == (
        100,
        0,
        "pending",
        100 * RATE,
        collateral(100),
    )
    assert s.unlock_at == s.submitted_at + PARAMS.verdict_window + PARAMS.reward_lock
    assert w.reward_pool() == pool - 160 * RATE  # reserved at submission
    assert w.worker(me).locked == collateral(160)

    v1.accept(me, key(1))
    v2.reject(me, key(2), "invalid")
    assert w.submission(me, key(1)).status == "accepted"
    assert w.submission(me, key(2)).status == "rejected"
    assert w.pending(me) == 100 * RATE and w.claimable(me) == 0
    assert w.worker(ledger.v2.address).locked == collateral(50)  # v2's bond answers for it
    with pytest.raises(LedgerRevert, match="nothing to claim"):
        w.claim()

    ledger.mature()
    assert w.matured(me) == 3 and w.claimable(me) == 100 * RATE
    burned, held = w.total_burned(), ledger.balance(ledger.address)
    before = ledger.balance(ledger.worker)
    receipt = w.claim()
    assert ledger.balance(ledger.worker) == before + 100 * RATE - paid(receipt)
    # the reject: exactly key 2's collateral leaves the stake, a quarter to v2, the rest burned
    slash = collateral(50)
    share = slash * PARAMS.validator_share_bps // 10_000
    info = w.worker(me)
    assert (info.stake, info.locked, info.slashed) == (5 * ETH - slash, 0, slash)
    assert w.total_burned() == burned + slash - share
    # the contract paid the reward and sent the burned part away; v2's share stays as credit
    assert ledger.balance(ledger.address) == held - 100 * RATE - (slash - share)
    assert w.reward_pool() == pool - 100 * RATE  # key 2's and key 3's rewards went back
    assert w.worker(ledger.v2.address).locked == 0
    assert w.claimable(ledger.v2.address) == share
    (claimed,) = w.events("Claimed", receipt)
    assert (claimed.args.reward, claimed.args.credit) == (100 * RATE, 0)
    (slashed,) = w.events("Slashed", receipt)
    assert (slashed.args.stake, slashed.args.validator_share, slashed.args.burned) == (
        slash,
        share,
        slash - share,
    )

    before = ledger.balance(ledger.v2)
    receipt = v2.claim()
    assert ledger.balance(ledger.v2) == before + share - paid(receipt)
    (claimed,) = w.events("Claimed", receipt)
    assert (claimed.args.reward, claimed.args.credit) == (0, share)

    w.unbond(3 * ETH)
    info = w.worker(me)
    assert (info.stake, info.unbonding) == (2 * ETH - slash, 3 * ETH)
    with pytest.raises(LedgerRevert, match="unbonding delay not over"):
        w.withdraw()
    ledger.chain.advance_time(PARAMS.unbonding_delay + 1)
    before = ledger.balance(ledger.worker)
    receipt = w.withdraw()
    assert ledger.balance(ledger.worker) == before + 3 * ETH - paid(receipt)
    assert w.worker(me).unbonding == 0


@pytest.mark.parametrize(
    ("who", "call", "reason"),
    [
        ("stranger", lambda c, L: c.reject(L.worker.address, key(1)), "only a validator"),
        ("worker", lambda c, L: c.accept(L.worker.address, key(1)), "only a validator"),
        ("stranger", lambda c, L: c.propose_validator(L.stranger.address), "only the owner"),
        ("v1", lambda c, L: c.propose_params(PARAMS), "only the owner"),
        ("v1", lambda c, L: c.set_policy_version(9), "only the owner"),
        ("stranger", lambda c, L: c.accept_ownership(), "only the pending owner"),
        # (the client's submit_work takes a key already there as done: the contract refuses)
        (
            "worker",
            lambda c, L: c.tx.transact("submit_work", key(1), 5, 0),
            "work key already submitted",
        ),
        ("worker", lambda c, L: c.submit_work(key(7), 0, 0), "zero units"),
        ("stranger", lambda c, L: c.submit_work(key(8), 5, 0), "not a registered worker"),
        ("stranger", lambda c, L: c.register(bytes(32), bytes(64), ETH), "empty peer key"),
        (
            "stranger",
            lambda c, L: c.register(b"\1" * 32, bytes(64), ETH // 2),
            "stake below minimum",
        ),
        ("worker", lambda c, L: c.register(b"\1" * 32, bytes(64), 2 * ETH), "already registered"),
        ("stranger", lambda c, L: c.claim(), "nothing to claim"),
        ("stranger", lambda c, L: c.settle(L.worker.address), "nothing to settle"),
        ("worker", lambda c, L: c.withdraw(), "nothing unbonding"),
        ("worker", lambda c, L: c.unbond(100 * ETH), "amount above free stake"),
        ("v1", lambda c, L: c.accept(L.worker.address, key(404)), "no such work"),
        (
            "v1",
            lambda c, L: c.reject(L.worker.address, key(1), "unavailable"),
            "fetch deadline not reached",
        ),
        ("stranger", lambda c, L: c.apply_params(), "no proposal"),
    ],
)
def test_access_control_and_bad_input_revert_and_change_nothing(ledger, who, call, reason):
    w = ledger.register(ledger.worker, 2 * ETH)
    w.submit_work(key(1), 5, 0)
    chain = ledger.chain
    me = ledger.worker.address

    def snapshot():
        return {
            "worker": w.worker(me),
            "submission": w.submission(me, key(1)),
            "pool": w.reward_pool(),
            "validator": w.is_validator(ledger.stranger.address),
            "params": w.params(),
            "owner": w.owner(),
            "block": chain.w3.eth.block_number,
        }

    before = snapshot()
    with pytest.raises(LedgerRevert) as exc:
        call(ledger.client(getattr(ledger, who)), ledger)
    assert exc.value.reason == reason
    assert snapshot() == before  # nothing was even sent


def test_registration_stores_a_signature_that_nodes_check_and_binds_a_peer_key_once(ledger):
    w = ledger.register(ledger.worker, 2 * ETH)
    me, chain_id = ledger.worker.address, ledger.chain.chain_id
    ident = ledger.identities[me]
    peer_key, signature = w.registration(me)
    assert peer_key == ident.public_bytes
    assert verify_registration(peer_key, signature, chain_id, me)
    assert not verify_registration(peer_key, signature, chain_id + 1, me)  # another chain
    assert not verify_registration(peer_key, signature, chain_id, ledger.stranger.address)
    assert w.registration_valid(me)

    # the same peer key for another account: refused, whatever the signature
    s = ledger.client(ledger.stranger)
    with pytest.raises(LedgerRevert, match="peer key registered by another account"):
        s.register(ident.public_bytes, ident.sign(registration_message(chain_id, me)), 2 * ETH)

    # a registration with a forged signature is stored (the EVM cannot check Ed25519), but
    # every node sees it is invalid, and a quorum of validators frees the key
    victim = Identity.generate()
    s.register(victim.public_bytes, bytes(64), 2 * ETH)
    assert not s.registration_valid(ledger.stranger.address)
    ledger.client(ledger.v1).revoke_registration(ledger.stranger.address)
    assert s.worker(ledger.stranger.address).registered  # one vote of two
    with pytest.raises(LedgerRevert, match="already voted to revoke"):
        ledger.client(ledger.v1).revoke_registration(ledger.stranger.address)
    ledger.client(ledger.v2).revoke_registration(ledger.stranger.address)
    assert not s.worker(ledger.stranger.address).registered
    # the stake stays, withdrawable, less min_stake burned: a squat costs its squatter
    assert s.worker(ledger.stranger.address).stake == 2 * ETH - PARAMS.min_stake
    holder = LedgerClient(ledger.chain, ledger.address, Account.from_key(ledger.chain.dev_keys[6]))
    holder.register_identity(victim, 2 * ETH)  # the key's real holder registers it now
    assert holder.registration_valid(holder.address)

    # rotation frees the old key
    new = Identity.generate()
    w.change_peer_key(new)
    assert w.registration(me)[0] == new.public_bytes and w.registration_valid(me)
    ledger.client(ledger.stranger).register_identity(ident, 0)  # the old key is free again


def test_one_validator_alone_cannot_revoke_a_valid_registration_nor_hand_its_key_over(ledger):
    """Issue #10 review, finding 5: a single (rogue) validator revokes a worker's valid
    registration so that a squatter takes its peer key. It takes a quorum of validators;
    one vote leaves the worker registered and its key bound to it."""
    w = ledger.register(ledger.worker, 2 * ETH)
    me = ledger.worker.address
    peer_key = ledger.identities[me].public_bytes
    ledger.client(ledger.v1).revoke_registration(me)  # a rogue validator
    assert w.registration(me)[0] == peer_key and w.registration_valid(me)
    squatter = ledger.client(ledger.stranger)
    with pytest.raises(LedgerRevert, match="peer key registered by another account"):
        squatter.register(peer_key, bytes(64), 2 * ETH)
    w.submit_work(key(1), 5, 0)  # still a worker
    # votes outlive a rotation (issue #33: a squatter reset them by rotating), so the
    # rogue's vote still counts: a second validator's vote is a quorum
    new = Identity.generate()
    w.change_peer_key(new)
    assert w.registration(me)[0] == new.public_bytes
    ledger.client(ledger.v2).revoke_registration(me)
    assert not w.worker(me).registered


def test_revert_data_decoding():
    data = (
        "0x08c379a0" + "20".rjust(64, "0") + "09".rjust(64, "0") + b"not owner".hex().ljust(64, "0")
    )
    assert decode_revert_data(data) == "not owner"
    assert decode_revert_data("0x4e487b71" + "11".rjust(64, "0")) == "panic 0x11"
    assert decode_revert_data("0xdeadbeef") is None
    assert decode_revert_data("nonsense") is None


def test_several_transactions_in_flight_get_consecutive_nonces(ledger):
    w = ledger.register(ledger.worker, 2 * ETH)
    receipts = w.submit_work_many([(key(100 + i), 1 + i, 0) for i in range(12)])
    assert all(r.status == 1 for r in receipts)
    me = ledger.worker.address
    assert [w.submission(me, key(100 + i)).units for i in range(12)] == [1 + i for i in range(12)]
    w.submit_work(key(200), 1, 0)  # the local nonce counter is still right afterwards


def test_refuses_to_sign_for_another_chain(ledger):
    wrong = ledger.client(ledger.worker, expected_chain_id=ledger.chain.chain_id + 1)
    with pytest.raises(LedgerError, match="config says"):
        wrong.add_stake(2 * ETH)
    assert ledger.client(ledger.worker).worker(ledger.worker.address).stake == 0


def test_an_unfunded_account_gets_one_clear_line(ledger):
    poor = Account.create()
    c = ledger.client(poor)
    with pytest.raises(LedgerError) as exc:
        c.register_identity(Identity.generate(), 2 * ETH)
    msg = str(exc.value)
    assert "\n" not in msg and "Traceback" not in msg
    assert poor.address in msg and "has 0 ETH" in msg and "needs up to 2.0" in msg
    assert f"intellect-node chain fund {poor.address}" in msg
    assert ledger.chain.w3.eth.get_transaction_count(poor.address) == 0


def test_transient_rpc_failures_are_retried_then_reported(monkeypatch):
    from ledger import client as client_module
    from ledger import records

    monkeypatch.setattr(records.time, "sleep", lambda s: None)  # retry's pause, where it lives
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("connection refused")
        return "ok"

    assert client_module._retry(flaky) == "ok" and len(calls) == 3

    # refused: asked three times; accepted and not answered: once (asking again only
    # triples the wait)
    for error, said, tries in (
        (ConnectionRefusedError("connection refused"), "unreachable after 3 tries", 3),
        (TimeoutError("timed out"), "did not answer in time", 1),
    ):

        def fails(error=error):
            calls.append(1)
            raise error

        calls.clear()
        with pytest.raises(client_module.LedgerError, match=said):
            client_module._retry(fails)
        assert len(calls) == tries


def test_the_validators_registration_cache_follows_the_chains_registration_events(ledger):
    """A validator reads a worker's registration once and keeps it until the chain logs a
    change (rotation, a new registration, a revocation), which its submission watcher reads
    in the same poll as the submissions, before it hands them out; the trainer's watcher
    reads submissions and votes in chain order, in one read."""
    from node.roles.io.chain import Registrations, SubmissionWatcher, WorkWatcher

    w = ledger.register(ledger.worker, 2 * ETH)
    me = ledger.worker.address
    old = ledger.identities[me]
    v = ledger.client(ledger.v1)
    regs = Registrations(v)
    watcher = SubmissionWatcher(v, ledger.block, registrations=regs)
    assert watcher.poll() == []
    assert regs.get(me) == (old.public_bytes, True) and regs.reads == 1
    assert regs.get(me.lower()) == (old.public_bytes, True) and regs.reads == 1  # kept

    new = Identity.generate()
    w.change_peer_key(new)  # the rotation, then work signed with the new key
    w.submit_work(key(1), 10, 0)
    assert regs.get(me)[0] == old.public_bytes  # not read again before the chain says so
    (sub,) = watcher.poll()
    assert (sub.worker, sub.key, sub.units) == (me.lower(), key(1), 10)
    assert regs.get(me) == (new.public_bytes, True) and regs.reads == 2  # as new as the work

    # a forged registration is stored but invalid; revoked by a quorum, it is gone
    s = ledger.client(ledger.stranger)
    s.register(Identity.generate().public_bytes, bytes(64), 2 * ETH)
    watcher.poll()
    assert regs.get(ledger.stranger.address)[1] is False
    ledger.client(ledger.v1).revoke_registration(ledger.stranger.address)
    ledger.client(ledger.v2).revoke_registration(ledger.stranger.address)
    watcher.poll()
    assert regs.get(ledger.stranger.address) == (bytes(32), False)

    v.accept(me, key(1))
    trainer = WorkWatcher(v, ledger.block)
    subs, rulings = trainer.poll_work()
    assert [x.key for x in subs] == [key(1)]
    assert [(r.key, r.verdict.accepted) for r in rulings] == [((me.lower(), key(1)), True)]
    assert trainer.poll_work() == ([], [])


def test_a_submission_is_judged_against_the_registration_as_of_its_block(ledger):
    """Issue #54: a worker submits, rotates its peer key, and serves a validator that judges
    after the rotation a batch signed with the new key, the others one signed with the old.
    Every validator judges against the registration as of the submission's block (read from
    the chain as it stood then once a change came after it), so all agree, whatever the
    order; work submitted after the rotation is judged against the new key."""
    from node.roles.io.chain import Registrations, SubmissionWatcher

    w = ledger.register(ledger.worker, 2 * ETH)
    me = ledger.worker.address
    old = ledger.identities[me]
    regs = Registrations(ledger.client(ledger.v1))
    watcher = SubmissionWatcher(ledger.client(ledger.v1), ledger.block, registrations=regs)
    w.submit_work(key(1), 10, 0)
    new = Identity.generate()
    w.change_peer_key(new)
    w.submit_work(key(2), 10, 0)
    first, second = watcher.poll()  # the rotation logged between them, read in this poll
    assert first.block < second.block
    assert regs.get(me, first.block) == (old.public_bytes, True)  # as it stood then
    assert regs.get(me, second.block) == (new.public_bytes, True)
    assert regs.get(me) == (new.public_bytes, True)
    reads = regs.reads
    assert regs.get(me, second.block) == (new.public_bytes, True) and regs.reads == reads  # kept
    # a validator that has not polled the rotation yet still reads the key as of the block
    fresh = Registrations(ledger.client(ledger.v2))
    assert fresh.get(me, first.block) == (old.public_bytes, True)
