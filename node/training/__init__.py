"""The training library: GRPO loss and samples (``grpo``), the policy being trained and
its checkpoints (``policy``), the held-out evaluation (``heldout``) and the centralized
baseline that runs all of it in one process (``central``)."""
