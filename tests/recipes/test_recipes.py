"""Packaged recipes: each loads and validates, and each setting carries its one-line reason."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from dflash_train.config import load_config, recipe_names

NO_REASON_NEEDED = {"run_dir"}  # where outputs go: a name, not a choice


@pytest.mark.parametrize("name", recipe_names())
def test_recipe_loads_and_each_setting_has_a_reason(name):
    load_config(name)
    text = (resources.files("dflash_train") / "recipes" / f"{name}.yaml").read_text()
    setting = re.compile(r"^\s+(?P<key>[a-z_]+):\s*(?P<value>[^#]*?)\s*(?:#\s*(?P<why>.+))?$")
    missing = []
    for line in text.splitlines():
        m = setting.match(line)
        if m and m["value"] and m["key"] not in NO_REASON_NEEDED and not m["why"]:
            missing.append(line.strip())
    assert not missing, f"{name}.yaml: settings without a reason: {missing}"
    assert len(text.splitlines()) <= 40  # the history lives in docs/results/ablations.md
