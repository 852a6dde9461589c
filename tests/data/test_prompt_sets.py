"""Named prompt sets: ``eval.prompts: heldout`` resolves without the trainer importing recipes."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from dflash_train.data.builders.offline_data import heldout_prompts_path
from dflash_train.data.prompt_sets import prompt_set_path, resolve_prompts
from dflash_train.data.prompts import read_prompts

SRC = Path(__file__).resolve().parents[2] / "src" / "dflash_train"


def test_heldout_is_the_file_the_recipes_ship():
    path = resolve_prompts("heldout")
    assert path.resolve() == (SRC / "recipes" / "heldout_prompts.txt").resolve()
    assert heldout_prompts_path() == path  # the synthesizer excludes the very prompts evaluation reads
    prompts = read_prompts(path)
    assert len(prompts) >= 40 and all(p[-1]["role"] == "user" and p[-1]["content"] for p in prompts)


def test_selection_set_is_disjoint_from_heldout_and_never_synthesized():
    """The ablation-selection prompts: packaged, 96 of them, none equal to or containing a
    held-out prompt (or the reverse), and refused by the prompt synthesizer like held-out ones."""
    from dflash_train.data.builders.prompts import PromptSet, load_heldout, normalize

    selection = [p[-1]["content"] for p in read_prompts(resolve_prompts("selection"))]
    heldout = [p[-1]["content"] for p in read_prompts(resolve_prompts("heldout"))]
    assert resolve_prompts("selection").resolve() == (SRC / "recipes" / "selection_prompts.txt").resolve()
    assert len(selection) == 96 and len({normalize(p) for p in selection}) == 96
    both = PromptSet(heldout)
    assert not [p for p in selection if both.is_heldout(p)]
    assert not [h for h in heldout if PromptSet(selection).is_heldout(h)]
    never = PromptSet(load_heldout())
    assert all(never.is_heldout(p) for p in selection + heldout)
    assert never.add("A question about something else entirely?", "x")


def test_paths_pass_through_and_unknown_names_are_refused(tmp_path):
    assert resolve_prompts(str(tmp_path / "mine.txt")) == tmp_path / "mine.txt"
    assert resolve_prompts(tmp_path) == tmp_path
    with pytest.raises(ValueError, match="unknown prompt set 'nope'; known: heldout, selection"):
        prompt_set_path("nope")


class _Tokenizer:
    chat_template = None

    def __call__(self, text, **_):
        return {"input_ids": [len(word) for word in text.split()]}


def test_heldout_evaluator_reads_the_named_set():
    from dflash_train.train.heldout import HeldoutEvaluator

    evaluator = HeldoutEvaluator(SimpleNamespace(prompts="heldout", num_prompts=5, max_new_tokens=8), _Tokenizer())
    assert Path(evaluator.source) == heldout_prompts_path() and len(evaluator.prompt_ids) == 5
    first = heldout_prompts_path().read_text(encoding="utf-8").splitlines()[0]
    assert evaluator.prompt_ids[0] == [len(word) for word in first.split()]


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_only_recipes_and_command_lines_import_recipes():
    """Recipes sit on top: they use the library, the library (trainer, eval, data, ...) never
    uses them. A command line (``*/cli.py``) may run one (``dflash-train demo``)."""
    found = [str(p.relative_to(SRC)) for p in sorted(SRC.rglob("*.py"))
             if "recipes" not in p.relative_to(SRC).parts and p.name != "cli.py"
             and any(name.startswith("dflash_train.recipes") for name in _imports(p))]
    assert not found, f"these import dflash_train.recipes: {found}"
