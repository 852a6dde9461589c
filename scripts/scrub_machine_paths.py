"""Replace the absolute paths of the machines things ran on with placeholders, in tracked files.

    python scripts/scrub_machine_paths.py            # rewrite every tracked text file in place
    python scripts/scrub_machine_paths.py --check    # list what would change; exit 1 if anything would
    python scripts/scrub_machine_paths.py FILE ...   # only these files

Logs, JSON results and device scripts are committed as they came back from the GPU machine, so they name
that machine's folders (its kept folder, its output folder, pytest's temp folders) and the absolute path of
the checkout they ran in. Those paths mean nothing on a reader's machine and leak one machine's layout, so
each is replaced by a placeholder that keeps its meaning (``tests/test_no_machine_paths.py`` fails on any
that remain; ``docs/results/README.md`` says what the placeholders stand for):

- the GPU machine's kept folder (``root/keep`` under ``/``)  -> ``$KEEP``
- its output folder (``root/out``)                          -> ``$OUT``
- another folder in root's home (``root/X``)                 -> ``~/X``
- a home folder (``home/USER``)                              -> ``~``
- pytest's temp folders (``tmp/pytest-of-USER/pytest-N/X``)  -> ``<tmp>/X``
- another temp folder (``tmp/X``)                            -> ``<tmp>/X``
- a checkout or worktree (``work/NAME/X``)                   -> ``X`` (repository-relative); ``work/NAME`` alone -> ``.``

A path counts only where it starts a word (not after a letter, digit, ``_`` or ``.``), the same rule the
test uses, so ``src/x/tmp/y`` and URLs' ``host/tmp/`` stay. Binary and compressed files are never read;
a changed ``.json`` (``.jsonl``: each line) must parse after the rewrite, or nothing is written.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

START = r"(?<![.A-Za-z0-9_])"  # a path starts a word: the test's `(^|[^.A-Za-z0-9_])`
NAME = r"[^/\s\"'`()<>,;:]+"  # one path component
END = r"(?![A-Za-z0-9_.-])"  # the whole component, not a prefix of a longer name


def _at(*parts: str) -> str:
    """An absolute path as a regex; built from its parts so this file holds none of the paths it removes."""
    return START + re.escape("/" + "/".join(parts))


RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(_at("root", "keep") + END), "$KEEP"),
    (re.compile(_at("root", "out") + END), "$OUT"),
    (re.compile(_at("root", "")), "~/"),
    (re.compile(_at("home", "") + NAME + END), "~"),
    (re.compile(_at("tmp", "pytest-of-") + NAME + r"/pytest-\d+" + END), "<tmp>"),
    (re.compile(_at("tmp", "")), "<tmp>/"),
    (re.compile(_at("work", "") + NAME + "/"), ""),
    (re.compile(_at("work", "") + NAME + END), "."),
]
BINARY_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".pdf", ".xz", ".gz", ".tgz", ".bz2", ".zst", ".zip",
                   ".tar", ".safetensors", ".bin", ".pt", ".pth", ".gguf", ".npy", ".npz", ".pkl", ".whl"}


def scrub_text(text: str) -> str:
    """Every rule in order: the specific folders before the generic ones, so `$KEEP` wins over `~/keep`."""
    for pattern, placeholder in RULES:
        text = pattern.sub(lambda _m, p=placeholder: p, text)
    return text


def read_text(path: Path) -> str | None:
    """The file as text, or None for a binary one (a known suffix, a NUL byte, or not UTF-8): left alone."""
    if path.suffix.lower() in BINARY_SUFFIXES:
        return None
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def still_parses(path: Path, before: str, after: str) -> bool:
    """A JSON file that parsed before must parse after (a replacement inside strings keeps it valid)."""
    def ok(text: str) -> bool:
        try:
            if path.suffix == ".jsonl":
                [json.loads(line) for line in text.splitlines() if line.strip()]
            else:
                json.loads(text)
        except ValueError:
            return False
        return True

    if path.suffix not in (".json", ".jsonl"):
        return True
    return ok(after) or not ok(before)


def tracked_files(root: Path) -> list[Path]:
    """What git tracks (runs/, assets/ and .venv are not tracked, so never touched)."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=root, check=True, capture_output=True).stdout
    return [root / name for name in out.decode().split("\0") if name]


def scrub_file(path: Path, write: bool) -> int:
    """Rewrite one file (when `write`); the number of lines that changed (0: untouched)."""
    before = read_text(path)
    if before is None:
        return 0
    after = scrub_text(before)
    if after == before:
        return 0
    if not still_parses(path, before, after):
        raise SystemExit(f"{path}: no longer valid JSON after the rewrite; nothing written")
    if write:
        path.write_bytes(after.encode("utf-8"))
    return sum(a != b for a, b in zip(before.splitlines(), after.splitlines(), strict=True))


def _files_under(path: Path) -> list[Path]:
    """A given file, or every file under a given folder (a results folder as it came back)."""
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file())
    if not path.is_file():
        raise SystemExit(f"scrub_machine_paths: {path}: no such file or folder")
    return [path]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, help="only these files (default: every tracked file)")
    parser.add_argument("--check", action="store_true", help="list what would change, write nothing")
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parents[1]
    files = [f for given in args.files for f in _files_under(given)] if args.files else tracked_files(root)
    changed = {path: n for path in files if (n := scrub_file(path, write=not args.check))}
    for path, n in changed.items():
        print(f"{path.relative_to(root) if path.is_relative_to(root) else path}: {n} line(s)")
    verb = "would change" if args.check else "changed"
    print(f"{verb} {sum(changed.values())} line(s) in {len(changed)} file(s)")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
