# pragma version 0.4.3
# pragma evm-version cancun
"""
@title intellect-node work ledger
@notice Staking, work submission, validator verdicts, slashing and rewards for one run.

Rules:
- The deployer is the run owner: it appoints and removes validators, sets the
  parameters, and funds the reward pool.
- Anyone registers as a worker with at least `min_stake`, bound to its node's Ed25519
  public key (from which the libp2p peer id is derived).
- A registered worker whose stake is at least `min_stake` submits each work key once.
- Within `verdict_window` seconds of submission a validator accepts or rejects the key.
  Accept reserves `units * reward_per_unit` from the pool for the worker, claimable
  `reward_lock` seconds after the verdict. Reject slashes `slash_bps` of the worker's
  stake (then of its unbonding stake), pays `validator_share_bps` of that to the
  validator and burns the rest; a reject may overturn an earlier accept of the same key
  within the window, which voids that key's reward.
- Unvalidated work past the window: anyone may `settle` it, and it is accepted
  optimistically (the reward accrues as for an accept). Validators act on fraud.
- Unbonding moves stake out at once and lets it be withdrawn `unbonding_delay` seconds
  later; unbonding stake can still be slashed until withdrawn.
"""

MAX_VALIDATORS_LOOP: constant(uint256) = 256
MAX_CLAIM: constant(uint256) = 256
BPS: constant(uint256) = 10000

STATUS_NONE: constant(uint8) = 0
STATUS_PENDING: constant(uint8) = 1
STATUS_ACCEPTED: constant(uint8) = 2
STATUS_REJECTED: constant(uint8) = 3

struct Worker:
    registered: bool
    peer_key: bytes32
    stake: uint256
    unbonding: uint256
    unbond_at: uint256
    accepted: uint256
    rejected: uint256
    slashed: uint256

struct Submission:
    worker: address
    units: uint256
    policy_version: uint256
    submitted_at: uint256
    status: uint8
    reward: uint256
    entry: uint256

struct Entry:
    key: bytes32
    amount: uint256
    unlock_at: uint256
    voided: bool

event ValidatorSet:
    validator: indexed(address)
    active: bool

event ParamsSet:
    min_stake: uint256
    reward_per_unit: uint256
    slash_bps: uint256
    validator_share_bps: uint256
    verdict_window: uint256
    unbonding_delay: uint256
    reward_lock: uint256

event Funded:
    sender: indexed(address)
    amount: uint256

event Registered:
    worker: indexed(address)
    peer_key: bytes32
    stake: uint256

event StakeAdded:
    worker: indexed(address)
    amount: uint256

event WorkSubmitted:
    worker: indexed(address)
    key: indexed(bytes32)
    units: uint256
    policy_version: uint256

event WorkAccepted:
    worker: indexed(address)
    key: indexed(bytes32)
    validator: indexed(address)
    reward: uint256
    unlock_at: uint256

event WorkRejected:
    worker: indexed(address)
    key: indexed(bytes32)
    validator: indexed(address)
    slashed: uint256
    validator_share: uint256
    voided_reward: uint256

event WorkSettled:
    worker: indexed(address)
    key: indexed(bytes32)
    reward: uint256
    unlock_at: uint256

event Claimed:
    account: indexed(address)
    amount: uint256

event Unbonded:
    worker: indexed(address)
    amount: uint256
    withdrawable_at: uint256

event Withdrawn:
    worker: indexed(address)
    amount: uint256

owner: public(address)
is_validator: public(HashMap[address, bool])
min_stake: public(uint256)
reward_per_unit: public(uint256)
slash_bps: public(uint256)
validator_share_bps: public(uint256)
verdict_window: public(uint256)
unbonding_delay: public(uint256)
reward_lock: public(uint256)

reward_pool: public(uint256)
total_burned: public(uint256)
workers: public(HashMap[address, Worker])
submissions: public(HashMap[bytes32, Submission])
credit: public(HashMap[address, uint256])

# per-worker FIFO of accrued rewards: entries [head, tail) unlock in order
entries: HashMap[address, HashMap[uint256, Entry]]
head: HashMap[address, uint256]
tail: HashMap[address, uint256]
locked_rewards: public(HashMap[address, uint256])


@deploy
def __init__(
    min_stake: uint256,
    reward_per_unit: uint256,
    slash_bps: uint256,
    validator_share_bps: uint256,
    verdict_window: uint256,
    unbonding_delay: uint256,
    reward_lock: uint256,
):
    self.owner = msg.sender
    self._set_params(min_stake, reward_per_unit, slash_bps, validator_share_bps, verdict_window, unbonding_delay, reward_lock)


