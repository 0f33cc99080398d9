"""Cheating workers for tests: the real binary with its inference role and batch maker
swapped for ones that cheat on purpose (``worker.py``, run as a process of its own), what
they can do (``catalogue.py``), how (``role.py``, ``maker.py``), and a devnet with some of
them among its workers (``devnet.py``)."""
