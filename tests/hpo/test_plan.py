"""`hpo plan`: R simulated runs of an experiment file, each in a temporary database, summarised with intervals.

The plan's figures are checked against `hpo run` of the same file with the seeds the plan gives each repetition
(tuner seed + r, training seed + 1000 r), recomputed here from the stored trials; the user's database is left as it
was; a bad file gets the errors `hpo run` gives.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from hpo.cli import main
from hpo.plan import DEFAULT_TABLE, percentile_range, share_interval
from hpo.storage import SqlStorage

ROOT = Path(__file__).resolve().parents[2]
PRESET = ROOT / "search_spaces" / "presets" / "adam_vs_lamb_simulated.yaml"
REPETITIONS = 4
GPUS = 8  # the preset's resources.gpus_per_trial


def small_preset(**changes) -> dict:
    """The simulated preset, small: random search, 48 trials on 16 slots (its table, confirmations, verdict kept)."""
    data = yaml.safe_load(PRESET.read_text())
    data["base_config"] = str((PRESET.parent / data["base_config"]).resolve())
    data["runner"]["simulation"]["table"] = str(DEFAULT_TABLE)
    data["tuner"] = {"name": "random", "seed": 0}
    data["budget"].update(trials=48, max_parallel=16)
    return {**data, **changes}


def write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def repetition_file(directory: Path, r: int) -> Path:
    """The plan's repetition r as a file of its own: tuner seed 0 + r, training seed 1234 + 1000 r."""
    base_seed = yaml.safe_load((ROOT / "trainer/configs/demo_cpu.yaml").read_text())["seed"]
    data = small_preset(name=f"rep-{r}")
    data["tuner"]["seed"] = r
    data["overrides"]["seed"] = base_seed + 1000 * r
    return write(directory / f"rep-{r}.yaml", data)


def figures(trials) -> dict:
    """A repetition's figures computed here from its stored trials (times are simulated)."""
    start = min(t.created_at for t in trials)
    hits = [t.finished_at for t in trials if t.samples_to_target is not None]
    moment = min(hits)

    def busy_until(t, end) -> float:  # seconds of the trial's slot-time before `end`
        return max(0.0, (min(t.finished_at, end) - t.started_at).total_seconds())

    return {
        "first_hit_gpu_h": sum(busy_until(t, moment) for t in trials) * GPUS / 3600,
        "first_hit_wall_h": (moment - start).total_seconds() / 3600,
        "answer_gpu_h": sum((t.finished_at - t.started_at).total_seconds() for t in trials) * GPUS / 3600,
        "answer_wall_h": (max(t.finished_at for t in trials) - start).total_seconds() / 3600,
    }


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """The user's database holds the plan's repetitions, each run by `hpo run`; then `hpo plan` of the file, with
    --db naming that database and HPO_DATABASE_URL naming another."""
    directory = tmp_path_factory.mktemp("plan")
    db_file = directory / "user.db"
    user = f"sqlite:///{db_file}"
    independent, outcomes, capture = [], {}, {}
    with pytest.MonkeyPatch.context() as patch:
        for r in range(REPETITIONS):
            path = repetition_file(directory, r)
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                assert main(["--db", user, "run", str(path), "--quiet", "--run-dir", str(directory / f"run-{r}")]) == 0
        with SqlStorage(user) as storage:
            for r in range(REPETITIONS):
                record = storage.get_experiment_by_name(f"rep-{r}")
                independent.append(figures(storage.list_trials(record.id)))
        for r in range(REPETITIONS):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                assert main(["--db", user, "best", f"rep-{r}", "--per-arm"]) == 0
            verdict = yaml.safe_load(out.getvalue())["verdict"]
            key = f"winner {verdict['winner']}" if verdict["outcome"] == "winner" else verdict["outcome"]
            outcomes[key] = outcomes.get(key, 0) + 1
        gc.collect()  # the commands' storages close (and checkpoint the database) now, not during the plan
        before = files_of(db_file)
        env_db = directory / "env" / "hpo.db"
        patch.setenv("HPO_DATABASE_URL", f"sqlite:///{env_db}")
        scratch = set(Path(tempfile.gettempdir()).glob("hpo-plan-*")) | set(Path("/dev/shm").glob("hpo-plan-*"))
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["--db", user, "plan", str(write(directory / "file.yaml", small_preset())), "--repetitions",
                         str(REPETITIONS)])  # fmt: skip
        left = set(Path(tempfile.gettempdir()).glob("hpo-plan-*")) | set(Path("/dev/shm").glob("hpo-plan-*"))
        capture.update(code=code, out=out.getvalue(), err=err.getvalue(), before=before, after=files_of(db_file),
                       env_db=env_db, scratch_left=left - scratch)  # fmt: skip
    return {**capture, "independent": independent, "outcomes": outcomes, "user": user, "directory": directory}