@internal
def _set_params(
    min_stake: uint256,
    reward_per_unit: uint256,
    slash_bps: uint256,
    validator_share_bps: uint256,
    verdict_window: uint256,
    unbonding_delay: uint256,
    reward_lock: uint256,
):
    assert slash_bps <= BPS, "slash_bps above 10000"
    assert validator_share_bps <= BPS, "validator_share_bps above 10000"
    assert min_stake > 0, "min_stake is zero"
    assert verdict_window > 0, "verdict_window is zero"
    self.min_stake = min_stake
    self.reward_per_unit = reward_per_unit
    self.slash_bps = slash_bps
    self.validator_share_bps = validator_share_bps
    self.verdict_window = verdict_window
    self.unbonding_delay = unbonding_delay
    self.reward_lock = reward_lock
    log ParamsSet(
        min_stake=min_stake,
        reward_per_unit=reward_per_unit,
        slash_bps=slash_bps,
        validator_share_bps=validator_share_bps,
        verdict_window=verdict_window,
        unbonding_delay=unbonding_delay,
        reward_lock=reward_lock,
    )


# ---- owner ------------------------------------------------------------------------


@external
def set_params(
    min_stake: uint256,
    reward_per_unit: uint256,
    slash_bps: uint256,
    validator_share_bps: uint256,
    verdict_window: uint256,
    unbonding_delay: uint256,
    reward_lock: uint256,
):
    assert msg.sender == self.owner, "only the owner"
    self._set_params(min_stake, reward_per_unit, slash_bps, validator_share_bps, verdict_window, unbonding_delay, reward_lock)


@external
def set_validator(validator: address, active: bool):
    assert msg.sender == self.owner, "only the owner"
    assert validator != empty(address), "zero address"
    self.is_validator[validator] = active
    log ValidatorSet(validator=validator, active=active)


@external
@payable
def fund():
    assert msg.value > 0, "nothing sent"
    self.reward_pool += msg.value
    log Funded(sender=msg.sender, amount=msg.value)


# ---- workers ----------------------------------------------------------------------


@external
@payable
def register(peer_key: bytes32):
    assert not self.workers[msg.sender].registered, "already registered"
    assert msg.value >= self.min_stake, "stake below minimum"
    assert peer_key != empty(bytes32), "empty peer key"
    self.workers[msg.sender] = Worker(
        registered=True, peer_key=peer_key, stake=msg.value, unbonding=0, unbond_at=0, accepted=0, rejected=0, slashed=0
    )
    log Registered(worker=msg.sender, peer_key=peer_key, stake=msg.value)


@external
@payable
def add_stake():
    assert self.workers[msg.sender].registered, "not a registered worker"
    assert msg.value > 0, "nothing sent"
    self.workers[msg.sender].stake += msg.value
    log StakeAdded(worker=msg.sender, amount=msg.value)


@external
def submit_work(key: bytes32, units: uint256, policy_version: uint256):
    w: Worker = self.workers[msg.sender]
    assert w.registered, "not a registered worker"
    assert w.stake >= self.min_stake, "stake below minimum"
    assert units > 0, "zero units"
    assert self.submissions[key].status == STATUS_NONE, "work key already submitted"
    self.submissions[key] = Submission(
        worker=msg.sender, units=units, policy_version=policy_version, submitted_at=block.timestamp, status=STATUS_PENDING, reward=0, entry=0
    )
    log WorkSubmitted(worker=msg.sender, key=key, units=units, policy_version=policy_version)


@internal
def _accrue(key: bytes32) -> (uint256, uint256):
    s: Submission = self.submissions[key]
    reward: uint256 = s.units * self.reward_per_unit
    assert self.reward_pool >= reward, "reward pool too small"
    self.reward_pool -= reward
    unlock_at: uint256 = block.timestamp + self.reward_lock
    i: uint256 = self.tail[s.worker]
    self.entries[s.worker][i] = Entry(key=key, amount=reward, unlock_at=unlock_at, voided=False)
    self.tail[s.worker] = i + 1
    self.locked_rewards[s.worker] += reward
    self.submissions[key].status = STATUS_ACCEPTED
    self.submissions[key].reward = reward
    self.submissions[key].entry = i
    self.workers[s.worker].accepted += 1
    return reward, unlock_at


# ---- validators -------------------------------------------------------------------


@external
def accept(key: bytes32):
    assert self.is_validator[msg.sender], "only a validator"
    s: Submission = self.submissions[key]
    assert s.status == STATUS_PENDING, "work is not pending"
    assert block.timestamp <= s.submitted_at + self.verdict_window, "verdict window closed"
    reward: uint256 = 0
    unlock_at: uint256 = 0
    reward, unlock_at = self._accrue(key)
    log WorkAccepted(worker=s.worker, key=key, validator=msg.sender, reward=reward, unlock_at=unlock_at)


