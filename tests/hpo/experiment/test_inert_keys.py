"""A trainer key tuned where the trainer does not read it (`trainer.config.INERT_UNDER`: clipping.max_norm under
clipping.strategy none, LAMB's settings under AdamW) is refused, in each arm and each combination of the choices its
space can make, naming the file, the field, the arm, the key that makes it inert with its value and where that value
comes from, and the `when` to add; a compared key that no arm reads is refused too. A stored experiment that tuned
such a key stays readable."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from hpo.errors import ExperimentFileError
from hpo.experiment import experiment_from_dict, load_experiment
from hpo.experiment.arms import arm_dimensions, arm_plans
from hpo.experiment.loading import spec_from_stored, stored_form
from tests.hpo.experiment.test_experiment import TINY_BASE, make_experiment, write_experiment
from tests.hpo.experiment.test_input_checks import refusal

SPACE = make_experiment()["space"]  # compares optimizer.name (adamw, lamb); clipping.strategy a choice of none too
MAX_NORM = {"float": [0.1, 10.0], "log": True}
SWITCH = {"choice": [True, False]}
SMALL = {"optimizer.lr": {"float": [1e-4, 1e-2], "log": True}}  # a space that tunes nothing else


def alone(space: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """An experiment without compare arms tuning `space`."""
    return make_experiment(space=space, compare=[], allow_unequal_arms=None, **changes)


def following(message: str, data: dict[str, Any], name: str) -> dict[str, Any]:
    """`data` with the `when` the message gives added to parameter `name`."""
    fix = message.split("condition it with ", 1)[1].split(", or remove it", 1)[0]
    changed = {**data, "space": {**data["space"]}}
    changed["space"][name] = {**changed["space"][name], **yaml.safe_load(fix)}
    return changed


# ------------------------------------------------------------------------------------------------ refused
def test_a_threshold_tuned_where_a_choice_clips_nothing_is_refused_naming_the_arm_and_the_when_to_add(tmp_path):
    data = make_experiment(space={**SPACE, "clipping.max_norm": MAX_NORM})
    path, message = refusal(tmp_path, data)
    assert message == (
        f"{path}: space.clipping.max_norm: in arm optimizer.name=adamw, clipping.strategy is none (a choice of "
        "space.clipping.strategy), and the trainer reads clipping.max_norm only where clipping.strategy is not none, "
        "so its trials would differ in nothing there: condition it with when: {clipping.strategy: {not: none}}, or "
        "remove it"
    )
    fixed = load_experiment(write_experiment(tmp_path / "fixed", following(message, data, "clipping.max_norm")))
    assert [(c.key, c.op, c.values) for c in fixed.space["clipping.max_norm"].when] == [
        ("clipping.strategy", "not", ("none",))
    ]


def test_a_lamb_setting_tuned_in_the_adamw_arm_is_refused_naming_the_arms_compared_value(tmp_path):
    data = make_experiment(space={**SPACE, "optimizer.use_nvlamb": SWITCH})
    path, message = refusal(tmp_path, data)
    assert message == (
        f"{path}: space.optimizer.use_nvlamb: in arm optimizer.name=adamw, optimizer.name is adamw (the arm's compared "
        "value), and the trainer reads optimizer.use_nvlamb only where optimizer.name is lamb, so its trials would "
        "differ in nothing there: condition it with when: {optimizer.name: lamb}, or remove it"
    )
    fixed = load_experiment(write_experiment(tmp_path / "fixed", following(message, data, "optimizer.use_nvlamb")))
    dims = arm_dimensions(fixed)
    assert (
        "optimizer.use_nvlamb" in dims["optimizer.name=lamb"]
        and "optimizer.use_nvlamb" not in dims["optimizer.name=adamw"]
    )  # the when drops it from the AdamW arm


def test_the_when_to_add_keeps_the_parameters_own_conditions(tmp_path):
    space = {**SPACE, "optimizer.max_grad_norm": {"float": [0.1, 10.0], "when": {"clipping.strategy": "none"}}}
    data = alone(space)
    path, message = refusal(tmp_path, data)
    assert message == (
        f"{path}: space.optimizer.max_grad_norm: optimizer.name is adamw (a choice of space.optimizer.name), and the "
        "trainer reads optimizer.max_grad_norm only where optimizer.name is lamb and clipping.strategy is not "
        "after_allreduce, so its trials would differ in nothing there: condition it with when: {clipping.strategy: "
        "none, optimizer.name: lamb}, or remove it"
    )  # no arms: none named
    load_experiment(write_experiment(tmp_path / "fixed", following(message, data, "optimizer.max_grad_norm")))


def test_lambs_threshold_where_lamb_clips_at_clipping_max_norm_is_refused(tmp_path):
    """Under after_allreduce LAMB's pre-normalization is the clip, at clipping.max_norm: its own threshold is unread."""
    data = make_experiment(space={**SPACE, "optimizer.max_grad_norm@lamb": {**MAX_NORM, "when": {
        "optimizer.name": "lamb"}}})  # fmt: skip
    path, message = refusal(tmp_path, data)
    assert message == (
        f"{path}: space.optimizer.max_grad_norm@lamb: in arm optimizer.name=lamb, clipping.strategy is after_allreduce "
        "(a choice of space.clipping.strategy), and the trainer reads optimizer.max_grad_norm only where "
        "optimizer.name is lamb and clipping.strategy is not after_allreduce, so its trials would differ in nothing "
        "there: condition it with when: {optimizer.name: lamb, clipping.strategy: {not: after_allreduce}}, or remove it"
    )
    load_experiment(write_experiment(tmp_path / "fixed", following(message, data, "optimizer.max_grad_norm@lamb")))


