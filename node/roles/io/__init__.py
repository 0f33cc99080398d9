"""The roles' I/O parts, each used by a role's service and tested against a chain or a
network of its own: the ledger as the roles read it (``chain``, the validator's history
before its start: ``catchup``), the worker's submissions until judged (``submissions``),
what the chain gives a validator to judge (``docket``) and its votes (``votes``), batches
served and fetched (``exchange``) and gathered by the trainer (``gathering``), and a
DiLoCo member's rounds (``rounds``) and joining a running group (``joining``)."""
