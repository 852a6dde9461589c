"""The configuration reference (docs/config.md) and ``dflash-train config``."""

from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest
import yaml

from dflash_train import config_reference as ref
from dflash_train.cli import main
from dflash_train.config import JobConfig, load_config

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "config.md"


def job_fields() -> dict[str, list[str]]:
    """Every section's field names, read straight from the dataclasses (not through the module under test)."""
    job = JobConfig()
    return {f.name: [g.name for g in dataclasses.fields(getattr(job, f.name))] for f in dataclasses.fields(JobConfig)}


def test_committed_reference_is_current():
    assert DOC.exists(), f"docs/config.md is missing; write it with: {ref.REGENERATE}"
    if DOC.read_text(encoding="utf-8") != ref.render_markdown():
        pytest.fail(f"docs/config.md is out of date with the config dataclasses; regenerate it with: {ref.REGENERATE} "
                    "(from a checkout without the entry point: PYTHONPATH=src python -m dflash_train.config_reference "
                    "> docs/config.md)")


@pytest.mark.parametrize("text", [pytest.param(lambda: DOC.read_text(encoding="utf-8"), id="committed"),
                                  pytest.param(ref.render_markdown, id="rendered")])
def test_every_field_has_exactly_one_row(text):
    rows = re.findall(r"^\| `([\w.]+)` \|", text(), flags=re.M)
    expected = [f"{section}.{name}" for section, names in job_fields().items() for name in names]
    assert rows == expected


def test_rows_show_type_default_and_meaning():
    text = ref.render_markdown()
    assert ("| `optim.momentum` | `float` | `0.95` | Muon's (Nesterov) momentum; AdamW uses betas |"
            in text.splitlines())
    assert "| `train.max_steps` | `int \\| None` | `null` | overrides epochs when set |" in text.splitlines()
    assert "| `optim.betas` | `tuple[float, float]` | `[0.9, 0.95]` |" in text
    assert "| `data.paths` | `list[str]` | `[]` |" in text
    # a block of comment lines above the field, joined
    assert "| `optim.name` | `str` | `\"adamw\"` | adamw, or muon: Muon for the drafter's weight matrices" in text
    assert "AdamW's RMS) |" in text


def test_every_key_is_documented():
    """A new config field needs a comment (its meaning in docs/config.md): none is marked undocumented."""
    text = ref.render_markdown()
    marked = re.findall(r"^\| `([\w.]+)` \|.*\| \(undocumented\) \|$", text, flags=re.M)
    assert marked == ref.undocumented_keys() == []


# A dataclass written the ways config fields are: comments above, beside, inside a multi-line field.
@dataclass
class Inner:
    depth: int = 3  # how deep


@dataclass
class Sample:
    """Sample section."""

    plain: int = 1  # noqa: B008  (a pragma is no meaning)
    beside: str = "#"  # the separator; a '#' inside the default is not a comment
    # above, line one
    # above, line two
    above: float | None = None
    # above
    both: bool = True  # and beside
    # a comment cut off by a blank line belongs to no field

    loose: list[str] = field(default_factory=lambda: ["a|b"])
    spread: tuple[int, int] = field(
        default=(1, 2),  # inside the call
    )
    mode: Literal["fast", "slow"] = "fast"  # stars * and ~tilde~ and <tag> and pipe |
    inner: Inner = field(default_factory=Inner)
    # a comment after the last field belongs to no field


def test_field_comments_cover_every_layout():
    assert ref.field_comments(Sample) == {
        "beside": "the separator; a '#' inside the default is not a comment",
        "above": "above, line one above, line two",
        "both": "above and beside",
        "spread": "inside the call",
        "mode": "stars * and ~tilde~ and <tag> and pipe |",
    }


def test_a_dataclass_without_source_has_no_comments():
    made = dataclasses.make_dataclass("Made", [("x", int, field(default=1))])
    assert ref.field_comments(made) == {}
    assert [(k.name, k.type, k.default, k.help) for k in ref.iter_keys(made, "m")] == [("m.x", "int", "1", "")]


def test_iter_keys_walks_nested_dataclasses_and_writes_defaults_as_yaml():
    keys = {k.name: k for k in ref.iter_keys(Sample, "s")}
    assert list(keys) == ["s.plain", "s.beside", "s.above", "s.both", "s.loose", "s.spread", "s.mode", "s.inner.depth"]
    assert [keys[n].default for n in keys] == ["1", '"#"', "null", "true", '["a|b"]', "[1, 2]", '"fast"', "3"]
    assert keys["s.mode"].type == "Literal['fast', 'slow']"  # as the compiler writes it
    assert keys["s.inner.depth"].help == "how deep"
    assert keys["s.plain"].help == ""