def test_a_key_the_base_config_makes_inert_is_refused_naming_the_key_to_set_in_overrides(tmp_path):
    space = {k: v for k, v in SPACE.items() if not k.startswith("clipping.")} | {"clipping.max_norm": MAX_NORM}
    data = make_experiment(space=space)  # the base config's clipping.strategy: none, the trainer's default
    path, message = refusal(tmp_path, data)
    assert message == (
        f"{path}: space.clipping.max_norm: in arm optimizer.name=adamw, clipping.strategy is none (base_config + "
        "overrides), and the trainer reads clipping.max_norm only where clipping.strategy is not none, so its trials "
        "would differ in nothing there: set clipping.strategy to after_allreduce, before_allreduce or bucketwise in "
        "overrides, or remove it"
    )
    overrides = {**data["overrides"], "clipping.strategy": "bucketwise"}
    spec = load_experiment(write_experiment(tmp_path / "fixed", {**data, "overrides": overrides}))
    assert all("clipping.max_norm" in plan.space for plan in arm_plans(spec))


def test_a_choice_whose_parameter_is_inactive_does_not_decide_the_base_config_does(tmp_path):
    """Under AdamW clipping.strategy is not sampled, so the trainer keeps the base config's none, whatever the
    combination picked for it: clipping.max_norm, active in every combination, is inert there."""
    space = {
        "optimizer.name": {"choice": ["adamw", "lamb"]},
        "clipping.strategy": {"choice": ["after_allreduce", "bucketwise"], "when": {"optimizer.name": "lamb"}},
        "clipping.max_norm": MAX_NORM,
    }
    data = alone(space)
    path, message = refusal(tmp_path, data)
    assert message == (
        f"{path}: space.clipping.max_norm: clipping.strategy is none (base_config + overrides), and the trainer reads "
        "clipping.max_norm only where clipping.strategy is not none, so its trials would differ in nothing there: "
        "condition it with when: {clipping.strategy: {in: [after_allreduce, bucketwise]}}, or remove it"
    )  # a clause on a parameter that is not sampled is false
    load_experiment(write_experiment(tmp_path / "fixed", following(message, data, "clipping.max_norm")))


