"""The network layer: the py-libp2p host and the services ``Node`` composes (requests,
presence, discovery and connection upkeep, announcements), their pure state machines,
metrics and the local admin endpoint."""
