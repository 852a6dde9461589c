"""The read/write points wired in the second round of issue 39 (docs/faults.md): checkpoint save
and load, export, the run folder's metrics/summary/config, compile artifacts, eval reports,
regeneration output, the data readers and prompt files, each under every fault that applies
(``fault_harness.py``). On 7f9d2a4 these fail: ENOSPC tracebacks out of DCP and a ``step-N.tmp``
left behind, raw ``OSError``s, ``metrics.jsonl.tmp`` debris, a data folder's link loop
recursing until the path is too long. The last section (rows 20, 21, 32, 38-41: run-folder mkdirs,
the curve, held-out prompts, compare/scaling/replay files, bench outputs, the target rank's log,
offline data, prompt sets, the model-folder conversion) fails on 84e3cf6 in 232 of its 237 fault cases."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from fault_harness import CONTENT_FAULTS, LINK_FAULTS, READ_ERRNOS, STAGES, WRITE_ERRNOS, Point, cases, drive
from testkit import tiny_drafter, tiny_qwen3

from dflash_train import files
from dflash_train.data.errors import SkipReport
from dflash_train.data.prompts import read_prompts
from dflash_train.data.readers import read_records, resolve_files
from dflash_train.data.regenerate import run_regenerate
from dflash_train.decoding.generators import Generation, Generator, SamplingParams
from dflash_train.eval.evaluate import write_report
from dflash_train.export.cli import read_training_artifact
from dflash_train.export.serving import export_drafter
from dflash_train.models.target import Target
from dflash_train.run_folder import (
    CHECKSUMS,
    COMPILE_ARTIFACTS,
    CONFIG,
    DRAFTER_CONFIG,
    DRAFTER_WEIGHTS,
    METRICS,
    SUMMARY,
    TRACKING,
    file_checksums,
)
from dflash_train.tracking.base import SinkSettings, save_run
from dflash_train.tracking.jsonl import JsonlSink, read_metrics
from dflash_train.train.checkpoint import PARTS, CheckpointManager
from dflash_train.train.compilation import load_artifacts, save_artifacts, save_artifacts_or_warn
from dflash_train.train.loop import write_run_config, write_summary


# -- checkpoints ----------------------------------------------------------------------------------
class _Position:
    def __init__(self):
        self.value = 0

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]


def _manager(run_dir: Path) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    clock = {"step": 2}
    manager = CheckpointManager(run_dir, model=model, optimizer=optimizer, drafter=model,
                                parts={"position": _Position()}, config={"train": {"seed": 0}},
                                drafter_config={"block_size": 4}, step=lambda: clock["step"], keep_last=3,
                                echo=lambda *a: None)
    return {"manager": manager, "clock": clock, "run": run_dir}


def _save_setup(tmp):
    ctx = _manager(tmp / "run")
    ctx["earlier"] = ctx["manager"].save()  # step 2: must survive a failed save of step 4
    ctx["clock"]["step"] = 4
    return ctx


def _earlier_files(ctx) -> list[Path]:
    return sorted(p for p in ctx["earlier"].rglob("*") if p.is_file())


CHECKPOINT_SAVE = Point(
    name="checkpoint-save", setup=_save_setup, writes=True, act=lambda ctx: ctx["manager"].save(),
    target=lambda ctx: ctx["run"] / "checkpoints" / "step-00000004", keep=_earlier_files,
    names=lambda ctx: f"cannot save checkpoint {ctx['run'] / 'checkpoints' / 'step-00000004'}:",
    check=lambda ctx, final: (final / "COMPLETE").is_file() or pytest.fail("no COMPLETE"),
)


def _load_point(file: str, wrong_types: list[bytes], wrong_names: list[str]) -> Point:
    return Point(
        name=f"checkpoint-load-{file}", setup=_save_setup, act=lambda ctx: ctx["manager"].load(ctx["earlier"]),
        target=lambda ctx: ctx["earlier"] / file, names=lambda ctx: ctx["earlier"].name, content=lambda ctx: (ctx["earlier"] / file).read_bytes(),
        wrong_types=wrong_types, wrong_type_names=wrong_names,
    )


CHECKPOINT_LOAD = [
    _load_point(CONFIG, [b"[1, 2]", b'"text"'], [CONFIG, CONFIG]),
    _load_point(PARTS, [b"[1, 2]", b'{"position": 3}'], [PARTS, PARTS]),
]


# -- export ---------------------------------------------------------------------------------------
_DRAFTER = {}


def _tiny():
    if not _DRAFTER:
        drafter, cfg = tiny_drafter(Target(tiny_qwen3()), num_layers=1)
        _DRAFTER.update(drafter=drafter.eval(), cfg=cfg)
    return _DRAFTER["drafter"], _DRAFTER["cfg"]


def _export_setup(tmp):
    drafter, cfg = _tiny()
    out = export_drafter(drafter, cfg, tmp / "export", dtype=torch.float32)  # replaced with force: kept on failure
    return {"out": out, "drafter": drafter, "cfg": cfg}


EXPORT_WRITE = Point(
    name="export-write", setup=_export_setup, writes=True,
    act=lambda ctx: export_drafter(ctx["drafter"], ctx["cfg"], ctx["out"], force=True, dtype=torch.float32),
    target=lambda ctx: ctx["out"], keep=lambda ctx: sorted(p for p in ctx["out"].iterdir() if p.is_file()),
    check=lambda ctx, out: (out / "config.json").is_file() or pytest.fail("no config.json"),
)


def _artifact_setup(tmp):
    ctx = _manager(tmp / "run")
    _tiny_drafter, cfg = _tiny()
    ckpt = ctx["manager"].save()
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in _tiny_drafter.state_dict().items()}, str(ckpt / DRAFTER_WEIGHTS))
    (ckpt / DRAFTER_CONFIG).write_text(json.dumps(cfg.to_dict()))
    (ckpt / CHECKSUMS).write_text(json.dumps(file_checksums(ckpt)))
    return ckpt


def _artifact_point(file: str, faults: list[str] | None = None, wrong_types=()) -> Point:
    """The export's reads of a checkpoint: behind its checksums, so every fault is one line
    naming the checkpoint (and what to export instead)."""
    ckpt_name = "step-00000002"
    return Point(
        name=f"export-read-{file}", setup=_artifact_setup, act=read_training_artifact,
        target=lambda ckpt: ckpt / file, content=lambda ckpt: (ckpt / file).read_bytes(), faults=faults,
        names=lambda ckpt: ckpt.name, wrong_type_names=[ckpt_name] * len(wrong_types),
        wrong_types=list(wrong_types),
    )


EXPORT_READ = [
    _artifact_point(DRAFTER_CONFIG, wrong_types=[b"[1]", b'{"block_size": "big"}']),
    _artifact_point(DRAFTER_WEIGHTS, faults=["read:EACCES", "read:EIO", "dangling-link", "link-loop", "a-folder",
                                             "truncated", "garbage"]),
]


def test_a_killed_exports_temporary_is_swept(tmp_path, capsys):
    """A temporary of a dead owner (staged-folder name) and an old legacy one are swept, with a
    note; a fresh legacy one (an export that may still run) is left."""
    import os

    drafter, cfg = _tiny()
    dead = tmp_path / f".export.tmp-999999999@{__import__('socket').gethostname()}-abcdef"
    legacy_old, legacy_new = tmp_path / ".export.tmp-0123abcd", tmp_path / ".export.tmp-4567cdef"
    for folder in (dead, legacy_old, legacy_new):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"half")
    os.utime(legacy_old, (1, 1))
    export_drafter(drafter, cfg, tmp_path / "export", dtype=torch.float32)
    assert not dead.exists() and not legacy_old.exists() and legacy_new.exists()
    assert "removed 2 stale temporary" in capsys.readouterr().err



# -- the run folder: metrics, summary, config, compile artifacts -------------------------------
ROWS = [{"step": i, "loss": 1.0 / i} for i in (1, 2, 3)]
WRITE_FAULTS = [f"write:{e}:{s}" for e in WRITE_ERRNOS for s in STAGES]
APPEND_FAULTS = [f"write:{e}:{s}" for e in WRITE_ERRNOS for s in ("create", "write")]  # no rename


def _metrics_setup(tmp):
    run = tmp / "run"
    run.mkdir()
    (run / METRICS).write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return run


def _rewind(run, step: int = 2) -> list[dict]:
    JsonlSink(SinkSettings(run)).rewind(step)
    return read_metrics(run)


def _rewound(run, kept):
    assert all(r["step"] <= 2 for r in kept) and all(isinstance(r, dict) for r in kept)
    on_disk = [json.loads(line) for line in (run / METRICS).read_text().splitlines()]  # every line whole
    assert on_disk == kept, "metrics.jsonl does not hold exactly the rows kept"


METRICS_REWIND = Point(
    name="metrics-rewind", setup=_metrics_setup, writes=True, keep=lambda run: [run / METRICS],
    act=_rewind, target=lambda run: run / METRICS,
    check=_rewound, content=lambda run: (run / METRICS).read_bytes(), on_content="recover",
    faults=WRITE_FAULTS + [f"read:{e}" for e in READ_ERRNOS] + ["dangling-link", "link-loop", "a-folder"]
    + ["truncated", "garbage", "latin-1", "utf-16", "deep-nesting", "huge-line", "wrong-types"],
    wrong_types=[b'[1, 2]\n{"step": "1"}\n{"step": 1}\n', b'{"step": 1, "loss": 1.0}\n"text"\n'],
)
METRICS_LOG = Point(
    name="metrics-log", setup=_metrics_setup, writes=True, faults=APPEND_FAULTS, target=lambda run: run / METRICS,
    act=lambda run: JsonlSink(SinkSettings(run)).log(4, {"loss": 0.5}),
    check=lambda run, _: json.loads((run / METRICS).read_text().splitlines()[-1])["step"] == 4 or pytest.fail(),
)


def test_rewind_keeps_the_rows_up_to_the_step_and_drops_torn_ones(tmp_path):
    run = _metrics_setup(tmp_path)
    with (run / METRICS).open("a") as fh:
        fh.write('{"step": 2, "lo')  # torn by a kill
    assert _rewind(run) == ROWS[:2]
    assert (run / METRICS).read_text() == "".join(json.dumps(r) + "\n" for r in ROWS[:2])


def _old_file(name: str):
    def setup(tmp):
        run = tmp / "run"
        run.mkdir()
        (run / name).write_text('{"old": true}')
        return run
    return setup


def _write_config(run):
    trainer = SimpleNamespace(ranks=SimpleNamespace(is_main=True), run_dir=run,
                              cfg=SimpleNamespace(to_dict=lambda: {"train": {"seed": 0}}),
                              drafter_cfg=SimpleNamespace(to_dict=lambda: {"block_size": 4}))
    write_run_config(trainer)


RUN_CONFIG = Point(name="run-config", setup=_old_file(CONFIG), writes=True, act=_write_config,
                   target=lambda run: run / CONFIG, keep=lambda run: [run / CONFIG])
RUN_SUMMARY = Point(name="run-summary", setup=_old_file(SUMMARY), writes=True, target=lambda run: run / SUMMARY,
                    act=lambda run: write_summary(run, {"steps": 3}), keep=lambda run: [run / SUMMARY])
TRACKING_IDS = Point(name="tracking-ids", setup=_old_file(TRACKING), writes=True, faults=WRITE_FAULTS,
                     target=lambda run: run / TRACKING, keep=lambda run: [run / TRACKING],
                     act=lambda run: save_run(run, "wandb", {"id": "abc", "last_step": 4}))


def _save_compiled(run):
    with mock.patch.object(torch.compiler, "save_cache_artifacts", return_value=(b"artifacts" * 100, None)):
        return save_artifacts(run / COMPILE_ARTIFACTS)


COMPILE_SAVE = Point(name="compile-artifacts-save", setup=_old_file(COMPILE_ARTIFACTS), writes=True,
                     act=_save_compiled, target=lambda run: run / COMPILE_ARTIFACTS,
                     keep=lambda run: [run / COMPILE_ARTIFACTS])


def test_a_failed_artifacts_save_is_a_warning_and_a_corrupt_one_a_cold_start(tmp_path, monkeypatch, caplog):
    """After the first step a failed save was a traceback: now one warning line, the run goes on;
    a damaged artifacts file is a warning and a cold start."""
    lines = []

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (b"x", None))
    monkeypatch.setattr(files.os, "write", no_space)
    assert save_artifacts_or_warn(tmp_path / COMPILE_ARTIFACTS, lines.append) == 0
    assert len(lines) == 1 and lines[0].startswith("warning: cannot write compile artifacts") and "no space" in lines[0]
    assert not list(tmp_path.iterdir())
    monkeypatch.undo()
    (tmp_path / COMPILE_ARTIFACTS).write_bytes(b"garbage" * 10)
    assert load_artifacts(tmp_path / COMPILE_ARTIFACTS, lines.append) is False
    assert "starting cold" in lines[-1] and str(tmp_path / COMPILE_ARTIFACTS) in lines[-1]
    assert not [r for r in caplog.records if r.name.startswith("torch.compiler")], "torch's traceback warning"



# -- eval reports, regeneration output ------------------------------------------------------------
REPORT = {"acceptance_histogram": {"1": 3, "2": 1}, "mean_tau": 1.25, "per_position_acceptance": [0.25, None],
          "num_prompts": 2, "block_size": 4, "temperature": 0.0}


def _report_setup(tmp):
    out = tmp / "eval"
    out.mkdir()
    (out / "eval.json").write_text('{"old": true}')
    (out / "eval.png").write_bytes(b"old png")
    return out


EVAL_REPORT = Point(name="eval-report", setup=_report_setup, writes=True, act=lambda out: write_report(REPORT, out),
                    target=lambda out: out / "eval.json", names=lambda out: str(out),
                    keep=lambda out: [out / "eval.json", out / "eval.png"])


class _Echo(Generator):
    def generate(self, prompts, params):
        return [Generation(f"reply {len(p)}", None, 2) for p in prompts]


def _regen_setup(tmp):
    src = tmp / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "messages": [{"role": "user", "content": f"q{i}"},
                                                                    {"role": "assistant", "content": "old"}]}) + "\n"
                           for i in range(4)))
    out = tmp / "out.jsonl"
    _regenerate({"src": src, "out": out}, limit=2)  # two records already written: kept on a failure
    return {"src": src, "out": out, "before": out.read_bytes()}


def _regenerate(ctx, limit=None):
    report = SkipReport()
    return run_regenerate(read_records([str(ctx["src"])], report), _Echo(), ctx["out"], SamplingParams(8), 1,
                          report, limit=limit, progress=False)


def _regen_kept(ctx, summary):
    ids = [json.loads(line)["id"] for line in ctx["out"].read_text().splitlines()]
    assert ids == ["r0", "r1", "r2", "r3"], ids


REGENERATE = Point(
    name="regenerate-output", setup=_regen_setup, writes=True, faults=APPEND_FAULTS, act=_regenerate,
    target=lambda ctx: ctx["out"], check=_regen_kept,
)


def test_regenerate_keeps_the_lines_written_before_a_failure_and_resumes(tmp_path, monkeypatch):
    """No space after the first record: one line naming the output, the lines before it kept,
    and a rerun finishes the rest without duplicates."""
    ctx = _regen_setup(tmp_path)
    real_fsync, calls = files.os.fsync, []

    def full_after_one(fd):
        calls.append(fd)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr("dflash_train.data.regenerate.os.fsync", full_after_one)
    with pytest.raises(ValueError, match="cannot write regenerated data .*out.jsonl: no space left"):
        _regenerate(ctx)
    monkeypatch.undo()
    assert ctx["out"].read_bytes().startswith(ctx["before"])
    _regenerate(ctx)
    _regen_kept(ctx, None)


# -- data readers and prompt files ----------------------------------------------------------------
CHAT = [{"id": f"c{i}", "messages": [{"role": "user", "content": f"hi {i}"}, {"role": "assistant", "content": "yo"}]}
        for i in range(3)]


def _data_setup(suffix: str):
    def setup(tmp):
        path = tmp / f"chat{suffix}"
        if suffix == ".jsonl":
            path.write_text("".join(json.dumps(r) + "\n" for r in CHAT))
        else:
            path.write_text(json.dumps(CHAT))
        return path
    return setup


def _read_all(path):
    report = SkipReport()
    return list(read_records([str(path)], report)), report


def _counted(path, result):
    records, report = result
    assert len(records) + report.total_skipped == report.read, "a record neither kept nor counted"
    for rec in records:
        assert rec.messages and rec.messages[0]["role"] == "user"


def _data_point(suffix: str) -> Point:
    return Point(
        name=f"data-file{suffix}", setup=_data_setup(suffix), act=_read_all, target=lambda p: p,
        content=lambda p: p.read_bytes(), on_content="recover", check=_counted,
        wrong_types=[b'{"messages": 3}\n[1, 2]\n"text"\n{"id": [1], "messages": [{"role": 5}]}\n'],
    )


def test_a_data_folder_with_a_link_loop_is_walked_once(tmp_path):
    """``data/a/loop -> ..``: each real folder is walked once (on 7f9d2a4: recursion until the
    path is too long, a raw OSError)."""
    data = tmp_path / "data"
    (data / "a").mkdir(parents=True)
    _data_setup(".jsonl")(data / "a")
    (data / "a" / "loop").symlink_to("..")
    assert resolve_files([str(data)]) == [data / "a" / "chat.jsonl"]


def _prompts_setup(suffix: str):
    def setup(tmp):
        path = tmp / f"prompts{suffix}"
        path.write_text("".join(json.dumps(r) + "\n" for r in CHAT) if suffix == ".jsonl" else json.dumps(CHAT))
        return path
    return setup


def _prompt_point(suffix: str) -> Point:
    return Point(
        name=f"prompts{suffix}", setup=_prompts_setup(suffix), act=read_prompts, target=lambda p: p,
        content=lambda p: p.read_bytes(), check=lambda p, prompts: len(prompts) == 3 or pytest.fail(),
        wrong_types=[b'{"messages": 3}', b"[1, 2]"], wrong_type_names=[f"prompts{suffix}"] * 2,
    )


# -- issue 39's "wire" rows (docs/faults.md rows 20, 21, 32, 38-41) --------------------------------
READ_FAULTS = [f"read:{e}" for e in READ_ERRNOS]
CREATE_FAULTS = [f"write:{e}:create" for e in WRITE_ERRNOS]  # a mkdir: nothing is written or renamed


def _open_tracking(run):
    from dflash_train.train.trainer import Trainer

    trainer = Trainer.__new__(Trainer)  # only what open_tracking reads: no model, no data
    trainer.tracking, trainer.run_dir, trainer.echo = None, run, print
    trainer.cfg = SimpleNamespace(train=SimpleNamespace(run_dir=str(run), loggers=["jsonl"]), to_dict=dict)
    trainer.ranks = SimpleNamespace(is_main=True)
    return trainer.open_tracking()


def _runs_folder(tmp):
    (tmp / "runs").mkdir()
    return tmp / "runs" / "run"


def _run_dir_point(name: str, act) -> Point:
    """Making the run folder (row 20): a fault of the place, or a dangling link or loop there."""
    return Point(name=name, setup=_runs_folder, act=act, target=lambda run: run, writes=True,
                 faults=CREATE_FAULTS + ["dangling-link", "link-loop"])


# the truncated half of these lines ends mid-line: a run killed mid-append
CURVE_ROWS = [{"step": 10, "loss": 3.0, "expected_acceptance": 1.5, "lr": 0.001}, {"step": 20, "tau": 1.75},
              {"step": 20, "loss": 2.5, "expected_acceptance": 1.7}, {"step": 30, "loss": 2.0}]


def _curve_setup(tmp):
    run = tmp / "run"
    run.mkdir()
    (run / METRICS).write_text("".join(json.dumps(r) + "\n" for r in CURVE_ROWS))
    return run


def _curve_prefix(run, series):
    """What a torn file gives: the points of the whole lines before the tear, nothing else."""
    from dflash_train.train.curve import read_curve

    whole = run.parent / "whole"
    whole.mkdir(exist_ok=True)
    full = read_curve(_curve_setup(whole))
    for key, points in series.items():
        assert points == full[key][: len(points)], (key, points)


def _curve_point(name: str, faults: list[str], on_content: str, deep: bytes) -> Point:
    from dflash_train.train.curve import read_curve

    return Point(name=name, setup=_curve_setup, act=read_curve, target=lambda run: run / METRICS,
                 content=lambda run: (run / METRICS).read_bytes(), on_content=on_content, check=_curve_prefix,
                 faults=faults, deep=deep,
                 wrong_types=[b"[1, 2]\n", b'{"step": "x", "loss": 1.0}\n', b'{"step": 1, "loss": [1]}\n'])


CURVE = [
    # unreadable or a bad whole line: one line naming the file (and the line)
    _curve_point("curve-read", READ_FAULTS + list(LINK_FAULTS) + ["garbage", "latin-1", "utf-16", "deep-nesting",
                                                                  "wrong-types"], "error", b"[" * 200_000 + b"\n"),
    # a last line without its newline (a run killed mid-append): skipped, the rest read
    _curve_point("curve-torn", ["truncated", "huge-line", "deep-nesting"], "recover", b"[" * 200_000),
]


def _old_png(tmp):
    (tmp / "curve.png").write_bytes(b"old png")
    return tmp / "curve.png"


def _plot_curve(out):
    from dflash_train.train.curve import plot_curves

    return plot_curves({"run": {"expected_acceptance": [(1, 1.5)], "tau": [(1, 1.8)], "loss": [(1, 2.0)]}}, out)


CURVE_PLOT = Point(name="curve-plot", setup=_old_png, writes=True, act=_plot_curve, target=lambda out: out,
                   keep=lambda out: [out])


HELDOUT_LINES = ["What is a prime number?", "Write a haiku about rain.", "Explain recursion to a child."]


def _heldout_setup(tmp):
    path = tmp / "heldout.txt"
    path.write_text("\n".join(HELDOUT_LINES) + "\n")
    return path


def _load_heldout(path):
    from dflash_train.data.builders.prompts import load_heldout

    return load_heldout(path)


HELDOUT = Point(name="heldout-prompts", setup=_heldout_setup, act=_load_heldout, target=lambda p: p,
                content=lambda p: p.read_bytes(), check=lambda p, lines: lines == HELDOUT_LINES or pytest.fail(),
                faults=READ_FAULTS + list(LINK_FAULTS) + ["garbage", "latin-1", "utf-16"])


def _eval_json(lengths: list[list[int]]) -> str:
    return json.dumps({"prompts": [{"tau": sum(a) / len(a), "kept_lengths": a, "acceptance_lengths": a}
                                   for a in lengths]})


def _reports_setup(tmp):
    base, variant = tmp / "base.json", tmp / "variant.json"
    base.write_text(_eval_json([[1, 2], [2, 2], [1, 1]]))
    variant.write_text(_eval_json([[2, 3], [3, 3], [1, 2]]))
    (tmp / "table.json").write_text('{"old": true}')
    return {"base": base, "variant": variant, "json": tmp / "table.json", "png": tmp / "scaling.png"}


def _load_report(ctx):
    from dflash_train.eval.compare import load_report

    return load_report(ctx["base"])


COMPARE_READ = Point(
    name="compare-report", setup=_reports_setup, act=_load_report, target=lambda ctx: ctx["base"],
    content=lambda ctx: ctx["base"].read_bytes(), check=lambda ctx, report: len(report["prompts"]) == 3 or pytest.fail(),
    wrong_types=[b"[1, 2]", b'{"prompts": 3}', b'{"prompts": [{"tau": "x", "acceptance_lengths": [1]}]}',
                 b'{"prompts": [{"tau": 1.0}]}'],
)


def _compare_json(ctx):
    from dflash_train.eval.compare import main

    return main([str(ctx["base"]), str(ctx["variant"]), "--json", str(ctx["json"])])


COMPARE_JSON = Point(name="compare-json", setup=_reports_setup, writes=True, act=_compare_json,
                     target=lambda ctx: ctx["json"], keep=lambda ctx: [ctx["json"]])


def _scaling(ctx, plot=True):
    from dflash_train.eval import scaling

    argv = [f"--point=1={ctx['base']}", f"--point=4={ctx['variant']}", "--out", str(ctx["png"])]
    if plot:
        return scaling.main(argv)
    with mock.patch.object(scaling, "plot"):  # the plot is the other point: only the JSON is written
        return scaling.main([*argv, "--json", str(ctx["json"])])


def _scaling_setup(tmp):
    ctx = _reports_setup(tmp)
    ctx["png"].write_bytes(b"old png")
    return ctx


SCALING_PLOT = Point(name="scaling-plot", setup=_scaling_setup, writes=True, act=_scaling,
                     target=lambda ctx: ctx["png"], keep=lambda ctx: [ctx["png"]])
SCALING_JSON = Point(name="scaling-json", setup=_scaling_setup, writes=True, act=lambda ctx: _scaling(ctx, plot=False),
                     target=lambda ctx: ctx["json"], keep=lambda ctx: [ctx["json"], ctx["png"]])

REFERENCES = {"key": "k", "continuations": [[1, 2, 3], [4, 5, 6]]}


def _refs_setup(key: str):
    def setup(tmp):
        path = tmp / "refs.json"
        path.write_text(json.dumps({**REFERENCES, "key": key}))
        return path
    return setup


def _references(path):
    from dflash_train.eval.replay import load_or_make_references

    return load_or_make_references(path, "k", lambda: [[7, 8, 9]])


REPLAY_REFS_READ = Point(
    name="replay-references-read", setup=_refs_setup("k"), act=_references, target=lambda p: p,
    content=lambda p: p.read_bytes(), check=lambda p, refs: refs == REFERENCES["continuations"] or pytest.fail(),
    faults=READ_FAULTS + ["dangling-link", "link-loop", "a-folder"] + list(CONTENT_FAULTS),  # missing: made
    wrong_types=[b"[1]", b'{"key": "k", "continuations": 3}', b'{"key": "k", "continuations": [["a"]]}'],
)
REPLAY_REFS_WRITE = Point(name="replay-references-write", setup=_refs_setup("another target"), writes=True,
                          act=_references, target=lambda p: p, keep=lambda p: [p],
                          check=lambda p, refs: json.loads(p.read_text())["key"] == "k" or pytest.fail())


def _replay_report(out):
    from dflash_train.eval.replay import write_replay_report

    return write_replay_report(REPORT, out)


REPLAY_REPORT = Point(name="replay-report", setup=_report_setup, writes=True, act=_replay_report,
                      target=lambda out: out / "eval.json", keep=lambda out: [out / "eval.json"])


def _old_out(name: str):
    def setup(tmp):
        (tmp / name).write_text('{"old": true}\n')
        return tmp / name
    return setup


def _bench_cli(out):
    import argparse

    from dflash_train.bench.cli import register, run_cli

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    with mock.patch("dflash_train.bench.run.run_bench", return_value={"rank": 0, "context_tokens_per_s": 1.0}):
        return run_cli(parser.parse_args(["bench", "--out", str(out)]))


def _decode_steps_write(out):
    from dflash_train.bench.decode_steps import _write

    _write({"variants": {"eager": {"plain": {"median_ms": 1.0}}}}, str(out))


BENCH_OUT = Point(name="bench-result", setup=_old_out("bench.json"), writes=True, act=_bench_cli,
                  target=lambda out: out, keep=lambda out: [out])
DECODE_STEPS_OUT = Point(name="decode-steps-report", setup=_old_out("steps.json"), writes=True,
                         act=_decode_steps_write, target=lambda out: out, keep=lambda out: [out])


def _target_log(log):
    from dflash_train.distributed.disagg import TargetServer

    server = SimpleNamespace(rank=0, log_path=log, echo=lambda line: None)
    window = {"forward_s": 0.5, "wait_s": 0.25, "send_s": 0.25, "items": 2.0}
    TargetServer._log(server, window, dict.fromkeys(window, 0.0))


DISAGG_LOG = Point(name="target-rank-log", setup=_old_out("target-rank0.jsonl"), writes=True, faults=APPEND_FAULTS,
                   act=_target_log, target=lambda log: log,
                   check=lambda log, _: json.loads(log.read_text().splitlines()[-1])["rank"] == 0 or pytest.fail())


def _jsonl_out(out):
    from dflash_train.data.builders.offline_data import write_jsonl

    return write_jsonl(CHAT, out)


def _prompt_set_setup(tmp):
    _heldout_setup(tmp)
    return _old_out("prompts.jsonl")(tmp)


def _prompt_set_out(out):
    from dflash_train.data.builders.prompts import main

    heldout = out.parent / "heldout.txt"
    return main(["--out", str(out), "--heldout", str(heldout), "--no-seeds", "--num-composed", "5"])


OFFLINE_DATA_OUT = Point(name="offline-data", setup=_old_out("demo.jsonl"), writes=True, act=_jsonl_out,
                         target=lambda out: out, keep=lambda out: [out])
PROMPT_SET_OUT = Point(name="prompt-set", setup=_prompt_set_setup, writes=True, act=_prompt_set_out,
                       target=lambda out: out, keep=lambda out: [out])


def _fake_convert(gguf, folder):
    """What ``convert_gguf_to_folder`` writes, without a GGUF: the folder and two files."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"weights")
    return folder


