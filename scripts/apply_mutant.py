"""Run tests against single mutmut mutants applied to a copy of ``src/`` (issue 60.4).

mutmut decides which tests to run by the coverage it records in the pytest process, so it cannot
see code that runs in other processes: torchrun's ranks (the checkpoint's multi-rank paths), a
process pool's workers. This writes one mutant at a time into a scratch copy of ``src/``, points
``PYTHONPATH`` at it (children started by the tests inherit it, so every rank imports the mutant),
and runs the given pytest arguments: a failing run kills the mutant.

    PYTHONPATH=$TMPDIR/mutmut-3.8.1 .venv/bin/python scripts/apply_mutant.py \\
        src/dflash_train/train/checkpoint.py "x__rank__mutmut_1 x__barrier__mutmut_1" \\
        tests/distributed/test_dist_training.py -k "restart"
    SHOW=1 ...   # print each mutant's change instead of running the tests

Prints ``name: killed|survived`` per mutant (with the first failing test). The mutant names are
mutmut 3.8.1's (``docs/results/mutation/<module>.txt``); mutmut itself is installed by
``scripts/mutation.sh``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from mutmut.mutation.diff_apply import get_diff_for_mutant
from mutmut.mutation.file_mutation import mutate_file_contents


def mutated_text(code: str, diff: str) -> str:
    """``code`` with the one hunk of ``diff`` applied (mutmut's hunks number lines within the
    function, so the hunk's old lines are found by text, at the top level or one class deep)."""
    body = [line for line in diff.splitlines()[2:] if not line.startswith("@@")]
    old = "\n".join(line[1:] for line in body if line[:1] in " -")
    new = "\n".join(line[1:] for line in body if line[:1] in " +")
    for indent in ("", "    "):
        o, n = ("\n".join(indent + line if line else line for line in text.split("\n")) for text in (old, new))
        if code.count(o) == 1:
            return code.replace(o, n)
    raise ValueError("the mutant's lines are not found once in the source")


def main(source: str, names: str, *pytest_args: str) -> None:
    code = Path(source).read_text(encoding="utf-8")
    mutated = mutate_file_contents(source, code).code
    for name in names.split():
        diff = get_diff_for_mutant(name, source=mutated, path=source)
        scratch = tempfile.mkdtemp(prefix="mutant-")
        try:
            shutil.copytree("src", f"{scratch}/src")
            with open(f"{scratch}/{source}", "w", encoding="utf-8") as fh:
                fh.write(mutated_text(code, diff))
            if os.environ.get("SHOW"):
                subprocess.run(["diff", source, f"{scratch}/{source}"])
                continue
            env = {**os.environ, "PYTHONPATH": f"{scratch}/src", "HF_HUB_OFFLINE": "1"}
            run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *pytest_args],
                                 env=env, capture_output=True, text=True)
            failed = [line for line in run.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))][:1]
            print(f"{name}: {'survived' if run.returncode == 0 else 'killed'} {' '.join(failed)}".rstrip(), flush=True)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(*sys.argv[1:])
