"""Default target layers (the authors' exact expression) and the refused last layer."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
from testkit import tiny_drafter, tiny_qwen3

from dflash_train.models.config import DrafterConfig, check_target_layer_ids, default_target_layer_ids
from dflash_train.models.target import Target


def authors_ids(L: int, n: int) -> list[int]:
    """The authors'/SGLang's ``build_target_layer_ids``, written out: integer product first, one division."""
    if n == 1:
        return [L // 2]
    return [int(round(1 + (i * (L - 4)) / (n - 1))) for i in range(n)]


def exact_ids(L: int, n: int) -> list[int]:
    """The same value in exact rational arithmetic (``round`` of a Fraction is round-half-even)."""
    return [round(1 + Fraction(i * (L - 4), n - 1)) for i in range(n)]


def old_ids(L: int, n: int) -> list[int]:
    """The expression this repo used before: the step is rounded to a float first."""
    step = (L - 4) / (n - 1)
    return [int(round(1 + i * step)) for i in range(n)]


# (L, n, expected) checked by hand; the last two are the issue's cases where the old expression
# gave 31 and 63 at index 7: 7*61/14 = 30.5 and 7*123/14 = 61.5 are exact ties, which Python
# rounds to even (1 + 30.5 -> 32, 1 + 61.5 -> 62), while 7*(61/14) is 30.499999999999996.
HAND = [
    (36, 5, [1, 9, 17, 25, 33]),  # Qwen3-8B, the authors' published drafter
    (30, 1, [15]),
    (28, 3, [1, 13, 25]),
    (8, 5, [1, 2, 3, 4, 5]),
    (65, 15, None),
    (127, 15, None),
]


@pytest.mark.parametrize("L, n, expected", HAND)
def test_hand_checked_cases(L, n, expected):
    got = default_target_layer_ids(L, n)
    if expected is not None:
        assert got == expected
    assert got == authors_ids(L, n)


def test_issue_cases_where_the_old_rounding_differed():
    assert default_target_layer_ids(65, 15)[7] == 32 and old_ids(65, 15)[7] == 31
    assert default_target_layer_ids(127, 15)[7] == 62 and old_ids(127, 15)[7] == 63
    assert default_target_layer_ids(65, 15)[:8] == [1, 5, 10, 14, 18, 23, 27, 32]


def test_table_against_the_authors_expression():
    """Every target depth up to 160 layers and feature count up to 16 that gives distinct layers."""
    differs = 0
    for L in range(4, 161):
        for n in range(1, min(16, L - 3) + 1):
            got = default_target_layer_ids(L, n)
            assert got == authors_ids(L, n), (L, n)
            if n > 1:
                assert got == exact_ids(L, n), (L, n)
                differs += got != old_ids(L, n)
            assert max(got) <= (L - 3 if n > 1 else L - 2)  # never the last layer
    assert differs >= 2  # the table really covers cases where the two expressions part


def test_last_layer_is_refused_with_the_reason():
    with pytest.raises(ValueError, match=r"includes 5, the last layer of a 6-layer target; use 0\.\.4.*final norm"):
        check_target_layer_ids([1, 5], 6)
    with pytest.raises(ValueError, match=r"drafter\.target_layer_ids includes 5.*vLLM/SGLang cannot capture it"):
        DrafterConfig(num_hidden_layers=2, target_layer_ids=[1, 5], num_target_layers=6).validate()
    with pytest.raises(ValueError, match=r"\[6\] out of range for a target with 6 layers \(valid: 0\.\.4\)"):
        check_target_layer_ids([1, 6], 6)
    check_target_layer_ids([0, 4], 6)  # L-2 is fine


def test_last_layer_refused_when_resolving_and_loading(tmp_path):
    from dflash_train.export.serving import export_drafter, load_drafter_folder
    from dflash_train.models.config import resolve_drafter_config

    target = Target(tiny_qwen3(num_layers=6))
    with pytest.raises(ValueError, match="last layer"):
        resolve_drafter_config(DrafterConfig(num_hidden_layers=1, target_layer_ids=[5]), target.facts, 7)
    drafter, cfg = tiny_drafter(target)
    out = export_drafter(drafter, cfg, tmp_path / "e")
    config = json.loads((out / "config.json").read_text())
    config["dflash_config"]["target_layer_ids"] = [1, 5]  # a folder from elsewhere that reads layer L-1
    config["eagle_aux_hidden_state_layer_ids"] = [2, 6]
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="last layer"):
        load_drafter_folder(out)
