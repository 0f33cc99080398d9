# pragma version 0.4.3
# pragma evm-version cancun
"""
@title intellect-node work ledger
@notice Stake, work submission, validator verdicts, slashing and rewards for one run.

The economic rules (SPEC.md section 12 has the arithmetic):
- Every submission reserves its reward (units x reward_per_unit, units <= max_units) from
  the pool and locks collateral = reward x collateral_bps / 10000 (at least the reward) of
  the worker's stake until it is settled, so a worker's unsettled claims are bounded by its
  stake (and by a tenth of the funded pool), and locked stake can be neither unbonded nor
  withdrawn.
- Work is paid only if a validator accepted it (an accept attests that the batch was
  fetched and matches its key and units); work nobody judged is never paid. A reject
  slashes exactly that submission's collateral at maturity: validator_share_bps of it to
  the rejecting validator, the rest burned.
- A submission matures at submitted_at + verdict_window + reward_lock (all recorded at
  submission, like every other term; reward_lock >= 1 h). The first verdict comes within
  the window; until maturity a quorum of other validators can overturn it (a reject that is
  the first verdict locks the same amount of the rejecting validator's bond, burned if it is
  overturned). A validator votes only while its stake covers the largest collateral.
- The validators of a submission are those active when it was made: they keep their votes
  on it if the owner removes them later, and validators added later have none.
- Parameters and new validators take effect only after a timelock longer than
  unbonding_delay + verdict_window + reward_lock, within hard bounds; ownership moves in
  two steps. Work keys live under (worker, key). Payouts forward all gas. A registration
  is revoked only by a quorum of validators.
"""

BPS: constant(uint256) = 10000
MAX_CLAIM: constant(uint256) = 256
MAX_SCAN: constant(uint256) = 4096
MAX_INITIAL_VALIDATORS: constant(uint256) = 16

# hard bounds on the parameters, whatever the owner proposes
MAX_UNITS_CAP: constant(uint256) = 268435456  # 2**28: 256 groups x 64 samples x 16384 tokens
MAX_REWARD_PER_UNIT: constant(uint256) = 10**18
MIN_COLLATERAL_BPS: constant(uint256) = 10000  # collateral is at least the reward
MAX_COLLATERAL_BPS: constant(uint256) = 100000
MAX_VALIDATOR_SHARE_BPS: constant(uint256) = 5000
MAX_PERIOD: constant(uint256) = 2592000  # 30 days: verdict window, reward lock
MAX_UNBONDING_DELAY: constant(uint256) = 15552000  # 180 days
MIN_REWARD_LOCK: constant(uint256) = 3600  # the quorum's time after a last-second verdict
MAX_RESERVE_BPS: constant(uint256) = 1000  # one worker reserves at most 10 % of the pool
UNBONDING_MARGIN: constant(uint256) = 3600  # unbonding_delay >= window + lock + this
TIMELOCK_MARGIN: constant(uint256) = 3600
MAX_STALENESS: constant(uint256) = 1000000
MIN_QUORUM: constant(uint256) = 2
MAX_QUORUM: constant(uint256) = 16

STATUS_PENDING: constant(uint256) = 1
STATUS_ACCEPTED: constant(uint256) = 2
STATUS_REJECTED: constant(uint256) = 3

REASON_INVALID: constant(uint256) = 1  # a proof, sampling, reward or assignment check failed
REASON_UNAVAILABLE: constant(uint256) = 2  # the batch was not served before the fetch deadline
REASON_MISMATCH: constant(uint256) = 3  # the batch's worker or units differ from the submission

# one submission's terms, packed in one word (bit offset, width)
UNITS_AT: constant(uint256) = 0  # 32
VERSION_AT: constant(uint256) = 32  # 48
T0_AT: constant(uint256) = 80  # 40
WINDOW_AT: constant(uint256) = 120  # 32
LOCK_AT: constant(uint256) = 152  # 32
FETCH_AT: constant(uint256) = 184  # 32
SHARE_AT: constant(uint256) = 216  # 14
STATUS_AT: constant(uint256) = 230  # 2
FINAL_AT: constant(uint256) = 232  # 1
QUORUM_AT: constant(uint256) = 233  # 5
BONDED_AT: constant(uint256) = 238  # 1: the first rejecter's bond is locked on it
M32: constant(uint256) = 2**32 - 1
M40: constant(uint256) = 2**40 - 1
M48: constant(uint256) = 2**48 - 1
M64: constant(uint256) = 2**64 - 1
M128: constant(uint256) = 2**128 - 1


