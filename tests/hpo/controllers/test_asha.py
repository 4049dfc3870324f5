"""The asha tuner's decisions, computed by hand from ASHA's rule (Li et al. 2020): rungs, promotions of the best
1/eta of a rung, finished and crashed configurations, the model sampler's data, and a replayed history."""

from __future__ import annotations

import math
import random

import pytest

from hpo.controllers.asha import AshaController
from hpo.controllers.base import Suggestion
from hpo.controllers.smac import ForestModel
from hpo.errors import ExperimentFileError
from hpo.experiment import experiment_from_dict
from hpo.experiment.rungs import asha_plan, rung_samples
from search_spaces.space import SearchSpace
from tests.hpo.experiment.test_experiment import TINY_BASE, make_experiment

SPACE = SearchSpace.from_dict({"optimizer.lr": {"float": [1e-4, 1e-1], "log": True},
                               "schedule.warmup_steps": {"choice": [0, 40]}})  # fmt: skip
BUDGETS = (1 / 9, 1 / 3, 1.0)


@pytest.mark.parametrize(
    ("top", "low", "eta", "every", "expected"),
    [
        (12288, 1365, 3, 1024, [1024, 4096, 12288]),  # 12,288 / 9 = 1,365 -> 1,024: the evaluation grid
        (8192, 1024, 2, 1024, [1024, 2048, 4096, 8192]),
        (96, 16, 3, 16, [32, 96]),  # 96 / 9 < 16: one division only
        (4096, 4096, 3, 512, [4096]),
        (10000, 1000, 3, 1000, [1000, 3000, 10000]),  # 10,000 / 3 = 3,333 -> 3,000; / 9 = 1,111 -> 1,000
    ],
)
def test_rungs_are_max_samples_over_powers_of_eta_on_the_evaluation_grid(top, low, eta, every, expected):
    assert rung_samples(top, low, eta, every) == expected


def spec_with(options: dict, **budget):
    data = make_experiment(base_config=TINY_BASE, tuner={"name": "asha", "seed": 0, "options": options},
                           budget={"trials": 8, **budget})  # fmt: skip
    return experiment_from_dict(data, "exp.yaml")


def test_the_plan_takes_its_defaults_from_the_budget():
    spec = spec_with({}, min_budget=1 / 16, eta=2)  # full budget 4,096, evaluations every 256
    plan = asha_plan(spec, 4096, 256)
    assert plan.eta == 2 and plan.samples == (256, 512, 1024, 2048, 4096)
    assert plan.budgets == (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0)
    assert asha_plan(spec_with({"min_samples": 1000, "eta": 4}), 4096, 256).samples == (1024, 4096)


@pytest.mark.parametrize(
    ("options", "field", "says"),
    [
        ({"etta": 3}, "tuner.options.etta", "not an option of asha (it understands eta, min_samples"),
        ({"eta": 1}, "tuner.options.eta", "greater than or equal to 2"),
        ({"sampler": "tpe"}, "tuner.options.sampler", "'model' or 'random'"),
        ({"max_samples": 8192}, "tuner.options.max_samples", "beyond budget.max_samples (4096)"),
        ({"min_samples": 100}, "tuner.options.min_samples", "before the first evaluation"),
        ({"min_samples": 3000, "max_samples": 2048}, "tuner.options.min_samples", "above the top rung"),
    ],
)
def test_bad_options_are_named_when_the_file_is_loaded(options, field, says):
    with pytest.raises(ExperimentFileError) as error:
        spec_with(options)
    assert f"exp.yaml: {field}:" in str(error.value) and says in str(error.value)


def asha(sampler="random", model=None, eta=3, hit_at_most=None, **kw) -> AshaController:
    return AshaController(SPACE, 0, BUDGETS, eta, sampler, model, reached_target_at_most=hit_at_most, **kw)


def test_a_configuration_in_the_best_third_of_its_rung_is_promoted_at_once():
    tuner = asha(hit_at_most=1.0)
    first = [tuner.ask() for _ in range(3)]  # nothing finished: three new configurations at the lowest rung
    assert [s.budget for s in first] == [1 / 9] * 3 and len({str(s.params) for s in first}) == 3
    for s, cost in zip(first, (5.0, 3.0, 4.0), strict=True):
        tuner.tell(s, cost)
    promoted = tuner.ask()  # 3 results: the best floor(3/3) = 1 goes up, asked at once
    assert promoted.params == first[1].params and promoted.budget == 1 / 3
    fourth = tuner.ask()  # the best third holds only the promoted one: a new configuration
    assert fourth.budget == 1 / 9 and fourth.params not in [s.params for s in first]
    tuner.tell(fourth, 1.0)  # reached the target (cost <= 1.0): finished, never promoted
    fifth = tuner.ask()  # 4 results, best 1 = the finished one: nothing to promote
    assert fifth.budget == 1 / 9
    tuner.tell(promoted, 2.5)  # rung 1 has one result: nothing to promote from it (floor(1/3) = 0)
    tuner.tell(fifth, 3.5)
    sixth = tuner.ask()
    assert sixth.budget == 1 / 9
    tuner.tell(sixth, 1.5)  # 6 results; best 2: the finished one (1.0) and this one (1.5)
    assert tuner.ask() == Suggestion(sixth.params, 1 / 3)
    assert tuner.promotions == [(1, 1), (5, 1)]


