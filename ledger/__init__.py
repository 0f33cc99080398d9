"""On-chain staking, work submission, validator verdicts, slashing and rewards.

``contracts/WorkLedger.vy`` and its committed artifact, ``chain`` (every backend
difference), ``devchain`` (the embedded chain over JSON-RPC), ``client`` (typed calls,
local signing), ``accounts`` (encrypted keystore), ``history`` (incremental event index).
"""