def files_of(db_file: Path) -> dict[str, bytes]:
    """The database's files (with SQLite's write-ahead log, where there is one) and their bytes."""
    return {p.name: p.read_bytes() for p in sorted(db_file.parent.glob(f"{db_file.name}*"))}


def figure_line(out: str, heading: str, label: str) -> str:
    """The line `label` below `heading` in the plan's summary."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    return next(line for line in lines[start + 1 :] if line.startswith(label))


def expected_line(label: str, values: list[float], fmt: str) -> str:
    """The summary line from numpy's percentiles (linear interpolation) of the independent figures."""
    median, low, high = (fmt.format(v) for v in np.percentile(values, [50, 2.5, 97.5]))
    return f"{label:<44}{median:>10}   {low} to {high}"


def test_the_plan_prints_the_cost_hpo_run_gives_for_each_repetition(planned):
    assert planned["code"] == 0, planned["err"]
    out, figures_of = planned["out"], planned["independent"]
    for heading, prefix in (("to the first target-reaching", "first_hit"), ("to the verdict", "answer")):
        for label, key, fmt in (("  GPU-hours", "gpu_h", "{:,.1f}"), ("  wall-clock", "wall_h", "{:,.2f} h")):
            values = [f[f"{prefix}_{key}"] for f in figures_of]
            assert figure_line(out, heading, label) == expected_line(label, values, fmt)
    assert f"{REPETITIONS} repetitions on the simulated runner" in out
    assert f"learning curves: {DEFAULT_TABLE}" in out
    assert "tuner seed 0 + r, training seed 1234 + 1000 r" in out


def test_the_outcome_shares_add_up_to_the_repetitions_and_match_each_run(planned):
    rows = {}
    lines = planned["out"].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("outcome (of"))
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        label, rest = line[:44].strip(), line[44:].split()
        rows[label] = int(rest[0])
        low, high = share_interval(int(rest[0]), REPETITIONS)
        assert rest[2:] == [f"{low:.0%}", "to", f"{high:.0%}"]
    assert set(rows) == {"winner optimizer.name=adamw", "winner optimizer.name=lamb", "equivalent", "not yet"}
    assert sum(rows.values()) == REPETITIONS
    assert {k: v for k, v in rows.items() if v} == planned["outcomes"]


def test_the_plan_leaves_the_users_database_as_it_was(planned):
    assert planned["after"] == planned["before"]  # byte for byte: not even opened
    assert not planned["env_db"].parent.exists()  # HPO_DATABASE_URL's database is not created either
    with SqlStorage(planned["user"]) as storage:
        assert sorted(e.name for e in storage.list_experiments()) == [f"rep-{r}" for r in range(REPETITIONS)]
    assert planned["scratch_left"] == set()  # the temporary databases are deleted
    progress = planned["err"].splitlines()
    assert progress[-1].startswith(f"plan: {REPETITIONS}/{REPETITIONS} repetitions")


