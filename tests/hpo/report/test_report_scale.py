"""The report of a large experiment: 2,400 tuning trials over two arms and three confirmation runs per arm, written
straight through the storage API (no trainer runs), so every count is known here by construction. The verdict
and the best configuration per arm on the page are those `hpo best --per-arm` prints from the same database;
the page stays under 1 MB; it lists each arm's best trials and every confirmation run and says how to list the
rest, while its counts and medians still cover every trial.
"""

from __future__ import annotations

import random
import statistics

import pytest
import yaml

from hpo.cli.main import main
from hpo.experiment import experiment_from_dict, stored_form
from hpo.report.html import experiment_report
from hpo.storage import SqlStorage
from hpo.storage.base import MetricPoint
from hpo.trials import TrialKind, TrialResult, TrialSpec, TrialState
from tests.hpo.report.test_report import Page, table_with

pytestmark = pytest.mark.slow  # 2,400 trials written one by one through the storage (about 20 s)

NAME = "large"
TUNING = 2400  # above every subset the page takes: 500 listed trials, 1,000 drawn and 500 ranked per arm
MAX_SAMPLES = 1024
TARGET = 0.5
ARMS = {"optimizer.name=adamw": "adamw", "optimizer.name=lamb": "lamb"}
OUTCOMES = (("reached", 0.7), ("missed", 0.2), ("diverged", 0.05), ("failed", 0.05))
PAGE_BOUND = 1_000_000  # bytes


def make_large_experiment(directory) -> tuple[str, list[dict]]:
    """The database URL and what was written: one dict per trial (number, arm, kind, outcome, objective,
    noise, params)."""
    data = {
        "name": NAME, "base_config": {}, "description": "many trials",
        "overrides": {"batch.global_batch_size": 16, "batch.micro_batch_size": 8, "eval.target_mlm_accuracy": TARGET,
                      "budget.max_samples": MAX_SAMPLES, "device": "cpu"},
        "space": {"optimizer.name": {"choice": list(ARMS.values())},
                  "optimizer.lr": {"float": [1e-4, 1e-2], "log": True},
                  "schedule.warmup_steps": {"int": [0, 100]}},
        "compare": ["optimizer.name"], "tuner": {"name": "random", "seed": 0},
        "budget": {"trials": TUNING, "max_parallel": 64, "confirm_seeds": 3},
        "resources": {"gpus": "none", "cpu_slots": 1},
    }  # fmt: skip
    spec = experiment_from_dict(data, f"{NAME}.yaml", base_dir=directory)
    url = f"sqlite:///{directory / 'hpo.db'}"
    storage = SqlStorage(url, upgrade=True)
    eid = storage.create_experiment(NAME, stored_form(spec, directory / "run"), spec.direction)
    rng = random.Random(0)
    written = []
    for number in range(TUNING):
        arm = list(ARMS)[number % 2]
        params = {"optimizer.name": ARMS[arm], "optimizer.lr": 10 ** rng.uniform(-4, -2),
                  "schedule.warmup_steps": rng.randrange(0, 101)}  # fmt: skip
        outcome = rng.choices([o for o, _ in OUTCOMES], [w for _, w in OUTCOMES])[0]
        written.append(_write(storage, eid, number, arm, params, outcome, TrialKind.TUNING, rng))
    number = TUNING
    for arm, best in storage.best_per_arm(eid).items():  # what the controller confirms
        for seed in (1, 2, 3):
            written.append(_write(storage, eid, number, arm, best.params, "reached", TrialKind.CONFIRMATION, rng, seed))
            number += 1
    storage.close()
    return url, written


