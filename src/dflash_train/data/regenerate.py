"""Replace assistant turns with the target model's own responses (resumable).

The drafter must imitate the target, so training responses should be the target's.
Each assistant turn is regenerated in order from the conversation so far (including the
turns already regenerated). OUT is JSONL with one line per finished input record, keyed
by record id: a restarted run drops an interrupted partial last line, skips ids already
present and appends, so no record is lost or duplicated.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from dflash_train.decoding.generators import Generator, SamplingParams
from dflash_train.files import explained

from .errors import DataError, SkipReport, handle
from .readers import Record


@dataclass
class Summary:
    done: int = 0
    already_done: int = 0
    new_tokens: int = 0
    seconds: float = 0.0

    def format(self, report: SkipReport) -> str:
        rate = self.new_tokens / self.seconds if self.seconds > 0 else 0.0
        return (f"regenerate: {self.done} records done, {self.already_done} already in output, "
                f"{report.total_skipped} skipped, {self.new_tokens} new tokens, {rate:.1f} tokens/s\n"
                + report.format())


OUTPUT_TODO = "free space or choose another --output"


def recover_output(path: Path) -> set[str]:
    """Ids already written; an unterminated or unparsable last line is cut off (the line a
    kill, a full disk or an I/O error tore: its record is regenerated)."""
    if not path.exists() and not path.is_symlink():
        return set()
    with explained("cannot read regenerated data", path):
        data = path.read_bytes()
    ids, good_end, pos = set(), 0, 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        if nl < 0:
            break
        line = data[pos:nl]
        try:
            ids.add(str(json.loads(line)["id"]))
        except (ValueError, KeyError, TypeError):
            if line.strip():
                if data.find(b"\n", nl + 1) >= 0:
                    raise ValueError(f"{path}: corrupt line in the middle of the output; fix or remove it") from None
                break
        good_end = pos = nl + 1
    if good_end < len(data):
        with explained("cannot write regenerated data", path, OUTPUT_TODO), open(path, "r+b") as fh:
            fh.truncate(good_end)
    return ids


def regenerate_batch(generator: Generator, batch: list[Record], params: SamplingParams) -> tuple[list, int]:
    """Regenerate every assistant turn of each conversation, turn by turn, batched across records."""
    convs = [[dict(m) for m in rec.messages] for rec in batch]
    turns = [[i for i, m in enumerate(c) if m["role"] == "assistant" and i > 0] for c in convs]
    total = 0
    for k in range(max(map(len, turns), default=0)):
        pending = [(r, t[k]) for r, t in enumerate(turns) if k < len(t)]
        gens = generator.generate([convs[r][:i] for r, i in pending], params)
        for (r, i), gen in zip(pending, gens):
            convs[r][i] = {"role": "assistant", "content": gen.content}
            if gen.reasoning is not None:
                convs[r][i]["reasoning_content"] = gen.reasoning
            total += gen.num_tokens
    return convs, total


def run_regenerate(records: Iterable[Record], generator: Generator, out: Path, params: SamplingParams,
                   batch_size: int, report: SkipReport, limit: int | None = None, strict: bool = False,
                   progress: bool = True) -> Summary:
    from tqdm import tqdm

    """Regenerate ``records`` into ``out`` (appending; see the module docstring). A write that
    fails (no space, an I/O error) is one line naming ``out``; the lines written before it are
    kept, and a rerun continues after them."""
    with explained("cannot write regenerated data", out, OUTPUT_TODO):
        out.parent.mkdir(parents=True, exist_ok=True)
    done_ids, seen, summary = recover_output(out), set(), Summary()
    start = time.perf_counter()
    bar = tqdm(total=limit, unit="rec", disable=not progress, file=sys.stderr, desc="regenerate")
    with explained("cannot write regenerated data", out, OUTPUT_TODO):
        fh = open(out, "a", encoding="utf-8")  # noqa: SIM115 - closed below; only its errors are explained here
    with fh:
        batch: list[Record] = []
        for rec in _limited(records, limit):
            if rec.id in seen:
                handle(DataError(rec.location, "id", "duplicate_id", rec.id), report, strict)
                continue
            seen.add(rec.id)
            if rec.id in done_ids:
                summary.already_done += 1
                report.kept += 1
                bar.update(1)
                continue
            batch.append(rec)
            if len(batch) == batch_size:
                _flush(generator, batch, params, fh, summary, report, bar, start)
                batch = []
        if batch:
            _flush(generator, batch, params, fh, summary, report, bar, start)
    bar.close()
    summary.seconds = time.perf_counter() - start
    return summary


def _limited(records: Iterable[Record], limit: int | None) -> Iterable[Record]:
    """``islice`` never pulls record limit+1, so the report does not count it as read."""
    return records if limit is None else itertools.islice(records, limit)


def _flush(generator, batch, params, fh, summary: Summary, report: SkipReport, bar, start: float) -> None:
    convs, tokens = regenerate_batch(generator, batch, params)
    with explained("cannot write regenerated data", fh.name, OUTPUT_TODO):
        for rec, conv in zip(batch, convs):
            fh.write(json.dumps({"id": rec.id, "messages": conv, "source": rec.location}, ensure_ascii=False) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    summary.done += len(batch)
    report.kept += len(batch)
    summary.new_tokens += tokens
    bar.update(len(batch))
    bar.set_postfix(tok_s=f"{summary.new_tokens / max(time.perf_counter() - start, 1e-9):.1f}")
