"""Every read/write point of files.py, run_lock.py, config.py and data/cache.py under every
fault (fault_harness.py; the table in docs/faults.md). On 7f9d2a4 these fail: tracebacks
(OSError, RecursionError, pyarrow errors), debris (a cache temp left after a failed report
write), a corrupt cache entry trusted, no run lock at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fault_harness import LINK_FAULTS, READ_ERRNOS, WRITE_ERRNOS, Point, cases, drive

from dflash_train.config import load_config
from dflash_train.data.cache import cached_build
from dflash_train.files import atomic_write_bytes, staged_folder
from dflash_train.run_folder import LOCK
from dflash_train.run_lock import hold_run_folder

# -- config files ---------------------------------------------------------------------------------
CONFIG = b'{target: {path: model}, data: {paths: [d.jsonl]}, train: {max_steps: 3, run_dir: r}}\n'


def _config_point(suffix: str) -> Point:
    def setup(tmp):
        path = tmp / f"job{suffix}"
        path.write_bytes(CONFIG if suffix == ".yaml" else json.dumps(
            {"target": {"path": "model"}, "data": {"paths": ["d.jsonl"]}, "train": {"max_steps": 3}}).encode())
        return path

    def check(path, cfg):
        assert cfg.train.max_steps == 3 and cfg.target.path == "model"

    return Point(
        name=f"config{suffix}", setup=setup, act=lambda path: load_config(str(path)), target=lambda path: path,
        check=check, content=lambda path: path.read_bytes(),
        wrong_types=[b'{"train": 5}', b'{"train": {"run_dir": {"a": 1}}}', b'{"1": 2}', b'[1, 2]',
                     b'{"train": {"max_steps": [1]}}', b'{"optim": {"lr": "fast"}}',
                     b'{"train": {"max_steps": ' + b"9" * 5000 + b"}}"],
        wrong_type_names=["section train", "train.run_dir", "['1']", f"job{suffix}", "train.max_steps",
                          "optim.lr", f"job{suffix}"],
    )


# -- the data cache -------------------------------------------------------------------------------
ROWS = [{"input_ids": [i, i + 1], "loss_mask": [0, 1], "length": 2, "num_supervised": 1} for i in range(5)]


def _build(report):
    report.read = report.kept = len(ROWS)
    yield from ROWS


def _cache_setup(tmp):
    cache = tmp / "cache"
    cached_build(cache, "aa" * 16, _build)  # an entry already there: a failed write must not touch it
    return {"cache": cache, "key": "bb" * 16}


def _cache_rows(ctx, result):
    ds, report = result
    assert [ds[i]["input_ids"] for i in range(len(ds))] == [r["input_ids"] for r in ROWS]
    assert report.kept == len(ROWS)


def _cache_read_setup(tmp):
    ctx = {"cache": tmp / "cache", "key": "cc" * 16}
    cached_build(ctx["cache"], ctx["key"], _build)
    return ctx


def _arrow_writer():
    from datasets.arrow_writer import ArrowWriter

    return ArrowWriter


CACHE_WRITE = Point(
    name="data-cache-write", setup=_cache_setup, writes=True, check=_cache_rows,
    act=lambda ctx: cached_build(ctx["cache"], ctx["key"], _build, echo=lambda line: None),
    target=lambda ctx: ctx["cache"] / ctx["key"], names=lambda ctx: str(ctx["cache"]),
    write_hooks=[(_arrow_writer(), "write_batch")],
    keep=lambda ctx: sorted((ctx["cache"] / ("aa" * 16)).iterdir()),
)


def _cache_read_point(file: str) -> Point:
    return Point(
        name=f"data-cache-read-{file}", setup=_cache_read_setup, check=_cache_rows,
        act=lambda ctx: cached_build(ctx["cache"], ctx["key"], _build, echo=lambda line: None),
        target=lambda ctx: ctx["cache"] / ctx["key"] / file, names=lambda ctx: ctx["key"],
        content=lambda ctx: (ctx["cache"] / ctx["key"] / file).read_bytes(),
        on_content="recover", on_link="recover",
        wrong_types=[b'{"read": "x"}', b"[]", b'{"read": 1, "kept": 1, "skipped": 3, "examples": {}}'],
        faults=[f"read:{e}" for e in READ_ERRNOS] + [f for f in LINK_FAULTS if f != "missing"]
        + ["truncated", "garbage"] + (["utf-16", "latin-1", "wrong-types"] if file.endswith(".json") else []),
    )


# -- the run lock ---------------------------------------------------------------------------------
def _hold(run):
    with hold_run_folder(run, echo=lambda line: None) as lock:
        assert lock.path.is_file() and json.loads(lock.path.read_text())["pid"]
    return run


def _run_setup(tmp):
    (tmp / "run").mkdir()
    return tmp / "run"


RUN_LOCK = Point(
    name="run-lock", setup=_run_setup, act=_hold, target=lambda run: run / LOCK,
    names=lambda run: str(run), writes=True, content=lambda run: b'{"host": "h", "pid": 1}',
    check=lambda run, result: not (run / LOCK).exists() or pytest.fail("lock left behind"),
    on_content="recover",
    faults=[f"write:{e}:{s}" for e in WRITE_ERRNOS for s in ("create", "write")]
    + ["dangling-link", "link-loop", "a-folder", "truncated", "garbage", "utf-16", "huge-line"],
)

# -- the primitives -------------------------------------------------------------------------------


def _atomic_setup(tmp):
    path = tmp / "out" / "file.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"old")
    return path


ATOMIC_WRITE = Point(
    name="atomic-write", setup=_atomic_setup, writes=True, target=lambda p: p,
    act=lambda p: atomic_write_bytes(p, b"new" * 1000, "test file"), keep=lambda p: [p],
)


def _staged(ctx):
    with staged_folder(ctx / "entry", "test folder") as tmp:
        (tmp / "a.txt").write_text("a")
    return ctx


STAGED_FOLDER = Point(name="staged-folder", setup=lambda tmp: tmp, writes=True, target=lambda t: t / "entry",
                      act=_staged, names=lambda t: "entry")

POINTS = [_config_point(".yaml"), _config_point(".json"), CACHE_WRITE, _cache_read_point("data.arrow"),
          _cache_read_point("report.json"), RUN_LOCK, ATOMIC_WRITE, STAGED_FOLDER]


@pytest.mark.parametrize(("point", "fault"), cases(POINTS))
def test_point_under_fault(point, fault, tmp_path, monkeypatch):
    drive(point, fault, tmp_path, monkeypatch)


@pytest.mark.parametrize("point", POINTS, ids=lambda p: p.name)
def test_point_without_fault(point, tmp_path):
    """The harness's baseline: each point works on good input (else every fault test is moot)."""
    ctx = point.setup(tmp_path)
    result = point.act(ctx)
    if point.check:
        point.check(ctx, result)


