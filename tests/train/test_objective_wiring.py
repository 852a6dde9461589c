"""The job config's objective keys reach the step's objective (they were once dropped on the way)."""

from __future__ import annotations

import torch

from dflash_train.config import TrainConfig
from dflash_train.train.step import StepSpec


def test_train_objective_keys_reach_the_objective_options():
    train = TrainConfig(objective="dpace", dpace_alpha=0.25, selector_out_of_topk="exclude")
    options = StepSpec.from_train(train, block_size=4, mask_token_id=3, compiled=False).objective(torch.device("cpu"))
    assert (options.objective, options.dpace_alpha, options.selector_out_of_topk) == ("dpace", 0.25, "exclude")
    default = StepSpec.from_train(TrainConfig(), 4, 3, False).objective(torch.device("cpu"))
    assert (default.objective, default.selector_out_of_topk) == ("ce", "inject")
