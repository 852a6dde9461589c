"""The random-kill soak (issue 60): a CPU training run SIGKILLed again and again, resumed with
``train.resume=auto`` after each kill, must end bitwise equal to a run never interrupted.

What is compared at the end (``compare``): the final checkpoint's drafter weights and every DCP
tensor (weights, Adam moments and steps), its optimizer hyperparameters, its ``trainer_state.json``
(step/sample/token counters, the data position: epoch, micro-batch cursor, steps done; the LR
schedule) but the wall-clock ``train_seconds``; every row of ``metrics.jsonl`` but the wall-clock
fields (``tokens_per_s``, ``*_s``): no step missing, none twice; the summary's losses and steps.
And no debris: no temporary left in the run folder or the data cache.

Where the kills land: a kill at a random time almost never falls inside a write, so most kills
are aimed (``DFLASH_KILL_AT``, ``dflash_train/faultpoints.py``) at a named moment inside one:
a checkpoint's shards written but not its JSON (``checkpoint-shards``), a complete checkpoint
not yet renamed (``checkpoint-complete``), a finished run's last step N set aside for its
replacement (``checkpoint-replace``), a data-cache entry's rows written but not its checksums
(``cache-arrow``) or complete but not published (``cache-checksums``; the cache is emptied
before such a kill so that the run writes it), a metrics line not yet closed
(``metrics-append``), a TensorBoard flush, and an atomic rewrite before its rename (the metrics
rewind, the run config, the summary), spread over the run's steps (``plan``). Every fourth falls
at a random moment of the next two steps; the child's trace (``DFLASH_FAULT_TRACE``) says which
write it had passed last.

    PYTHONPATH=src:tests python tests/faults/soak.py --kills 24 --steps 12 --seed 0 --out runs/soak   # the long soak
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHECKPOINT_POINTS = ("checkpoint-shards", "checkpoint-complete", "checkpoint-replace")
CACHE_POINTS = ("cache-arrow", "cache-checksums")
TRACKING_POINTS = ("metrics-append", "tensorboard-flush", "atomic-write:metrics.jsonl",
                   "atomic-write:config.json", "atomic-write:summary.json")
WALL_CLOCK = ("tokens_per_s", "_sha256")  # (a line's checksum covers them) plus every key ending in "_s": per-role seconds


@dataclass
class Kill:
    """One planned kill: ``aim`` is ``<point>:<n>`` (the n-th time the child reaches it) or a
    delay in seconds; ``fell`` and ``step`` say where it landed (the last write passed, the
    last step logged); ``landed`` False: the child finished first."""

    aim: str | float  # "<point>:<n>", "<point>:@<step>" or seconds after the data is loaded
    fell: str = ""
    step: int = 0
    landed: bool = False


@dataclass
class Soak:
    folder: Path
    steps: int = 8
    env: dict = field(default_factory=dict)

    @property
    def job(self) -> Path:
        return self.folder / "job.json"

    def setup(self, tokenizer: Path) -> None:
        """A tiny random target, repetitive chat data and the job: a checkpoint every step, two
        kept, a metric line every step, TensorBoard on, a data cache in the folder."""
        sys.path.insert(0, str(REPO / "tests"))
        from testkit import tiny_chat_job

        from dflash_train.assets import write_tiny_model

        write_tiny_model(self.folder / "target", tokenizer)
        job = tiny_chat_job(self.folder, max_steps=self.steps, save_every_steps=1, keep_last=2)
        job["target"]["path"] = str(self.folder / "target")
        job["drafter"].update(num_target_features=None, target_layer_ids=[0, 2])
        job["train"]["resume"] = "auto"
        self.job.write_text(json.dumps(job, indent=1))

    def command(self, run_dir: Path) -> list[str]:
        return [sys.executable, "-m", "dflash_train.cli", "train", str(self.job), f"train.run_dir={run_dir}"]

    def start(self, run_dir: Path, log: Path, trace: Path, kill_at: str | None = None) -> subprocess.Popen:
        env = {**os.environ, **self.env, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
               "DFLASH_FAULT_TRACE": str(trace)}
        env.pop("DFLASH_KILL_AT", None)
        if kill_at is not None:
            env["DFLASH_KILL_AT"] = kill_at
        with open(log, "w") as out:  # its own session: the kill reaches every process it started
            return subprocess.Popen(self.command(run_dir), env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    def run_once(self, run_dir: Path, name: str) -> float:
        """An uninterrupted run (the reference, or the last of the soak); the seconds it ran after
        its data was loaded (the part of a run a timed kill is drawn from)."""
        log = self.folder / f"{name}.log"
        proc = self.start(run_dir, log, self.folder / f"{name}.trace")
        started = wait_for_training(proc, log)
        if proc.wait() != 0:
            raise RuntimeError(f"{name} failed (exit {proc.returncode}): {tail(log)}")
        return time.monotonic() - started

    def resolve(self, aim: str | float, run_dir: Path) -> str | float:
        """``point:@S`` (a kill near step S) as the visit of ``point`` that this run, resuming from
        its newest checkpoint, makes at step S (the first one when it is past S already)."""
        from dflash_train.run_folder import checkpoint_step, latest_checkpoint

        point, _, visit = aim.rpartition(":") if isinstance(aim, str) else ("", "", "")
        if not visit.startswith("@"):
            return aim
        newest = latest_checkpoint(run_dir)
        done = checkpoint_step(newest) if newest is not None else 0
        return f"{point}:{max(1, int(visit[1:]) - done)}"

    def attempt(self, run_dir: Path, kill: Kill, index: int) -> Kill:
        """Start the run (resuming), kill it as ``kill`` aims, and record where it fell."""
        log, trace = self.folder / f"kill-{index:02d}.log", self.folder / f"kill-{index:02d}.trace"
        kill.aim = self.resolve(kill.aim, run_dir)
        aimed = isinstance(kill.aim, str)
        if aimed and kill.aim.startswith("cache-"):
            shutil.rmtree(self.folder / "cache", ignore_errors=True)  # so that this run writes the entry
        proc = self.start(run_dir, log, trace, kill.aim if aimed else None)
        if not aimed:
            wait_for_training(proc, log)
        try:
            proc.wait(timeout=None if aimed else kill.aim)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        kill.landed = proc.returncode == -signal.SIGKILL
        if proc.returncode not in (0, -signal.SIGKILL):
            raise RuntimeError(f"kill {index} ({kill.aim}): the resumed run failed (exit {proc.returncode}): "
                               f"{tail(log)}")
        points = trace.read_text().split() if trace.exists() else []
        kill.fell = points[-1] if points else "before any write"
        kill.step = last_step(log)
        return kill


def wait_for_training(proc: subprocess.Popen, log: Path) -> float:
    """Wait until the child has loaded its data (its ``data: N sequences`` line: imports, target and
    cache are behind it) or has ended; returns that moment (``time.monotonic``)."""
    while proc.poll() is None and "sequences," not in log.read_text(errors="replace"):
        time.sleep(0.02)
    return time.monotonic()


def plan(rng: random.Random, kills: int, steps: int, seconds: float):
    """Kills spread over the run: the i-th near step ``1 + i * steps / kills`` (its aimed visit is
    resolved against the checkpoint it resumes from), every fourth at a random moment of the
    next two steps' time (``seconds``: one whole run's training), the others aimed at a point of
    the checkpoint, cache and tracking writes in turn; the last two inside the end of a finished
    run (its summary, then its last checkpoint's replacement). Then timed ones without end."""
    groups = (CHECKPOINT_POINTS[:2], CACHE_POINTS, TRACKING_POINTS[:4])  # the end's points come last
    for i in range(max(kills - 2, 0)):
        if i % 4 == 3:
            yield Kill(round(rng.uniform(0.0, 2 * seconds / steps), 2))
            continue
        point = rng.choice(groups[(i - i // 4) % 3])
        once = point.startswith(("cache-", "atomic-write"))
        yield Kill(f"{point}:1" if once else f"{point}:@{min(steps, 1 + i * steps // kills)}")
    yield Kill("atomic-write:summary.json:1")
    yield Kill("checkpoint-replace:1")
    while True:
        yield Kill(round(rng.uniform(0.0, 2 * seconds / steps), 2))


def soak(folder: Path, kills: list[Kill] | int, steps: int = 8, seed: int = 0, tokenizer: Path | None = None,
         echo=print) -> dict:
    """Set up, run the reference, kill and resume the soak run (the given kills, or drawn ones
    until ``kills`` have landed), finish it, compare. Returns the report (``differences`` empty: equal)."""
    s = Soak(Path(folder), steps)
    s.folder.mkdir(parents=True, exist_ok=True)
    s.setup(tokenizer or REPO / "assets" / "smollm2")
    seconds = s.run_once(s.folder / "reference", "reference")
    echo(f"reference run: {steps} steps, {seconds:.1f} s from its data loaded to its end")
    planned = iter(kills) if isinstance(kills, list) else plan(random.Random(seed), kills, steps, seconds)
    wanted = len(kills) if isinstance(kills, list) else kills
    done: list[Kill] = []  # a drawn kill whose run finished first does not count: draw until enough landed
    for i, kill in enumerate(planned):
        if sum(k.landed for k in done) >= wanted or i >= 2 * wanted:
            break
        done.append(s.attempt(s.folder / "soak", kill, i))
        echo(f"kill {i}: aimed {kill.aim}, {'fell after ' + kill.fell if kill.landed else 'finished first'}, "
             f"last step logged {kill.step}")
    s.run_once(s.folder / "soak", "final")
    differences = compare(s.folder / "reference", s.folder / "soak") + debris(s.folder)
    return {"steps": steps, "seed": seed, "kills": [vars(k) for k in done],
            "landed": sum(k.landed for k in done), "differences": differences}


# -- the comparison -------------------------------------------------------------------------------
def compare(reference: Path, other: Path) -> list[str]:
    """What differs between two run folders' final state (see the module docstring); [] if none."""
    from dflash_train.run_folder import latest_checkpoint

    a, b = latest_checkpoint(reference), latest_checkpoint(other)
    if a is None or b is None or a.name != b.name:
        return [f"final checkpoints differ: {a} vs {b}"]
    out = _tensors(a / "drafter.safetensors", b / "drafter.safetensors")
    for shard in sorted((a / "state").glob("*.safetensors")):
        out += _tensors(shard, b / "state" / shard.name)
    out += _json_diff(a / "optim_groups.json", b / "optim_groups.json")
    out += _json_diff(a / "trainer_state.json", b / "trainer_state.json", drop=("train_seconds",))
    out += _rows_diff(_metrics(reference), _metrics(other))
    summary = [{k: json.loads((run / "summary.json").read_text()).get(k) for k in ("first_loss", "last_loss", "steps")}
               for run in (reference, other)]
    if summary[0] != summary[1]:
        out.append(f"summary.json differs: {summary[0]} vs {summary[1]}")
    return out


def _tensors(a: Path, b: Path) -> list[str]:
    import torch
    from safetensors.torch import load_file

    if not b.exists():
        return [f"{b} missing"]
    x, y = load_file(a), load_file(b)
    if x.keys() != y.keys():
        return [f"{b.name}: tensors differ in names: {sorted(x.keys() ^ y.keys())}"]
    return [f"{b.parent.name}/{b.name}: {k} differs" for k in x
            if x[k].dtype != y[k].dtype or not torch.equal(x[k], y[k])]


def _strip(value, drop):
    if isinstance(value, dict):
        return {k: _strip(v, drop) for k, v in value.items() if k not in drop}
    return value


def _json_diff(a: Path, b: Path, drop=()) -> list[str]:
    x, y = (_strip(json.loads(p.read_text()), drop) for p in (a, b))
    return [] if x == y else [f"{b.name} differs: {x} vs {y}"]


def _metrics(run: Path) -> list[str]:
    """Each row of ``metrics.jsonl`` without its wall-clock fields, as canonical JSON (NaN equal to NaN)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [json.dumps({k: v for k, v in row.items() if k not in WALL_CLOCK and not k.endswith("_s")},
                       sort_keys=True) for row in rows]


def _rows_diff(a: list[str], b: list[str]) -> list[str]:
    if a == b:
        return []
    steps = [[json.loads(r)["step"] for r in rows] for rows in (a, b)]
    if steps[0] != steps[1]:
        return [f"metrics.jsonl steps differ: {steps[0]} vs {steps[1]}"]
    return [f"metrics.jsonl row of step {json.loads(x)['step']} differs: {x} vs {y}" for x, y in zip(a, b) if x != y]


def latest_checkpoint_state(run: Path) -> Path:
    """The ``trainer_state.json`` of a run's newest checkpoint."""
    from dflash_train.run_folder import latest_checkpoint

    return latest_checkpoint(run) / "trainer_state.json"


def debris(folder: Path) -> list[str]:
    """Temporaries or set-aside checkpoints left in the soak's run folder or data cache."""
    left = [p for where in (folder / "soak", folder / "cache") if where.exists() for p in where.rglob("*")
            if ".tmp" in p.name or p.name.endswith(".old") or ".write-test-" in p.name]
    return [f"debris left: {p}" for p in left]


def tail(log: Path, lines: int = 3) -> str:
    text = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    return " | ".join(text[-lines:])


def last_step(log: Path) -> int:
    """The last ``step N |`` line the child printed (0: none)."""
    steps = [int(line.split()[1]) for line in log.read_text(errors="replace").splitlines()
             if line.startswith("step ") and line.split()[1].isdigit()]
    return steps[-1] if steps else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=24)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True, help="a new folder for the runs and the report")
    args = p.parse_args(argv)
    report = soak(args.out, args.kills, args.steps, args.seed)
    (args.out / "soak.json").write_text(json.dumps(report, indent=1))
    where: dict[str, int] = {}
    for k in report["kills"]:
        if k["landed"]:
            where[k["fell"]] = where.get(k["fell"], 0) + 1
    print(f"{report['landed']} of {len(report['kills'])} kills landed; where: {json.dumps(where, sort_keys=True)}")
    print("equal to the uninterrupted run" if not report["differences"] else "\n".join(report["differences"]))
    return 0 if not report["differences"] else 1


if __name__ == "__main__":
    sys.exit(main())
