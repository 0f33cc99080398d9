"""What runs in a role's child process, off the trio thread: ``offload`` starts a class
in a spawned process from its frozen spec and forwards typed calls to it; the children are
the validator's batch checker (``checking``), a DiLoCo member's GRPO policy
(``grouppolicy``) and its pretraining policy (``pretrainpolicy``). The worker's batch
maker (``node/rollouts/maker.py``) and the trainer's policy worker
(``node/training/worker.py``) are children too, kept beside the code they run."""
