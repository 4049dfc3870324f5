"""Confirmation runs of an arm start as soon as that arm's tuning is over, through the real Study on the simulated
runner.

Every trial trains to the budget (`eval.stop_at_target: false`, learning rates below the diverging 1e-1), so every
attempt lasts D = MAX_SAMPLES x scale / throughput simulated seconds and the schedule is computable by hand. With
7 tuning trials over two arms (quotas 4 and 3, created round robin: A B A B A B A) on 3 slots:

    0:  #1 A, #2 B, #3 A
    D:  #4 B, #5 A, #6 B
    2D: #7 A, then B's tuning is over: B's 2 confirmations fill the other two slots
    3D: A's tuning is over: A's 2 confirmations
    4D: the end (had confirmations waited for every arm: 4 on 3 slots from 3D, the end at 5D)
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import yaml

from hpo.cli.main import main as hpo_main
from hpo.engine import local as local_engine
from hpo.storage import SqlStorage
from hpo.trials import TrialKind, TrialState
from tests.hpo.simulation.conftest import MAX_SAMPLES
from tests.hpo.simulation.test_simulated_runner import expected_curve
from tests.hpo.simulation.test_simulated_runner import experiment_file as simulated_experiment_file

ROOT = Path(__file__).resolve().parents[3]
SCALE, GPU_RATE, GPUS = 256.0, 350.0, 8  # runner.simulation's defaults (a100) and the file's gpus_per_trial
D = MAX_SAMPLES * SCALE / (GPU_RATE * GPUS)  # every attempt trains the whole budget
TARGET, CONFIRM = 0.12, 2
ADAMW, LAMB = "optimizer.name=adamw", "optimizer.name=lamb"  # quotas 4 and 3: the first arm takes the remainder
BASE_SEED = yaml.safe_load((ROOT / "trainer/configs/demo_cpu.yaml").read_text())["seed"]


def experiment_file(directory: Path, name: str, trials: int = 7, slots: int = 3, space: dict | None = None,
                    compare: tuple[str, ...] = ("optimizer.name",)) -> Path:  # fmt: skip
    """test_simulated_runner's experiment, every trial to the full budget (no stop at the target), lr up to 1e-2."""
    space = space or {"optimizer.name": {"choice": ["adamw", "lamb"]},
                      "optimizer.lr": {"float": [1.0e-4, 1.0e-2], "log": True},
                      "schedule.warmup_steps": {"choice": [0, 40]}}  # fmt: skip
    path = simulated_experiment_file(directory, name, "random", trials, slots, space, compare,
                                     {"eval.stop_at_target": False}, confirm_seeds=CONFIRM)  # fmt: skip
    if trials % 2:  # quotas 4 and 3, so that one arm's tuning ends first: a file must say why
        spec = yaml.safe_load(path.read_text())
        path.write_text(yaml.safe_dump({**spec, "allow_unequal_arms": "one arm's tuning ends before the other's"}))
    return path


def run(directory: Path, name: str, **kwargs) -> list:
    directory.mkdir(exist_ok=True)
    path = experiment_file(directory, name, **kwargs)
    url = f"sqlite:///{directory / 'hpo.db'}"
    assert hpo_main(["--db", url, "run", str(path), "--quiet", "--run-dir", str(directory / "run")]) == 0
    with SqlStorage(url) as storage:
        return storage.list_trials(storage.get_experiment_by_name(name).id)


def seconds(trials, moment) -> float:
    """Simulated seconds from the experiment's first start to `moment`."""
    return (moment - min(t.started_at for t in trials)).total_seconds()


