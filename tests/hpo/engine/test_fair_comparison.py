"""Fair comparisons: arms tune the same hyperparameters (or the file says why not), every preset bounds its
trials by samples, and `hpo run` shows each arm's dimensions and budget before it starts. Then a tiny real
comparison (SMAC3, trainer processes, SQLite): confirmation seeds, the verdict against scipy, the printed
"train the best" line run as printed, and the same results on a rerun and on a machine busy with other work."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats

from hpo.cli.main import main
from hpo.engine.local import describe_plan, experiment_verdict
from hpo.errors import ExperimentFileError
from hpo.experiment import experiment_from_dict, load_experiment, spec_from_stored, stored_form
from hpo.experiment.arms import arm_dimensions
from hpo.storage import SqlStorage
from hpo.trials import TrialKind, TrialState
from search_spaces import list_presets, preset_path
from tests.hpo.engine.test_study import tiny_overrides
from tests.hpo.evidence.independent import interpolated
from tests.trainer.conftest import make_samples
from trainer.config import TrainerConfig
from trainer.data.shards import write_shard

UNEQUAL = {
    "optimizer.name": {"choice": ["adamw", "lamb"]},
    "optimizer.lr@lamb": {"float": [1e-3, 2e-2], "log": True, "when": {"optimizer.name": "lamb"}},
    "optimizer.lr@adamw": {"float": [3e-4, 1e-2], "log": True, "when": {"optimizer.name": "adamw"}},
    "optimizer.beta2": {"float": [0.7, 0.999], "when": {"optimizer.name": "lamb"}},
    "optimizer.eps": {"float": [1e-9, 1e-6], "log": True, "when": {"optimizer.name": "adamw"}},
}


def experiment(space: dict, **fields) -> dict:
    return {"name": "exp", "base_config": {"device": "cpu"}, "space": space, "compare": ["optimizer.name"],
            "budget": {"trials": 4}, **fields}  # fmt: skip


def test_arms_that_tune_different_hyperparameters_are_refused_naming_file_arms_and_dimensions():
    with pytest.raises(ExperimentFileError) as e:
        experiment_from_dict(experiment(UNEQUAL), "unequal.yaml")
    message = str(e.value)
    assert message.startswith("unequal.yaml: compare: the arms optimizer.name=adamw, optimizer.name=lamb")
    assert "optimizer.beta2 (optimizer.name=adamw: not tuned; optimizer.name=lamb: float)" in message
    assert "optimizer.eps (optimizer.name=adamw: float, log; optimizer.name=lamb: not tuned)" in message
    assert "optimizer.lr" not in message.split("favour the arm tuned more:")[1]  # lr@lamb and lr@adamw match
    assert "allow_unequal_arms: <reason>" in message


def test_unequal_arms_load_with_a_reason():
    reason = "AdamW's epsilon is tuned as in the NVIDIA reference; LAMB's beta2 as in MLPerf"
    spec = experiment_from_dict(experiment(UNEQUAL, allow_unequal_arms=reason), "unequal.yaml")
    assert spec.allow_unequal_arms == reason
    with pytest.raises(ExperimentFileError, match="allow_unequal_arms: expected the reason"):
        experiment_from_dict(experiment(UNEQUAL, allow_unequal_arms=" "), "unequal.yaml")


def test_a_dimension_of_another_kind_or_scale_is_unequal_and_a_needless_reason_is_refused():
    space = {**UNEQUAL, "optimizer.lr@adamw": {"float": [3e-4, 1e-2], "when": {"optimizer.name": "adamw"}}}
    del space["optimizer.beta2"], space["optimizer.eps"]
    with pytest.raises(ExperimentFileError, match=r"optimizer\.lr \(optimizer\.name=adamw: float; optimizer\.name"):
        experiment_from_dict(experiment(space), "scale.yaml")
    equal = {**space, "optimizer.lr@adamw": {"float": [3e-4, 1e-2], "log": True, "when": {"optimizer.name": "adamw"}}}
    dims = arm_dimensions(experiment_from_dict(experiment(equal), "equal.yaml"))
    assert dims == {"optimizer.name=adamw": {"optimizer.lr": "float, log"},
                    "optimizer.name=lamb": {"optimizer.lr": "float, log"}}  # fmt: skip
    with pytest.raises(ExperimentFileError, match="equal.yaml: allow_unequal_arms: the arms tune the same"):
        experiment_from_dict(experiment(equal, allow_unequal_arms="just in case"), "equal.yaml")
    with pytest.raises(ExperimentFileError, match="allow_unequal_arms: there are no compare arms"):
        experiment_from_dict(experiment(equal, compare=[], allow_unequal_arms="x"), "equal.yaml")


def test_a_stored_experiment_reads_back_as_it_ran():
    """Experiments stored before the rule existed stay readable (`hpo best`, `hpo export`, the API)."""

    class Record:
        name = "old"
        spec = {"experiment": {**experiment(UNEQUAL), "base_config": {"device": "cpu"}}}

    spec = spec_from_stored(Record())  # unequal arms without a reason: refused in a file, read back as stored
    assert spec.allow_unequal_arms is None
    assert arm_dimensions(spec) == {
        "optimizer.name=adamw": {"optimizer.lr": "float, log", "optimizer.eps": "float, log"},
        "optimizer.name=lamb": {"optimizer.lr": "float, log", "optimizer.beta2": "float"},
    }


@pytest.mark.parametrize("name", list_presets())
def test_every_preset_has_equal_arms_or_a_reason_and_bounds_trials_by_samples(name):
    spec = load_experiment(preset_path(name))
    dims = list(arm_dimensions(spec).values())
    assert spec.allow_unequal_arms or all(d == dims[0] for d in dims)
    base = TrainerConfig.model_validate(spec.resolved_base())
    assert base.budget.max_time_s is None  # trials end by samples (or the target), never by the clock
    # only as a safety net, recorded as `timeout` (a simulated trial runs no process)
    assert spec.budget.trial_timeout_s is not None or spec.runner.name == "simulated"
    assert spec.budget.trials % len(dims) == 0  # every arm the same number of trials


def test_adam_vs_lamb_gives_adamw_the_mlperf_betas_and_weight_decay():
    for name in ("adam_vs_lamb", "adam_vs_lamb_demo_cpu"):
        spec = load_experiment(preset_path(name))
        dims = arm_dimensions(spec)
        assert dims["optimizer.name=adamw"] == dims["optimizer.name=lamb"]
        assert {"optimizer.lr", "optimizer.beta1", "optimizer.beta2", "optimizer.weight_decay"} <= set(
            dims["optimizer.name=adamw"]
        )
    spec = load_experiment(preset_path("adam_vs_lamb"))
    samsung = {"optimizer.beta1": 0.80, "optimizer.beta2": 0.82, "optimizer.weight_decay": 0.0029}  # MLPerf ADAM
    assert all(spec.space[key].contains(value) for key, value in samsung.items())


class _Runner:
    def describe(self) -> str:
        return "local runner, 1 slot(s): cpu0"


def test_the_plan_shows_each_arms_dimensions_and_sample_budget():
    spec = load_experiment(preset_path("adam_vs_lamb_demo_cpu"))
    plan = describe_plan(spec, _Runner()).splitlines()
    arms = {line.split(":")[0].strip(): line for line in plan if line.startswith("  arm ")}
    assert set(arms) == {"arm optimizer.name=adamw", "arm optimizer.name=lamb"}
    max_samples = spec.resolved_base()["budget"]["max_samples"]
    for label, line in arms.items():
        assert f"{spec.budget.trials // 2} trials of at most {max_samples:,} samples" in line
        for key in arm_dimensions(spec)[label.removeprefix("arm ")]:
            assert key in line
    rounds = spec.budget.confirmation_rounds  # the demo confirms with auto: rounds of 3 up to 6
    assert f"in rounds of {rounds[0]} more seeds until the verdict decides" in plan[-1]
    assert plan[-1].endswith(f"at most {rounds[-1]}") and "equivalent within ±5 %" in plan[-1]
    clipping = describe_plan(load_experiment(preset_path("clipping_strategies")), _Runner())
    assert "the arms tune different dimensions: strategy none adds no clip to LAMB's own" in clipping


def test_stored_form_keeps_the_reason(tmp_path: Path):
    spec = experiment_from_dict(experiment(UNEQUAL, allow_unequal_arms="why"), "unequal.yaml")
    assert stored_form(spec, tmp_path)["experiment"]["allow_unequal_arms"] == "why"


# ------------------------------------------------------------------------------------------------ a tiny comparison
# AdamW against LAMB on the tiny BERT, on shards whose masked tokens are mostly one token (id 7, 60 %), so runs
# reach the target (accuracy 0.5) after tens of samples, or miss it, depending on the learning rate and the seed.
# 2 tuning trials per arm (the second one proposed by SMAC's model), then 2 confirmation seeds per arm (each arm's
# as soon as its own tuning is over).
TINY_SPACE = {
    "optimizer.name": {"choice": ["adamw", "lamb"]},
    "optimizer.lr@lamb": {"float": [1e-2, 1e-1], "log": True, "when": {"optimizer.name": "lamb"}},
    "optimizer.lr@adamw": {"float": [3e-4, 3e-3], "log": True, "when": {"optimizer.name": "adamw"}},
}
CONFIRM_SEEDS = 2


def make_learnable_shards(directory: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    dirs = []
    for split, n, seed in (("train", 96, 0), ("eval", 32, 1)):
        samples = make_samples(rng.integers(8, 65, n), 64, seed=seed)
        labels = samples.masked_lm_ids
        real = labels > 0
        labels[real] = np.where(rng.random(real.sum()) < 0.6, 7, rng.integers(5, 99, real.sum()))
        write_shard(directory / split / "part-00000.h5", samples)
        dirs.append(directory / split)
    return dirs[0], dirs[1]


def tiny_comparison(directory: Path) -> Path:
    """The experiment file of the tiny comparison, written into `directory`."""
    train_dir, eval_dir = make_learnable_shards(directory / "learnable")
    overrides = tiny_overrides(directory / "data", **{
        "budget.max_samples": 96, "eval.every_samples": 8, "eval.target_mlm_accuracy": 0.5,
        "data.train": str(train_dir), "data.eval": str(eval_dir)})  # fmt: skip
    data = {
        "name": "tiny-compare", "base_config": {}, "overrides": overrides, "space": TINY_SPACE,
        "compare": ["optimizer.name"], "tuner": {"name": "smac_bo", "seed": 0},
        "budget": {"trials": 4, "max_parallel": 1, "trial_timeout_s": 300, "confirm_seeds": CONFIRM_SEEDS},
        "resources": {"gpus": "none", "cpu_slots": 1},
    }  # fmt: skip
    path = directory / "tiny-compare.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@dataclass
class Finished:
    directory: Path
    spec: object
    storage: SqlStorage
    experiment_id: int
    summary: str  # what `hpo run` printed at the end


def hpo_run(directory: Path) -> Finished:
    """`hpo run` of the tiny comparison in `directory` (its own database), as a user would start it."""
    directory.mkdir(parents=True, exist_ok=True)
    path = tiny_comparison(directory)
    db = f"sqlite:///{directory / 'hpo.db'}"
    done = subprocess.run([sys.executable, "-m", "hpo", "--db", db, "run", str(path), "--run-dir", "run"],
                          cwd=directory, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    storage = SqlStorage(db)
    record = storage.get_experiment_by_name("tiny-compare")
    return Finished(directory, spec_from_stored(record), storage, record.id, done.stdout)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Finished:
    return hpo_run(tmp_path_factory.mktemp("tiny-compare"))


@pytest.mark.slow  # the module's real compare experiment (about 30 s on 2 cores) runs once for these
def test_confirm_seeds_rerun_each_arms_best_configuration_with_further_seeds(finished):
    trials = finished.storage.list_trials(finished.experiment_id)
    tuning = [t for t in trials if t.kind is TrialKind.TUNING]
    confirmations = [t for t in trials if t.kind is TrialKind.CONFIRMATION]
    assert len(tuning) == 4 and len(confirmations) == 2 * CONFIRM_SEEDS
    assert all(t.state.finished for t in trials)
    for arm in {t.arm for t in tuning}:  # once that arm's tuning has ended (the other arm's may go on)
        ended = max(t.finished_at for t in tuning if t.arm == arm)
        mine = [t for t in confirmations if t.arm == arm]
        assert min(t.number for t in mine) > max(t.number for t in tuning if t.arm == arm)
        assert min(t.created_at for t in mine) >= ended
    seed = TrainerConfig.model_validate(finished.spec.resolved_base()).seed
    best = finished.storage.best_per_arm(finished.experiment_id)
    for arm, top in best.items():
        mine = [t for t in confirmations if t.arm == arm]
        assert [t.seed for t in mine] == [seed + 1 + k for k in range(CONFIRM_SEEDS)]
        assert all(t.params == top.params and t.budget == 1.0 for t in mine)
        stored_seed = yaml.safe_load((finished.directory / "run" / "trials" / f"{mine[0].number:05d}" /
                                      "trial.yaml").read_text())["seed"]  # fmt: skip
        assert stored_seed == seed + 1  # the trainer really ran with the other seed
    assert {t.number for t in best.values()} <= {t.number for t in tuning}  # confirmations never count as best


@pytest.mark.slow  # the module's real compare experiment (about 30 s on 2 cores) runs once for these
def test_smac_gives_each_arm_an_equal_share_and_only_its_own_conditional_dimensions(finished):
    """SMAC3 (smac_bo) over a conditional space: every arm gets the same number of tuning trials, each trial carries
    its arm's learning rate only, trained what it was given (its trial.yaml) and streamed its learning curve."""
    tuning = [t for t in finished.storage.list_trials(finished.experiment_id) if t.kind is TrialKind.TUNING]
    assert sorted(t.arm for t in tuning) == ["optimizer.name=adamw"] * 2 + ["optimizer.name=lamb"] * 2
    for t in tuning:
        name = t.params["optimizer.name"]
        assert set(t.params) == {"optimizer.name", f"optimizer.lr@{name}"}
        assert t.state is TrialState.COMPLETED and t.objective is not None
        assert finished.storage.get_metrics(t.id, "loss")  # the learning curve was streamed in
        config = yaml.safe_load((finished.directory / "run" / "trials" / f"{t.number:05d}" / "trial.yaml").read_text())
        assert config["optimizer"]["name"] == name
        assert config["optimizer"]["lr"] == pytest.approx(t.params[f"optimizer.lr@{name}"])