struct Params:
    min_stake: uint256
    reward_per_unit: uint256
    max_units: uint256
    collateral_bps: uint256
    validator_share_bps: uint256
    verdict_window: uint256
    fetch_deadline: uint256
    reward_lock: uint256
    unbonding_delay: uint256
    max_staleness: uint256
    quorum: uint256

struct Account:
    peer_key: bytes32
    stake: uint256
    locked: uint256
    unbonding: uint256
    unbond_at: uint256
    accepted: uint256
    rejected: uint256
    slashed: uint256

struct Submission:
    index: uint256
    units: uint256
    policy_version: uint256
    submitted_at: uint256
    fetch_after: uint256
    verdict_until: uint256
    unlock_at: uint256
    reward: uint256
    collateral: uint256
    validator_share_bps: uint256
    quorum: uint256
    status: uint256
    final: bool
    settled: bool
    reason: uint256
    rejecter: address
    accept_votes: uint256
    reject_votes: uint256


event ParamsProposed:
    eta: uint256
    params: Params

event ParamsSet:
    params: Params

event ParamsCancelled:
    eta: uint256

event OwnershipTransferStarted:
    owner: indexed(address)
    pending_owner: indexed(address)

event OwnershipTransferred:
    previous_owner: indexed(address)
    owner: indexed(address)

event ValidatorProposed:
    validator: indexed(address)
    active_at: uint256

event ValidatorRemoved:
    validator: indexed(address)
    removed_at: uint256

event PolicyVersion:
    version: uint256

event Funded:
    sender: indexed(address)
    amount: uint256

event Registered:
    worker: indexed(address)
    peer_key: bytes32
    stake: uint256
    signature: Bytes[64]

event PeerKeyChanged:
    worker: indexed(address)
    old_peer_key: bytes32
    peer_key: bytes32
    signature: Bytes[64]

event RevocationVoted:
    worker: indexed(address)
    peer_key: bytes32
    validator: indexed(address)
    votes: uint256

event RegistrationRevoked:
    worker: indexed(address)
    peer_key: bytes32
    validator: indexed(address)

event StakeAdded:
    account: indexed(address)
    amount: uint256

event WorkSubmitted:
    worker: indexed(address)
    key: indexed(bytes32)
    index: uint256
    units: uint256
    policy_version: uint256
    reward: uint256
    collateral: uint256
    unlock_at: uint256

event WorkAccepted:
    worker: indexed(address)
    key: indexed(bytes32)
    validator: indexed(address)
    status: uint256
    final: bool

event WorkRejected:
    worker: indexed(address)
    key: indexed(bytes32)
    validator: indexed(address)
    reason: uint256
    status: uint256
    final: bool

event RejectOverturned:
    worker: indexed(address)
    key: indexed(bytes32)
    validator: indexed(address)
    burned_bond: uint256

event Slashed:
    worker: indexed(address)
    index: uint256
    validator: indexed(address)
    stake: uint256
    validator_share: uint256
    burned: uint256

event Settled:
    worker: indexed(address)
    entries: uint256
    reward: uint256
    unpaid: uint256
    slashed_stake: uint256
    burned: uint256

event Claimed:
    account: indexed(address)
    reward: uint256
    credit: uint256
    total: uint256

event Unbonded:
    account: indexed(address)
    stake: uint256
    withdrawable_at: uint256

event Withdrawn:
    account: indexed(address)
    unbonded_stake: uint256


owner: public(address)
pending_owner: public(address)
# since | until << 64: active from ``since`` (0: never a validator) for work submitted
# up to ``until`` (0: not removed)
validator_terms: HashMap[address, uint256]
policy_version: public(uint256)

min_stake: public(uint256)
reward_per_unit: public(uint256)
max_units: public(uint256)
collateral_bps: public(uint256)
validator_share_bps: public(uint256)
verdict_window: public(uint256)
fetch_deadline: public(uint256)
reward_lock: public(uint256)
unbonding_delay: public(uint256)
max_staleness: public(uint256)
quorum: public(uint256)
validator_bond: public(uint256)  # max(min_stake, the largest collateral): needed to vote
proposed: Params
params_eta: public(uint256)  # 0: no proposal

