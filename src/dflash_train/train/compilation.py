"""What the first (compiling) step costs, and how not to pay it twice.

``torch.compile`` turns the drafter layer into one Triton-backed graph (forward and
backward) during the first step. On an empty cache that is most of a short run, so:

* a persistent cache by default: inductor's cache (FX graphs, AOTAutograd, Triton kernels)
  goes to ``$XDG_CACHE_HOME/dflash-train/inductor`` (``~/.cache/...``) unless
  ``TORCHINDUCTOR_CACHE_DIR`` is set; a second run, a restart or another rank on the same
  machine then starts warm;
* portable artifacts: after the first step rank 0 writes the compiled artifacts
  (``torch.compiler.save_cache_artifacts``) to ``RUN/compile-artifacts.bin``; a resumed run
  loads them, and ``train.compile_artifacts=FILE`` loads a file shipped from another
  machine (same torch, GPU kind and shapes) so that fresh machines and new ranks start warm;
* say what happens: the state of the cache folder before the first step (``compile_cache``:
  empty or warm), the time it took, and whether this run's graphs came from the cache
  (``compile_cache_result``: hit, miss, partial, none; ``compile_cache_lookups``: inductor's
  FX-graph and AOTAutograd cache counters), since a folder full of other shapes' graphs is
  "warm" and still compiles everything: the lookups tell.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from dflash_train.files import UserFacingError, atomic_write_bytes, describe_os_error
from dflash_train.run_folder import COMPILE_ARTIFACTS


def default_cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "dflash-train" / "inductor"


def use_persistent_cache() -> Path:
    """Point inductor at a persistent folder (unless the user already chose one); return it."""
    if not os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(default_cache_dir())
    folder = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def cache_state(folder: Path) -> str:
    """``"warm"`` when the folder holds compiled graphs already, else ``"empty"``."""
    graphs = [folder / "fxgraph", folder / "aotautograd"]
    return "warm" if any(p.is_dir() and any(p.iterdir()) for p in graphs) else "empty"


def load_artifacts(path: Path, echo=print) -> bool:
    """Pre-populate the caches from a ``save_cache_artifacts`` file; False if there is none, or
    if it cannot be read or used (a warning line: the artifacts only save compile time, so a
    damaged file means a cold start, never a failed run)."""
    if not path.is_file():
        return False
    try:
        data = path.read_bytes()
    except OSError as err:
        echo(f"warning: {describe_os_error(err, 'cannot read compile artifacts', path)}; starting cold")
        return False
    # torch logs a bad file with a traceback and returns None (some versions raise): one line here
    quiet = logging.getLogger("torch.compiler._cache")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        loaded, reason = torch.compiler.load_cache_artifacts(data), "not readable by this torch"
    except Exception as err:  # noqa: BLE001 - whatever the loader raises on bad bytes: a cold start
        loaded, reason = None, (str(err).strip().splitlines() or [type(err).__name__])[-1][:200]
    finally:
        quiet.setLevel(level)
    if loaded is None:
        echo(f"warning: compile artifacts {path} are damaged or from another torch ({reason}); starting cold "
             f"(the first step compiles)")
        return False
    return True


def save_artifacts(path: Path) -> int:
    """Write what this process compiled so far, atomically; the number of bytes (0: nothing
    compiled). A failure is one line (``UserFacingError``), the previous file intact."""
    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        return 0
    data, _info = saved
    atomic_write_bytes(path, data, "compile artifacts", "free space or set train.run_dir elsewhere")
    return len(data)


def save_artifacts_or_warn(path: Path, echo=print) -> int:
    """``save_artifacts``, a failure a warning line: the run goes on (the artifacts only save
    a later run's compile time; a run stopped for them would lose real work)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return save_artifacts(path)
    except OSError as err:
        echo(f"warning: {describe_os_error(err, 'cannot write compile artifacts', path)}; the next run compiles")
    except UserFacingError as err:
        echo(f"warning: {err}; the next run compiles")
    return 0


def compile_seconds() -> dict[str, float]:
    """Where compile time went in this process (dynamo's own timers, summed per phase):
    ``total`` = dynamo entry (tracing + forward graph) + the lazily compiled backward graphs."""
    from torch._dynamo.utils import compilation_time_metrics as m

    def total(key: str) -> float:
        return float(sum(m.get(key, [])))

    out = {
        "dynamo_tracing": total("bytecode_tracing"),
        "forward_graphs": total("OutputGraph.call_user_compiler"),
        "backward_graphs": total("compile_fx.<locals>.bw_compiler"),
        "triton_compile_wait": total("async_compile.wait"),
        "cache_loads": total("AOTAutogradCache.inductor_load"),
    }
    out["total"] = total("_compile.compile_inner") + out["backward_graphs"]
    return out


# (report name, torch counter group, counter prefix): inductor's FX graph cache (the generated
# kernels: the expensive part) and the AOTAutograd cache (the traced, partitioned forward and
# backward graphs, whose hit also loads the FX graphs: those count as FX hits too). Counter
# names read from torch 2.13 (``_inductor/codecache.py``, ``_functorch/_aot_autograd/autograd_cache.py``),
# the same since the AOTAutograd cache came (torch 2.5); absent names read as 0.
CACHES = (("fx_graph", "inductor", "fxgraph_cache_"), ("aot_autograd", "aot_autograd", "autograd_cache_"))
OUTCOMES = ("hit", "miss", "bypass")  # bypass: a graph the cache cannot hold, compiled every time


def cache_lookups() -> dict[str, dict[str, int]]:
    """This process's lookups so far in inductor's two graph caches, by outcome:
    ``{"fx_graph": {"hit", "miss", "bypass"}, "aot_autograd": {...}}``. Forward and backward
    graphs count separately. Subtract an earlier reading (:func:`lookups_since`) for one window."""
    from torch._dynamo.utils import counters

    return {name: {o: int(counters[group][prefix + o]) for o in OUTCOMES} for name, group, prefix in CACHES}


def lookups_since(before: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    now = cache_lookups()
    return {name: {o: now[name][o] - before[name][o] for o in OUTCOMES} for name in now}


def cache_result(lookups: dict[str, dict[str, int]]) -> str:
    """Whether a window's compiled graphs came from the cache, judged by inductor's graphs:
    ``hit`` (all of them), ``miss`` (none), ``partial`` (some: e.g. a folder warm with
    other shapes' graphs), ``none`` (nothing was compiled: no compile, or graphs already in
    memory). A bypassed graph was compiled anew, as a miss is."""
    fx = lookups["fx_graph"]
    compiled = fx["miss"] + fx["bypass"]
    if fx["hit"] + compiled == 0:
        return "none"
    return "hit" if compiled == 0 else "miss" if fx["hit"] == 0 else "partial"


def cache_report(before: dict[str, dict[str, int]]) -> dict:
    """The fields a report adds for the window since ``before`` (a :func:`cache_lookups` reading):
    ``compile_cache_result`` (:func:`cache_result`) and ``compile_cache_lookups`` (the counts)."""
    lookups = lookups_since(before)
    return {"compile_cache_result": cache_result(lookups), "compile_cache_lookups": lookups}


def graph_cache_counts() -> dict[str, int]:
    """Inductor's FX-graph cache lookups in this process so far (forward and backward graphs
    count separately): ``from_cache`` hits, ``compiled`` misses and bypasses."""
    fx = cache_lookups()["fx_graph"]
    return {"from_cache": fx["hit"], "compiled": fx["miss"] + fx["bypass"]}


class FirstStep:
    """Announces the first step's compilation and reports what it cost (see module doc)."""

    def __init__(self, run_dir: Path, artifacts: str | None, enabled: bool, is_main: bool, echo=print):
        self.enabled, self.is_main, self.echo = enabled, is_main, echo
        self.run_dir = run_dir
        self.state = "n/a"
        self.reported = False
        if not enabled:
            return
        self.counts_before = graph_cache_counts()
        self.lookups_before = cache_lookups()
        self.cache_dir = use_persistent_cache()
        self.state = cache_state(self.cache_dir)
        if artifacts and not Path(artifacts).is_file():
            raise FileNotFoundError(f"train.compile_artifacts: {artifacts} does not exist (or is not a file)")
        loaded = [p for p in (Path(artifacts) if artifacts else None, run_dir / COMPILE_ARTIFACTS)
                  if p is not None and load_artifacts(p, echo)]
        if loaded:
            self.state = "warm"
        source = f", artifacts {', '.join(map(str, loaded))}" if loaded else ""
        echo(f"compiling the drafter layers: first step only (cache {self.state}: {self.cache_dir}{source})")

    def done(self, seconds: float) -> dict:
        """After the first step: report it, and (rank 0) save the artifacts for restarts.
        Later calls return nothing."""
        if not self.enabled or self.reported:
            return {}
        self.reported = True
        spent = compile_seconds()
        now = graph_cache_counts()
        graphs = {k: now[k] - self.counts_before[k] for k in now}
        cached = cache_report(self.lookups_before)
        self.echo(f"first step {seconds:.1f} s, of which compiling {spent['total']:.1f} s (cache {self.state}, "
                  f"this run: {cached['compile_cache_result']}; graphs: {graphs['from_cache']} from the cache, "
                  f"{graphs['compiled']} compiled)")
        if self.is_main:
            save_artifacts_or_warn(self.run_dir / COMPILE_ARTIFACTS, self.echo)
        return {"first_step_s": seconds, "compile_s": spent["total"], "compile_cache": self.state,
                "compile_graphs": graphs, **cached}