def independent_evidence(storage, experiment_id, target: float) -> dict[str, list[float | None]]:
    """Per arm: samples to target of the confirmation runs of its best configuration (None: missed), each read
    off its stored accuracy curve by linear interpolation between the evaluations around the target."""
    best = storage.best_per_arm(experiment_id)
    trials = storage.list_trials(experiment_id)
    return {arm: [interpolated(storage, t, target) for t in trials if t.kind is TrialKind.CONFIRMATION and t.arm == arm]
            for arm in sorted(best)}  # fmt: skip


@pytest.mark.slow  # the module's real compare experiment (about 30 s on 2 cores) runs once for these
def test_the_per_arm_interval_and_the_verdict_follow_from_the_stored_runs(finished):
    cfg = TrainerConfig.model_validate(finished.spec.resolved_base())
    evidence = independent_evidence(finished.storage, finished.experiment_id, cfg.eval.target_mlm_accuracy)
    verdict = experiment_verdict(finished.storage, finished.experiment_id, finished.spec)
    for summary in verdict.arms:
        runs = evidence[summary.label]
        hits = [s for s in runs if s is not None]
        assert (summary.runs, summary.hits) == (CONFIRM_SEEDS, len(hits))
        if len(hits) >= 2:
            low, high = stats.t.interval(0.95, len(hits) - 1, loc=np.mean(hits), scale=stats.sem(hits))
            low = max(low, 0.0)  # a count of samples: a wide t interval of few runs is cut at 0
            assert (summary.mean, summary.low, summary.high) == pytest.approx((np.mean(hits), low, high))
    assert any(len([s for s in runs if s is not None]) >= 2 for runs in evidence.values()), evidence  # not vacuous
    # The rule for two arms: Welch on ln samples (a miss at the budget), the winner hit in every run.
    (a, xa), (b, xb) = [(arm, [s if s is not None else cfg.budget.max_samples for s in runs])
                        for arm, runs in evidence.items()]  # fmt: skip
    low, high = stats.ttest_ind(np.log(xa), np.log(xb), equal_var=False).confidence_interval(0.95)
    floor = max(cfg.eval.every_samples / np.sqrt(12) / np.exp(np.mean(np.log(x))) for x in (xa, xb)) ** 2
    if min(np.var(np.log(xa), ddof=1), np.var(np.log(xb), ddof=1)) > floor:  # the resolution floor does not bind
        expected = a if high < 0 and None not in evidence[a] else b if low > 0 and None not in evidence[b] else None
        assert verdict.winner == expected
    assert verdict.line.startswith(f"{verdict.winner} needs" if verdict.winner else ("not yet", "optimizer"))
    assert f"verdict: {verdict.line}" in finished.summary
    for summary in verdict.arms:
        assert summary.describe() in finished.summary


