"""On-chain staking, work submission, verdicts and rewards (not built yet: issue #5)."""
