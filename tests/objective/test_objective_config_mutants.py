"""``objective:``'s validation at its bounds, word for word, pinned where mutation testing found it unchecked
(issue 60.4): mutmut over ``objective/config.py`` left each bound moved by one (gamma 0, dpace_alpha 0 and 1,
chunk_size 1, a target weight 0) and each refusal's words alive. The equivalent survivors: ``docs/faults.md``.
"""

from __future__ import annotations

import pytest

from dflash_train.objective.config import ObjectiveConfig


@pytest.mark.parametrize("changes", [dict(gamma=1e-9), dict(gamma=0.5), dict(dpace_alpha=0.0), dict(dpace_alpha=1.0),
                                     dict(chunk_size=1), dict(targets={"ce": 0.0, "kl": 1.0}), dict(targets={"ce": 2}),
                                     dict(loss_positions=1)])
def test_the_bounds_themselves_are_accepted(changes):
    ObjectiveConfig(**changes).validate()


@pytest.mark.parametrize(("changes", "message"), [
    (dict(weighting="flat"), "objective.weighting must be one of ['decay', 'reach', 'dpace'], got 'flat'"),
    (dict(gamma=0.0), "objective.gamma must be > 0 (null: the paper's), got 0.0"),
    (dict(dpace_alpha=-0.1), "objective.dpace_alpha must be in [0, 1], got -0.1"),
    (dict(dpace_alpha=1.5), "objective.dpace_alpha must be in [0, 1], got 1.5"),
    (dict(chunk_size=0), "objective.chunk_size must be a positive integer, got 0"),
    (dict(chunk_size=2.5), "objective.chunk_size must be a positive integer, got 2.5"),
    (dict(targets={}), "objective.targets must map target names to weights, e.g. {ce: 1.0}, got {}"),
    (dict(targets=["ce"]), "objective.targets must map target names to weights, e.g. {ce: 1.0}, got ['ce']"),
    (dict(targets={"ce": -1.0}), "objective.targets.ce must be a weight >= 0, got -1.0"),
    (dict(targets={"ce": True}), "objective.targets.ce must be a weight >= 0, got True"),
    (dict(targets={"ce": "1"}), "objective.targets.ce must be a weight >= 0, got '1'"),
    (dict(targets={"ce": 0.0}), "objective.targets: the weights sum to 0; give one target a positive weight"),
    (dict(loss_positions=0), "objective.loss_positions must be a positive integer or null (all), got 0"),
    (dict(kind=[1]), "objective.kind must be a mapping of the kind's term settings, got [1]"),
])
def test_each_refusal_names_the_key_and_the_value(changes, message):
    with pytest.raises(ValueError) as err:
        ObjectiveConfig(**changes).validate()
    assert str(err.value) == message