reward_pool: public(uint256)  # unreserved
reserved: public(HashMap[address, uint256])  # rewards of a worker's unsettled submissions
total_reserved: public(uint256)
total_burned: public(uint256)
accounts: HashMap[address, Account]
peer_owner: public(HashMap[bytes32, address])
signatures: public(HashMap[address, Bytes[64]])
registration_id: public(HashMap[address, uint256])  # counts an account's bindings
revoke_votes: public(HashMap[address, HashMap[uint256, uint256]])  # by registration_id
revoke_voted: HashMap[address, HashMap[uint256, HashMap[address, bool]]]
rewards_due: public(HashMap[address, uint256])  # settled, accepted work
credit: public(HashMap[address, uint256])  # validator shares of final slashes

# per-worker FIFO of submissions [head, tail), settled in order
index_of: HashMap[address, HashMap[bytes32, uint256]]  # index + 1
terms: HashMap[address, HashMap[uint256, uint256]]
amounts: HashMap[address, HashMap[uint256, uint256]]  # reward | collateral << 128
rejecters: HashMap[address, HashMap[uint256, address]]
tallies: HashMap[address, HashMap[uint256, uint256]]  # accepts | rejects << 8 | reason << 16
voted: HashMap[address, HashMap[uint256, HashMap[address, bool]]]
head: public(HashMap[address, uint256])
tail: public(HashMap[address, uint256])


@deploy
def __init__(p: Params, validators: DynArray[address, MAX_INITIAL_VALIDATORS]):
    self.owner = msg.sender
    self._check_params(p)
    self._apply(p)
    for v: address in validators:
        assert v != empty(address), "zero address"
        assert self.validator_terms[v] == 0, "duplicate validator"
        self.validator_terms[v] = block.timestamp
        log ValidatorProposed(validator=v, active_at=block.timestamp)


# ---- parameters and owner ---------------------------------------------------------


@pure
@internal
def _check_params(p: Params):
    assert p.min_stake > 0, "min_stake is zero"
    assert p.reward_per_unit <= MAX_REWARD_PER_UNIT, "reward_per_unit above bound"
    assert p.max_units > 0 and p.max_units <= MAX_UNITS_CAP, "max_units out of bounds"
    assert p.collateral_bps >= MIN_COLLATERAL_BPS and p.collateral_bps <= MAX_COLLATERAL_BPS, "collateral_bps out of bounds"
    assert p.validator_share_bps <= MAX_VALIDATOR_SHARE_BPS, "validator_share_bps above bound"
    assert p.verdict_window > 0 and p.verdict_window <= MAX_PERIOD, "verdict_window out of bounds"
    assert p.fetch_deadline > 0 and p.fetch_deadline < p.verdict_window, "fetch_deadline must be in the window"
    assert p.reward_lock >= MIN_REWARD_LOCK and p.reward_lock <= MAX_PERIOD, "reward_lock out of bounds"
    assert p.unbonding_delay >= p.verdict_window + p.reward_lock + UNBONDING_MARGIN, "unbonding_delay too short"
    assert p.unbonding_delay <= MAX_UNBONDING_DELAY, "unbonding_delay above bound"
    assert p.max_staleness <= MAX_STALENESS, "max_staleness above bound"
    assert p.quorum >= MIN_QUORUM and p.quorum <= MAX_QUORUM, "quorum out of bounds"


