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


def test_stacks_are_whole_lines_prefixed_with_the_rank(tmp_path):
    """Each line of the dump names its rank and is written by one call (two ranks that fire together
    share torchrun's stderr: faulthandler's own pieces interleaved mid-line there). A thread parked
    in a named function shows up by name."""
    import threading

    parked, release = threading.Event(), threading.Event()

    def parked_in_a_named_function():
        parked.set()
        release.wait(10)

    thread = threading.Thread(target=parked_in_a_named_function, daemon=True)
    thread.start()
    parked.wait(10)

    class Recorder:
        def __init__(self):
            self.writes = []

        def write(self, text):
            self.writes.append(text)

        def flush(self):
            pass

    out = Recorder()
    try:
        Watchdog(rank=3, role="target", start_seconds=10, step_seconds=10, stream=out).dump_stacks()
    finally:
        release.set()
    assert out.writes and all(w.startswith("[rank 3] ") and w.endswith("\n") and w.count("\n") == 1
                              for w in out.writes)
    assert any("in parked_in_a_named_function" in w for w in out.writes)
    assert any("in test_stacks_are_whole_lines_prefixed_with_the_rank" in w for w in out.writes)
