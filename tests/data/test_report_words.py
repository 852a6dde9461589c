"""The data summary: truncation at data.max_length is counted, every skip reason is explained."""

from __future__ import annotations

from data_helpers import write_jsonl

from dflash_train.data import DataConfig, SkipReport, load_tokenized
from dflash_train.data.errors import WHY

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho".split()  # noqa: SIM905


def conv(i: int, n_words: int) -> dict:
    answer = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(n_words))
    return {"messages": [{"role": "user", "content": f"Question {i}?"}, {"role": "assistant", "content": answer}]}


def test_truncation_is_counted_with_the_supervised_tokens_it_removed(tmp_path, chatml_tok):
    rows = [conv(0, 300), conv(1, 5), conv(2, 300)]  # two far longer than max_length, one short
    write_jsonl(tmp_path / "d.jsonl", rows)
    data = DataConfig(paths=[str(tmp_path / "d.jsonl")], max_length=64, token_budget=128,
                      min_supervised_tokens=2, cache_dir=str(tmp_path / "cache"))
    ds, report = load_tokenized(data, chatml_tok, block_size=4)
    full = load_tokenized(DataConfig(paths=data.paths, max_length=4096, token_budget=4096, min_supervised_tokens=2,
                                     cache_dir=str(tmp_path / "cache")), chatml_tok, block_size=4)[0]
    lost = sum(f - c for f, c in zip(full["num_supervised"], ds["num_supervised"]))  # brute force
    assert report.truncated == {"records": 2, "tokens": lost, "supervised": sum(full["num_supervised"])}
    assert lost > 400
    text = report.format()
    assert text.splitlines()[0] == "data: read 3, kept 3, skipped 0, truncated 2"
    assert f"losing {lost} supervised tokens" in text and "data.max_length" in text
    assert SkipReport.from_dict(report.to_dict()).truncated == report.truncated  # survives the cache


def test_nothing_cut_reports_zero(tmp_path, chatml_tok):
    write_jsonl(tmp_path / "d.jsonl", [conv(0, 10)])
    data = DataConfig(paths=[str(tmp_path / "d.jsonl")], max_length=256, token_budget=256,
                      min_supervised_tokens=2, cache_dir=str(tmp_path / "cache"))
    _, report = load_tokenized(data, chatml_tok, block_size=4)
    assert report.truncated["records"] == 0 and report.format() == "data: read 1, kept 1, skipped 0, truncated 0"


def test_each_skip_reason_is_explained_with_its_setting(tmp_path, chatml_tok):
    write_jsonl(tmp_path / "d.jsonl", [conv(0, 60), conv(1, 1), conv(2, 2), "{broken"])
    data = DataConfig(paths=[str(tmp_path / "d.jsonl")], max_length=256, token_budget=256,
                      min_supervised_tokens=8, cache_dir=str(tmp_path / "cache"))
    _, report = load_tokenized(data, chatml_tok, block_size=4)
    lines = report.format().splitlines()
    assert report.skipped == {"too_few_supervised": 2, "malformed_json": 1}
    i = next(k for k, line in enumerate(lines) if line.startswith("  too_few_supervised: 2 (50% of read)"))
    assert lines[i + 1].startswith("    why: ") and "data.min_supervised_tokens" in lines[i + 1]
    j = next(k for k, line in enumerate(lines) if line.startswith("  malformed_json: 1"))
    assert lines[j + 1] == f"    why: {WHY['malformed_json']}"


def test_every_reason_the_code_raises_has_words():
    import ast
    from pathlib import Path

    import dflash_train.data as data

    reasons = set()
    for path in Path(data.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "DataError"
                    and len(node.args) >= 3 and isinstance(node.args[2], ast.Constant)):
                reasons.add(node.args[2].value)
    reasons -= {"duplicate_id"}  # regeneration's own check, never a training-data skip
    assert reasons and reasons <= set(WHY), sorted(reasons - set(WHY))