def _prepare_model(out):
    from dflash_train import assets

    with (mock.patch.object(assets, "fetch_smollm2_gguf", return_value=out.parent / "gguf" / "x.gguf"),
          mock.patch.object(assets, "convert_gguf_to_folder", _fake_convert)):
        return assets.prepare_smollm2(out)


MODEL_FOLDER = Point(name="model-folder", setup=lambda tmp: tmp / "smollm2", writes=True, act=_prepare_model,
                     target=lambda out: out,
                     check=lambda out, _: (out / "model.safetensors").is_file() or pytest.fail("no weights"))


def test_a_killed_conversions_folder_is_swept(tmp_path, capsys):
    """A dead owner's staged folder and an hour-old ``smollm2.tmp`` (the name before the staged
    folder) are swept at the next conversion, with a note; the model folder is complete."""
    import os
    import socket

    dead = tmp_path / f".smollm2.tmp-999999999@{socket.gethostname()}-abcdef"
    legacy = tmp_path / "smollm2.tmp"
    for folder in (dead, legacy):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"half")
    os.utime(legacy, (1, 1))
    _prepare_model(tmp_path / "smollm2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smollm2"]
    assert "removed 2 stale temporary" in capsys.readouterr().err


WIRED = [_run_dir_point("trainer-run-dir", _open_tracking),
         *CURVE, CURVE_PLOT, HELDOUT, COMPARE_READ, COMPARE_JSON, SCALING_PLOT, SCALING_JSON, REPLAY_REFS_READ,
         REPLAY_REFS_WRITE, REPLAY_REPORT, BENCH_OUT, DECODE_STEPS_OUT, DISAGG_LOG, OFFLINE_DATA_OUT, PROMPT_SET_OUT,
         MODEL_FOLDER]


POINTS = [CHECKPOINT_SAVE, *CHECKPOINT_LOAD, EXPORT_WRITE, *EXPORT_READ, METRICS_REWIND, METRICS_LOG, RUN_CONFIG,
          RUN_SUMMARY, TRACKING_IDS, COMPILE_SAVE, EVAL_REPORT, REGENERATE, _data_point(".jsonl"),
          _data_point(".json"), _prompt_point(".jsonl"), _prompt_point(".json"), *WIRED]


@pytest.mark.parametrize(("point", "fault"), cases(POINTS))
def test_point_under_fault(point, fault, tmp_path, monkeypatch):
    drive(point, fault, tmp_path, monkeypatch)


@pytest.mark.parametrize("point", POINTS, ids=lambda p: p.name)
def test_point_without_fault(point, tmp_path):
    ctx = point.setup(tmp_path)
    result = point.act(ctx)
    if point.check:
        point.check(ctx, result)