def test_export_of_a_simulated_experiment_says_no_training_happened(planned, capsys):
    path = planned["directory"] / "best.yaml"
    assert main(["--db", planned["user"], "export", "rep-0", "-o", str(path)]) == 0
    console = capsys.readouterr().err
    assert "warning: experiment rep-0 ran on the simulated runner: no training happened" in console
    comments = [line for line in path.read_text().splitlines() if line.startswith("#")]
    assert comments[0].endswith("SIMULATED: no training happened.")
    reached = next(line for line in comments if line.startswith("# reached the target mlm_accuracy"))
    assert reached.endswith("samples (simulated: read from a learning-curve table, not trained)")
    assert main(["--db", planned["user"], "export", "rep-0", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["provenance"]["simulated"] is True


# --------------------------------------------------------------------------- files it refuses or moves


@pytest.mark.parametrize(
    "changes",
    [
        {"space": {"optimizer.lrr": {"float": [1e-3, 1e-2], "log": True}}},  # not a trainer key
        {"space": {"optimizer.name": {"choice": ["adamw", "lamb"]}, "optimizer.lr": {"float": [1e-5, 1e-2]}}},
    ],
    ids=["typo", "lr-outside-the-table"],
)
def test_a_bad_file_gets_the_errors_hpo_run_gives_and_nothing_is_written(tmp_path, capsys, changes):
    path = write(tmp_path / "bad.yaml", small_preset(**changes))
    db_file = tmp_path / "hpo.db"
    assert main(["--db", f"sqlite:///{db_file}", "run", str(path)]) == 2
    run_error = capsys.readouterr().err
    assert main(["--db", f"sqlite:///{db_file}", "plan", str(path), "--repetitions", "1"]) == 2
    assert capsys.readouterr().err == run_error and "bad.yaml" in run_error
    assert not db_file.exists()


def test_a_real_experiment_runs_on_the_default_table_when_it_covers_the_space(tmp_path, capsys):
    data = small_preset(name="real", resources={"gpus": "none", "gpus_per_trial": 8}, engine="local")
    path = write(tmp_path / "real.yaml", {k: v for k, v in data.items() if k != "runner"})
    assert main(["plan", str(path), "--repetitions", "1", "--slots", "2", "--gpu", "h100"]) == 0
    out = capsys.readouterr().out
    assert "is a real experiment (runner local, engine local): planned on the simulated runner" in out
    assert "2 slot(s) of 8 GPU(s), H100, 1,100 samples/s a GPU" in out


def test_a_real_experiment_the_table_cannot_serve_is_refused_saying_what_a_plannable_file_needs(tmp_path, capsys):
    preset = ROOT / "search_spaces" / "presets" / "adam_vs_lamb_demo_cpu.yaml"  # it tunes beta1, beta2, ...
    assert main(["--db", f"sqlite:///{tmp_path / 'hpo.db'}", "plan", str(preset)]) == 2
    error = capsys.readouterr().err
    assert "adam_vs_lamb_demo_cpu.yaml: cannot be planned: it is a real experiment (runner local" in error
    assert "space.optimizer.beta1: the curve table does not vary optimizer.beta1" in error
    assert "A plannable file tunes only what a table varies" in error
    assert not (tmp_path / "hpo.db").exists()


# --------------------------------------------------------------------------- the intervals


def test_the_percentile_range_is_numpys_and_counts_a_miss_as_never():
    values = [3.0, 1.0, 7.5, 2.0, 4.25, 9.0, 0.5]
    assert percentile_range(values) == pytest.approx(tuple(np.percentile(values, [50, 2.5, 97.5])))
    assert percentile_range([1.0, None, 2.0, None]) == (math.inf, pytest.approx(1.075), math.inf)
    assert percentile_range([5.0]) == (5.0, 5.0, 5.0)


@pytest.mark.parametrize("count,total", [(0, 3), (2, 3), (17, 20), (20, 20)])
def test_the_share_interval_is_wilsons(count, total):
    z = 1.959963984540054  # the normal 97.5 % quantile
    p = count / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z / (1 + z * z / total) * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total))
    assert share_interval(count, total) == pytest.approx((centre - half, centre + half))
