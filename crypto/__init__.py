"""Identities, signatures and hashes: pure functions over bytes, no I/O, no networking."""
