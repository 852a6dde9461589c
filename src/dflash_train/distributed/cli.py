"""CLI wiring: ``dflash-train train`` goes distributed under torchrun; ``dflash-train plan``.

``register`` extends the ``train`` sub-command (registered earlier by ``train.cli``) with
``--target-ranks/--drafter-ranks`` and routes it to ``distributed.launch.run`` when torchrun's
variables (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``) are set, so the same command works
for one process and for ``torchrun ... $(which dflash-train) train CONFIG``.
"""

from __future__ import annotations

from dflash_train.cli_types import positive_int
from dflash_train.distributed.env import launched_by_torchrun


def register(sub) -> None:
    train_parser = sub.choices.get("train")
    if train_parser is not None:
        from dflash_train.distributed.launch import add_arguments

        add_arguments(train_parser, with_config=False)
        single = train_parser.get_default("func")
        train_parser.set_defaults(func=lambda args: run_train(args, single))
    p = sub.add_parser("plan", help="measure target and drafter speed; recommend colocated or an N:M split")
    p.add_argument("config", help="a YAML/JSON config file or a recipe name")
    p.add_argument("overrides", nargs="*", help="section.key=value")
    p.add_argument("--gpus", type=positive_int, required=True, help="GPUs the job will use (G)")
    p.add_argument("--steps", type=positive_int, default=3, help="timed steps per side (after one warm-up)")
    p.set_defaults(func=_run_plan)


def run_train(args, single) -> int:
    if not launched_by_torchrun():
        if args.target_ranks or args.drafter_ranks:
            raise ValueError("--target-ranks/--drafter-ranks need several processes: launch with torchrun")
        return single(args)
    from dflash_train.config import job_from_args
    from dflash_train.distributed.launch import run

    run(job_from_args(args), target_ranks=args.target_ranks, drafter_ranks=args.drafter_ranks)
    return 0


def _run_plan(args) -> int:
    from dflash_train.distributed.plan import run_plan

    return run_plan(args)
