# pragma version 0.4.3
# pragma evm-version cancun
# pragma optimize codesize
"""
@title intellect-node work ledger
@notice Stake, work submission, validator verdicts, slashing and rewards for one run.

The economic rules (SPEC section 19 has the arithmetic):
- Every submission reserves its reward (units x reward_per_unit, units <= max_units) from
  the pool and locks collateral = reward x collateral_bps / 10000 (at least the reward) of
  the worker's stake until it is settled, so a worker's unsettled claims are bounded by its
  stake (and by a tenth of the funded pool), and locked stake can be neither unbonded nor
  withdrawn. Work is taken only while at least quorum + 1 bonded validators can vote on it
  (and not while apply_params's recount of the validators, in parts, is not over).
- Work is paid only if a validator accepted it (an accept attests that the batch was
  fetched and matches its key and units); work nobody judged is never paid. A reject
  slashes exactly that submission's collateral at maturity: validator_share_bps of it to
  the rejecting validator if it bonded the reject (or a quorum overturned an accept), the
  rest burned.
- A submission matures at submitted_at + verdict_window + reward_lock. Every term of it
  (reward, collateral, share, window, fetch deadline, lock, quorum and the validator bond)
  is that of the parameter epoch it was made in. The first verdict comes within the window;
  until maturity a quorum of other validators can overturn it. A first reject for an
  invalid or mismatched batch locks the same amount of the rejecting validator's free bond
  when it has that much (burned if it is overturned); an "unavailable" reject, or one
  beyond the free bond, locks and risks nothing and earns nothing. A validator votes only
  while its stake covers the bond recorded with the submission, and its own work locks
  only stake above the bond (its first rejects stay bonded).
- The validators of a submission are those active when it was made: they keep their votes
  on it if the owner removes them later, and validators added later have none.
- Parameters, new validators and removals take effect only after a timelock longer than
  unbonding_delay + verdict_window + reward_lock, within hard bounds; a proposal not applied
  within a day of its due time expires; ownership moves in two steps; a removed validator
  leaves the list. Work keys live under (worker, key). Payouts forward all gas. A
  registration is revoked only by a quorum of bonded validators (votes outlive rotations),
  and the revoked account pays min_stake, from free then unbonding stake.

Storage is packed (bit offset, width) so that submit_work writes two new words.
"""

BPS: constant(uint256) = 10000
MAX_CLAIM: constant(uint256) = 256
MAX_SCAN: constant(uint256) = 4096
MAX_INITIAL_VALIDATORS: constant(uint256) = 16
MAX_VALIDATORS: constant(uint256) = 65000  # ``voters`` is a 16-bit field
RECOUNT_STEP: constant(uint256) = 64  # validators apply_params counts again itself

# hard bounds on the parameters, whatever the owner proposes
MAX_MIN_STAKE: constant(uint256) = 10**24  # a million ETH: fits the packed words below
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
PARAMS_GRACE: constant(uint256) = 86400  # a due proposal expires a day after its eta
MAX_STALENESS: constant(uint256) = 1000000
MIN_QUORUM: constant(uint256) = 2
MAX_QUORUM: constant(uint256) = 16

STATUS_PENDING: constant(uint256) = 1
STATUS_ACCEPTED: constant(uint256) = 2
STATUS_REJECTED: constant(uint256) = 3

REASON_INVALID: constant(uint256) = 1  # a proof, sampling, reward or assignment check failed
REASON_UNAVAILABLE: constant(uint256) = 2  # the batch was not served before the fetch deadline
REASON_MISMATCH: constant(uint256) = 3  # the batch's worker or units differ from the submission

M1: constant(uint256) = 1
M2: constant(uint256) = 3
M5: constant(uint256) = 2**5 - 1
M8: constant(uint256) = 2**8 - 1
M13: constant(uint256) = 2**13 - 1
M16: constant(uint256) = 2**16 - 1
M17: constant(uint256) = 2**17 - 1
M22: constant(uint256) = 2**22 - 1
M24: constant(uint256) = 2**24 - 1
M32: constant(uint256) = 2**32 - 1
M40: constant(uint256) = 2**40 - 1
M48: constant(uint256) = 2**48 - 1
M60: constant(uint256) = 2**60 - 1
M64: constant(uint256) = 2**64 - 1
M80: constant(uint256) = 2**80 - 1
M95: constant(uint256) = 2**95 - 1
M112: constant(uint256) = 2**112 - 1
M120: constant(uint256) = 2**120 - 1
M128: constant(uint256) = 2**128 - 1
M160: constant(uint256) = 2**160 - 1

# cfg: the current parameters submit_work checks, and the policy version
C_MIN_STAKE: constant(uint256) = 0  # 80
C_MAX_UNITS: constant(uint256) = 80  # 32
C_STALENESS: constant(uint256) = 112  # 24
C_UNBONDING: constant(uint256) = 136  # 24
C_POLICY: constant(uint256) = 160  # 48
C_EPOCH: constant(uint256) = 208  # 32
C_RECOUNT: constant(uint256) = 240  # 1: apply_params's recount of the validators is not over