def _write(storage, eid, number, arm, params, outcome, kind, rng, seed=None) -> dict:
    trial_id = storage.create_trial(eid, TrialSpec(number, params, arm, 1.0, (), 16, kind, seed))
    storage.mark_trial_running(trial_id, pid=1, host="h")
    noise = round(rng.uniform(5, 60), 1)  # below 4x its big batch of 16: a value, not a lower bound
    reached_at = 64 * rng.randrange(1, MAX_SAMPLES // 64 + 1) if outcome == "reached" else None
    samples = reached_at or MAX_SAMPLES
    points = [MetricPoint(step, samples * step // 4, {"noise_scale": noise}) for step in range(1, 5)]
    if kind is TrialKind.CONFIRMATION:  # the verdict reads its evaluations: the target crossed at reached_at
        points += [MetricPoint(10 + k, 64 * k, {"mlm_accuracy": TARGET * 64 * k / reached_at})
                   for k in range(1, reached_at // 64 + 1)]  # fmt: skip
    storage.add_metrics(trial_id, points)
    objective = {"reached": reached_at, "missed": 2.0 * MAX_SAMPLES * 1.3, "diverged": 4.0 * MAX_SAMPLES}.get(outcome)
    state = {"diverged": TrialState.DIVERGED, "failed": TrialState.FAILED}.get(outcome, TrialState.COMPLETED)
    result = TrialResult(state, "crashed" if outcome == "failed" else None, objective, reached_at, None,
                         TARGET if reached_at else 0.3, 1.0, {"samples": samples})  # fmt: skip
    storage.finish_trial(trial_id, result)
    return {"number": number, "arm": arm, "kind": kind.value, "outcome": outcome, "objective": objective,
            "noise": noise, "params": params}  # fmt: skip


@pytest.fixture(scope="module")
def large(tmp_path_factory) -> tuple[str, list[dict], str]:
    url, written = make_large_experiment(tmp_path_factory.mktemp("large"))
    with SqlStorage(url) as storage:
        html = experiment_report(storage, NAME)
    return url, written, html


def best_per_arm_from_the_cli(url: str, capsys) -> tuple[dict, str]:
    capsys.readouterr()
    assert main(["--db", url, "best", NAME, "--per-arm"]) == 0
    out = capsys.readouterr().out
    return yaml.safe_load(out), out.rsplit("# verdict: ", 1)[1].strip()


def test_verdict_and_best_configurations_are_what_hpo_best_per_arm_prints(large, capsys):
    url, _, html = large
    printed, line = best_per_arm_from_the_cli(url, capsys)
    page = Page(html)
    assert page.cells[(None, "verdict")] == line == printed["verdict"]["line"]
    assert page.cells[(None, "outcome")] == printed["verdict"]["outcome"]
    configs = [t for t in page.tables if t and t[0] == ["parameter", "value"]]
    assert len(configs) == len(ARMS)
    for arm, config in zip(ARMS, configs, strict=True):  # the page's arms in the spec's order
        best = printed[arm]
        assert page.cells[(arm, "best_trial")] == str(best["trial"])
        shown = dict(config[1:])
        assert shown.keys() == best["params"].keys()
        for key, value in best["params"].items():
            if isinstance(value, float):
                assert float(shown[key]) == pytest.approx(value, rel=1e-5)
            else:
                assert shown[key] == str(value)
        evidence = best["evidence"]
        assert page.cells[(arm, "runs")] == str(evidence["runs"]) == "3"
        assert page.cells[(arm, "hits")] == str(evidence["reached_target"])
        assert page.cells[(arm, "mean")] == f"{evidence['samples_to_target_mean']:,.0f}"


def test_the_page_stays_light_and_lists_each_arms_best_and_every_confirmation(large):
    _, written, html = large
    assert len(html.encode()) < PAGE_BOUND
    page = Page(html)
    assert page.cells[(None, "listed")].startswith(f"26 of {len(written):,} trials listed")
    assert f"hpo trials {NAME}" in html
    listed = [int(row[0]) for row in table_with(page, "noise scale")[1:]]
    expected = {w["number"] for w in written if w["kind"] == "confirmation"}
    for arm in ARMS:  # the 10 best by objective among the runs that reached the target, ties by number
        reached = [w for w in written if w["arm"] == arm and w["kind"] == "tuning" and w["outcome"] == "reached"]
        expected |= {w["number"] for w in sorted(reached, key=lambda w: (w["objective"], w["number"]))[:10]}
    assert listed == sorted(expected)


def test_counts_and_medians_still_cover_every_trial(large):
    _, written, html = large
    page = Page(html)
    for arm in ARMS:
        mine = [w for w in written if w["arm"] == arm]
        tuning = [w for w in mine if w["kind"] == "tuning"]
        assert page.cells[(arm, "tuning")] == str(len(tuning))
        for outcome, _ in OUTCOMES:
            assert page.cells[(arm, outcome)] == str(sum(w["outcome"] == outcome for w in tuning))
        median = statistics.median(w["noise"] for w in mine)  # every finished trial reported one noise scale
        assert page.cells[(arm, "noise_trials")] == str(len(mine))
        assert page.cells[(arm, "noise_median")] == (f"{median:,.0f}" if median >= 100 else f"{median:.3g}")
        usable = sum(w["outcome"] != "failed" for w in tuning)
        assert f"500 of {usable:,} usable trials" in html
