"""NNI's Anneal and Evolution, seeded (hpo.nni.seeded): the same seed proposes the same sequence, another seed
another, as the dispatcher of NNI's manager drives them (generate, report, end); NNI's own classes, unseeded, draw
anew in every process."""

from __future__ import annotations

import random

from hpo.nni.seeded import ManagerEvolution, SeededAnneal

SPACE = {"x": {"_type": "uniform", "_value": [0.0, 1.0]}, "c": {"_type": "choice", "_value": ["a", "b", "c"]},
         "lr": {"_type": "loguniform", "_value": [1e-4, 1e-1]}}  # fmt: skip


def proposals(tuner, n: int = 8) -> list[dict]:
    """`n` proposals, each reported (a value from its parameters) and ended before the next, as trials one at a time."""
    tuner.update_search_space(SPACE)
    seen = []
    for parameter_id in range(n):
        params = tuner.generate_parameters(parameter_id)
        tuner.receive_trial_result(parameter_id, params, params["x"] + params["lr"])
        tuner.trial_end(parameter_id, True)
        seen.append(params)
    return seen


def test_seeded_anneal_proposes_the_same_for_the_same_seed_and_else_for_another():
    first, again, other = (proposals(SeededAnneal(seed)) for seed in (3, 3, 4))
    assert first == again and first != other
    assert len({round(p["x"], 12) for p in first}) > 4  # it explores, not one point


def test_evolution_under_the_manager_proposes_the_same_for_the_same_seed_and_else_for_another():
    saved = random.getstate()  # ManagerEvolution seeds the process's global stream, as the dispatcher's own
    try:
        # population 2: from the third proposal on, mutations (random.shuffle and random.randint on the global stream)
        first, again, other = (proposals(ManagerEvolution(seed, population_size=2)) for seed in (3, 3, 4))
    finally:
        random.setstate(saved)
    assert first == again and first != other
    assert first[2:] != first[:2] * 3  # mutated, not the first population again