@external
@nonreentrant
def reject(key: bytes32):
    assert self.is_validator[msg.sender], "only a validator"
    s: Submission = self.submissions[key]
    assert s.status == STATUS_PENDING or s.status == STATUS_ACCEPTED, "work is not pending or accepted"
    assert block.timestamp <= s.submitted_at + self.verdict_window, "verdict window closed"
    voided: uint256 = 0
    if s.status == STATUS_ACCEPTED:
        e: Entry = self.entries[s.worker][s.entry]
        if not e.voided:
            self.entries[s.worker][s.entry].voided = True
            self.locked_rewards[s.worker] -= e.amount
            self.reward_pool += e.amount
            voided = e.amount
        self.workers[s.worker].accepted -= 1
    self.submissions[key].status = STATUS_REJECTED
    self.submissions[key].reward = 0

    w: Worker = self.workers[s.worker]
    slash: uint256 = (w.stake + w.unbonding) * self.slash_bps // BPS
    from_stake: uint256 = min(slash, w.stake)
    from_unbonding: uint256 = slash - from_stake
    self.workers[s.worker].stake = w.stake - from_stake
    self.workers[s.worker].unbonding = w.unbonding - from_unbonding
    self.workers[s.worker].rejected += 1
    self.workers[s.worker].slashed += slash
    share: uint256 = slash * self.validator_share_bps // BPS
    self.credit[msg.sender] += share
    burned: uint256 = slash - share
    self.total_burned += burned
    log WorkRejected(worker=s.worker, key=key, validator=msg.sender, slashed=slash, validator_share=share, voided_reward=voided)
    if burned > 0:
        send(empty(address), burned)


@external
def settle(key: bytes32):
    s: Submission = self.submissions[key]
    assert s.status == STATUS_PENDING, "work is not pending"
    assert block.timestamp > s.submitted_at + self.verdict_window, "verdict window still open"
    reward: uint256 = 0
    unlock_at: uint256 = 0
    reward, unlock_at = self._accrue(key)
    log WorkSettled(worker=s.worker, key=key, reward=reward, unlock_at=unlock_at)


# ---- rewards and stake ------------------------------------------------------------


@view
@internal
def _matured(account: address) -> uint256:
    total: uint256 = 0
    i: uint256 = self.head[account]
    for _: uint256 in range(MAX_CLAIM):
        if i >= self.tail[account]:
            break
        e: Entry = self.entries[account][i]
        if e.unlock_at > block.timestamp:
            break
        if not e.voided:
            total += e.amount
        i += 1
    return total


@view
@external
def claimable(account: address) -> uint256:
    """Rewards past their lock plus validator credit (up to 256 entries at a time)."""
    return self._matured(account) + self.credit[account]


@view
@external
def pending(account: address) -> uint256:
    """Accrued rewards still locked."""
    return self.locked_rewards[account] - self._matured(account)


@external
@nonreentrant
def claim() -> uint256:
    total: uint256 = self.credit[msg.sender]
    self.credit[msg.sender] = 0
    i: uint256 = self.head[msg.sender]
    for _: uint256 in range(MAX_CLAIM):
        if i >= self.tail[msg.sender]:
            break
        e: Entry = self.entries[msg.sender][i]
        if e.unlock_at > block.timestamp:
            break
        if not e.voided:
            total += e.amount
            self.locked_rewards[msg.sender] -= e.amount
        i += 1
    self.head[msg.sender] = i
    assert total > 0, "nothing to claim"
    log Claimed(account=msg.sender, amount=total)
    send(msg.sender, total)
    return total


@external
def unbond(amount: uint256):
    w: Worker = self.workers[msg.sender]
    assert w.registered, "not a registered worker"
    assert amount > 0, "zero amount"
    assert amount <= w.stake, "amount above stake"
    self.workers[msg.sender].stake = w.stake - amount
    self.workers[msg.sender].unbonding = w.unbonding + amount
    withdrawable_at: uint256 = block.timestamp + self.unbonding_delay
    self.workers[msg.sender].unbond_at = withdrawable_at
    log Unbonded(worker=msg.sender, amount=amount, withdrawable_at=withdrawable_at)


@external
@nonreentrant
def withdraw() -> uint256:
    w: Worker = self.workers[msg.sender]
    assert w.unbonding > 0, "nothing unbonding"
    assert block.timestamp >= w.unbond_at, "unbonding delay not over"
    amount: uint256 = w.unbonding
    self.workers[msg.sender].unbonding = 0
    log Withdrawn(worker=msg.sender, amount=amount)
    send(msg.sender, amount)
    return amount