@internal
def _apply(p: Params):
    self.min_stake = p.min_stake
    self.reward_per_unit = p.reward_per_unit
    self.max_units = p.max_units
    self.collateral_bps = p.collateral_bps
    self.validator_share_bps = p.validator_share_bps
    self.verdict_window = p.verdict_window
    self.fetch_deadline = p.fetch_deadline
    self.reward_lock = p.reward_lock
    self.unbonding_delay = p.unbonding_delay
    self.max_staleness = p.max_staleness
    self.quorum = p.quorum
    self.validator_bond = max(p.min_stake, p.max_units * p.reward_per_unit * p.collateral_bps // BPS)
    log ParamsSet(params=p)


@view
@internal
def _current() -> Params:
    return Params(
        min_stake=self.min_stake,
        reward_per_unit=self.reward_per_unit,
        max_units=self.max_units,
        collateral_bps=self.collateral_bps,
        validator_share_bps=self.validator_share_bps,
        verdict_window=self.verdict_window,
        fetch_deadline=self.fetch_deadline,
        reward_lock=self.reward_lock,
        unbonding_delay=self.unbonding_delay,
        max_staleness=self.max_staleness,
        quorum=self.quorum,
    )


@view
@internal
def _timelock() -> uint256:
    """Longer than any stake can take to leave: maturity plus unbonding."""
    return self.unbonding_delay + self.verdict_window + self.reward_lock + TIMELOCK_MARGIN


@view
@external
def params() -> Params:
    return self._current()


@view
@external
def proposed_params() -> Params:
    return self.proposed


@view
@external
def timelock() -> uint256:
    return self._timelock()


@internal
def _only_owner():
    assert msg.sender == self.owner, "only the owner"


@external
def propose_params(p: Params):
    self._only_owner()
    self._check_params(p)
    delay: uint256 = max(self._timelock(), p.unbonding_delay + p.verdict_window + p.reward_lock + TIMELOCK_MARGIN)
    self.proposed = p
    self.params_eta = block.timestamp + delay
    log ParamsProposed(eta=block.timestamp + delay, params=p)


@external
def apply_params():
    eta: uint256 = self.params_eta
    assert eta != 0, "no proposal"
    assert block.timestamp >= eta, "timelock not over"
    self.params_eta = 0
    self._apply(self.proposed)


@external
def cancel_params():
    self._only_owner()
    assert self.params_eta != 0, "no proposal"
    log ParamsCancelled(eta=self.params_eta)
    self.params_eta = 0


@external
def transfer_ownership(new_owner: address):
    self._only_owner()
    self.pending_owner = new_owner
    log OwnershipTransferStarted(owner=msg.sender, pending_owner=new_owner)


@external
def accept_ownership():
    assert msg.sender == self.pending_owner, "only the pending owner"
    log OwnershipTransferred(previous_owner=self.owner, owner=msg.sender)
    self.owner = msg.sender
    self.pending_owner = empty(address)


@external
def propose_validator(validator: address):
    self._only_owner()
    assert validator != empty(address), "zero address"
    terms: uint256 = self.validator_terms[validator]
    assert terms >> 64 == 0, "a removed validator cannot return"
    assert terms == 0, "already a validator"
    active_at: uint256 = block.timestamp + self._timelock()
    self.validator_terms[validator] = active_at
    log ValidatorProposed(validator=validator, active_at=active_at)


@external
def remove_validator(validator: address):
    """No vote on work submitted from now on; work submitted before keeps this validator's
    vote until it matures (so removing honest validators cannot let a false verdict stand)."""
    self._only_owner()
    terms: uint256 = self.validator_terms[validator]
    assert terms != 0 and terms >> 64 == 0, "not a validator"
    self.validator_terms[validator] = terms | (block.timestamp << 64)
    log ValidatorRemoved(validator=validator, removed_at=block.timestamp)


@external
def set_policy_version(version: uint256):
    self._only_owner()
    assert version > self.policy_version, "versions only go up"
    assert version <= M48, "version above 2**48"
    self.policy_version = version
    log PolicyVersion(version=version)


@view
@internal
def _is_validator(account: address) -> bool:
    """Active now, for work submitted now."""
    terms: uint256 = self.validator_terms[account]
    return terms != 0 and terms >> 64 == 0 and block.timestamp >= terms & M64


@view
@external
def is_validator(account: address) -> bool:
    return self._is_validator(account)


@view
@external
def validator_since(account: address) -> uint256:
    """When the validator became (or becomes) active; 0: never appointed."""
    return self.validator_terms[account] & M64


@view
@external
def validator_until(account: address) -> uint256:
    """When it was removed (it votes only on work submitted up to then); 0: not removed."""
    return self.validator_terms[account] >> 64


@external
@payable
def fund():
    assert msg.value > 0, "nothing sent"
    self.reward_pool += msg.value
    log Funded(sender=msg.sender, amount=msg.value)


# ---- accounts ---------------------------------------------------------------------


@view
@external
def workers(account: address) -> Account:
    return self.accounts[account]


@internal
def _bind(peer_key: bytes32, signature: Bytes[64]):
    assert peer_key != empty(bytes32), "empty peer key"
    assert len(signature) == 64, "signature must be 64 bytes"
    assert self.peer_owner[peer_key] == empty(address), "peer key registered by another account"
    self.peer_owner[peer_key] = msg.sender
    self.registration_id[msg.sender] += 1
    self.accounts[msg.sender].peer_key = peer_key
    self.signatures[msg.sender] = signature


@external
@payable
def register(peer_key: bytes32, signature: Bytes[64]):
    """Bind this account to its node's Ed25519 key; ``signature`` is that key's signature of
    the registration message (SPEC section 12), checked off-chain by every node."""
    a: Account = self.accounts[msg.sender]
    assert a.peer_key == empty(bytes32), "already registered"
    assert a.stake + msg.value >= self.min_stake, "stake below minimum"
    self._bind(peer_key, signature)
    self.accounts[msg.sender].stake = a.stake + msg.value
    log Registered(worker=msg.sender, peer_key=peer_key, stake=a.stake + msg.value, signature=signature)


@external
def change_peer_key(peer_key: bytes32, signature: Bytes[64]):
    old: bytes32 = self.accounts[msg.sender].peer_key
    assert old != empty(bytes32), "not a registered worker"
    self.peer_owner[old] = empty(address)
    self._bind(peer_key, signature)
    log PeerKeyChanged(worker=msg.sender, old_peer_key=old, peer_key=peer_key, signature=signature)


@external
def revoke_registration(worker: address):
    """A vote that the stored signature is invalid; at ``quorum`` votes of distinct
    validators the registration is revoked and the peer key freed (the account keeps its
    stake and may register again with a valid signature). One validator alone can neither
    unregister a worker nor free its key for a squatter."""
    assert self._is_validator(msg.sender), "only a validator"
    old: bytes32 = self.accounts[worker].peer_key
    assert old != empty(bytes32), "not a registered worker"
    rid: uint256 = self.registration_id[worker]
    assert not self.revoke_voted[worker][rid][msg.sender], "already voted to revoke"
    self.revoke_voted[worker][rid][msg.sender] = True
    votes: uint256 = self.revoke_votes[worker][rid] + 1
    self.revoke_votes[worker][rid] = votes
    log RevocationVoted(worker=worker, peer_key=old, validator=msg.sender, votes=votes)
    if votes < self.quorum:
        return
    self.peer_owner[old] = empty(address)
    self.accounts[worker].peer_key = empty(bytes32)
    self.signatures[worker] = b""
    log RegistrationRevoked(worker=worker, peer_key=old, validator=msg.sender)


@external
@payable
def add_stake():
    """More stake (a validator's bond is its stake; no registration needed for it)."""
    assert msg.value > 0, "nothing sent"
    self.accounts[msg.sender].stake += msg.value
    log StakeAdded(account=msg.sender, amount=msg.value)


@external
def unbond(amount: uint256):
    a: Account = self.accounts[msg.sender]
    assert amount > 0, "zero amount"
    assert amount <= a.stake - a.locked, "amount above free stake"
    self.accounts[msg.sender].stake = a.stake - amount
    self.accounts[msg.sender].unbonding = a.unbonding + amount
    withdrawable_at: uint256 = block.timestamp + self.unbonding_delay
    self.accounts[msg.sender].unbond_at = withdrawable_at
    log Unbonded(account=msg.sender, stake=amount, withdrawable_at=withdrawable_at)


@external
@nonreentrant
def withdraw() -> uint256:
    a: Account = self.accounts[msg.sender]
    assert a.unbonding > 0, "nothing unbonding"
    assert block.timestamp >= a.unbond_at, "unbonding delay not over"
    self.accounts[msg.sender].unbonding = 0
    log Withdrawn(account=msg.sender, unbonded_stake=a.unbonding)
    raw_call(msg.sender, b"", value=a.unbonding)
    return a.unbonding


# ---- work -------------------------------------------------------------------------


@external
def submit_work(key: bytes32, units: uint256, policy_version: uint256):
    a: Account = self.accounts[msg.sender]
    assert a.peer_key != empty(bytes32), "not a registered worker"
    assert a.stake >= self.min_stake, "stake below minimum"
    assert units > 0, "zero units"
    assert units <= self.max_units, "units above max_units"
    current: uint256 = self.policy_version
    assert policy_version <= current, "policy version not published"
    assert policy_version + self.max_staleness >= current, "stale policy version"
    assert self.index_of[msg.sender][key] == 0, "work key already submitted"
    reward: uint256 = units * self.reward_per_unit
    collateral: uint256 = reward * self.collateral_bps // BPS
    assert a.stake - a.locked >= collateral, "free stake below this work's collateral"
    assert self.reward_pool >= reward, "reward pool too small"
    total: uint256 = self.total_reserved
    mine: uint256 = self.reserved[msg.sender] + reward
    assert mine * BPS <= (self.reward_pool + total) * MAX_RESERVE_BPS, "worker's reserved rewards above its share of the pool"
    self.reward_pool -= reward
    self.reserved[msg.sender] = mine
    self.total_reserved = total + reward
    self.accounts[msg.sender].locked = a.locked + collateral
    window: uint256 = self.verdict_window
    lock: uint256 = self.reward_lock
    i: uint256 = self.tail[msg.sender]
    self.tail[msg.sender] = i + 1
    self.index_of[msg.sender][key] = i + 1
    self.terms[msg.sender][i] = (
        units
        | (policy_version << VERSION_AT)
        | (block.timestamp << T0_AT)
        | (window << WINDOW_AT)
        | (lock << LOCK_AT)
        | (self.fetch_deadline << FETCH_AT)
        | (self.validator_share_bps << SHARE_AT)
        | (STATUS_PENDING << STATUS_AT)
        | (self.quorum << QUORUM_AT)
    )
    self.amounts[msg.sender][i] = reward | (collateral << 128)
    log WorkSubmitted(
        worker=msg.sender,
        key=key,
        index=i,
        units=units,
        policy_version=policy_version,
        reward=reward,
        collateral=collateral,
        unlock_at=block.timestamp + window + lock,
    )


@pure
@internal
def _unlock_at(b: uint256) -> uint256:
    return ((b >> T0_AT) & M40) + ((b >> WINDOW_AT) & M32) + ((b >> LOCK_AT) & M32)


@internal
def _lock_bond(validator: address, amount: uint256):
    v: Account = self.accounts[validator]
    assert v.stake - v.locked >= amount, "validator's free stake below this work's collateral"
    self.accounts[validator].locked = v.locked + amount


@internal
def _vote(worker: address, key: bytes32, accept: bool, reason: uint256) -> (uint256, bool):
    """One validator's verdict on one submission; returns (status, final)."""
    vt: uint256 = self.validator_terms[msg.sender]
    since: uint256 = vt & M64
    until: uint256 = vt >> 64
    assert since != 0 and block.timestamp >= since, "only a validator"
    assert self.accounts[msg.sender].stake >= self.validator_bond, "validator stake below the validator bond"
    assert msg.sender != worker, "a validator cannot judge its own work"
    n: uint256 = self.index_of[worker][key]
    assert n != 0, "no such work"
    i: uint256 = n - 1
    b: uint256 = self.terms[worker][i]
    t0: uint256 = (b >> T0_AT) & M40
    # removed at ``until``: still a validator of work submitted up to that second (blocks
    # can share a timestamp, and such work was made before its worker could see the removal)
    assert since <= t0 and (until == 0 or t0 <= until), "not a validator when this work was submitted"
    assert not self.voted[worker][i][msg.sender], "already voted on this work"
    self.voted[worker][i][msg.sender] = True
    assert (b >> FINAL_AT) & 1 == 0, "verdict is final"
    status: uint256 = (b >> STATUS_AT) & 3
    assert block.timestamp < self._unlock_at(b), "work has matured"
    collateral: uint256 = self.amounts[worker][i] >> 128
    tally: uint256 = self.tallies[worker][i]
    accepts: uint256 = tally & 255
    rejects: uint256 = (tally >> 8) & 255
    quorum: uint256 = (b >> QUORUM_AT) & 31

    if not accept:
        assert reason >= REASON_INVALID and reason <= REASON_MISMATCH, "unknown reject reason"
        if reason == REASON_UNAVAILABLE:
            assert block.timestamp >= t0 + ((b >> FETCH_AT) & M32), "fetch deadline not reached"
        if rejects == 0:  # the first reject: its validator gets the share if it stands
            self.rejecters[worker][i] = msg.sender
            tally |= reason << 16
            if status == STATUS_PENDING:  # and the first verdict: its bond answers for it
                self._lock_bond(msg.sender, collateral)
                b |= 1 << BONDED_AT
        rejects += 1
    else:
        accepts += 1

    final: bool = False
    if status == STATUS_PENDING:
        assert block.timestamp <= t0 + ((b >> WINDOW_AT) & M32), "verdict window closed"
        if accept:
            status = STATUS_ACCEPTED
            self.accounts[worker].accepted += 1
        else:
            status = STATUS_REJECTED
            self.accounts[worker].rejected += 1
    elif status == STATUS_ACCEPTED:
        assert not accept, "work already accepted"
        if rejects >= quorum:
            status = STATUS_REJECTED
            final = True
            self.accounts[worker].accepted -= 1
            self.accounts[worker].rejected += 1
    else:
        assert accept, "work already rejected"
        if accepts >= quorum:
            status = STATUS_ACCEPTED
            final = True
            self.accounts[worker].rejected -= 1
            self.accounts[worker].accepted += 1
            self._overturn(worker, key, i, collateral)
            b &= ~(1 << BONDED_AT)

    b = (b & ~(3 << STATUS_AT)) | (status << STATUS_AT)
    if final:
        b |= 1 << FINAL_AT
    self.terms[worker][i] = b
    self.tallies[worker][i] = (tally & ~65535) | accepts | (rejects << 8)
    return status, final


@internal
def _overturn(worker: address, key: bytes32, i: uint256, collateral: uint256):
    """A quorum overturned a reject: the rejecting validator's locked bond is burned."""
    rejecter: address = self.rejecters[worker][i]
    v: Account = self.accounts[rejecter]
    self.accounts[rejecter].locked = v.locked - collateral
    self.accounts[rejecter].stake = v.stake - collateral
    self.accounts[rejecter].slashed = v.slashed + collateral
    self.total_burned += collateral
    log RejectOverturned(worker=worker, key=key, validator=rejecter, burned_bond=collateral)
    if collateral > 0:
        raw_call(empty(address), b"", value=collateral)


@external
@nonreentrant
def accept(worker: address, key: bytes32):
    """The batch was fetched and matches its key and units (and passed the checks run on it)."""
    status: uint256 = 0
    final: bool = False
    status, final = self._vote(worker, key, True, 0)
    log WorkAccepted(worker=worker, key=key, validator=msg.sender, status=status, final=final)


@external
@nonreentrant
def reject(worker: address, key: bytes32, reason: uint256):
    status: uint256 = 0
    final: bool = False
    status, final = self._vote(worker, key, False, reason)
    log WorkRejected(worker=worker, key=key, validator=msg.sender, reason=reason, status=status, final=final)


# ---- settlement and payouts -------------------------------------------------------


@internal
def _settle(worker: address, max_entries: uint256) -> uint256:
    """Settle up to ``max_entries`` matured submissions of ``worker``, oldest first."""
    i: uint256 = self.head[worker]
    end: uint256 = self.tail[worker]
    n: uint256 = 0
    paid: uint256 = 0
    unpaid: uint256 = 0
    released: uint256 = 0
    slashed: uint256 = 0
    burned: uint256 = 0
    for _: uint256 in range(MAX_CLAIM):
        if n >= max_entries or i >= end:
            break
        b: uint256 = self.terms[worker][i]
        if self._unlock_at(b) > block.timestamp:
            break
        amount: uint256 = self.amounts[worker][i]
        reward: uint256 = amount & M128
        collateral: uint256 = amount >> 128
        status: uint256 = (b >> STATUS_AT) & 3
        released += collateral
        if status == STATUS_ACCEPTED:
            paid += reward
        else:
            unpaid += reward  # rejected, or never judged: never paid
        if status == STATUS_REJECTED:
            rejecter: address = self.rejecters[worker][i]
            if (b >> BONDED_AT) & 1 == 1:
                self.accounts[rejecter].locked -= collateral
            share: uint256 = collateral * ((b >> SHARE_AT) & 16383) // BPS
            self.credit[rejecter] += share
            slashed += collateral
            burned += collateral - share
            log Slashed(worker=worker, index=i, validator=rejecter, stake=collateral, validator_share=share, burned=collateral - share)
        i += 1
        n += 1
    if n == 0:
        return 0
    self.head[worker] = i
    a: Account = self.accounts[worker]
    self.accounts[worker].locked = a.locked - released
    self.accounts[worker].stake = a.stake - slashed
    self.accounts[worker].slashed = a.slashed + slashed
    self.reserved[worker] -= paid + unpaid
    self.total_reserved -= paid + unpaid
    self.reward_pool += unpaid
    self.rewards_due[worker] += paid
    self.total_burned += burned
    log Settled(worker=worker, entries=n, reward=paid, unpaid=unpaid, slashed_stake=slashed, burned=burned)
    if burned > 0:
        raw_call(empty(address), b"", value=burned)
    return n


@external
@nonreentrant
def settle(worker: address, max_entries: uint256) -> uint256:
    """Anyone may settle a worker's matured submissions (validators do, for their share)."""
    n: uint256 = self._settle(worker, max_entries)
    assert n > 0, "nothing to settle"
    return n


@external
@nonreentrant
def claim(max_entries: uint256) -> uint256:
    """Settle up to ``max_entries`` of the caller's matured submissions, then pay its
    settled rewards and validator credit (all gas forwarded, so contract wallets work)."""
    n: uint256 = self._settle(msg.sender, max_entries)
    reward: uint256 = self.rewards_due[msg.sender]
    credit: uint256 = self.credit[msg.sender]
    total: uint256 = reward + credit
    assert total > 0 or n > 0, "nothing to claim"
    self.rewards_due[msg.sender] = 0
    self.credit[msg.sender] = 0
    log Claimed(account=msg.sender, reward=reward, credit=credit, total=total)
    if total > 0:
        raw_call(msg.sender, b"", value=total)
    return total


# ---- views ------------------------------------------------------------------------


@view
@external
def submission(worker: address, key: bytes32) -> Submission:
    n: uint256 = self.index_of[worker][key]
    if n == 0:
        return empty(Submission)
    i: uint256 = n - 1
    b: uint256 = self.terms[worker][i]
    amount: uint256 = self.amounts[worker][i]
    tally: uint256 = self.tallies[worker][i]
    t0: uint256 = (b >> T0_AT) & M40
    return Submission(
        index=i,
        units=b & M32,
        policy_version=(b >> VERSION_AT) & M48,
        submitted_at=t0,
        fetch_after=t0 + ((b >> FETCH_AT) & M32),
        verdict_until=t0 + ((b >> WINDOW_AT) & M32),
        unlock_at=self._unlock_at(b),
        reward=amount & M128,
        collateral=amount >> 128,
        validator_share_bps=(b >> SHARE_AT) & 16383,
        quorum=(b >> QUORUM_AT) & 31,
        status=(b >> STATUS_AT) & 3,
        final=(b >> FINAL_AT) & 1 == 1,
        settled=i < self.head[worker],
        reason=(tally >> 16) & 255,
        rejecter=self.rejecters[worker][i],
        accept_votes=tally & 255,
        reject_votes=(tally >> 8) & 255,
    )


@view
@internal
def _scan(account: address) -> (uint256, uint256, uint256):
    """(matured unsettled entries, their accepted rewards, accepted rewards not matured)."""
    matured: uint256 = 0
    ripe: uint256 = 0
    waiting: uint256 = 0
    blocked: bool = False  # settlement is in order: a later entry waits for an earlier one
    i: uint256 = self.head[account]
    end: uint256 = self.tail[account]
    for _: uint256 in range(MAX_SCAN):
        if i >= end:
            break
        b: uint256 = self.terms[account][i]
        accepted: bool = (b >> STATUS_AT) & 3 == STATUS_ACCEPTED
        if not blocked and self._unlock_at(b) <= block.timestamp:
            matured += 1
            if accepted:
                ripe += self.amounts[account][i] & M128
        else:
            blocked = True
            if accepted:
                waiting += self.amounts[account][i] & M128
        i += 1
    return matured, ripe, waiting


@view
@external
def matured(account: address) -> uint256:
    """Submissions that ``claim``/``settle`` can settle now (counting up to 4096)."""
    return self._scan(account)[0]


@view
@external
def claimable(account: address) -> uint256:
    """What ``claim`` would pay now: settled rewards, credit, matured accepted work."""
    return self.rewards_due[account] + self.credit[account] + self._scan(account)[1]


@view
@external
def pending(account: address) -> uint256:
    """Rewards of accepted work that has not matured yet."""
    return self._scan(account)[2]