def test_the_highest_rung_promotes_first_and_ties_go_to_the_earlier_result():
    tuner = asha()
    lows = [tuner.ask() for _ in range(9)]
    for s in lows:
        tuner.tell(s, 7.0)  # a nine-way tie at rung 0: the first three results go up, in their order
    ups = [tuner.ask() for _ in range(3)]
    assert [u.params for u in ups] == [s.params for s in lows[:3]] and {u.budget for u in ups} == {1 / 3}
    for u, cost in zip(ups, (6.0, 2.0, 4.0), strict=True):
        tuner.tell(u, cost)
    assert tuner.ask() == Suggestion(lows[1].params, 1.0)  # rung 1 (3 results) before rung 0's next in line


def test_a_crashed_configuration_is_never_promoted():
    tuner = asha()
    asked = [tuner.ask() for _ in range(3)]
    tuner.tell(asked[0], None)  # a crash ranks last ...
    tuner.tell(asked[1], 9.0)
    tuner.tell(asked[2], 8.0)
    assert tuner.ask() == Suggestion(asked[2].params, 1 / 3)
    crashed_only = asha()
    asked = [crashed_only.ask() for _ in range(3)]
    for s in asked:
        crashed_only.tell(s, None)  # ... and is never the one promoted, even when it is all there is
    assert crashed_only.ask().budget == 1 / 9


def test_the_model_is_fitted_on_the_highest_rung_with_enough_results_after_the_random_start():
    seen: list[list[float]] = []

    def model(observed):
        seen.append([cost for _, cost in observed])
        return {"optimizer.lr": 0.01, "schedule.warmup_steps": 0}

    tuner = asha(sampler="model", model=model, min_points_in_model=3, random_fraction=0.0)
    asked = [tuner.ask() for _ in range(3)]
    assert seen == []  # no rung has 3 results yet: random configurations
    for s, cost in zip(asked, (3.0, 2.0, 1.0), strict=True):
        tuner.tell(s, cost)
    up = tuner.ask()  # a promotion (of cost 1.0) needs no sampler
    assert up.budget == 1 / 3 and seen == []
    new = tuner.ask()
    assert new.params == {"optimizer.lr": 0.01, "schedule.warmup_steps": 0} and seen == [[3.0, 2.0, 1.0]]
    tuner.tell(up, 0.5)
    more = [tuner.ask() for _ in range(2)]
    for s, cost in zip([new, *more], (4.0, 5.0, 6.0), strict=True):
        tuner.tell(s, cost)
    assert tuner.ask() == Suggestion(asked[1].params, 1 / 3)  # the best 2 of 6 go up: cost 1.0 went, now 2.0
    tuner.ask()  # a new configuration: rung 1 has one result, rung 0 six: the model is fitted on rung 0
    assert seen[-1] == [3.0, 2.0, 1.0, 4.0, 5.0, 6.0]


def test_a_replayed_history_rebuilds_the_promotion_state():
    """What a resumed controller is told (hpo.engine.study.Study.restore replays a stored trial as a replay when a fresh
    controller asks something else): the same configurations, rungs, results and promotions."""
    live = asha(hit_at_most=100.0)
    rng = random.Random(5)
    history = []
    running: list[Suggestion] = []
    for _ in range(60):  # ask, and tell a random one of those in flight, as slots free in any order
        running.append(live.ask())
        if len(running) > 4:
            done = running.pop(rng.randrange(len(running)))
            cost = rng.choice([None, 50.0, *[rng.uniform(200, 900) for _ in range(8)]])
            live.tell(done, cost)
            history.append((done.params, done.budget, cost))
    replayed = asha(hit_at_most=100.0)
    for params, budget, cost in history:
        replayed.replay(params, budget, cost)

    def results(tuner):  # configuration -> its results by rung and whether it is finished, for the told ones
        return {str(params): (told, finished) for params, _, told, finished in tuner.state()["configurations"] if told}

    assert results(replayed) == results(live)
    assert sum(len(told) > 1 for told, _ in results(live).values()) >= 5  # promoted configurations were told
    assert any(finished for _, finished in results(live).values())


def test_the_forest_proposes_near_the_optimum_more_often_than_chance():
    """SMAC3's random forest + expected improvement (ForestModel) on a known cost: distance from log10 lr = -2.5.
    Proposals fed back one by one end nearer the optimum than as many random draws (the same seeds)."""

    def cost(p):
        return 1000.0 * (1 + abs(math.log10(p["optimizer.lr"]) + 2.5)) + p["schedule.warmup_steps"]

    rng = random.Random(3)
    observed = [(p, cost(p)) for p in (SPACE.sample(rng) for _ in range(12))]
    model = ForestModel(SPACE, seed=0)
    proposed = []
    for _ in range(12):
        p = model(observed)
        proposed.append(cost(p))
        observed.append((p, cost(p)))
    drawn = sorted(cost(SPACE.sample(rng)) for _ in range(12))
    assert sorted(proposed)[6] < drawn[6]  # the median proposal beats the median random draw
    assert min(proposed) < 1100  # within 0.1 decades of the optimum