def test_an_arms_confirmations_start_when_its_own_tuning_is_over(tmp_path):
    trials = run(tmp_path, "early")
    tuning = {arm: [t for t in trials if t.kind is TrialKind.TUNING and t.arm == arm] for arm in (ADAMW, LAMB)}
    confirms = {arm: [t for t in trials if t.kind is TrialKind.CONFIRMATION and t.arm == arm] for arm in (ADAMW, LAMB)}
    assert [len(tuning[ADAMW]), len(tuning[LAMB])] == [4, 3]
    assert [len(confirms[ADAMW]), len(confirms[LAMB])] == [CONFIRM, CONFIRM]
    assert all(t.state is TrialState.COMPLETED for t in trials)
    assert all(t.duration_s == pytest.approx(D) for t in trials)
    # each arm's confirmations are created (and started) the moment its last tuning trial finished
    for arm in (ADAMW, LAMB):
        ended = max(t.finished_at for t in tuning[arm])
        assert {t.created_at for t in confirms[arm]} == {ended} == {t.started_at for t in confirms[arm]}
    assert seconds(trials, max(t.finished_at for t in tuning[LAMB])) == pytest.approx(2 * D)
    assert seconds(trials, max(t.finished_at for t in tuning[ADAMW])) == pytest.approx(3 * D)
    assert max(t.created_at for t in confirms[LAMB]) < max(t.finished_at for t in tuning[ADAMW])
    # no slot idled while work was known: the last trial ends at 4D (5D had the confirmations waited)
    assert seconds(trials, max(t.finished_at for t in trials)) == pytest.approx(4 * D)
    # they re-run the arm's best configuration (all hits beat all misses; ties by number) with the next seeds
    for arm in (ADAMW, LAMB):
        hits = {}
        for t in tuning[arm]:
            p = t.params
            curve = expected_curve(p["optimizer.name"], p["optimizer.lr"], p["schedule.warmup_steps"], BASE_SEED)
            hits[t.number] = next((s for s, a in curve if a >= TARGET), None)
            assert t.samples_to_target == hits[t.number]
        best = min((n for n, hit in hits.items() if hit is not None), key=lambda n: (hits[n], n))
        best_params = next(t.params for t in tuning[arm] if t.number == best)
        assert all(c.params == best_params and c.budget == 1.0 for c in confirms[arm])
        assert sorted(c.seed for c in confirms[arm]) == [BASE_SEED + 1 + k for k in range(CONFIRM)]


def test_an_arm_without_a_completed_trial_confirms_nothing_and_the_study_ends(tmp_path):
    """The lr=0.1 arm diverges in every trial (the table's 1e-1 runs diverge): no best, so no confirmations."""
    space = {
        "optimizer.name": {"choice": ["adamw", "lamb"]},
        "optimizer.lr": {"choice": [0.001, 0.1]},
        "schedule.warmup_steps": {"choice": [0, 40]},
    }
    trials = run(tmp_path, "no-best", trials=6, slots=2, space=space, compare=("optimizer.lr",))
    tuning = [t for t in trials if t.kind is TrialKind.TUNING]
    assert Counter(t.arm for t in tuning) == {"optimizer.lr=0.001": 3, "optimizer.lr=0.1": 3}
    assert {t.state for t in tuning if t.arm == "optimizer.lr=0.1"} == {TrialState.DIVERGED}
    confirms = [t for t in trials if t.kind is TrialKind.CONFIRMATION]
    assert [t.arm for t in confirms] == ["optimizer.lr=0.001"] * CONFIRM
    assert all(t.state.finished for t in trials)


def test_a_resumed_study_neither_repeats_nor_forgets_an_arms_confirmations(tmp_path):
    """Stopped while LAMB's confirmations and AdamW's last tuning trial run (2D to 3D), then `hpo resume`: the
    final trials are those of an uninterrupted run, with exactly k confirmations an arm."""
    whole = run(tmp_path / "whole", "resume")
    original = local_engine.Study.run

    def run_then_stop(study):
        poll = study.runner.poll

        def stop_once_confirming():  # before the clock moves on: stop while they are in flight
            running = study.storage.list_trials(study.experiment_id, state=TrialState.RUNNING)
            if any(t.kind is TrialKind.CONFIRMATION for t in running):
                study.stop_reason = study.stop_reason or "the controller was terminated (SIGTERM)"
                return []
            return poll()

        study.runner.poll = stop_once_confirming
        return original(study)

    directory = tmp_path / "parted"
    directory.mkdir()
    path = experiment_file(directory, "resume")
    url = f"sqlite:///{directory / 'hpo.db'}"
    local_engine.Study.run = run_then_stop
    try:
        code = hpo_main(["--db", url, "run", str(path), "--quiet", "--run-dir", str(directory / "run")])
    finally:
        local_engine.Study.run = original
    assert code == 1
    with SqlStorage(url) as storage:
        before = storage.list_trials(storage.get_experiment_by_name("resume").id)
    interrupted = {(t.kind, t.arm) for t in before if t.state is TrialState.INTERRUPTED}
    assert interrupted == {(TrialKind.TUNING, ADAMW), (TrialKind.CONFIRMATION, LAMB)}
    assert not any(t.kind is TrialKind.CONFIRMATION and t.arm == ADAMW for t in before)
    assert hpo_main(["--db", url, "resume", "resume", "--quiet"]) == 0
    with SqlStorage(url) as storage:
        after = storage.list_trials(storage.get_experiment_by_name("resume").id)

    def summary(trials):
        return Counter((t.kind, t.arm, tuple(sorted(t.params.items())), t.budget, t.seed, t.state, t.objective)
                       for t in trials)  # fmt: skip

    assert len(after) == len(whole) == 7 + 2 * CONFIRM
    assert summary(after) == summary(whole)
    assert Counter((t.arm, t.seed) for t in after if t.kind is TrialKind.CONFIRMATION) == {
        (arm, BASE_SEED + 1 + k): 1 for arm in (ADAMW, LAMB) for k in range(CONFIRM)
    }
    again = {t.number for t in before if t.state is TrialState.INTERRUPTED}
    assert {t.number: t.attempt for t in after if t.number in again} == dict.fromkeys(again, 1)
    assert {t.number: t.attempt for t in after if t.number not in again} == {t.number: 0 for t in after
                                                                             if t.number not in again}  # fmt: skip


