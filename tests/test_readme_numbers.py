"""The README's numbers against the committed files they are read from (issue 49: numbers you can trust).

``scripts/readme_numbers.py`` writes the README's Results, Performance and "How to size a run" tables, its
"Which to pick" paragraph, the recipe README's result paragraphs and the recount table of
``docs/results/README.md`` from the files under ``docs/results/``, between ``<!-- numbers:NAME -->`` comments,
and draws ``docs/figures/``. This test regenerates all of it in memory and fails when the committed text
differs, so a number cannot be edited by hand or left behind when a file changes. No network, no GPU.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import readme_numbers as rn  # noqa: E402

REGENERATE = "regenerate with: python scripts/readme_numbers.py"


def test_every_block_equals_what_the_files_give():
    stale = rn.out_of_step()
    assert not stale, f"out of step with the committed files: {stale}; {REGENERATE}"


@pytest.mark.parametrize("name", sorted(rn.BLOCKS))
def test_each_block_is_marked_once(name):
    text = rn.BLOCKS[name][0].read_text(encoding="utf-8")
    assert text.count(f"<!-- numbers:{name} -->") == 1 and text.count(f"<!-- /numbers:{name} -->") == 1


def test_a_number_edited_by_hand_is_caught(tmp_path, monkeypatch, capsys):
    """The check can fail: one tau changed back to its old count in a copy of the README is named."""
    readme = rn.README.read_text(encoding="utf-8")
    body = rn.current(readme, "results")
    assert "**2.486**" in body  # the eleventh run, kept tokens (2.541 as verified)
    copy = tmp_path / "README.md"
    copy.write_text(readme.replace("**2.486**", "**2.541**", 1), encoding="utf-8")
    monkeypatch.setitem(rn.BLOCKS, "results", (copy, rn.results_block))
    assert rn.out_of_step() == [f"{copy}: numbers:results"]
    assert rn.main(["--check"]) == 1
    assert "numbers:results" in capsys.readouterr().out
    # and writing puts the file's number back
    assert "**2.486**" in rn.splice(copy.read_text(encoding="utf-8"), "results", rn.results_block())


def test_figures_json_is_what_the_pictures_draw_and_the_pngs_exist():
    assert rn.FIGURES_JSON.read_text(encoding="utf-8") == rn.figures_json(rn.figures_data()), REGENERATE
    for png in rn.PNG.values():
        data = (rn.FIGURES / png).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000, png
        assert f"docs/figures/{png}" in rn.README.read_text(encoding="utf-8"), f"the README does not show {png}"


def test_the_headline_recount():
    """Issue 49's recount of the headline runs: old count (as verified) -> kept tokens, pooled (per-prompt mean)."""
    from dflash_train.eval.accounting import verified_tau

    expected = {  # report: (as verified, kept pooled, per-prompt mean), prompts 1-24
        "smollm2-h200-12/main/eval24": (2.541, 2.486, 2.588),
        "smollm2-h200-13/main/eval24": (2.508, 2.474, 2.577),
        "dflash2-h200/main/eval40-float32": (2.578, 2.531, 2.675),
    }
    for rel, (old, kept, per_prompt) in expected.items():
        runs = rn.prompts(rel)
        assert (round(verified_tau(runs), 3), round(rn.tau(rel), 3), round(rn.tau_pp(rel), 3)) == (old, kept, per_prompt)


def test_the_statements_issue_49_corrected():
    """D-PACE for DFlash2 is not ~+0.05; 1.47x was the better of two runs; bf16 left greedy decoding at ties."""
    kinds = "dflash2-h200/kinds"
    assert rn.paired(f"{kinds}/dflash2", f"{kinds}/dflash2-dpace", "1-40") == "+0.111 +- 0.022 (higher on 31/40)"
    twelfth = "smollm2-h200-13/main"
    assert [round(rn.speedup(f"{twelfth}/{e}"), 3) for e in ("eval24", "eval24-splitk")] == [1.468, 1.437]
    assert round(rn.speedup(f"{twelfth}/eval40"), 2) == 1.43
    assert rn.lossless(f"{twelfth}/eval24-bf16")[:2] == (11, 24)
    assert rn.lossless("dflash2-h200/main/eval40-bfloat16", "1-40")[:2] == (20, 40)
    assert rn.load(f"{twelfth}/eval24-bf16")["static_linear"] == "default"


def test_every_committed_evaluation_is_recounted():
    """The recount table holds a row for every committed report with per-prompt results."""
    table = rn.current(rn.RESULTS_README.read_text(encoding="utf-8"), "recount")
    named = set(re.findall(r"^\| `([^`]+)` \|", table, flags=re.M))
    reports = {p.relative_to(rn.RESULTS).as_posix() for p in rn.RESULTS.rglob("*.json")
               if isinstance(d := json.loads(p.read_text(encoding="utf-8")), dict) and isinstance(d.get("prompts"), list)
               and d["prompts"] and "acceptance_lengths" in d["prompts"][0]}
    assert reports and named == reports


def test_the_config_comments_quote_their_files():
    """config.py's FP8 comments (and docs/config.md, generated from them) state the bench numbers of the files they name."""
    config = (REPO / "src" / "dflash_train" / "config.py").read_text(encoding="utf-8")
    doc = (REPO / "docs" / "config.md").read_text(encoding="utf-8")

    def tps(rel: str) -> str:
        return rn.n0(rn.bench(rel)["context_tokens_per_s"])

    quoted = {
        "fp8_linear": [tps("fp8-h200/2026-12-04b/ref-fp8-ct.json"), tps("fp8-h200/2026-12-04b/ref-bf16-ct.json"),
                       tps("fp8-h200/ref-target-fp8.json"), tps("fp8-h200/ref-bf16.json"),
                       f"{rn.bench('fp8-h200/2026-12-04b/ref-fp8-ct.json')['peak_memory_gib']:.1f} against "
                       f"{rn.bench('fp8-h200/2026-12-04b/ref-bf16-ct.json')['peak_memory_gib']:.1f} GiB"],
        "fp8_drafter": [tps("fp8-h200/ref-drafter-fp8.json"), tps("fp8-h200/ref-bf16.json")],
    }
    for key, numbers in quoted.items():
        comment = re.search(rf"((?:    #.*\n)+)    {key}: bool", config).group(1)
        row = next(line for line in doc.splitlines() if line.startswith("| `") and f".{key}`" in line)
        for number in numbers:
            assert number in comment and number in row, (key, number)


def test_the_compiled_target_gain_the_readme_states():
    """The Training section's "+N% on a Qwen3-8B-shaped target" for target.compile, from the Performance files."""
    gain = rn.bench("fp8-h200/2026-12-04b/ref-bf16-ct.json")["context_tokens_per_s"] / \
        rn.bench("fp8-h200/2026-12-04b/ref-bf16.json")["context_tokens_per_s"]
    assert f"(+{round(100 * (gain - 1))}% on a Qwen3-8B-shaped target" in rn.README.read_text(encoding="utf-8")
