"""What the tests share: real node processes and clusters (``net``), the tiny model
(``tiny_lm``), the ledger fixtures (``ledger``), a peer that misbehaves on purpose
(``evil_node``), and workers that cheat on purpose (``cheating``)."""
