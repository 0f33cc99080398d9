"""The contract's status and reject-reason codes (``contracts/WorkLedger.vy``'s ``STATUS_*``
and ``REASON_*`` constants), in a module of their own so that a node reads them without
importing web3 (a network-only node never talks to a chain)."""

REASONS = {"invalid": 1, "unavailable": 2, "mismatch": 3}
REASON_NAMES = {v: k for k, v in REASONS.items()}  # a rejection's reason code, in words
STATUS = {0: "none", 1: "pending", 2: "accepted", 3: "rejected"}
