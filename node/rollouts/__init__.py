"""Rollouts: generating a proven batch from assigned tasks (``generate``), and the worker's
durable store of signed batches (``store``)."""
