"""Round trips through ConfigSpace (SMAC3) and NNI's search-space JSON, checked against the YAML form directly."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
import yaml

from search_spaces import SearchSpace
from search_spaces.configspace import from_configuration, to_configspace
from search_spaces.nni import from_nni_params, to_nni, to_nni_params

# Every kind of parameter and condition: eq / not / not-in / in, several clauses, a grandchild, booleans and
# integers as choices, integer log ranges, arm-specific variants of one trainer key, and a condition on two
# independent parents (which NNI's nesting cannot express alone; from_nni_params enforces the rest).
RICH = yaml.safe_load(
    """
optimizer.name: {choice: [adamw, lamb]}
optimizer.lr@lamb: {float: [3.0e-4, 5.0e-3], log: true, when: {optimizer.name: lamb}}
optimizer.lr@adamw: {float: [1.0e-4, 2.0e-3], log: true, when: {optimizer.name: adamw}}
optimizer.use_nvlamb: {choice: [true, false], when: {optimizer.name: lamb}}
optimizer.beta1: {float: [0.6, 0.95], when: {optimizer.name: lamb, optimizer.use_nvlamb: true}}
clipping.strategy: {choice: [none, after_allreduce, before_allreduce, bucketwise]}
clipping.max_norm: {float: [0.1, 10.0], log: true, when: {clipping.strategy: {not: none}}}
clipping.bucket_cap_mb: {float: [1, 100], when: {clipping.strategy: {in: [bucketwise]}}}
balance.method: {choice: [none, stratified, local_presort]}
precision.dtype: {choice: [auto, fp32, bf16], when: {balance.method: {not: [none, stratified]}}}
batch.global_batch_size: {choice: [32, 64, 128]}
schedule.warmup_steps: {int: [0, 3]}
schedule.total_steps: {int: [10, 10000], log: true}
eval.batch_size: {int: [1, 4], log: true, when: {batch.global_batch_size: 128}}
log.every_steps: {int: [1, 50], when: {optimizer.name: adamw, batch.global_batch_size: {in: [32, 64]}}}
"""
)
SPACE = SearchSpace.from_dict(RICH)
N = 200


def expected_active(name: str, config: dict[str, Any]) -> bool:
    """Whether `name` should be active, read from the YAML form alone (independent of the space model)."""
    for parent, rule in RICH[name].get("when", {}).items():
        if parent not in config or not expected_active(parent, config):
            return False
        value = config[parent]
        if isinstance(rule, dict) and "not" in rule:
            excluded = rule["not"] if isinstance(rule["not"], list) else [rule["not"]]
            ok = value not in excluded
        elif isinstance(rule, dict):
            ok = value in rule["in"]
        else:
            ok = value == rule and type(value) is type(rule)
        if not ok:
            return False
    return True


def check_configurations(configs: list[dict[str, Any]]) -> None:
    """Values in range with the right types, log parameters positive, absent exactly when inactive."""
    for config in configs:
        for name, spec in RICH.items():
            assert (name in config) == expected_active(name, config), (name, config)
            if name not in config:
                continue
            value = config[name]
            if "choice" in spec:
                assert any(value == c and type(value) is type(c) for c in spec["choice"]), (name, value)
            else:
                low, high = spec.get("float", spec.get("int"))
                assert type(value) is (int if "int" in spec else float), (name, value)
                assert low <= value <= high, (name, value)
                assert value > 0 or not spec.get("log")
        assert set(config) <= set(RICH)
    # Every choice is drawn and every conditional parameter is both present and absent somewhere.
    for name, spec in RICH.items():
        if "choice" in spec:
            drawn = {repr(c[name]) for c in configs if name in c}
            assert drawn == {repr(v) for v in spec["choice"]}, name
        if "when" in spec:
            assert 0 < sum(name in c for c in configs) < len(configs), name


def log_midpoint_fraction(configs: list[dict[str, Any]], name: str) -> float:
    low, high = RICH[name]["float"]
    values = [c[name] for c in configs if name in c]
    return sum(v < math.sqrt(low * high) for v in values) / len(values)


# ------------------------------------------------------------------------------------------------ ConfigSpace
def configspace_samples(seed: int = 0) -> list[dict[str, Any]]:
    cs = to_configspace(SPACE, seed=seed)
    return [from_configuration(c) for c in cs.sample_configuration(N)]


def test_configspace_round_trip_keeps_ranges_and_conditions():
    configs = configspace_samples()
    check_configurations(configs)
    for config in configs:
        SPACE.validate_params(config)


def test_configspace_names_and_kinds():
    import ConfigSpace as CS

    cs = to_configspace(SPACE)
    assert set(cs.keys()) == set(SPACE.names)
    assert isinstance(cs["optimizer.lr@lamb"], CS.UniformFloatHyperparameter) and cs["optimizer.lr@lamb"].log
    assert isinstance(cs["schedule.total_steps"], CS.UniformIntegerHyperparameter) and cs["schedule.total_steps"].log
    assert (cs["schedule.warmup_steps"].lower, cs["schedule.warmup_steps"].upper) == (0, 3)
    kinds = {c.child.name if hasattr(c, "child") else c.get_descendant_literal_conditions()[0].child.name: type(c)
             for c in cs.conditions}  # fmt: skip
    assert kinds["optimizer.lr@lamb"] is CS.EqualsCondition
    assert kinds["clipping.max_norm"] is CS.InCondition  # {not: none} -> the complement (see the next test)
    assert kinds["clipping.bucket_cap_mb"] is CS.InCondition
    assert kinds["precision.dtype"] is CS.InCondition  # {not: [none, stratified]} -> the complement
    assert kinds["optimizer.beta1"] is CS.AndConjunction
    assert kinds["log.every_steps"] is CS.AndConjunction


def test_configspace_takes_a_not_clause_on_an_inactive_parent_as_not_holding():
    """A parameter under {not: a} of a parent that is itself conditional: where the parent is inactive, ConfigSpace
    takes a configuration without the child (as our space has it) and samples none with it; where the parent is
    active, the child is there exactly when the parent is not a."""
    import ConfigSpace as CS

    space = SearchSpace.from_dict({
        "top": {"choice": ["a", "b"]},
        "mid": {"choice": ["a", "b"], "when": {"top": "a"}},
        "leaf": {"float": [0.0, 1.0], "when": {"mid": {"not": "a"}}},
    })  # fmt: skip
    cs = to_configspace(space, seed=3)
    for config in ({"top": "b"}, {"top": "a", "mid": "a"}, {"top": "a", "mid": "b", "leaf": 0.5}):
        CS.Configuration(cs, values=config).check_valid_configuration()  # raises where ConfigSpace disagrees
    for configuration in cs.sample_configuration(50):
        config = from_configuration(configuration)
        space.validate_params(config)
        assert ("leaf" in config) == (config.get("mid") == "b")


def test_configspace_log_scale_is_kept():
    assert log_midpoint_fraction(configspace_samples(1), "clipping.max_norm") == pytest.approx(0.5, abs=0.15)


def test_configspace_seed_makes_samples_reproducible():
    assert configspace_samples(3)[:5] == configspace_samples(3)[:5]
    assert configspace_samples(3)[:5] != configspace_samples(4)[:5]  # the seed is the one given, not a fixed one


def test_from_configuration_converts_numpy_scalars():
    import numpy as np

    config = {"a": np.str_("x"), "b": np.int64(3), "c": np.float64(0.5), "d": np.bool_(True)}
    out = from_configuration(config)
    assert out == {"a": "x", "b": 3, "c": 0.5, "d": True}
    assert [type(v) for v in out.values()] == [str, int, float, bool]


# ------------------------------------------------------------------------------------------------ NNI
def nni_sample(space: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """An independent sampler of NNI's search-space JSON, returning parameters shaped as NNI trials get them."""
    params: dict[str, Any] = {}
    for name, spec in space.items():
        kind, values = spec["_type"], spec["_value"]
        if kind == "choice":
            option = rng.choice(values)
            if isinstance(option, dict):
                nested = {k: v for k, v in option.items() if k != "_name"}
                option = {"_name": option["_name"], **nni_sample(nested, rng)}
            params[name] = option
        elif kind == "randint":
            params[name] = rng.randrange(values[0], values[1])  # upper bound exclusive, as in NNI
        elif kind in ("uniform", "quniform"):
            params[name] = rng.uniform(values[0], values[1])
        elif kind in ("loguniform", "qloguniform"):
            params[name] = math.exp(rng.uniform(math.log(values[0]), math.log(values[1])))
        else:
            raise AssertionError(f"unexpected NNI type {kind}")
        if kind.startswith("q"):
            params[name] = min(max(round(params[name] / values[2]) * values[2], values[0]), values[1]) * 1.0
    return params