def test_the_harness_catches_a_traceback_and_debris(tmp_path, monkeypatch):
    """A point written the old way (a raw write to a temp, then a rename) fails the harness:
    the raw OSError escapes, and the temp stays behind."""
    def naive(path: Path):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(b"new")
        tmp.replace(path)

    point = Point(name="naive", setup=_atomic_setup, writes=True, target=lambda p: p, act=naive)
    with pytest.raises(AssertionError, match="escapes"):
        drive(point, "write:ENOSPC:publish", tmp_path / "a", monkeypatch)
    (tmp_path / "b").mkdir()
    tolerant = Point(name="tolerant", setup=_atomic_setup, writes=True, target=lambda p: p,
                     act=lambda p: _wrap(naive, p))
    with pytest.raises(AssertionError, match="debris"):
        drive(tolerant, "write:ENOSPC:publish", tmp_path / "b", monkeypatch)


def _wrap(fn, path):
    try:
        fn(path)
    except OSError as err:
        raise ValueError(f"cannot write {path.name}") from err


@pytest.mark.parametrize(("override", "names"), [
    ("train.max_steps=[", "train.max_steps"), ("train.max_steps=" + "[" * 100_000, "train.max_steps"),
    ("train.max_steps=" + "9" * 5000, "train.max_steps"), ("train.run_dir=[1]", "train.run_dir"),
    ("train.max_steps=1e999", "train.max_steps"), ("train.max_steps=.nan", "train.max_steps"),
    ("train.lr=0.1", "lr"), ("nosection=1", "nosection"), ("train.max_steps", "train.max_steps"),
    ("target=3", "target"), ("optim.betas={a: 1}", "optim.betas"),
])
def test_bad_overrides_are_one_line(override, names):
    from fault_harness import assert_one_line

    with pytest.raises(Exception) as caught:
        load_config(None, ["target.path=m", "data.paths=[d.jsonl]", override])
    assert_one_line(caught.value, names)


def test_a_text_field_written_as_a_number_is_its_text():
    cfg = load_config(None, ["target.path=m", "data.paths=[d.jsonl]", "train.run_dir=2024"])
    assert cfg.train.run_dir == "2024"
