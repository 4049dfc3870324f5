"""Random spaces drawn by Hypothesis: what SMAC3's ConfigSpace and NNI receive is our space (names, bounds, log
flags, choices, conditions), and every configuration sampled from either, or from the space itself, is one of
its valid configurations (exactly the active parameters, each within its range)."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from search_spaces import CategoricalParam, FloatParam, IntParam, SearchSpace
from search_spaces.configspace import from_configuration, to_configspace
from search_spaces.nni import from_nni_params, to_nni, to_nni_params
from tests.conftest import examples
from tests.search_spaces.test_converters import nni_sample

FAMILIES = (["a", "b", "c", "d"], [0, 1, 2, 3], [True, False], [0.5, 1.5, 2.5])


@st.composite
def spaces(draw) -> dict[str, Any]:
    """The YAML form of a space of 1 to 7 parameters; a parameter may have conditions on earlier choices."""
    data: dict[str, Any] = {}
    choices: dict[str, list[Any]] = {}
    for i in range(draw(st.integers(1, 7))):
        name, kind = f"p{i}.x", draw(st.sampled_from(["choice", "float", "int"]))
        if kind == "choice":
            family = draw(st.sampled_from(FAMILIES))
            values = draw(st.lists(st.sampled_from(family), min_size=1, max_size=len(family), unique=True))
            spec: dict[str, Any] = {"choice": values}
        elif kind == "float":
            log = draw(st.booleans())  # bounds of 6 decimals: ConfigSpace keeps 13 (test_converters checks more)
            low = round(draw(st.floats(1e-6, 1e3) if log else st.floats(-1e3, 1e3)), 6)
            high = round(low + draw(st.floats(1e-3, 1e3)), 6)
            spec = {"float": [low, high], **({"log": True} if log else {})}
        else:
            log = draw(st.booleans())
            low = draw(st.integers(1, 1000) if log else st.integers(-1000, 1000))
            spec = {"int": [low, low + draw(st.integers(1, 5000))], **({"log": True} if log else {})}
        parents = draw(st.lists(st.sampled_from(sorted(choices)), max_size=2, unique=True)) if choices else []
        when = {parent: draw(clause(choices[parent])) for parent in parents}
        if kind == "choice":
            choices[name] = values
        data[name] = {**spec, **({"when": when} if when else {})}
    return data


@st.composite
def clause(draw, values: list[Any]) -> Any:
    """A clause that can hold: `value`, {in: [...]} or {not: ...} leaving at least one choice."""
    op = draw(st.sampled_from(["eq", "in", "not"] if len(values) > 1 else ["eq", "in"]))
    if op == "eq":
        return draw(st.sampled_from(values))
    picked = draw(st.lists(st.sampled_from(values), min_size=1, max_size=len(values) - (op == "not"), unique=True))
    return {op: picked[0] if op == "not" and len(picked) == 1 and draw(st.booleans()) else picked}


def assignments(space: SearchSpace) -> list[dict[str, Any]]:
    """Every distinct assignment of the active choices, with each active number at its low bound."""
    names = [n for n in space.names if isinstance(space[n], CategoricalParam)]
    seen: list[dict[str, Any]] = []
    for values in itertools.product(*(space[n].choices for n in names)):
        config: dict[str, Any] = {}
        for name in space.names:
            if space.is_active(name, config):
                config[name] = dict(zip(names, values, strict=True)).get(name, getattr(space[name], "low", None))
        if config not in seen:
            seen.append(config)
    return seen


def same_value(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


@pytest.mark.hypothesis
@given(data=spaces(), seed=st.integers(0, 2**16))
@settings(max_examples=examples(ci=100, fuzz=2000))
def test_configspace_receives_our_space(data, seed):
    import ConfigSpace as CS

    space = SearchSpace.from_dict(data)
    cs = to_configspace(space, seed=seed)
    assert set(cs.keys()) == set(space.names)
    for name in space.names:
        param, hp = space[name], cs[name]
        if isinstance(param, CategoricalParam):
            assert isinstance(hp, CS.CategoricalHyperparameter)
            assert len(hp.choices) == len(param.choices)
            assert all(map(same_value, from_configuration(dict(enumerate(hp.choices))).values(), param.choices))
        else:
            kind = CS.UniformFloatHyperparameter if isinstance(param, FloatParam) else CS.UniformIntegerHyperparameter
            assert isinstance(hp, kind)
            assert (hp.lower, hp.upper, hp.log) == (param.low, param.high, param.log)
    # Conditions: ConfigSpace takes exactly our active parameters as a valid configuration, for every assignment.
    for config in assignments(space):
        CS.Configuration(cs, values=config).check_valid_configuration()
    # Samples: within bounds, exactly the active parameters, each number of its kind.
    for configuration in cs.sample_configuration(20):
        config = from_configuration(configuration)
        space.validate_params(config)
        for name, value in config.items():
            if isinstance(space[name], IntParam):
                assert type(value) is int
            elif isinstance(space[name], FloatParam):
                assert type(value) is float


@pytest.mark.hypothesis
@given(data=spaces(), seed=st.integers(0, 2**16))
@settings(max_examples=examples(ci=100, fuzz=2000))
def test_nni_receives_our_space(data, seed):
    space = SearchSpace.from_dict(data)
    nni = to_nni(space)
    found: dict[str, list[dict[str, Any]]] = {}
    collect(nni, found)
    assert set(found) == set(space.names)
    for name, specs in found.items():
        param = space[name]
        for spec in specs:
            if isinstance(param, CategoricalParam):
                names = [v["_name"] if isinstance(v, dict) else v for v in spec["_value"]]
                assert spec["_type"] == "choice" and all(map(same_value, names, param.choices))
                assert len(names) == len(param.choices)
            elif isinstance(param, FloatParam):
                assert spec == {"_type": "loguniform" if param.log else "uniform", "_value": [param.low, param.high]}
            elif param.log:
                assert spec == {"_type": "qloguniform", "_value": [param.low, param.high, 1]}
            else:
                assert spec == {"_type": "randint", "_value": [param.low, param.high + 1]}
    # Conditions: every assignment's nested form lies inside NNI's JSON and reads back to it.
    for config in assignments(space):
        nested = to_nni_params(config, space)
        assert inside(nni, nested)
        assert from_nni_params(nested, space) == config
    # Samples drawn from NNI's JSON, by an independent sampler, read back as valid configurations.
    rng = random.Random(seed)
    for _ in range(20):
        space.validate_params(from_nni_params(nni_sample(nni, rng), space))


@pytest.mark.hypothesis
@given(data=spaces(), seed=st.integers(0, 2**16))
@settings(max_examples=examples(ci=100, fuzz=2000))
def test_our_samples_and_yaml_form_keep_the_space(data, seed):
    space = SearchSpace.from_dict(data)
    assert SearchSpace.from_dict(space.to_dict()) == space
    rng = random.Random(seed)
    for _ in range(20):
        space.validate_params(space.sample(rng))


def collect(nni: dict[str, Any], found: dict[str, list[dict[str, Any]]]) -> None:
    """Every parameter spec in NNI's JSON, nested ones included, by name (a child may sit under several options)."""
    for name, spec in nni.items():
        found.setdefault(name, []).append(spec)
        for option in spec["_value"] if spec["_type"] == "choice" else []:
            if isinstance(option, dict):
                collect({k: v for k, v in option.items() if k != "_name"}, found)


def inside(nni: dict[str, Any], params: dict[str, Any]) -> bool:
    """Whether NNI's (nested) parameters are a point of its JSON: each name offered where it sits, each value in
    its spec."""
    for name, value in params.items():
        spec = nni.get(name)
        if spec is None:
            return False
        if spec["_type"] == "choice":
            chosen = value["_name"] if isinstance(value, dict) else value
            option = next((o for o in spec["_value"] if same_value(o["_name"] if isinstance(o, dict) else o, chosen)),
                          None)  # fmt: skip
            if option is None:
                return False
            if isinstance(value, dict):
                offered = {k: v for k, v in option.items() if k != "_name"} if isinstance(option, dict) else {}
                if not inside(offered, {k: v for k, v in value.items() if k != "_name"}):
                    return False
        else:
            low, high = spec["_value"][:2]
            if not low <= value < high if spec["_type"] == "randint" else not low <= value <= high:
                return False
    return True
