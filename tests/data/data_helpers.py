"""Helpers shared by the data tests (imported by name: never import from conftest)."""

from __future__ import annotations

import json  # noqa: F401
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = REPO / "assets" / "smollm2"


def write_jsonl(path: Path, rows: list) -> Path:
    with open(path, "w") as fh:
        for row in rows:
            fh.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return path
