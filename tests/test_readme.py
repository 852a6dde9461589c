"""The README as a user reads it: its serving example against a real export, its length, its commands, its links.

The serving example is where a wrong number costs a user silently (an engine told to draft 15 tokens
from a drafter whose block holds 8 accepts nothing and reports no error), so the flags are read out of
the README and checked against the ``config.json`` that ``dflash-train export`` writes for a drafter of
the block size the README states.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from safetensors.torch import save_file
from testkit import tiny_drafter, tiny_qwen3

from dflash_train.cli import build_parser, main
from dflash_train.models.target import Target
from dflash_train.run_folder import CHECKSUMS, file_checksums

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MAX_LINES = 500  # 410 before issue 48's tracking lines, issue 50's llama.cpp serving block, issue 51's kinds,
# issue 58's "Train from a feature store", issue 61's vLLM serving block

# The user-facing subcommands (issue 36: every tool a user runs is one). Those not yet registered on
# this branch are being added by another branch; once merged, PENDING_REGISTRATION should be emptied.
EXPECTED_SUBCOMMANDS = {
    "train", "demo", "data", "regenerate", "export", "eval", "bench", "plan", "config", "compare",
    "replay", "scaling", "curve", "bench-decode", "bench-generate", "bench-fp8-features", "prompts", "offline-data",
    "tiny-model", "llama-cpp", "features", "vllm",
}
PENDING_REGISTRATION: set[str] = set()


def readme() -> str:
    return README.read_text(encoding="utf-8")


def section(text: str, title: str) -> str:
    """The body of the heading ``title`` (any level) up to the next heading of the same or a higher
    level; lines inside code fences (a YAML or shell comment starts with ``#`` too) are never headings."""
    lines, body, level, fenced = text.splitlines(keepends=True), None, 0, False
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"(#+) (.+?)\s*$", line)
        if body is None:
            if heading and heading.group(2) == title:
                body, level = [], len(heading.group(1))
        elif heading and len(heading.group(1)) <= level:
            break
        else:
            body.append(line)
    assert body is not None, f"README has no section {title!r}"
    return "".join(body)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    body = re.sub(r"```.*?```", "", text, flags=re.S)  # comments in code blocks are not headings
    return {slug(h) for h in re.findall(r"^#+ (.+)$", body, flags=re.M)}


# -- what the README's serving example says --------------------------------------------------------


def serving_claims(text: str) -> dict:
    export = section(text, "4. Export")
    serve = section(text, "5. Serving and evaluation")
    command = re.search(r"^dflash-train export (.+)$", export, flags=re.M)
    assert command, "the Export section shows no `dflash-train export` command"
    args = shlex.split(command.group(1))
    row = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \| (.+?) \|", export, flags=re.M)}
    block = re.fullmatch(r"`(\d+)`", row["block_size"].strip())
    assert block, f"the block_size row should state the value as `N`, got {row['block_size']!r}"
    vllm = re.search(r"--speculative-config \\?\s*'(\{.*?\})'", serve, flags=re.S)
    assert vllm, "no vLLM --speculative-config JSON in the serving section"
    sglang_tokens = re.search(r"--speculative-num-draft-tokens (\d+)", serve)
    sglang_path = re.search(r"--speculative-draft-model-path (\S+)", serve)
    auto_model = re.search(r'AutoModel\.from_pretrained\("([^"]+)"', serve)
    assert sglang_tokens and sglang_path and auto_model, "the SGLang command or the transformers snippet is missing"
    return {
        "export_args": args,
        "block_size": int(block.group(1)),
        "architectures": re.findall(r'\["(\w+)"\]', row["architectures"]),
        "dflash_config": row["dflash_config"],
        "aux_ids": row["eagle_aux_hidden_state_layer_ids"],
        "vllm": json.loads(vllm.group(1)),
        "sglang_tokens": int(sglang_tokens.group(1)),
        "sglang_path": sglang_path.group(1),
        "auto_model_path": auto_model.group(1),
        "b_stated": re.search(r"With `B = block_size` \((\d+) here\)", serve),
    }