def test_section_table_escapes_markdown():
    table = ref.section_markdown("s", Sample)
    assert table.startswith("## `s`\n\nSample section.\n\n| key | type | default | meaning |\n")
    assert "| `s.loose` | `list[str]` | `[\"a\\|b\"]` | (undocumented) |" in table
    assert "stars \\* and \\~tilde\\~ and \\<tag> and pipe \\| |" in table
    assert "| `s.above` | `float \\| None` | `null` |" in table


def test_type_name_of_evaluated_annotations():
    assert ref.type_name(int) == "int"
    assert ref.type_name(int | None) == "int | None"
    assert ref.type_name(list[str]) == "list[str]"
    assert ref.type_name(tuple[float, float]) == "tuple[float, float]"
    assert ref.type_name(Literal["a", "b"]) == "Literal['a', 'b']"


def test_keys_epilog_lists_every_key_and_survives_argparse():
    epilog = ref.keys_epilog()
    parser = argparse.ArgumentParser(prog="x", epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    shown = parser.format_help()
    assert epilog in shown
    assert "dflash-train config --reference" in epilog
    for section, names in job_fields().items():
        block = re.search(rf"^  {section}: (.*(?:\n {{{len(section) + 4}}}.*)*)", epilog, flags=re.M)
        assert block, section
        assert re.split(r",\s+", block.group(1).strip()) == names
    assert max(len(line) for line in epilog.splitlines()) <= 100


def test_config_prints_a_recipe_resolved_and_loadable(capsys, tmp_path):
    overrides = ["train.max_steps=5", "optim.betas=[0.8,0.9]"]
    assert main(["config", "cpu-demo", *overrides]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# dflash-train config cpu-demo train.max_steps=5 'optim.betas=[0.8,0.9]'\n")  # shell-quoted
    data = yaml.safe_load(out)
    assert data["train"]["max_steps"] == 5 and data["train"]["device"] == "cpu"  # override and recipe
    assert data["train"]["feature_cache"] == "off"  # a YAML word that must stay text
    assert data["optim"]["betas"] == [0.8, 0.9]
    assert data["train"]["grad_accum"] == 1  # a default the recipe leaves out
    saved = tmp_path / "job.yaml"
    saved.write_text(out)
    assert load_config(str(saved)) == load_config("cpu-demo", overrides)


def test_config_errors_are_one_line(capsys):
    assert main(["config", "cpu-demo", "train.max_step=5"]) == 2
    err = capsys.readouterr().err
    assert "unknown key(s) ['max_step'] in train" in err and "Traceback" not in err
    assert main(["config", "cpu-demo", "train.max_steps=0"]) == 2  # validation runs
    assert "train.max_steps must be >= 1" in capsys.readouterr().err
    assert main(["config"]) == 2
    assert "or pass --reference" in capsys.readouterr().err
    assert main(["config", "cpu-demo", "--reference"]) == 2
    assert "takes no config" in capsys.readouterr().err


def test_config_reference_flag_prints_the_reference(capsys):
    assert main(["config", "--reference"]) == 0
    assert capsys.readouterr().out == ref.render_markdown()


def test_config_help_lists_the_keys(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["config", "--help"])
    assert stop.value.code == 0
    assert ref.keys_epilog() in capsys.readouterr().out


def test_the_kinds_table_lists_every_registered_kind_and_its_settings():
    """docs/config.md's kinds table comes from the registries: a new kind's file shows up in it."""
    from dflash_train.models.kinds import get_kind, kind_names
    from dflash_train.objective.kinds import terms_of

    rows = {line.split("|")[1].strip(): line for line in ref.kinds_markdown().splitlines()
            if line.startswith("| ") and "`" in line.split("|")[2]}
    assert sorted(rows) == sorted(kind_names())
    for name in kind_names():
        assert f"`{get_kind(name).architecture}`" in rows[name]
        for key in [*get_kind(name).options, *terms_of(name).options]:
            assert f"`{key}: " in rows[name], (name, key)


@dataclass
class Base:
    kept: int = 1  # meant in the base
    redone: int = 2  # the base's meaning, replaced below


@dataclass
class Derived(Base):
    redone: int = 3  # the derived class's meaning
    own: bool = False


def test_an_inherited_field_is_documented_where_it_is_defined():
    """TrainConfig's tracking keys are written in tracking/<backend>.py: their comments are read there."""
    assert ref.field_comments(Derived) == {"kept": "meant in the base", "redone": "the derived class's meaning"}
    keys = {k.name: k.help for k in ref.iter_keys(Derived, "d")}
    assert keys == {"d.kept": "meant in the base", "d.redone": "the derived class's meaning", "d.own": ""}
    assert "| `train.wandb_mode` | `str \\| None` | `null` | online, offline (no network;" in ref.render_markdown()