# epochs[e]: the terms a submission made in parameter epoch e is held to
E_RATE: constant(uint256) = 0  # 60 reward_per_unit
E_CBPS: constant(uint256) = 60  # 17 collateral_bps
E_SHARE: constant(uint256) = 77  # 13 validator_share_bps
E_WINDOW: constant(uint256) = 90  # 22
E_FETCH: constant(uint256) = 112  # 22
E_LOCK: constant(uint256) = 134  # 22
E_QUORUM: constant(uint256) = 156  # 5
E_BOND: constant(uint256) = 161  # 95 validator_bond

# records[worker][i]: one submission
R_UNITS: constant(uint256) = 0  # 32
R_VERSION: constant(uint256) = 32  # 48
R_T0: constant(uint256) = 80  # 40
R_EPOCH: constant(uint256) = 120  # 32
R_STATUS: constant(uint256) = 152  # 2
R_FINAL: constant(uint256) = 154  # 1
R_BONDED: constant(uint256) = 155  # 1: the first rejecter's bond is locked on it

# verdicts[worker][i]: first rejecter, votes and reason
V_ACCEPTS: constant(uint256) = 160  # 8
V_REJECTS: constant(uint256) = 168  # 8
V_REASON: constant(uint256) = 176  # 8

# bal[account]: stake, locked and two flags
B_LOCKED: constant(uint256) = 112  # 112 (stake at 0, 112)
B_VOTER: constant(uint256) = 224  # 1: counted in ``voters``
B_REGISTERED: constant(uint256) = 225  # 1
B_APPOINTED: constant(uint256) = 226  # 1: ever appointed a validator (its work locks no bond)

# fifo[worker]: settlement queue [head, tail) and reserved rewards
F_TAIL: constant(uint256) = 40  # 40 (head at 0, 40)
F_RESERVED: constant(uint256) = 80  # 112

# pools: unreserved pool, reserved rewards, validators that can vote on new work
P_RESERVED: constant(uint256) = 120  # 120 (reward_pool at 0, 120)
P_VOTERS: constant(uint256) = 240  # 16

# exits[account]: unbonding stake and when it is withdrawable
X_AT: constant(uint256) = 112  # 40 (unbonding at 0, 112)

# stats[account]: verdict counts and slashed stake
S_REJECTED: constant(uint256) = 64  # 64 (accepted at 0, 64)
S_SLASHED: constant(uint256) = 128  # 128


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

event ValidatorCounted:
    validator: indexed(address)
    counted: bool
    voters: uint256

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
    charged: uint256

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
# up to ``until`` (0: no removal scheduled)
validator_terms: HashMap[address, uint256]
validator_list: DynArray[address, MAX_VALIDATORS]
validator_index: HashMap[address, uint256]  # its index in validator_list + 1
recount_next: uint256  # the next entry of validator_list apply_params's recount counts

cfg: uint256
epochs: HashMap[uint256, uint256]
proposed: Params
params_eta: public(uint256)  # 0: no proposal

pools: uint256
total_burned: public(uint256)
bal: HashMap[address, uint256]
fifo: HashMap[address, uint256]
exits: HashMap[address, uint256]
stats: HashMap[address, uint256]
peer_keys: HashMap[address, bytes32]
peer_owner: public(HashMap[bytes32, address])
signatures: public(HashMap[address, Bytes[64]])
registration_id: public(HashMap[address, uint256])  # counts an account's bindings
revocation_round: public(HashMap[address, uint256])  # counts an account's revocations
revoke_votes: public(HashMap[address, HashMap[uint256, uint256]])  # by revocation_round
revoke_voted: HashMap[address, HashMap[uint256, HashMap[address, bool]]]
rewards_due: public(HashMap[address, uint256])  # settled, accepted work
credit: public(HashMap[address, uint256])  # validator shares of final slashes

# per-worker FIFO of submissions [head, tail), settled in order
index_of: HashMap[address, HashMap[bytes32, uint256]]  # index + 1
records: HashMap[address, HashMap[uint256, uint256]]
verdicts: HashMap[address, HashMap[uint256, uint256]]
voted: HashMap[address, HashMap[uint256, HashMap[address, bool]]]


@deploy
def __init__(p: Params, validators: DynArray[address, MAX_INITIAL_VALIDATORS]):
    self.owner = msg.sender
    self._check_params(p)
    assert len(validators) >= p.quorum + 1, "fewer than quorum + 1 validators"
    self._apply(p)
    for v: address in validators:
        assert v != empty(address), "zero address"
        assert self.validator_terms[v] == 0, "duplicate validator"
        self.validator_terms[v] = block.timestamp
        self.validator_list.append(v)
        self.validator_index[v] = len(self.validator_list)
        self.bal[v] |= 1 << B_APPOINTED
        log ValidatorProposed(validator=v, active_at=block.timestamp)