def write_run(run: Path, block_size: int, **drafter_kw) -> None:
    """A run folder holding one complete checkpoint, as the trainer writes it (checksums, COMPLETE)."""
    drafter, cfg = tiny_drafter(Target(tiny_qwen3(num_layers=6)), num_layers=1, block_size=block_size, **drafter_kw)
    ckpt = run / "checkpoints" / "step-000001"
    ckpt.mkdir(parents=True)
    (ckpt / "drafter_config.json").write_text(json.dumps(cfg.to_dict()))
    save_file({k: v.contiguous() for k, v in drafter.state_dict().items()}, str(ckpt / "drafter.safetensors"))
    (ckpt / CHECKSUMS).write_text(json.dumps(file_checksums(ckpt)))
    (ckpt / "COMPLETE").write_text("")


def export_as_readme_says(tmp_path: Path, claims: dict, **drafter_kw) -> tuple[dict, str]:
    """Run the README's export command (its paths under ``tmp_path``, MODEL a tiny saved target)."""
    run_arg, out_arg, *flags = claims["export_args"]
    model = tmp_path / "MODEL"
    tiny_qwen3(num_layers=6).save_pretrained(model)
    flags = [str(model) if f == "MODEL" else f for f in flags]
    write_run(tmp_path / run_arg, claims["block_size"], **drafter_kw)
    rc = main(["export", str(tmp_path / run_arg), str(tmp_path / out_arg), *flags, "--no-tokenizer", "--dtype",
               "float32"])
    assert rc == 0
    return json.loads((tmp_path / out_arg / "config.json").read_text()), out_arg


