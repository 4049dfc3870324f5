"""Sequential confirmations (`budget.confirm_seeds: auto`) through the real Study on the simulated runner: rounds
of 3 runs per arm until the verdict decides, up to the cap; every look's verdict recomputed here with scipy.

The synthetic table (conftest.py) gives AdamW at lr 1e-3 a straight accuracy line, so samples to target between
evaluations are known; LAMB reads AdamW's curves `delay_samples` later (runner.simulation.handicaps). With the
learning rate fixed, each arm's best configuration is known in advance, and its confirmation runs cycle through
the table's 3 recorded seeds.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import yaml
from scipy import stats

from hpo.cli.main import main as hpo_main
from hpo.evidence.verdict import look_level
from hpo.experiment.schema import Budget
from hpo.storage import SqlStorage
from hpo.trials import TrialKind
from tests.hpo.evidence.independent import interpolated
from tests.hpo.simulation.test_simulated_runner import TARGET, experiment_file

ADAMW, LAMB = "optimizer.name=adamw", "optimizer.name=lamb"
SPACE = {"optimizer.name": {"choice": ["adamw", "lamb"]}, "optimizer.lr": {"choice": [1.0e-3]},
         "schedule.warmup_steps": {"choice": [0]}}  # fmt: skip


def run(directory: Path, delay: int, margin: float, quiet: bool = True) -> tuple[SqlStorage, int, str]:
    directory.mkdir(exist_ok=True)
    path = experiment_file(directory, "seq", "random", 4, 4, SPACE, ("optimizer.name",), None,
                           confirm_seeds="auto", max_confirm_seeds=12)  # fmt: skip
    spec = yaml.safe_load(path.read_text())
    spec["runner"]["simulation"]["handicaps"] = {"lamb": {"curves_of": "adamw", "delay_samples": delay}}
    spec["verdict"] = {"margin": margin}
    path.write_text(yaml.safe_dump(spec))
    url = f"sqlite:///{directory / 'hpo.db'}"
    assert hpo_main(["--db", url, "run", str(path), *(["--quiet"] if quiet else []), "--run-dir",
                     str(directory / "run")]) == 0  # fmt: skip
    storage = SqlStorage(url)
    return storage, storage.get_experiment_by_name("seq").id, url


def confirmation_values(storage, experiment_id) -> dict[str, list[float]]:
    trials = sorted(storage.list_trials(experiment_id), key=lambda t: t.number)
    return {arm: [interpolated(storage, t, TARGET) for t in trials if t.kind is TrialKind.CONFIRMATION and t.arm == arm]
            for arm in (ADAMW, LAMB)}  # fmt: skip


def welch(a: list[float], b: list[float], level: float) -> tuple[tuple[float, float], tuple[float, float]]:
    """scipy's Welch intervals of ln(a/b): the winner's (1 - level) and the equivalence (1 - 2 level) one."""
    test = stats.ttest_ind(np.log(a), np.log(b), equal_var=False)
    return test.confidence_interval(1 - level), test.confidence_interval(1 - 2 * level)


def first_decision(values: dict[str, list[float]], margin: float) -> tuple[int, str]:
    """(the look, the outcome) at which the rule decides, computed here round by round with scipy."""
    rounds = Budget(trials=4, confirm_seeds="auto", max_confirm_seeds=12).confirmation_rounds
    assert rounds == (3, 6, 9, 12)
    for j, n in enumerate(rounds, 1):
        a, b = values[ADAMW][:n], values[LAMB][:n]
        (low, high), (eq_low, eq_high) = welch(a, b, look_level(j, len(rounds)))
        if high < 0:
            return j, "adamw"
        if low > 0:
            return j, "lamb"
        if math.log(1 - margin) < eq_low and eq_high < math.log(1 + margin):
            return j, "equivalent"
    return len(rounds), "not yet"


def test_a_large_difference_stops_after_the_first_round(tmp_path):
    storage, experiment_id, url = run(tmp_path / "large", delay=1024, margin=0.05)
    values = confirmation_values(storage, experiment_id)
    assert [len(v) for v in values.values()] == [3, 3]  # one round of 3 per arm, then the verdict decided
    assert first_decision(values, 0.05) == (1, "adamw")
    assert all(b - a > 900 for a, b in zip(values[ADAMW], values[LAMB], strict=True))  # the same seeds, 1,024 later
    seeds = sorted(t.seed for t in storage.list_trials(experiment_id) if t.kind is TrialKind.CONFIRMATION)
    assert seeds == [1235, 1235, 1236, 1236, 1237, 1237]  # the config's seed + 1, + 2, + 3 in each arm
    assert hpo_main(["--db", url, "best", "seq", "--per-arm"]) == 0


def test_a_tie_runs_every_round_to_the_cap_when_the_margin_is_too_tight(tmp_path, capsys):
    storage, experiment_id, url = run(tmp_path / "tie", delay=0, margin=0.001, quiet=False)
    values = confirmation_values(storage, experiment_id)
    assert [len(v) for v in values.values()] == [12, 12]  # 4 rounds: never decided
    progress = capsys.readouterr().err.splitlines()
    final = next(line for line in reversed(progress) if "confirmations: round" in line)
    assert "| confirmations: round 4 of at most 4 done, verdict not yet" in final, final
    assert first_decision(values, 0.001) == (4, "not yet")
    capsys.readouterr()
    assert hpo_main(["--db", url, "status", "seq"]) == 0
    status = capsys.readouterr().out
    assert (
        "confirmations round 4 of at most 4 (4 finished)" in status and "verdict now (look 4 of 4): not yet" in status
    )


def test_a_tie_within_a_wide_margin_stops_as_equivalent(tmp_path):
    storage, experiment_id, _ = run(tmp_path / "equivalent", delay=0, margin=0.2)
    values = confirmation_values(storage, experiment_id)
    look, outcome = first_decision(values, 0.2)
    assert outcome == "equivalent" and [len(v) for v in values.values()] == [3 * look] * 2


def test_the_progress_line_shows_the_round_and_the_verdict_so_far():
    """The study's note (the heartbeat) carries where sequential confirmations stand; the progress line shows it."""
    import io

    from hpo.engine.progress import ProgressView
    from hpo.trials import TrialState

    view = ProgressView(None, 0, total=10, stream=io.StringIO())
    note = "confirmations: round 2 of at most 4 done, verdict not yet; 3 running, 3 queued"
    line = view.status_line({TrialState.COMPLETED: 4, TrialState.RUNNING: 3}, {}, note)
    assert line.endswith("| confirmations: round 2 of at most 4 done, verdict not yet")
    assert "confirmations" not in view.status_line({TrialState.COMPLETED: 4}, {}, "3 running, 0 queued")
    # once it ended before the cap, what it created is the total: nothing shows as waiting
    assert view.status_line({TrialState.COMPLETED: 8}, {}, "", final=True).startswith(
        "trials: 8/8 done, 0 running, 0 waiting"
    )
