"""The job config's objective section reaches the step's objective as it is (keys were once dropped on
the way), the keys that moved out of ``train`` say where to, and the step divides as the weighting says."""

import pytest
import torch

from dflash_train.config import TrainConfig, config_from_dict
from dflash_train.objective.config import ObjectiveConfig
from dflash_train.objective.step import ObjectiveOptions
from dflash_train.train.step import StepSpec


def test_the_objective_section_reaches_the_step_options():
    objective = ObjectiveConfig(weighting="dpace", dpace_alpha=0.25, targets={"ce": 0.5, "kl": 0.5},
                                kind={"selector_out_of_topk": "exclude"})
    options = StepSpec.from_job(objective, TrainConfig(), block_size=4, mask_token_id=3,
                                compiled=False).options(torch.device("cpu"))
    assert options.objective is objective and options.needs_target_distribution
    loss = options.loss_options()
    assert (loss.weighting, loss.dpace_alpha, loss.targets) == ("dpace", 0.25, (("ce", 0.5), ("kl", 0.5)))
    assert options.objective.kind_options("dflash2") == {"selector_out_of_topk": "exclude"}
    assert ObjectiveConfig().kind_options("dflash2") == {"selector_out_of_topk": "inject"}
    job = config_from_dict({"data": {"paths": ["x.jsonl"]}, "objective": {"weighting": "reach", "gamma": 3}})
    assert (job.objective.weighting, job.objective.gamma) == ("reach", 3)


@pytest.mark.parametrize(("old", "hint"), [
    ("reach_weighting", "objective.weighting: reach"), ("objective", "objective.weighting"),
    ("distill", "{ce: 1 - d, kl: d}"), ("selector_out_of_topk", "objective.kind.selector_out_of_topk"),
    ("gamma", "objective.gamma"), ("loss_chunk_size", "objective.chunk_size")])
def test_keys_moved_out_of_train_say_where_they_went(old, hint):
    with pytest.raises(ValueError, match=f"train.{old} is now") as err:
        config_from_dict({"train": {old: 1}})
    assert hint in str(err.value)


def test_bad_objective_keys_are_one_line_naming_the_key():
    for section, match in [({"weighting": "linear"}, "objective.weighting must be one of"),
                           ({"targets": {"js": 1.0}}, r"objective.targets: unknown \['js'\]"),
                           ({"targets": {"ce": 0.0}}, "sum to 0"), ({"dpace_alpha": 2}, "objective.dpace_alpha"),
                           ({"loss_positions": 0}, "objective.loss_positions")]:
        with pytest.raises(ValueError, match=match):
            config_from_dict({"data": {"paths": ["x"]}, "objective": section}).objective.validate()
    job = config_from_dict({"data": {"paths": ["x"]}, "drafter": {"kind": "dflash2"}, "target": {"path": "t"},
                            "objective": {"kind": {"confidence_weight": 1.0}}})
    with pytest.raises(ValueError, match="not settings of drafter.kind=dflash2"):
        job.validate()


def test_the_step_divides_by_the_decay_weights_or_by_the_label_count_under_dpace():
    """docs/spec.md section 2b: D-PACE normalizes by the number of labels; decay and reach by the
    sum of the decay weights (a full block of B = 16 holds 15 labels, decay weights summing to ~6.6)."""
    from dflash_train.objective.blocks import build_blocks, default_gamma

    ids = torch.arange(40).view(1, 40)
    blocks = build_blocks(ids, torch.ones_like(ids), torch.tensor([[0, 20]]), torch.tensor([[True, True]]), 16, 99,
                          default_gamma(16))
    decay = ObjectiveOptions(16, 99)
    dpace = decay.with_objective(weighting="dpace")
    expected_decay = 2 * sum(torch.exp(-torch.arange(15.0) / 7.0)).item()
    assert decay.normalizer(blocks).item() == pytest.approx(expected_decay)
    assert dpace.normalizer(blocks).item() == 30
    assert decay.with_objective(weighting="reach").normalizer(blocks).item() == pytest.approx(expected_decay)