def test_serving_flags_match_the_exported_config(tmp_path):
    claims = serving_claims(readme())
    config, out = export_as_readme_says(tmp_path, claims)
    block = config["block_size"]
    assert block == claims["block_size"]
    assert claims["b_stated"] and int(claims["b_stated"].group(1)) == block
    assert claims["vllm"]["method"] == "dflash"
    assert claims["vllm"]["num_speculative_tokens"] == block - 1  # vLLM counts drafted tokens
    assert claims["sglang_tokens"] == block  # SGLang counts the verify window
    assert claims["vllm"]["model"] == claims["sglang_path"] == claims["auto_model_path"] == out
    assert config["architectures"] == [claims["architectures"][0]] == ["DFlashDraftModel"]
    assert set(config["dflash_config"]) == {"mask_token_id", "target_layer_ids"}
    assert all(f'"{k}"' in claims["dflash_config"] for k in config["dflash_config"])
    assert "`target_layer_ids` + 1" in claims["aux_ids"]
    ids = config["dflash_config"]["target_layer_ids"]
    assert config["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in ids]


def test_dflash2_is_served_as_the_readme_says(tmp_path):
    text = readme()
    claims = serving_claims(text)
    config, _ = export_as_readme_says(tmp_path, claims, kind="dflash2")
    assert "drafter.kind=dflash2" in section(text, "4. Export")
    assert config["architectures"] == [claims["architectures"][1]] == ["DFlash2DraftModel"]
    assert config["block_size"] == claims["block_size"]  # the same flags as DFlash
    stated = section(text, "Drafter kinds and objectives")
    for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
        assert key in config["dflash_config"] and f"`{key}`" in stated, key


def test_dspark_is_served_as_the_readme_says(tmp_path):
    """The README's DSpark line names the architecture and the keys engines read; the export writes them."""
    text = readme()
    claims = serving_claims(text)
    config, _ = export_as_readme_says(tmp_path, claims, kind="dspark", options={"markov_rank": 8})
    stated = section(text, "Drafter kinds and objectives")
    assert config["architectures"] == ["DSparkDraftModel"] and "`DSparkDraftModel`" in stated
    assert config["block_size"] == claims["block_size"]  # the same flags as DFlash: B - 1 drafts
    assert (config["markov_rank"], config["markov_head_type"], config["sample_from_anchor"]) == (8, "vanilla", False)
    for key in ("markov_rank", "markov_head_type: vanilla", "sample_from_anchor: false"):
        assert f"`{key}`" in stated, key


def test_readme_is_short():
    lines = readme().count("\n")
    assert lines <= MAX_LINES, f"README.md has {lines} lines; the user's guide keeps to ~400 (run history: docs/results)"


def test_every_command_the_readme_names_is_a_subcommand():
    parser = build_parser()
    registered = set(next(a for a in parser._subparsers._group_actions).choices)  # noqa: SLF001
    mentioned = set(re.findall(r"dflash-train ([a-z][a-z0-9-]*)", readme()))
    assert mentioned, "the README names no dflash-train command"
    assert mentioned <= EXPECTED_SUBCOMMANDS, f"not user subcommands: {sorted(mentioned - EXPECTED_SUBCOMMANDS)}"
    unregistered = mentioned - registered
    assert unregistered <= PENDING_REGISTRATION, f"named in README.md but not registered: {sorted(unregistered)}"
    assert registered <= EXPECTED_SUBCOMMANDS | {"data"}, f"registered but not in the README's list: {sorted(registered)}"
    table = section(readme(), "Command line")
    missing = {name for name in registered | EXPECTED_SUBCOMMANDS if f"`dflash-train {name}" not in table}
    assert not missing, f"the Command line table lacks {sorted(missing)}"


def test_no_python_dash_m_for_user_tools():
    assert not re.search(r"python -m dflash_train|-m dflash_train", readme())


@pytest.mark.parametrize("doc", [README, *sorted((REPO / "docs" / "results").glob("*.md"))], ids=lambda p: p.name)
def test_links_into_the_readme_resolve(doc):
    text = doc.read_text(encoding="utf-8")
    targets = anchors(readme())
    pattern = r"\]\(#([\w-]+)\)" if doc == README else r"\]\(\.\./\.\./README\.md#([\w-]+)\)"
    broken = sorted(set(re.findall(pattern, text)) - targets)
    assert not broken, f"{doc.relative_to(REPO)} links to README anchors that do not exist: {broken}"


def test_readme_file_links_exist():
    links = re.findall(r"\]\(((?!https?:|#)[^)#]+)(?:#[^)]*)?\)", readme())
    missing = sorted(link for link in links if not (REPO / link).exists())
    assert not missing, f"README.md links to missing files: {missing}"


def test_the_training_yaml_is_a_valid_config(tmp_path, capsys):
    """The README's ``my.yaml`` resolves through ``dflash-train config`` (no unknown key, no bad value)."""
    block = re.search(r"```yaml\n(# my\.yaml.*?)```", section(readme(), "3. Training"), flags=re.S)
    assert block, "the Training section shows no my.yaml"
    path = tmp_path / "my.yaml"
    path.write_text(block.group(1))
    assert main(["config", str(path)]) == 0
    shown = capsys.readouterr().out
    assert "time_budget_minutes: 60" in shown and "block_size: 16" in shown


def test_the_performance_tables_bench_lines_parse_into_jobs():
    """Each ``dflash-train bench`` line of the Performance table (``REF`` spelled out, and each
    "the REF bench with `OVERRIDES`") parses and names a valid job: bench is a recipe plus overrides."""
    from dflash_train.bench.cli import job_words
    from dflash_train.bench.job import bench_job

    table = section(readme(), "Performance")
    ref = re.search(r"`REF` = `([^`]+)`", table).group(1)
    lines = [m.replace("REF", ref) for m in re.findall(r"`(?:torchrun [^`]*?)?dflash-train (bench [^`]+)`", table)]
    lines += [f"bench {ref} {extra}" for extra in re.findall(r"the REF bench with `([^`]+=[^`]+)`", table)]
    assert len(lines) >= 3, lines  # the REF line, the 2-GPU line, the MoE override
    for line in lines:
        args = build_parser().parse_args(shlex.split(line))
        job = bench_job(*job_words(args), args.target_config)
        assert job.target.path in ("qwen3-8b", "qwen3-30b-a3b") and job.drafter.target_layer_ids == [1, 9, 17, 25, 33]