@pytest.mark.slow  # the module's real compare experiment (about 30 s on 2 cores) runs once for these
def test_hpo_best_per_arm_shows_the_evidence_and_the_verdict(finished, capsys):
    db = f"sqlite:///{finished.directory / 'hpo.db'}"
    assert main(["--db", db, "best", "tiny-compare", "--per-arm"]) == 0
    out = capsys.readouterr().out
    shown = yaml.safe_load(out)
    verdict = experiment_verdict(finished.storage, finished.experiment_id, finished.spec)
    for summary in verdict.arms:
        assert shown[summary.label]["evidence"]["runs"] == summary.runs
        assert shown[summary.label]["evidence"]["reached_target"] == summary.hits
    assert out.rstrip().endswith(f"# verdict: {verdict.line}")


@pytest.mark.slow  # the module's real compare experiment (about 30 s on 2 cores) runs once for these
def test_hpo_trials_marks_the_confirmation_runs_and_their_seeds(finished, capsys):
    assert main(["--db", f"sqlite:///{finished.directory / 'hpo.db'}", "trials", "tiny-compare"]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    for t in finished.storage.list_trials(finished.experiment_id):
        row = rows[t.number]
        assert (f"confirmation (seed {t.seed}):" in row) == (t.kind is TrialKind.CONFIRMATION), row


@pytest.mark.slow  # the module's real compare experiment (about 30 s on 2 cores) runs once for these
def test_the_train_the_best_line_runs_as_printed(finished):
    (line,) = [line for line in finished.summary.splitlines() if line.endswith("# train the best")]
    command = line.rsplit("#", 1)[0].strip()
    assert "--db" in command  # this run's database, not the default one
    done = subprocess.run(command, shell=True, cwd=finished.directory, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "finished: " in done.stderr + done.stdout  # the trainer's last line: it trained to its end
    exported = yaml.safe_load((finished.directory / "best.yaml").read_text())
    best = finished.storage.best_trial(finished.experiment_id)
    assert exported["optimizer"]["name"] == best.params["optimizer.name"]


def outcome(storage, experiment_id) -> list[tuple]:
    """Everything about the trials that must not depend on the machine's load (not their durations)."""
    rows = []
    for t in storage.list_trials(experiment_id):
        curve = [(m.samples, m.name, m.value) for m in storage.get_metrics(t.id) if m.name in ("loss", "mlm_accuracy")]
        final = {k: t.metrics.get(k) for k in ("status", "samples", "steps", "final_mlm_accuracy")}
        rows.append((t.number, t.kind, t.seed, t.arm, t.params, t.state, t.objective, t.samples_to_target,
                     t.best_mlm_accuracy, final, curve))  # fmt: skip
    return rows


@pytest.mark.slow  # about 2.5 min: the experiment twice, once beside a CPU burner
def test_the_same_file_and_seed_reproduce_trials_results_and_winner_even_on_a_busy_machine(finished, tmp_path):
    first = outcome(finished.storage, finished.experiment_id)
    verdict = experiment_verdict(finished.storage, finished.experiment_id, finished.spec).line
    again = hpo_run(tmp_path / "again")
    assert outcome(again.storage, again.experiment_id) == first
    assert experiment_verdict(again.storage, again.experiment_id, again.spec).line == verdict
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        busy = hpo_run(tmp_path / "busy")
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert outcome(busy.storage, busy.experiment_id) == first
    assert experiment_verdict(busy.storage, busy.experiment_id, busy.spec).line == verdict
