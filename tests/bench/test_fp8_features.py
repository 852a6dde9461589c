"""``dflash-train bench-fp8-features``: the error measures against hand-made cases, and the command on the
real SmolLM2 target (FP8 emulated on the CPU) against features computed here without it."""

from __future__ import annotations

import contextlib
import io
import json
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from dflash_train.bench.fp8_features import feature_error  # noqa: E402
from dflash_train.cli import main  # noqa: E402


def test_feature_error_of_known_perturbations():
    torch.manual_seed(0)
    ref = torch.randn(200, 32)
    same = feature_error(ref, ref.clone())
    assert same["rel_error"] == 0 and same["cosine_mean"] == pytest.approx(1.0, abs=1e-6)
    scaled = feature_error(ref, 1.1 * ref)  # 10% longer, same direction
    assert scaled["rel_error"] == pytest.approx(0.1, abs=1e-5)
    assert scaled["cosine_p01"] == pytest.approx(1.0, abs=1e-6)
    flipped = ref.clone()
    flipped[:10] = -flipped[:10]  # 5% of the tokens reversed: the mean hides them, the 1st percentile does not
    worst = feature_error(ref, flipped)
    assert worst["cosine_p01"] == pytest.approx(-1.0, abs=1e-5)
    assert worst["cosine_mean"] == pytest.approx(0.9, abs=1e-5)
    expected = float((flipped - ref).norm() / ref.norm())
    assert worst["rel_error"] == pytest.approx(expected, rel=1e-5)


def test_command_on_smollm2_matches_a_direct_computation(smollm2_path, tmp_path):
    out = tmp_path / "f.json"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        rc = main(["bench-fp8-features", "--target", str(smollm2_path), "--rows", "2", "--max-length", "48",
                   "--layer-ids", "1,20", "--device", "cpu", "--out", str(out)])
    assert rc == 0
    result = json.loads(stdout.getvalue())
    assert json.loads(out.read_text()) == result
    assert result["fp8"] == "emulated" and result["text"] == "heldout" and set(result["layers"]) == {"1", "20"}

    from dflash_train.bench.fp8_features import _features, _texts
    from dflash_train.models.target import Target

    target = Target.load(smollm2_path, dtype=torch.bfloat16)
    class Args:  # what the command read: the first two held-out prompts
        data, rows = None, 2
    rows = [torch.tensor(target.tokenizer(t, add_special_tokens=False)["input_ids"][:48])
            for t in _texts(Args, target.tokenizer)]
    assert result["tokens"] == sum(len(r) for r in rows)
    bf16 = _features(target, rows, [1, 20])
    target.use_fp8_linears(emulate=True)
    fp8 = _features(target, rows, [1, 20])
    for layer, a, b in zip(("1", "20"), bf16, fp8):
        rel = float((b.float() - a.float()).norm() / a.float().norm())
        assert result["layers"][layer]["rel_error"] == pytest.approx(rel, rel=1e-4)
        # e4m3 with rowwise scales moves the features a few percent, never to another direction
        assert 0.001 < rel < 0.2 and result["layers"][layer]["cosine_mean"] > 0.98