# ---- packing ----------------------------------------------------------------------


@pure
@internal
def _put(word: uint256, at: uint256, mask: uint256, field: uint256) -> uint256:
    assert field <= mask, "field out of range"
    return (word & ~(mask << at)) | (field << at)


@view
@internal
def _epoch_terms(e: uint256) -> uint256:
    return self.epochs[e]


@view
@internal
def _current_terms() -> uint256:
    return self.epochs[(self.cfg >> C_EPOCH) & M32]


@pure
@internal
def _amounts(r: uint256, t: uint256) -> (uint256, uint256):
    """(reward, collateral) of a submission record under its epoch's terms."""
    reward: uint256 = (r & M32) * (t & M60)
    return reward, reward * ((t >> E_CBPS) & M17) // BPS


@pure
@internal
def _unlock_at(r: uint256, t: uint256) -> uint256:
    return ((r >> R_T0) & M40) + ((t >> E_WINDOW) & M22) + ((t >> E_LOCK) & M22)


# ---- parameters and owner ---------------------------------------------------------


@pure
@internal
def _check_params(p: Params):
    assert p.min_stake > 0, "min_stake is zero"
    assert p.min_stake <= MAX_MIN_STAKE, "min_stake above bound"
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
    """A new parameter epoch: work submitted from now on is held to these terms."""
    c: uint256 = self.cfg
    e: uint256 = ((c >> C_EPOCH) & M32) + 1
    bond: uint256 = max(p.min_stake, p.max_units * p.reward_per_unit * p.collateral_bps // BPS)
    t: uint256 = p.reward_per_unit
    t = self._put(t, E_CBPS, M17, p.collateral_bps)
    t = self._put(t, E_SHARE, M13, p.validator_share_bps)
    t = self._put(t, E_WINDOW, M22, p.verdict_window)
    t = self._put(t, E_FETCH, M22, p.fetch_deadline)
    t = self._put(t, E_LOCK, M22, p.reward_lock)
    t = self._put(t, E_QUORUM, M5, p.quorum)
    t = self._put(t, E_BOND, M95, bond)
    self.epochs[e] = t
    c = self._put(c, C_MIN_STAKE, M80, p.min_stake)
    c = self._put(c, C_MAX_UNITS, M32, p.max_units)
    c = self._put(c, C_STALENESS, M24, p.max_staleness)
    c = self._put(c, C_UNBONDING, M24, p.unbonding_delay)
    c = self._put(c, C_EPOCH, M32, e)
    self.cfg = c
    log ParamsSet(params=p)


@view
@internal
def _current() -> Params:
    c: uint256 = self.cfg
    t: uint256 = self._current_terms()
    return Params(
        min_stake=c & M80,
        reward_per_unit=t & M60,
        max_units=(c >> C_MAX_UNITS) & M32,
        collateral_bps=(t >> E_CBPS) & M17,
        validator_share_bps=(t >> E_SHARE) & M13,
        verdict_window=(t >> E_WINDOW) & M22,
        fetch_deadline=(t >> E_FETCH) & M22,
        reward_lock=(t >> E_LOCK) & M22,
        unbonding_delay=(c >> C_UNBONDING) & M24,
        max_staleness=(c >> C_STALENESS) & M24,
        quorum=(t >> E_QUORUM) & M5,
    )


@view
@internal
def _timelock() -> uint256:
    """Longer than any stake can take to leave: maturity plus unbonding."""
    t: uint256 = self._current_terms()
    return ((self.cfg >> C_UNBONDING) & M24) + ((t >> E_WINDOW) & M22) + ((t >> E_LOCK) & M22) + TIMELOCK_MARGIN


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


@view
@external
def validator_bond() -> uint256:
    """max(min_stake, the largest collateral): the stake a validator needs to vote on work
    submitted now (each submission keeps the bond of its epoch)."""
    return self._current_terms() >> E_BOND


@view
@external
def policy_version() -> uint256:
    return (self.cfg >> C_POLICY) & M48


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
    """Anyone, from the proposal's eta for PARAMS_GRACE: a proposal left pending longer
    expires (it cannot be held back and sprung later)."""
    eta: uint256 = self.params_eta
    assert eta != 0, "no proposal"
    assert block.timestamp >= eta, "timelock not over"
    assert block.timestamp <= eta + PARAMS_GRACE, "proposal expired"
    self.params_eta = 0
    self._apply(self.proposed)
    # the bond may have changed: every validator is counted again, the first RECOUNT_STEP
    # here, the rest by recount_validators; no work is taken until the last is
    self.recount_next = 0
    self._recount(RECOUNT_STEP)


@internal
def _recount(max_entries: uint256) -> uint256:
    n: uint256 = len(self.validator_list)
    start: uint256 = min(self.recount_next, n)  # removals shorten the list
    stop: uint256 = start + min(max_entries, n - start)
    for i: uint256 in range(start, stop, bound=MAX_VALIDATORS):
        self._count(self.validator_list[i])
    self.recount_next = stop
    self.cfg = self._put(self.cfg, C_RECOUNT, M1, convert(stop < n, uint256))
    return n - stop


@external
def recount_validators(max_entries: uint256) -> uint256:
    """Anyone, while apply_params's recount is not over: count up to ``max_entries`` more
    validators again (the bond may have changed); returns how many are left."""
    if (self.cfg >> C_RECOUNT) & 1 == 0:
        return 0
    return self._recount(max_entries)


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
    self.validator_list.append(validator)
    self.validator_index[validator] = len(self.validator_list)
    self.bal[validator] |= 1 << B_APPOINTED
    log ValidatorProposed(validator=validator, active_at=active_at)


@external
def remove_validator(validator: address):
    """After the timelock: the validator votes on work submitted up to now + timelock (so
    workers see the change coming, like any other), and not after. It no longer counts
    toward the quorum + 1 validators new work needs from now on."""
    self._only_owner()
    terms: uint256 = self.validator_terms[validator]
    assert terms != 0 and terms >> 64 == 0, "not a validator"
    until: uint256 = block.timestamp + self._timelock()
    self.validator_terms[validator] = terms | (until << 64)
    self._count(validator)
    # it never counts again (apply_params recounts the list): room for a new appointment
    i: uint256 = self.validator_index[validator] - 1
    last: address = self.validator_list[len(self.validator_list) - 1]
    self.validator_list[i] = last
    self.validator_index[last] = i + 1
    self.validator_list.pop()
    self.validator_index[validator] = 0
    self._count(last)  # it may have moved before a pending recount's next entry
    log ValidatorRemoved(validator=validator, removed_at=until)


@external
def count_validator(validator: address):
    """Anyone: count (or stop counting) ``validator`` among those that can vote on new work,
    e.g. once a proposed validator's activation time has come."""
    self._count(validator)


@internal
def _count(v: address):
    """``v`` counts toward ``voters`` iff it is active now, no removal is scheduled and its
    stake covers the current validator bond."""
    terms: uint256 = self.validator_terms[v]
    b: uint256 = self.bal[v]
    counts: bool = False
    if terms != 0 and terms >> 64 == 0 and block.timestamp >= terms & M64:
        counts = b & M112 >= self._current_terms() >> E_BOND
    if counts == ((b >> B_VOTER) & 1 == 1):
        return
    p: uint256 = self.pools
    voters: uint256 = (p >> P_VOTERS) & M16
    if counts:
        voters += 1
    else:
        voters -= 1
    self.bal[v] = self._put(b, B_VOTER, M1, convert(counts, uint256))
    self.pools = self._put(p, P_VOTERS, M16, voters)
    log ValidatorCounted(validator=v, counted=counts, voters=voters)


@view
@external
def voters() -> uint256:
    """Validators that can vote on work submitted now (active, no removal scheduled, bonded)."""
    return (self.pools >> P_VOTERS) & M16


@external
def set_policy_version(version: uint256):
    self._only_owner()
    c: uint256 = self.cfg
    assert version > (c >> C_POLICY) & M48, "versions only go up"
    assert version <= M48, "version above 2**48"
    self.cfg = self._put(c, C_POLICY, M48, version)
    log PolicyVersion(version=version)


@view
@internal
def _is_validator(account: address) -> bool:
    """Active now, for work submitted now."""
    terms: uint256 = self.validator_terms[account]
    until: uint256 = terms >> 64
    return terms != 0 and block.timestamp >= terms & M64 and (until == 0 or block.timestamp <= until)


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
    """When its removal takes effect (it votes only on work submitted up to then); 0: none."""
    return self.validator_terms[account] >> 64


@external
@payable
def fund():
    assert msg.value > 0, "nothing sent"
    p: uint256 = self.pools
    self.pools = self._put(p, 0, M120, (p & M120) + msg.value)
    log Funded(sender=msg.sender, amount=msg.value)


@view
@external
def reward_pool() -> uint256:
    """Unreserved."""
    return self.pools & M120


@view
@external
def total_reserved() -> uint256:
    return (self.pools >> P_RESERVED) & M120


@view
@external
def reserved(account: address) -> uint256:
    """Rewards of a worker's unsettled submissions."""
    return self.fifo[account] >> F_RESERVED


# ---- accounts ---------------------------------------------------------------------


@view
@external
def workers(account: address) -> Account:
    b: uint256 = self.bal[account]
    x: uint256 = self.exits[account]
    s: uint256 = self.stats[account]
    return Account(
        peer_key=self.peer_keys[account],
        stake=b & M112,
        locked=(b >> B_LOCKED) & M112,
        unbonding=x & M112,
        unbond_at=x >> X_AT,
        accepted=s & M64,
        rejected=(s >> S_REJECTED) & M64,
        slashed=s >> S_SLASHED,
    )


@internal
def _set_stake(account: address, stake: uint256, locked: uint256):
    b: uint256 = self.bal[account]
    b = self._put(b, 0, M112, stake)
    self.bal[account] = self._put(b, B_LOCKED, M112, locked)


@internal
def _add_slashed(account: address, amount: uint256):
    s: uint256 = self.stats[account]
    self.stats[account] = self._put(s, S_SLASHED, M128, (s >> S_SLASHED) + amount)


@internal
def _bind(peer_key: bytes32, signature: Bytes[64]):
    assert peer_key != empty(bytes32), "empty peer key"
    assert len(signature) == 64, "signature must be 64 bytes"
    assert self.peer_owner[peer_key] == empty(address), "peer key registered by another account"
    self.peer_owner[peer_key] = msg.sender
    self.registration_id[msg.sender] += 1
    self.peer_keys[msg.sender] = peer_key
    self.signatures[msg.sender] = signature


@external
@payable
def register(peer_key: bytes32, signature: Bytes[64]):
    """Bind this account to its node's Ed25519 key; ``signature`` is that key's signature of
    the registration message (SPEC section 19), checked off-chain by every node."""
    assert self.peer_keys[msg.sender] == empty(bytes32), "already registered"
    b: uint256 = self.bal[msg.sender]
    stake: uint256 = (b & M112) + msg.value
    assert stake >= self.cfg & M80, "stake below minimum"
    self._bind(peer_key, signature)
    b = self._put(b, 0, M112, stake)
    self.bal[msg.sender] = self._put(b, B_REGISTERED, M1, 1)
    self._count(msg.sender)
    log Registered(worker=msg.sender, peer_key=peer_key, stake=stake, signature=signature)


@external
def change_peer_key(peer_key: bytes32, signature: Bytes[64]):
    """Rotate the peer key; revocation votes against the account carry over."""
    old: bytes32 = self.peer_keys[msg.sender]
    assert old != empty(bytes32), "not a registered worker"
    assert peer_key != old, "same peer key"
    self.peer_owner[old] = empty(address)
    self._bind(peer_key, signature)
    log PeerKeyChanged(worker=msg.sender, old_peer_key=old, peer_key=peer_key, signature=signature)


@external
@nonreentrant
def revoke_registration(worker: address):
    """A vote that the stored signature is invalid; at ``quorum`` votes of distinct bonded
    validators (counted per revocation round: rotating the key does not reset them) the
    registration is revoked, the peer key freed and min_stake of the account's free stake
    burned (a squatter pays for each squat). One validator alone can neither unregister a
    worker nor free its key for a squatter."""
    assert self._is_validator(msg.sender), "only a validator"
    t: uint256 = self._current_terms()
    assert self.bal[msg.sender] & M112 >= t >> E_BOND, "validator stake below the validator bond"
    old: bytes32 = self.peer_keys[worker]
    assert old != empty(bytes32), "not a registered worker"
    rnd: uint256 = self.revocation_round[worker]
    assert not self.revoke_voted[worker][rnd][msg.sender], "already voted to revoke"
    self.revoke_voted[worker][rnd][msg.sender] = True
    votes: uint256 = self.revoke_votes[worker][rnd] + 1
    self.revoke_votes[worker][rnd] = votes
    log RevocationVoted(worker=worker, peer_key=old, validator=msg.sender, votes=votes)
    if votes < (t >> E_QUORUM) & M5:
        return
    self.revocation_round[worker] = rnd + 1
    self.peer_owner[old] = empty(address)
    self.peer_keys[worker] = empty(bytes32)
    self.signatures[worker] = b""
    b: uint256 = self.bal[worker]
    stake: uint256 = b & M112
    locked: uint256 = (b >> B_LOCKED) & M112
    free: uint256 = stake - locked
    x: uint256 = self.exits[worker]
    # from free stake, then from unbonding stake: a squatter that unbonded at once still pays
    charged: uint256 = min(self.cfg & M80, free + (x & M112))
    if charged > free:
        self.exits[worker] = x - (charged - free)
    b = self._put(b, B_REGISTERED, M1, 0)
    self.bal[worker] = self._put(b, 0, M112, stake - min(charged, free))
    self._add_slashed(worker, charged)
    self._count(worker)
    self.total_burned += charged
    log RegistrationRevoked(worker=worker, peer_key=old, validator=msg.sender, charged=charged)
    if charged > 0:
        raw_call(empty(address), b"", value=charged)


@external
@payable
def add_stake():
    """More stake (a validator's bond is its stake; no registration needed for it)."""
    assert msg.value > 0, "nothing sent"
    b: uint256 = self.bal[msg.sender]
    self.bal[msg.sender] = self._put(b, 0, M112, (b & M112) + msg.value)
    log StakeAdded(account=msg.sender, amount=msg.value)
    self._count(msg.sender)


@external
def unbond(amount: uint256):
    b: uint256 = self.bal[msg.sender]
    stake: uint256 = b & M112
    assert amount > 0, "zero amount"
    assert amount <= stake - ((b >> B_LOCKED) & M112), "amount above free stake"
    self.bal[msg.sender] = self._put(b, 0, M112, stake - amount)
    withdrawable_at: uint256 = block.timestamp + ((self.cfg >> C_UNBONDING) & M24)
    x: uint256 = self.exits[msg.sender]
    x = self._put(x, 0, M112, (x & M112) + amount)
    self.exits[msg.sender] = self._put(x, X_AT, M40, withdrawable_at)
    self._count(msg.sender)
    log Unbonded(account=msg.sender, stake=amount, withdrawable_at=withdrawable_at)


@external
@nonreentrant
def withdraw() -> uint256:
    x: uint256 = self.exits[msg.sender]
    amount: uint256 = x & M112
    assert amount > 0, "nothing unbonding"
    assert block.timestamp >= x >> X_AT, "unbonding delay not over"
    self.exits[msg.sender] = x & ~M112
    log Withdrawn(account=msg.sender, unbonded_stake=amount)
    raw_call(msg.sender, b"", value=amount)
    return amount


# ---- work -------------------------------------------------------------------------


@external
def submit_work(key: bytes32, units: uint256, policy_version: uint256):
    c: uint256 = self.cfg
    e: uint256 = (c >> C_EPOCH) & M32
    t: uint256 = self.epochs[e]
    b: uint256 = self.bal[msg.sender]
    stake: uint256 = b & M112
    locked: uint256 = (b >> B_LOCKED) & M112
    assert (b >> B_REGISTERED) & 1 == 1, "not a registered worker"
    assert stake >= c & M80, "stake below minimum"
    assert units > 0, "zero units"
    assert units <= (c >> C_MAX_UNITS) & M32, "units above max_units"
    current: uint256 = (c >> C_POLICY) & M48
    assert policy_version <= current, "policy version not published"
    assert policy_version + ((c >> C_STALENESS) & M24) >= current, "stale policy version"
    p: uint256 = self.pools
    # enough validators that q of them, other than the worker, can overturn a false verdict;
    # none is known to while apply_params's recount is not over (2**16 > any count)
    quorum: uint256 = (t >> E_QUORUM) & M5
    need: uint256 = quorum + 1 + ((b >> B_VOTER) & 1) + ((c >> C_RECOUNT) << 16)
    assert (p >> P_VOTERS) & M16 >= need, "fewer than quorum + 1 validators counted to vote on new work"
    assert self.index_of[msg.sender][key] == 0, "work key already submitted"
    reward: uint256 = units * (t & M60)
    collateral: uint256 = reward * ((t >> E_CBPS) & M17) // BPS
    free: uint256 = stake - locked
    if (b >> B_APPOINTED) & 1 == 1:  # a validator's work leaves its bond free for rejects
        free -= min(free, t >> E_BOND)
    assert free >= collateral, "free stake below this work's collateral"
    pool: uint256 = p & M120
    assert pool >= reward, "reward pool too small"
    total: uint256 = (p >> P_RESERVED) & M120
    f: uint256 = self.fifo[msg.sender]
    mine: uint256 = (f >> F_RESERVED) + reward
    assert mine * BPS <= (pool + total) * MAX_RESERVE_BPS, "worker's reserved rewards above its share of the pool"
    self.pools = (p & ~(M120 | (M120 << P_RESERVED))) | (pool - reward) | ((total + reward) << P_RESERVED)
    # locked + collateral <= stake < 2**112; the tail stays below 2**40 and the reserved
    # rewards below the pool: plain additions, no field checks
    self.bal[msg.sender] = b + (collateral << B_LOCKED)
    i: uint256 = (f >> F_TAIL) & M40
    self.fifo[msg.sender] = f + (1 << F_TAIL) + (reward << F_RESERVED)
    self.index_of[msg.sender][key] = i + 1
    self.records[msg.sender][i] = (
        units
        | (policy_version << R_VERSION)
        | (block.timestamp << R_T0)
        | (e << R_EPOCH)
        | (STATUS_PENDING << R_STATUS)
    )
    log WorkSubmitted(
        worker=msg.sender,
        key=key,
        index=i,
        units=units,
        policy_version=policy_version,
        reward=reward,
        collateral=collateral,
        unlock_at=self._unlock_at(block.timestamp << R_T0, t),
    )


@internal
def _count_verdict(worker: address, accepted: int256, rejected: int256):
    s: uint256 = self.stats[worker]
    a: uint256 = convert(convert(s & M64, int256) + accepted, uint256)
    r: uint256 = convert(convert((s >> S_REJECTED) & M64, int256) + rejected, uint256)
    s = self._put(s, 0, M64, a)
    self.stats[worker] = self._put(s, S_REJECTED, M64, r)


@internal
def _vote(worker: address, key: bytes32, accept: bool, reason: uint256) -> (uint256, bool):
    """One validator's verdict on one submission; returns (status, final)."""
    vt: uint256 = self.validator_terms[msg.sender]
    since: uint256 = vt & M64
    until: uint256 = vt >> 64
    assert since != 0 and block.timestamp >= since, "only a validator"
    assert msg.sender != worker, "a validator cannot judge its own work"
    n: uint256 = self.index_of[worker][key]
    assert n != 0, "no such work"
    i: uint256 = n - 1
    r: uint256 = self.records[worker][i]
    t: uint256 = self.epochs[(r >> R_EPOCH) & M32]
    vb: uint256 = self.bal[msg.sender]
    # the bond of the submission's epoch: a later parameter change cannot take the vote away
    assert vb & M112 >= t >> E_BOND, "validator stake below the validator bond"
    t0: uint256 = (r >> R_T0) & M40
    # a removal takes effect at ``until``: still a validator of work submitted up to then
    assert since <= t0 and (until == 0 or t0 <= until), "not a validator when this work was submitted"
    assert not self.voted[worker][i][msg.sender], "already voted on this work"
    self.voted[worker][i][msg.sender] = True
    assert (r >> R_FINAL) & 1 == 0, "verdict is final"
    status: uint256 = (r >> R_STATUS) & M2
    assert block.timestamp < self._unlock_at(r, t), "work has matured"
    reward: uint256 = 0
    collateral: uint256 = 0
    reward, collateral = self._amounts(r, t)
    v: uint256 = self.verdicts[worker][i]
    accepts: uint256 = (v >> V_ACCEPTS) & M8
    rejects: uint256 = (v >> V_REJECTS) & M8
    quorum: uint256 = (t >> E_QUORUM) & M5

    if not accept:
        assert reason >= REASON_INVALID and reason <= REASON_MISMATCH, "unknown reject reason"
        if reason == REASON_UNAVAILABLE:
            assert block.timestamp >= t0 + ((t >> E_FETCH) & M22), "fetch deadline not reached"
        if rejects == 0:  # the first reject: its validator gets the share if it stands
            v = self._put(v, 0, M160, convert(msg.sender, uint256))
            v = self._put(v, V_REASON, M8, reason)
            # a first verdict on an invalid or mismatched batch is bonded when the free
            # stake allows: the share if it stands, the bond burned if it is overturned. An
            # unavailable batch may have been served to others only (no lie in that), and
            # a reject beyond the free bond must still be possible: both go unbonded.
            locked: uint256 = (vb >> B_LOCKED) & M112
            if status == STATUS_PENDING and reason != REASON_UNAVAILABLE and (vb & M112) - locked >= collateral:
                self.bal[msg.sender] = self._put(vb, B_LOCKED, M112, locked + collateral)
                r |= 1 << R_BONDED
        rejects += 1
    else:
        accepts += 1

    final: bool = False
    if status == STATUS_PENDING:
        assert block.timestamp <= t0 + ((t >> E_WINDOW) & M22), "verdict window closed"
        if accept:
            status = STATUS_ACCEPTED
            self._count_verdict(worker, 1, 0)
        else:
            status = STATUS_REJECTED
            self._count_verdict(worker, 0, 1)
    elif status == STATUS_ACCEPTED:
        assert not accept, "work already accepted"
        if rejects >= quorum:
            status = STATUS_REJECTED
            final = True
            self._count_verdict(worker, -1, 1)
    else:
        assert accept, "work already rejected"
        if accepts >= quorum:
            status = STATUS_ACCEPTED
            final = True
            self._count_verdict(worker, 1, -1)
            if (r >> R_BONDED) & 1 == 1:
                self._overturn(worker, key, convert(v & M160, address), collateral)
                r &= ~(1 << R_BONDED)

    r = self._put(r, R_STATUS, M2, status)
    if final:
        r |= 1 << R_FINAL
    self.records[worker][i] = r
    v = self._put(v, V_ACCEPTS, M8, accepts)
    self.verdicts[worker][i] = self._put(v, V_REJECTS, M8, rejects)
    self._count(msg.sender)  # e.g. a proposed validator's first vote once active
    return status, final


@internal
def _overturn(worker: address, key: bytes32, rejecter: address, collateral: uint256):
    """A quorum overturned a bonded reject: the rejecting validator's locked bond is burned."""
    b: uint256 = self.bal[rejecter]
    self._set_stake(rejecter, (b & M112) - collateral, ((b >> B_LOCKED) & M112) - collateral)
    self._add_slashed(rejecter, collateral)
    self._count(rejecter)
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
    f: uint256 = self.fifo[worker]
    i: uint256 = f & M40
    end: uint256 = (f >> F_TAIL) & M40
    n: uint256 = 0
    paid: uint256 = 0
    unpaid: uint256 = 0
    released: uint256 = 0
    slashed: uint256 = 0
    burned: uint256 = 0
    e: uint256 = 0
    t: uint256 = 0
    for _: uint256 in range(MAX_CLAIM):
        if n >= max_entries or i >= end:
            break
        r: uint256 = self.records[worker][i]
        if (r >> R_EPOCH) & M32 != e:
            e = (r >> R_EPOCH) & M32
            t = self.epochs[e]
        if self._unlock_at(r, t) > block.timestamp:
            break
        reward: uint256 = 0
        collateral: uint256 = 0
        reward, collateral = self._amounts(r, t)
        status: uint256 = (r >> R_STATUS) & M2
        released += collateral
        if status == STATUS_ACCEPTED:
            paid += reward
        else:
            unpaid += reward  # rejected, or never judged: never paid
        if status == STATUS_REJECTED:
            rejecter: address = convert(self.verdicts[worker][i] & M160, address)
            share: uint256 = 0
            if (r >> R_BONDED) & 1 == 1:
                b: uint256 = self.bal[rejecter]
                self.bal[rejecter] = self._put(b, B_LOCKED, M112, ((b >> B_LOCKED) & M112) - collateral)
                share = collateral * ((t >> E_SHARE) & M13) // BPS
            elif (r >> R_FINAL) & 1 == 1:  # a quorum overturned an accept
                share = collateral * ((t >> E_SHARE) & M13) // BPS
            if share > 0:
                self.credit[rejecter] += share
            slashed += collateral
            burned += collateral - share
            log Slashed(worker=worker, index=i, validator=rejecter, stake=collateral, validator_share=share, burned=collateral - share)
        i += 1
        n += 1
    if n == 0:
        return 0
    f = self._put(f, 0, M40, i)
    self.fifo[worker] = self._put(f, F_RESERVED, M112, (f >> F_RESERVED) - paid - unpaid)
    b: uint256 = self.bal[worker]
    self._set_stake(worker, (b & M112) - slashed, ((b >> B_LOCKED) & M112) - released)
    if slashed > 0:
        self._add_slashed(worker, slashed)
        self._count(worker)
    p: uint256 = self.pools
    p = self._put(p, 0, M120, (p & M120) + unpaid)
    self.pools = self._put(p, P_RESERVED, M120, ((p >> P_RESERVED) & M120) - paid - unpaid)
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
    r: uint256 = self.records[worker][i]
    t: uint256 = self.epochs[(r >> R_EPOCH) & M32]
    v: uint256 = self.verdicts[worker][i]
    t0: uint256 = (r >> R_T0) & M40
    reward: uint256 = 0
    collateral: uint256 = 0
    reward, collateral = self._amounts(r, t)
    return Submission(
        index=i,
        units=r & M32,
        policy_version=(r >> R_VERSION) & M48,
        submitted_at=t0,
        fetch_after=t0 + ((t >> E_FETCH) & M22),
        verdict_until=t0 + ((t >> E_WINDOW) & M22),
        unlock_at=self._unlock_at(r, t),
        reward=reward,
        collateral=collateral,
        validator_share_bps=(t >> E_SHARE) & M13,
        quorum=(t >> E_QUORUM) & M5,
        status=(r >> R_STATUS) & M2,
        final=(r >> R_FINAL) & 1 == 1,
        settled=i < self.fifo[worker] & M40,
        reason=(v >> V_REASON) & M8,
        rejecter=convert(v & M160, address),
        accept_votes=(v >> V_ACCEPTS) & M8,
        reject_votes=(v >> V_REJECTS) & M8,
    )


@view
@external
def submission_bond(worker: address, key: bytes32) -> uint256:
    """The stake a validator needs to vote on this submission (its epoch's validator bond)."""
    n: uint256 = self.index_of[worker][key]
    if n == 0:
        return 0
    return self.epochs[(self.records[worker][n - 1] >> R_EPOCH) & M32] >> E_BOND


@view
@internal
def _scan(account: address) -> (uint256, uint256, uint256):
    """(matured unsettled entries, their accepted rewards, accepted rewards not matured)."""
    matured: uint256 = 0
    ripe: uint256 = 0
    waiting: uint256 = 0
    blocked: bool = False  # settlement is in order: a later entry waits for an earlier one
    f: uint256 = self.fifo[account]
    i: uint256 = f & M40
    end: uint256 = (f >> F_TAIL) & M40
    e: uint256 = 0
    t: uint256 = 0
    for _: uint256 in range(MAX_SCAN):
        if i >= end:
            break
        r: uint256 = self.records[account][i]
        if (r >> R_EPOCH) & M32 != e:
            e = (r >> R_EPOCH) & M32
            t = self.epochs[e]
        accepted: bool = (r >> R_STATUS) & M2 == STATUS_ACCEPTED
        reward: uint256 = (r & M32) * (t & M60)
        if not blocked and self._unlock_at(r, t) <= block.timestamp:
            matured += 1
            if accepted:
                ripe += reward
        else:
            blocked = True
            if accepted:
                waiting += reward
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
