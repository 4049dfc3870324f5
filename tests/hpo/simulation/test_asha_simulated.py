"""The asha tuner on the simulated cluster, through the real Study, storage and simulated runner: every slot is
busy while a promotion or a new configuration is possible, every promotion is the one ASHA's rule picks
(recomputed here from the stored trials alone), and a controller stopped and resumed rebuilds the same promotion
state from the database."""

from __future__ import annotations

import math
from datetime import datetime

import pytest
import yaml

from hpo.cli.main import main as hpo_main
from hpo.engine import local as local_engine
from hpo.simulation.cost import experiment_cost
from hpo.storage import SqlStorage
from hpo.trials import TrialKind, TrialState
from tests.hpo.simulation.conftest import MAX_SAMPLES
from tests.hpo.simulation.test_simulated_runner import experiment_file

ETA = 3


def asha_file(directory, name, trials, slots, sampler="random", confirm=0):
    path = experiment_file(directory, name, tuner="asha", trials=trials, slots=slots)
    data = yaml.safe_load(path.read_text())
    data["tuner"]["options"] = {"sampler": sampler, "eta": ETA}
    data["budget"]["confirm_seeds"] = confirm
    path.write_text(yaml.safe_dump(data))
    return path


# About 16 trials a slot, as 1,000 on 64 slots: idle 0.027 and tail 0.069 here, 0.026 and 0.069 there.
TRIALS, SLOTS = 500, 32


@pytest.fixture(scope="module")
def asha_trials(tmp_path_factory):
    """500 asha trials (random sampler) over two arms on 32 slots, no confirmations."""
    directory = tmp_path_factory.mktemp("asha")
    url = f"sqlite:///{directory / 'hpo.db'}"
    code = hpo_main(["--db", url, "run", str(asha_file(directory, "asha-32", TRIALS, SLOTS)), "--quiet",
                     "--run-dir", str(directory / "run")])  # fmt: skip
    assert code == 0
    with SqlStorage(url) as storage:
        return storage.list_trials(storage.get_experiment_by_name("asha-32").id)


def running_between(trials, moments):
    """How many trials ran during each interval between consecutive `moments`."""
    intervals = zip(moments, moments[1:], strict=False)
    return [sum(t.started_at <= a and b <= t.finished_at for t in trials) for a, b in intervals]


def test_no_slot_idles_while_a_promotion_or_a_new_configuration_is_possible(asha_trials):
    trials = asha_trials
    assert len(trials) == TRIALS and all(t.state.finished for t in trials)
    last_asked = max(t.created_at for t in trials)
    moments = sorted({m for t in trials for m in (t.started_at, t.finished_at) if m <= last_asked})
    assert set(running_between(trials, moments)) == {SLOTS}  # all slots busy until the last trial is asked
    start, end = min(t.started_at for t in trials), max(t.finished_at for t in trials)
    busy = sum((t.finished_at - t.started_at).total_seconds() for t in trials)
    idle = 1 - busy / (SLOTS * (end - start).total_seconds())
    cost = experiment_cost(trials, SLOTS, 8)
    assert cost.idle_fraction == pytest.approx(idle)
    tail = (end - last_asked).total_seconds() / (end - start).total_seconds()
    # What idles is the tail once the budget of trials is used: the last trials' spread of end times.
    assert idle <= tail < 0.08 and idle < 0.03


def rung_of(budget: float, budgets: list[float]) -> int:
    return min(range(len(budgets)), key=lambda k: abs(budgets[k] - budget))


