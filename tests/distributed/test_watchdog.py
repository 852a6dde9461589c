"""The watchdog's budgets (its firing is tested end to end in test_dist_training.py)."""

from __future__ import annotations

from dflash_train.distributed.watchdog import Watchdog


def test_budget_follows_the_phase():
    """Start-up (compiling) gets the long budget, steps the short one, and a checkpoint or a
    held-out evaluation (other ranks wait for it) the long one again until the next step."""
    dog = Watchdog(rank=1, role="drafter", start_seconds=1800, step_seconds=60)
    assert dog.limit == 1800 and dog.phase == "start-up"
    dog.beat("after step 1", steady=True)
    assert dog.limit == 60
    dog.beat("held-out evaluation", long=True)
    assert dog.limit == 1800 and dog.phase == "held-out evaluation"
    dog.beat("after step 2", steady=True)
    assert dog.limit == 60


def test_zero_disables():
    assert not Watchdog(0, "colocated", start_seconds=0, step_seconds=60).enabled
    assert Watchdog(0, "colocated", start_seconds=10, step_seconds=60).enabled