def nni_names(space: dict[str, Any]) -> set[str]:
    names = set()
    for name, spec in space.items():
        names.add(name)
        for option in spec["_value"] if spec["_type"] == "choice" else []:
            if isinstance(option, dict):
                names |= nni_names({k: v for k, v in option.items() if k != "_name"})
    return names


def nni_samples(seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    nni_space = to_nni(SPACE)
    return [from_nni_params(nni_sample(nni_space, rng), SPACE) for _ in range(N)]


def test_nni_round_trip_keeps_ranges_and_conditions():
    configs = nni_samples()
    check_configurations(configs)
    for config in configs:
        SPACE.validate_params(config)


def test_nni_names_equal_the_space():
    assert nni_names(to_nni(SPACE)) == set(SPACE.names)


def test_nni_json_shapes():
    nni = to_nni(SPACE)
    assert set(nni) == {n for n in SPACE.names if not SPACE[n].when}
    assert nni["schedule.warmup_steps"] == {"_type": "randint", "_value": [0, 4]}
    assert nni["schedule.total_steps"] == {"_type": "qloguniform", "_value": [10, 10000, 1]}
    assert nni["batch.global_batch_size"]["_value"][2]["eval.batch_size"]["_type"] == "qloguniform"
    strategies = {o["_name"]: o for o in nni["clipping.strategy"]["_value"]}
    assert set(strategies["none"]) == {"_name"}
    assert {"clipping.max_norm", "clipping.bucket_cap_mb"} <= set(strategies["bucketwise"])
    assert "clipping.bucket_cap_mb" not in strategies["after_allreduce"]
    lamb = next(o for o in nni["optimizer.name"]["_value"] if o["_name"] == "lamb")
    nvlamb = {o["_name"]: o for o in lamb["optimizer.use_nvlamb"]["_value"]}
    assert "optimizer.beta1" in nvlamb[True] and "optimizer.beta1" not in nvlamb[False]
    assert "optimizer.lr@lamb" in lamb and "optimizer.lr@adamw" not in lamb


def test_nni_log_scale_is_kept():
    assert log_midpoint_fraction(nni_samples(1), "clipping.max_norm") == pytest.approx(0.5, abs=0.15)


def test_from_nni_params_flattens_nested_choices():
    params = {"optimizer.name": {"_name": "lamb", "optimizer.lr@lamb": 1e-3, "optimizer.use_nvlamb": {"_name": True}}}
    assert from_nni_params(params) == {
        "optimizer.name": "lamb",
        "optimizer.lr@lamb": 1e-3,
        "optimizer.use_nvlamb": True,
    }


def test_from_nni_params_with_space_drops_inactive_and_types_integers():
    params = {
        "optimizer.name": {"_name": "lamb", "optimizer.lr@lamb": 1e-3, "optimizer.use_nvlamb": {"_name": False}},
        "clipping.strategy": {"_name": "none"},
        "balance.method": {"_name": "none"},
        # NNI nests log.every_steps under batch 32, but its other clause (optimizer.name: adamw) is false.
        "batch.global_batch_size": {"_name": 32, "log.every_steps": 7},
        "schedule.warmup_steps": 2,
        "schedule.total_steps": 120.0,  # qloguniform returns floats
    }
    out = from_nni_params(params, SPACE)
    assert out["schedule.total_steps"] == 120 and type(out["schedule.total_steps"]) is int
    assert "log.every_steps" not in out
    SPACE.validate_params(out)
    params["optimizer.name"] = {"_name": "adamw", "optimizer.lr@adamw": 1e-3}
    assert from_nni_params(params, SPACE)["log.every_steps"] == 7


def test_from_nni_params_rejects_unknown_names():
    with pytest.raises(ValueError, match="optimizer.lrr"):
        from_nni_params({"optimizer.lrr": 1.0}, SPACE)


def test_to_nni_params_inverts_from_nni_params_with_nesting():
    """NNI's form of a flat configuration reads back to it, and nests each conditional parameter in the option of
    its parent that NNI's JSON (to_nni) offers it under."""
    nni_space = to_nni(SPACE)
    for flat in nni_samples(seed=3):
        nested = to_nni_params(flat, SPACE)
        assert from_nni_params(nested, SPACE) == flat
        for name, value in nested.items():
            if isinstance(value, dict):  # the option of to_nni's choice with this _name holds its children
                option = next(o for o in nni_space[name]["_value"] if o["_name"] == value["_name"])
                assert set(value) - {"_name"} <= set(option) - {"_name"}


@pytest.mark.parametrize(
    "bounds",
    [
        "[1.0e-16, 1.0e-8], log: true",  # ConfigSpace rounds 1e-16 to 0: no log range
        "[3.0e-14, 1.0e-8], log: true",  # to 0 as well
        "[1.5e-13, 1.0e-8], log: true",  # to 2e-13: a third more than asked
        "[1.0e-14, 1.0e-12]",  # to [0, 1e-12]: SMAC3 would propose 0
    ],
)
def test_configspace_refuses_a_range_it_would_round(bounds):
    space = SearchSpace.from_dict(yaml.safe_load(f"optimizer.eps: {{float: {bounds}}}"))
    with pytest.raises(ValueError, match=r"^optimizer.eps: SMAC3's ConfigSpace keeps 13 decimal places") as err:
        to_configspace(space)
    assert err.value.key == "optimizer.eps"


def test_configspace_keeps_usual_bounds_exactly():
    space = SearchSpace.from_dict({"a.x": {"float": [1e-12, 1e-6], "log": True}, "b.x": {"float": [0.6, 0.999]}})
    cs = to_configspace(space)
    assert (cs["a.x"].lower, cs["a.x"].upper, cs["b.x"].lower, cs["b.x"].upper) == (1e-12, 1e-6, 0.6, 0.999)