def test_a_key_no_choice_of_the_space_reads_is_to_be_removed(tmp_path):
    data = alone({**SMALL, "optimizer.name": {"choice": ["adamw"]}, "optimizer.use_nvlamb": SWITCH})
    path, message = refusal(tmp_path, data)
    assert message.startswith(f"{path}: space.optimizer.use_nvlamb: optimizer.name is adamw (a choice of space.")
    assert message.endswith("so its trials would differ in nothing there: no choice of the space reads it; remove it")


def test_a_compared_key_no_arm_reads_is_refused(tmp_path):
    """Compared keys take no `when`: each of its arms would train alike."""
    overrides = {"budget.max_samples": 4096, "optimizer.name": "adamw"}
    data = make_experiment(space={**SMALL, "optimizer.use_nvlamb": SWITCH}, compare=["optimizer.use_nvlamb"],
                           overrides=overrides, allow_unequal_arms=None)  # fmt: skip
    path, message = refusal(tmp_path, data)
    assert message == (
        f"{path}: compare[0]: the trainer reads optimizer.use_nvlamb only where optimizer.name is lamb, and "
        "optimizer.name is adamw in every arm (base_config + overrides), so its arms would train alike: set "
        "optimizer.name to lamb in overrides, or remove optimizer.use_nvlamb from compare"
    )
    threshold = {**SMALL, "clipping.strategy": {"choice": ["none"]}, "clipping.max_norm": {"choice": [0.5, 2.0]}}
    data = make_experiment(space=threshold, compare=["clipping.strategy", "clipping.max_norm"], allow_unequal_arms=None)
    path, message = refusal(tmp_path / "threshold", data)
    assert message == (
        f"{path}: compare[1]: the trainer reads clipping.max_norm only where clipping.strategy is not none, and "
        "clipping.strategy is none in every arm (each arm's compared value), so its arms would train alike: let "
        "clipping.strategy be after_allreduce, before_allreduce or bucketwise, or remove clipping.max_norm from compare"
    )


def test_a_compared_key_each_arm_leaves_unread_for_its_own_reason_names_each(tmp_path):
    space = {**SMALL, "optimizer.name": {"choice": ["adamw", "lamb"]}, "clipping.strategy": {"choice": [
        "after_allreduce"]}, "optimizer.max_grad_norm": {"choice": [0.5, 2.0]}}  # fmt: skip
    data = make_experiment(space=space, compare=list(space)[1:], allow_unequal_arms=None)
    path, message = refusal(tmp_path, data)
    arms = [f"optimizer.name={name},clipping.strategy=after_allreduce,optimizer.max_grad_norm={norm}"
            for name in ("adamw", "lamb") for norm in (0.5, 2.0)]  # fmt: skip
    assert message == (
        f"{path}: compare[2]: the trainer reads optimizer.max_grad_norm only where optimizer.name is lamb and "
        f"clipping.strategy is not after_allreduce, and in arm {arms[0]}, optimizer.name is adamw (the arm's compared "
        f"value); in arm {arms[1]}, optimizer.name is adamw (the arm's compared value); in arm {arms[2]}, "
        f"clipping.strategy is after_allreduce (the arm's compared value); in arm {arms[3]}, clipping.strategy is "
        "after_allreduce (the arm's compared value), so its arms would train alike: compare it where optimizer.name is "
        "lamb and clipping.strategy is not after_allreduce, or remove optimizer.max_grad_norm from compare"
    )


def test_precision_settings_tuned_where_the_precision_does_not_read_them_are_refused(tmp_path):
    """The loss scale is fp16's alone (auto is bf16 or fp32); the residual stream's dtype is autocast's, which fp32
    does not enter."""
    on_gpus = {"gpus": "all", "gpus_per_trial": 1}
    scale = alone({**SMALL, "precision.initial_loss_scale": {"float": [1.0, 65536.0], "log": True}}, resources=on_gpus)
    path, message = refusal(tmp_path / "scale", scale)
    assert message == (
        f"{path}: space.precision.initial_loss_scale: precision.dtype is auto (base_config + overrides), and the "
        "trainer reads precision.initial_loss_scale only where precision.dtype is fp16, so its trials would differ in "
        "nothing there: set precision.dtype to fp16 in overrides, or remove it"
    )
    space = {**SMALL, "precision.dtype": {"choice": ["fp32", "bf16"]}, "model.half_residual": SWITCH}
    residual = make_experiment(space=space, compare=["precision.dtype"], allow_unequal_arms=None, resources=on_gpus)
    path, message = refusal(tmp_path / "residual", residual)
    assert message == (
        f"{path}: space.model.half_residual: in arm precision.dtype=fp32, precision.dtype is fp32 (the arm's compared "
        "value), and the trainer reads model.half_residual only where precision.dtype is not fp32, so its trials "
        "would differ in nothing there: condition it with when: {precision.dtype: {not: fp32}}, or remove it"
    )