@pytest.mark.parametrize("confirm_seeds", [CONFIRM, "auto"])
def test_a_controller_that_died_between_a_rounds_confirmations_leaves_none_short(tmp_path, confirm_seeds):
    """The controller dies after creating the first of an arm's first round of confirmations (killed between two
    writes): `hpo resume` creates the rest of the round, with the next seeds, as an uninterrupted run has it."""
    directory = tmp_path / "died"
    directory.mkdir()
    path = experiment_file(directory, "died")
    data = yaml.safe_load(path.read_text())
    data["budget"]["confirm_seeds"] = confirm_seeds
    path.write_text(yaml.safe_dump(data))
    url = f"sqlite:///{directory / 'hpo.db'}"
    original = local_engine.Study._queue_confirmation

    def create_one_then_die(study, arm):
        original(study, arm)
        raise KeyboardInterrupt  # as if killed: what the loop does on its way out does not matter to the rows

    local_engine.Study._queue_confirmation = create_one_then_die
    try:
        assert hpo_main(["--db", url, "run", str(path), "--quiet", "--run-dir", str(directory / "run")]) != 0
    finally:
        local_engine.Study._queue_confirmation = original
    with SqlStorage(url) as storage:
        before = storage.list_trials(storage.get_experiment_by_name("died").id)
    assert Counter(t.arm for t in before if t.kind is TrialKind.CONFIRMATION) == {LAMB: 1}
    assert hpo_main(["--db", url, "resume", "died", "--quiet"]) == 0
    with SqlStorage(url) as storage:
        after = storage.list_trials(storage.get_experiment_by_name("died").id)
    rounds = (CONFIRM,) if confirm_seeds == CONFIRM else (3, 6, 9, 12)  # auto: rounds of 3, with the cap of 12
    confirms = Counter((t.arm, t.seed) for t in after if t.kind is TrialKind.CONFIRMATION)
    runs = Counter(arm for arm, _ in confirms.elements())
    assert runs[LAMB] == runs[ADAMW] and runs[LAMB] in rounds
    assert confirms == {(arm, BASE_SEED + 1 + k): 1 for arm in (ADAMW, LAMB) for k in range(runs[LAMB])}
    assert all(t.state.finished for t in after)


def test_confirmation_runs_that_outnumber_the_tables_seeds_are_said_to_repeat_curves(tmp_path):
    """The shipped curves table records 3 seeds: an arm's 3rd confirmation run read its tuning run's curve (seed s +
    3), and later ones earlier runs' curves, without a word, while the verdict counted each as a run of its own. The
    start says so (and, for the 20-seed table at 12 runs an arm, says nothing)."""
    from hpo.experiment import load_experiment
    from hpo.runners.simulated import SimulatedRunner
    from hpo.simulation.surrogate import Surrogate
    from hpo.simulation.table import load_table, shipped_table
    from search_spaces import preset_path

    spec = load_experiment(preset_path("adam_vs_lamb_simulated"))
    assert spec.budget.most_confirm_seeds == 12
    line = SimulatedRunner(spec, 4).describe()
    assert ("note: the table records 3 training seed(s) (seeds s and s + 3 read one), so an arm's confirmation runs "
            "from the 3rd on read curves that its tuning run or earlier runs read") in line  # fmt: skip
    assert "narrower than 12 real runs an arm would give" in line
    surrogate = Surrogate(load_table(shipped_table("curves")), {})  # what the note says, read from the surrogate itself
    assert len({surrogate.recorded_seed(1234 + k) for k in range(3)}) == 3
    assert surrogate.recorded_seed(1234 + 3) == surrogate.recorded_seed(1234)
    fewer = yaml.safe_load(preset_path("adam_vs_lamb_simulated").read_text())
    fewer["budget"].update(confirm_seeds=2)
    fewer["base_config"] = "demo_cpu"
    fewer["budget"].pop("max_confirm_seeds", None)
    path = tmp_path / "fewer.yaml"
    path.write_text(yaml.safe_dump(fewer))
    assert "note:" not in SimulatedRunner(load_experiment(path), 4).describe()  # 2 runs an arm: 2 other seeds
