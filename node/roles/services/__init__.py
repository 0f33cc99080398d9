"""The roles themselves: each a trio service with a run loop (``run(node, cfg, weights, *,
task_status)``, chosen in ``node/roles/__init__.py``) that moves bytes between the network,
its child process and the chain, and leaves every decision to ``node/roles/decisions/``:
``inference`` (a worker), ``validator``, ``trainer``, and the trainer as a member of a
DiLoCo group (``grouptrainer``: GRPO; ``pretrainer``: pretraining on a text corpus)."""