# ------------------------------------------------------------------------------------------------ accepted
ACCEPTED = {
    "max_norm where a strategy clips": {**SPACE},  # {not: none}
    "max_norm under the strategies listed": {
        **SPACE, "clipping.max_norm": {**MAX_NORM, "when": {"clipping.strategy": {"in": ["after_allreduce"]}}}},
    "use_nvlamb where LAMB runs": {**SPACE, "optimizer.use_nvlamb": {**SWITCH, "when": {"optimizer.name": "lamb"}}},
    "max_grad_norm of the LAMB arm, where LAMB clips at it": {
        **SPACE, "optimizer.max_grad_norm@lamb": {
            **MAX_NORM, "when": {"optimizer.name": "lamb", "clipping.strategy": {"not": "after_allreduce"}}}},
    "max_norm whose parent is not sampled under AdamW": {
        **SPACE,
        "clipping.strategy": {"choice": ["none", "bucketwise"], "when": {"optimizer.name": "lamb"}},
        "clipping.max_norm": {**MAX_NORM, "when": {"clipping.strategy": "bucketwise"}},
    },
}  # fmt: skip


@pytest.mark.parametrize("space", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_a_key_conditioned_on_what_the_trainer_reads_it_under_is_accepted(tmp_path, space):
    load_experiment(write_experiment(tmp_path, make_experiment(space=space)))


def test_a_key_the_base_config_or_every_arm_reads_needs_no_condition(tmp_path):
    lamb = alone({**SMALL, "optimizer.use_nvlamb": SWITCH, "optimizer.max_grad_norm": MAX_NORM})  # the base: lamb
    load_experiment(write_experiment(tmp_path / "lamb", lamb))
    clipping = alone({**SMALL, "clipping.max_norm": MAX_NORM}, overrides={"clipping.strategy": "after_allreduce"})
    load_experiment(write_experiment(tmp_path / "clipping", clipping))
    both = make_experiment(space={**SPACE, "optimizer.use_nvlamb": SWITCH}, compare=["optimizer.name",
                           "optimizer.use_nvlamb"])  # fmt: skip
    load_experiment(write_experiment(tmp_path / "both", both))  # the LAMB arms compare it
    tuned = make_experiment(space={**SPACE, "optimizer.use_nvlamb": SWITCH}, compare=["optimizer.use_nvlamb"],
                            allow_unequal_arms=None)  # fmt: skip
    load_experiment(write_experiment(tmp_path / "tuned", tuned))  # each arm tunes optimizer.name, LAMB reads it


def test_a_stored_experiment_that_tuned_an_inert_key_is_still_read_as_it_ran(tmp_path):
    data = make_experiment(space={**SPACE, "clipping.max_norm": MAX_NORM, "optimizer.use_nvlamb": SWITCH},
                           base_config=TINY_BASE)  # fmt: skip
    with pytest.raises(ExperimentFileError, match="space.clipping.max_norm: in arm optimizer.name=adamw"):
        experiment_from_dict(data, "<new>")
    stored = experiment_from_dict(data, "<stored>", current_rules=False)
    record = SimpleNamespace(name="before", spec=stored_form(stored, tmp_path))
    spec = spec_from_stored(record)
    assert all({"clipping.max_norm", "optimizer.use_nvlamb"} <= set(plan.space.names) for plan in arm_plans(spec))
    assert spec.space["clipping.max_norm"].when == ()
