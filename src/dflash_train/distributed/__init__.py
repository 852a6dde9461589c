"""Distributed training: torchrun launch, colocated DDP/FSDP2, disaggregated target/drafter ranks.

* ``env``: process-group set-up from torchrun's environment, timeouts, clean shutdown.
* ``colocated``: every rank runs target + drafter on its data shard (DDP or FSDP2).
* ``disagg``: target ranks stream features to drafter ranks over point-to-point.
* ``launch``: the entry point (``torchrun -m dflash_train.distributed.launch`` or ``dflash-train train``).
* ``plan``: measures target and drafter throughput and recommends a topology.

See ``README.md`` in this folder for launch commands.
"""
