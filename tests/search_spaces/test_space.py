"""The search-space model: parsing, validation errors, conditions, sampling and arm-specific variants."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import yaml

from search_spaces import (
    PRESETS_DIR,
    CategoricalParam,
    FloatParam,
    IntParam,
    SearchSpace,
    SearchSpaceError,
    list_presets,
    preset_path,
    shipped_preset,
    trainer_key,
    unread_namesake,
)

EXAMPLE = """
optimizer.name: {choice: [adamw, lamb]}
optimizer.lr: {float: [1.0e-4, 5.0e-3], log: true}
optimizer.beta2: {float: [0.7, 0.999], when: {optimizer.name: lamb}}
clipping.strategy: {choice: [none, after_allreduce, bucketwise]}
clipping.max_norm: {float: [0.1, 10.0], log: true, when: {clipping.strategy: {not: none}}}
schedule.warmup_steps: {int: [0, 200]}
"""


def make_space(text: str = EXAMPLE) -> SearchSpace:
    return SearchSpace.from_dict(yaml.safe_load(text))


def test_from_dict_builds_typed_params():
    space = make_space()
    assert space["optimizer.name"] == CategoricalParam(("adamw", "lamb"))
    assert space["optimizer.lr"] == FloatParam(1e-4, 5e-3, log=True)
    assert space["schedule.warmup_steps"] == IntParam(0, 200)
    clause = space["clipping.max_norm"].when[0]
    assert (clause.key, clause.op, clause.values) == ("clipping.strategy", "not", ("none",))
    assert len(space) == 6


def test_to_dict_round_trips():
    space = make_space()
    assert SearchSpace.from_dict(space.to_dict()) == space
    assert space.to_dict()["clipping.max_norm"] == {
        "float": [0.1, 10.0],
        "log": True,
        "when": {"clipping.strategy": {"not": "none"}},
    }


def test_names_put_parents_before_children():
    space = make_space(
        """
        b.x: {float: [0, 1], when: {a.y: on}}
        a.y: {choice: [on, off], when: {a.z: 1}}
        a.z: {choice: [1, 2]}
        """
    )
    assert space.names == ["a.z", "a.y", "b.x"]


@pytest.mark.parametrize(
    ("when", "value", "active"),
    [
        ("{p.c: a}", "a", True),
        ("{p.c: a}", "b", False),
        ("{p.c: {not: a}}", "a", False),
        ("{p.c: {not: a}}", "c", True),
        ("{p.c: {not: [a, b]}}", "b", False),
        ("{p.c: {not: [a, b]}}", "c", True),
        ("{p.c: {in: [a, c]}}", "c", True),
        ("{p.c: {in: [a, c]}}", "b", False),
    ],
)
def test_condition_operators(when, value, active):
    space = make_space(f"p.c: {{choice: [a, b, c]}}\nq.x: {{float: [0, 1], when: {when}}}")
    assert space.is_active("q.x", {"p.c": value}) is active


def test_several_clauses_all_must_hold_and_inactive_parents_make_children_inactive():
    space = make_space(
        """
        a.k: {choice: [x, y]}
        b.k: {choice: [u, v], when: {a.k: x}}
        c.x: {int: [1, 3], when: {a.k: x, b.k: u}}
        """
    )
    assert space.is_active("c.x", {"a.k": "x", "b.k": "u"})
    assert not space.is_active("c.x", {"a.k": "x", "b.k": "v"})
    # b.k has a value but is itself inactive (a.k = y), so its child is inactive too.
    assert not space.is_active("c.x", {"a.k": "y", "b.k": "u"})
    assert not space.is_active("c.x", {"a.k": "x"})


def test_booleans_are_not_numbers_in_conditions():
    space = make_space("f.b: {choice: [true, false]}\nf.n: {choice: [1, 0]}\nx.y: {float: [0, 1], when: {f.b: true}}")
    assert space.is_active("x.y", {"f.b": True})
    assert not space.is_active("x.y", {"f.b": 1})
    with pytest.raises(SearchSpaceError, match="not among the choices"):
        make_space("f.n: {choice: [1, 0]}\nx.y: {float: [0, 1], when: {f.n: true}}")


def test_sample_respects_ranges_conditions_and_types():
    space = make_space()
    rng = random.Random(0)
    seen_strategies = set()
    for _ in range(500):
        config = space.sample(rng)
        space.validate_params(config)  # exactly the active parameters, all within range
        assert ("optimizer.beta2" in config) == (config["optimizer.name"] == "lamb")
        assert ("clipping.max_norm" in config) == (config["clipping.strategy"] != "none")
        assert 1e-4 <= config["optimizer.lr"] <= 5e-3
        assert type(config["schedule.warmup_steps"]) is int
        seen_strategies.add(config["clipping.strategy"])
    assert seen_strategies == {"none", "after_allreduce", "bucketwise"}


def test_sample_is_reproducible_with_a_seed():
    space = make_space()
    assert space.sample(7) == space.sample(random.Random(7))
    assert space.sample(7) != space.sample(8)


def test_log_scale_sampling_is_uniform_in_log_space():
    space = make_space("x.lr: {float: [1.0e-4, 1.0e-2], log: true}\nx.n: {int: [1, 1000], log: true}")
    rng = random.Random(1)
    samples = [space.sample(rng) for _ in range(4000)]
    below = sum(s["x.lr"] < 1e-3 for s in samples) / len(samples)  # 1e-3: the geometric midpoint
    assert below == pytest.approx(0.5, abs=0.03)
    below_int = sum(s["x.n"] <= math.sqrt(1000) for s in samples) / len(samples)
    assert below_int == pytest.approx(0.5, abs=0.04)


def test_int_bounds_are_inclusive():
    space = make_space("x.n: {int: [3, 5]}")
    rng = random.Random(2)
    assert {space.sample(rng)["x.n"] for _ in range(200)} == {3, 4, 5}


def test_numeric_strings_that_yaml_leaves_as_strings_are_read_as_floats():
    space = make_space("x.lr: {float: [5e-4, 1e-2], log: true}")  # PyYAML reads 5e-4 as a string
    assert space["x.lr"] == FloatParam(5e-4, 1e-2, log=True)


# ------------------------------------------------------------------------------------------------ variants
ARMS = """
optimizer.name: {choice: [adamw, lamb]}
optimizer.lr@lamb: {float: [3.0e-4, 5.0e-3], log: true, when: {optimizer.name: lamb}}
optimizer.lr@adamw: {float: [1.0e-4, 2.0e-3], log: true, when: {optimizer.name: adamw}}
"""


def test_arm_specific_ranges_map_to_one_trainer_key():
    space = make_space(ARMS)
    assert trainer_key("optimizer.lr@lamb") == "optimizer.lr"
    rng = random.Random(3)
    for _ in range(200):
        config = space.sample(rng)
        name = f"optimizer.lr@{config['optimizer.name']}"
        assert set(config) == {"optimizer.name", name}
        values = space.trainer_values(config)
        assert values == {"optimizer.name": config["optimizer.name"], "optimizer.lr": config[name]}
        low, high = (3e-4, 5e-3) if config["optimizer.name"] == "lamb" else (1e-4, 2e-3)
        assert low <= values["optimizer.lr"] <= high


def test_variants_may_be_exclusive_through_an_ancestor():
    # b.k exists only when a.k = x, so "a.k = y" and "b.k = u" never hold together: the space is accepted, and each
    # sample holds at most one variant of o.lr, the one its values ask for, in that variant's range.
    space = make_space(
        """
        a.k: {choice: [x, y]}
        b.k: {choice: [u, v], when: {a.k: x}}
        o.lr@1: {float: [0.1, 1], when: {a.k: y}}
        o.lr@2: {float: [1, 2], when: {b.k: u}}
        """
    )
    rng, seen = random.Random(5), set()
    for _ in range(200):
        config = space.sample(rng)
        variant = "o.lr@1" if config["a.k"] == "y" else "o.lr@2" if config.get("b.k") == "u" else None
        assert [k for k in config if k.startswith("o.lr@")] == ([variant] if variant else []), config
        values = space.trainer_values(config)
        assert ("o.lr" in values) is (variant is not None), values
        if variant:
            low, high = (0.1, 1) if variant == "o.lr@1" else (1, 2)
            assert low <= values["o.lr"] <= high and values["o.lr"] == config[variant]
        seen.add(variant)
    assert seen == {"o.lr@1", "o.lr@2", None}  # every case drawn


def test_overlapping_variants_are_rejected_with_an_example():
    with pytest.raises(SearchSpaceError) as err:
        make_space(ARMS.replace("{optimizer.name: adamw}", "{optimizer.name: {in: [adamw, lamb]}}"))
    assert err.value.key == "optimizer.lr@adamw"
    assert "optimizer.name=lamb" in str(err.value)


# ------------------------------------------------------------------------------------------------ errors
BAD_SPACES = [
    ("x.a: {float: [1, 1]}", "x.a", "low must be < high"),
    ("x.a: {float: [2, 1]}", "x.a", "low must be < high"),
    ("x.a: {int: [5, 1]}", "x.a", "low must be < high"),
    ("x.a: {float: [0, 1], log: true}", "x.a", "log range needs low > 0"),
    ("x.a: {int: [-1, 8], log: true}", "x.a", "log range needs low > 0"),
    ("x.a: {choice: []}", "x.a", "empty"),
    ("x.a: {choice: [a, a]}", "x.a", "listed twice"),
    ("x.a: {choice: [[1, 2]]}", "x.a", "not a string, number or boolean"),
    ("x.a: {choice: a}", "x.a", "expected a list"),
    ("x.a: {choice: [a], log: true}", "x.a", "only float and int"),
    ("x.a: {float: [0, 1], lg: true}", "x.a", "unknown field 'lg'"),
    ("x.a: {float: [0, 1], int: [0, 1]}", "x.a", "exactly one of"),
    ("x.a: {}", "x.a", "exactly one of"),
    ("x.a: [0, 1]", "x.a", "expected a mapping"),
    ("x.a: {float: [0]}", "x.a", "expected [low, high]"),
    ("x.a: {float: [a, 1]}", "x.a", "not a finite number"),
    ("x.a: {int: [0.5, 2]}", "x.a", "not an integer"),
    ("x.a: {float: [0, .inf]}", "x.a", "not a finite number"),
    ("x.a: {float: [0, 1], log: yes please}", "x.a", "log: expected true or false"),
    ("x.a: {float: [0, 1], when: {x.b: 1}}", "x.a", "'x.b' is not a parameter"),
    ("x.c: {choice: [1]}\nx.a: {float: [0, 1], when: {x.d: 1}}", "x.a", "did you mean 'x.c'"),
    ("x.b: {float: [0, 1]}\nx.a: {float: [0, 1], when: {x.b: 0.5}}", "x.a", "not categorical"),
    ("x.b: {choice: [u, v]}\nx.a: {float: [0, 1], when: {x.b: w}}", "x.a", "'w' is not among the choices"),
    ("x.b: {choice: [u, v]}\nx.a: {float: [0, 1], when: {x.b: {not: [u, v]}}}", "x.a", "can never hold"),
    ("x.b: {choice: [u, v]}\nx.a: {float: [0, 1], when: {x.b: {neq: u}}}", "x.a", "{not: value}"),
    ("x.b: {choice: [u, v]}\nx.a: {float: [0, 1], when: {x.b: {in: u}}}", "x.a", "expected a list"),
    ("x.b: {choice: [u, v]}\nx.a: {float: [0, 1], when: {x.b: {in: []}}}", "x.a", "empty"),
    ("x.b: {choice: [u, v]}\nx.a: {float: [0, 1], when: x.b}", "x.a", "when: expected a mapping"),
    ("x.a: {choice: [u, v], when: {x.a: u}}", "x.a", "cannot depend on itself"),
    ("x.a: {choice: [u], when: {x.b: u}}\nx.b: {choice: [u], when: {x.a: u}}", "x.a", "cycle (x.a -> x.b -> x.a)"),
    ("'x a': {float: [0, 1]}", "x a", "not a dotted key"),
    ("x.a@: {float: [0, 1]}", "x.a@", "not a dotted key"),
    ('"x.a\\n": {float: [0, 1]}', "x.a\n", "not a dotted key"),  # `$` lets a final newline by
    ("x.a@1: {float: [0, 1]}\nx.a@2: {float: [1, 2]}", "x.a@2", "same trainer key x.a"),
    ("x.a: {float: [0, 1]}\nx.a@2: {float: [1, 2]}", "x.a@2", "both are active together (always)"),
]


@pytest.mark.parametrize(("text", "key", "message"), BAD_SPACES,
                         ids=[f"{i}-{m}" for i, (_, _, m) in enumerate(BAD_SPACES)])  # fmt: skip
def test_malformed_spaces_name_the_key_and_the_problem(text, key, message):
    with pytest.raises(SearchSpaceError) as err:
        make_space(text)
    assert err.value.key == key
    assert str(err.value).startswith(f"{key}: ")
    assert message in str(err.value)


@pytest.mark.parametrize("data", [None, {}, [1, 2], "space"])
def test_a_space_must_be_a_non_empty_mapping(data):
    with pytest.raises(SearchSpaceError, match="non-empty mapping"):
        SearchSpace.from_dict(data)


def test_validate_params_names_the_offending_parameter():
    space = make_space()
    good = {"optimizer.name": "adamw", "optimizer.lr": 1e-3, "clipping.strategy": "none", "schedule.warmup_steps": 3}
    space.validate_params(good)
    cases = [
        ({**good, "optimizer.lrr": 1e-3}, "optimizer.lrr", "did you mean 'optimizer.lr'"),
        ({k: v for k, v in good.items() if k != "optimizer.lr"}, "optimizer.lr", "no value"),
        ({**good, "optimizer.beta2": 0.9}, "optimizer.beta2", "condition is false"),
        ({**good, "optimizer.lr": 1.0}, "optimizer.lr", "outside"),
        ({**good, "schedule.warmup_steps": 3.5}, "schedule.warmup_steps", "outside"),
        ({**good, "optimizer.name": "sgd"}, "optimizer.name", "outside"),
    ]
    for config, key, message in cases:
        with pytest.raises(SearchSpaceError, match=message) as err:
            space.validate_params(config)
        assert err.value.key == key


def test_presets_are_listed_and_found():
    names = list_presets()
    for base in ("adam_vs_lamb", "clipping_strategies", "batch_scaling"):
        assert base in names and f"{base}_demo_cpu" in names
        assert preset_path(base) == preset_path(f"{base}.yaml")
        assert preset_path(base).is_file()
    with pytest.raises(SearchSpaceError, match="no preset named 'nope'"):
        preset_path("nope")


def test_a_bare_preset_name_stands_for_its_file_unless_a_file_of_that_name_is_at_hand(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shipped = PRESETS_DIR / "adam_vs_lamb_simulated.yaml"
    assert shipped_preset("adam_vs_lamb_simulated") == shipped_preset("adam_vs_lamb_simulated.yaml") == shipped
    assert shipped_preset("nope") is None and shipped_preset("somewhere/adam_vs_lamb_simulated.yaml") is None
    assert unread_namesake("adam_vs_lamb_simulated") is None
    (tmp_path / "adam_vs_lamb_simulated.yaml").write_text("name: mine\n")  # the user's own file wins
    assert shipped_preset("adam_vs_lamb_simulated.yaml") is None
    # a bare name still reads the preset, and the file beside it that it does not read is named
    assert shipped_preset("adam_vs_lamb_simulated") == shipped
    assert unread_namesake("adam_vs_lamb_simulated") == Path("adam_vs_lamb_simulated.yaml")
    assert unread_namesake("adam_vs_lamb_simulated.yaml") is None and unread_namesake("nope") is None


# ------------------------------------------------------------------------------------------------ YAML oddities
@pytest.mark.parametrize("choices", ["[true, 1]", "[0, false]", "[1, true, 2]"])
def test_a_boolean_and_its_number_are_one_choice(choices):
    """ConfigSpace (SMAC3) counts true and 1 as one choice and would refuse the space only when the experiment
    starts, after it is written; the trainer reads them as one value."""
    with pytest.raises(SearchSpaceError, match="the same choice") as err:
        make_space(f"x.a: {{choice: {choices}}}")
    assert err.value.key == "x.a"


def test_exponent_numbers_that_yaml_leaves_as_strings_are_numbers_in_choices_and_conditions():
    """PyYAML (YAML 1.1) reads 1e-3 and 1.0e3 as strings; in choices and conditions they are numbers, as in ranges."""
    space = make_space("x.lr: {choice: [1e-3, 1.0e-2, 0.1]}\nx.b: {float: [0, 1], when: {x.lr: {not: 1e-3}}}")
    assert space["x.lr"].choices == (1e-3, 1e-2, 0.1)
    assert space["x.b"].when[0].values == (1e-3,)
    assert make_space("x.n: {choice: [a, '1x', 4]}")["x.n"].choices == ("a", "1x", 4)  # other strings stay strings


def test_integer_bounds_may_be_written_as_yaml_strings_of_whole_numbers():
    assert make_space("x.n: {int: [1e2, 1.0e4], log: true}")["x.n"] == IntParam(100, 10_000, log=True)
    assert make_space("x.n: {int: ['0', '4']}")["x.n"] == IntParam(0, 4)
    with pytest.raises(SearchSpaceError, match="'1.5e0' is not an integer"):
        make_space("x.n: {int: [0, 1.5e0]}")


def test_an_empty_when_is_refused_not_read_as_no_condition():
    """`when:` with every line under it commented out would otherwise make the parameter unconditional."""
    with pytest.raises(SearchSpaceError, match="when: empty") as err:
        make_space("x.c: {choice: [u, v]}\nx.a:\n  float: [0, 1]\n  when:\n    # x.c: u\n")
    assert err.value.key == "x.a"
