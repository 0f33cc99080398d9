"""SHARDCAST: signed, verified, multi-source weight distribution (see service.py)."""
