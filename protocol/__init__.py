"""Everything on the wire: message types, framing, protocol ids, topics, DHT keys.

Depends on ``crypto`` only; never on ``node`` or ``ledger``.
"""