def promotable(trials, arm: str, rung: int, moment: datetime, rungs: list[float], promoted_to: dict):
    """ASHA's rule, from the stored trials: the best configuration among the best floor(n / eta) of the n results
    at `rung` finished by `moment` (ties to the earlier result) that was not promoted yet, did not crash and did not
    reach the target; None if there is none."""
    done = [t for t in trials if t.arm == arm and t.kind is TrialKind.TUNING and rung_of(t.budget, rungs) == rung
            and t.finished_at is not None and t.finished_at <= moment]  # fmt: skip
    done.sort(key=lambda t: (math.inf if t.objective is None or t.state is TrialState.FAILED else t.objective,
                             t.finished_at, t.number))  # fmt: skip
    for t in done[: len(done) // ETA]:
        key = str(sorted(t.params.items()))
        if promoted_to.get(key, 0) == rung and t.samples_to_target is None and t.state is TrialState.COMPLETED:
            return key
    return None


def check_promotions(trials):
    """Replays the experiment in creation order and checks each trial is what ASHA asks at that moment."""
    rungs = sorted({t.budget for t in trials if t.kind is TrialKind.TUNING})
    promoted_to: dict[str, dict[str, int]] = {}
    promotions = 0
    for t in sorted((t for t in trials if t.kind is TrialKind.TUNING), key=lambda t: (t.created_at, t.number)):
        arm, key = promoted_to.setdefault(t.arm, {}), str(sorted(t.params.items()))
        below_top = range(len(rungs) - 2, -1, -1)
        candidates = ((k, promotable(trials, t.arm, k, t.created_at, rungs, arm)) for k in below_top)
        expected = next(((k, c) for k, c in candidates if c is not None), None)
        rung = rung_of(t.budget, rungs)
        if expected is None:
            assert rung == 0 and key not in arm, f"trial {t.number}: a new configuration was due"
        else:
            assert (rung - 1, key) == expected, f"trial {t.number}: ASHA promotes {expected}"
            promotions += 1
        arm[key] = rung
    return promotions


def test_every_promotion_is_the_one_ashas_rule_picks(asha_trials):
    assert check_promotions(asha_trials) > 75  # 97 of 500 trials (193 of 1,000 on 64 slots)
    rungs = sorted({t.budget for t in asha_trials})
    assert [round(b * MAX_SAMPLES) for b in rungs] == [2048, MAX_SAMPLES]  # 8,192 / 3 on the evaluation grid


def test_a_promoted_trial_trains_and_is_charged_only_the_new_samples(asha_trials):
    by_config: dict[str, list] = {}
    for t in sorted(asha_trials, key=lambda t: t.number):
        by_config.setdefault(str(sorted(t.params.items())), []).append(t)
    continued = [runs for runs in by_config.values() if len(runs) > 1]
    assert continued
    for low, high in continued:
        assert low.budget < high.budget and low.samples_to_target is None
        trained = high.metrics["samples"] - low.metrics["samples"]
        assert high.duration_s == pytest.approx(trained * 256 / (350 * 8))


def test_a_stopped_and_resumed_controller_rebuilds_the_same_promotion_state(tmp_path):
    """Stopped after 60 results (in-flight trials interrupted), then `hpo resume`: the new controllers, replayed the
    stored history, hold exactly the state the stopped ones had (configurations, rungs, results, promotions in
    order), and the resumed run's promotions follow ASHA's rule to the end."""
    path = asha_file(tmp_path, "asha-resume", 160, 16, sampler="model", confirm=2)
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    original = local_engine.Study.run
    states = {}

    def stop_after_60(study):
        handle = study._handle

        def counting(exits):
            handle(exits)
            if sum(t.state.finished for t in study.storage.list_trials(study.experiment_id)) >= 60:
                study.stop_reason = study.stop_reason or "the controller was terminated (SIGTERM)"

        study._handle = counting
        try:
            return original(study)
        finally:
            states["stopped"] = [arm.controller.state() for arm in study.arms]

    def snapshot_then_run(study):
        states["resumed"] = [arm.controller.state() for arm in study.arms]
        return original(study)

    local_engine.Study.run = stop_after_60
    try:
        assert hpo_main(["--db", url, "run", str(path), "--quiet", "--run-dir", str(tmp_path / "run")]) == 1
        local_engine.Study.run = snapshot_then_run
        assert hpo_main(["--db", url, "resume", "asha-resume", "--quiet"]) == 0
    finally:
        local_engine.Study.run = original
    assert states["resumed"] == states["stopped"]
    assert any(state["promotions"] for state in states["stopped"])
    with SqlStorage(url) as storage:
        trials = storage.list_trials(storage.get_experiment_by_name("asha-resume").id)
    assert sum(t.kind is TrialKind.TUNING for t in trials) == 160
    assert sum(t.kind is TrialKind.CONFIRMATION for t in trials) == 4
    assert check_promotions(trials) > 10


@pytest.mark.parametrize("tuner", ["asha", "smac_hyperband"])
def test_one_trial_at_a_time_a_stopped_and_resumed_experiment_ends_as_an_uninterrupted_one(tmp_path, tuner):
    """What docs/experiments.md promises of a resume at `max_parallel: 1`: stopped after 20 results, then `hpo
    resume`, the experiment ends with the trials, rungs (budgets), promotions and results of an uninterrupted run
    of the same file (with several trials in flight the re-run trials finish later, and the promotions may differ)."""
    from tests.hpo.simulation.test_simulated_runner import hpo_run_stopped_after

    def run(name: str, stop_after: int | None) -> list[tuple]:
        directory = tmp_path / name
        directory.mkdir()
        path = experiment_file(directory, "mf", tuner=tuner, trials=40, slots=1, min_budget=1 / 8)  # 1,024 samples
        url = f"sqlite:///{directory / 'hpo.db'}"
        assert hpo_run_stopped_after(url, path, directory / "run", stop_after) == (1 if stop_after else 0)
        if stop_after:
            assert hpo_main(["--db", url, "resume", "mf", "--quiet"]) == 0
        with SqlStorage(url) as storage:
            trials = storage.list_trials(storage.get_experiment_by_name("mf").id)
        return [(t.number, t.kind, t.arm, t.params, t.budget, t.seed, t.state, t.objective) for t in trials]

    whole, resumed = run("whole", None), run("resumed", 20)
    assert resumed == whole
    assert len({t[4] for t in whole}) >= 2  # several rungs: promotions happened
