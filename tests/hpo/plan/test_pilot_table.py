"""A pilot's curves as a table (`hpo table`) and `hpo plan --like` over them.

The pilot is a grid (tuner `grid` over learning rates and training seeds) run on the simulated runner over the
learning-curve table, so the table `hpo table` writes is checked against the source table's own records at those
points; a plan over the pilot (`--like`) is checked against a plan of a file that names the written table.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import pytest
import yaml

from hpo.cli.main import main
from hpo.plan.forecast import DEFAULT_TABLE
from hpo.storage import SqlStorage

ROOT = Path(__file__).resolve().parents[3]
BASE = str(ROOT / "trainer" / "configs" / "demo_cpu.yaml")
OVERRIDES = {"budget.max_samples": 12288, "budget.max_time_s": None, "eval.every_samples": 1024,
             "eval.max_samples": 512, "eval.target_mlm_accuracy": 0.12, "batch.global_batch_size": 32,
             "batch.micro_batch_size": 4, "schedule.warmup_steps": 40}  # fmt: skip
LRS = [0.001, 0.00316228, 0.01]  # grid learning rates of hpo/simulation/tables/curves.jsonl
SEEDS = [0, 1, 2]


def experiment(name: str, space: dict, tuner: dict, budget: dict, **overrides) -> dict:
    return {
        "name": name,
        "base_config": BASE,
        "overrides": {**OVERRIDES, **overrides},
        "space": {"optimizer.name": {"choice": ["adamw", "lamb"]}, **space},
        "objective": {"metric": "samples_to_target", "direction": "minimize"},
        "compare": ["optimizer.name"],
        "tuner": tuner,
        "budget": budget,
        "resources": {"gpus_per_trial": 8},
        "runner": {"name": "simulated", "simulation": {"table": str(DEFAULT_TABLE), "gpu": "a100"}},
    }


def pilot(name: str = "pilot", stop_at_target: bool = False) -> dict:
    """Every learning rate of LRS with every seed of SEEDS, per optimizer: 18 runs."""
    space = {"optimizer.lr": {"choice": LRS}, "seed": {"choice": SEEDS}}
    return experiment(name, space, {"name": "grid", "seed": 0}, {"trials": 18, "max_parallel": 4},
                      **{"eval.stop_at_target": stop_at_target})  # fmt: skip


def planned_file(table: Path | None = None) -> dict:
    """What the user plans: random search over the pilot's range of learning rates, 3 confirmation runs an arm."""
    space = {"optimizer.lr": {"float": [0.001, 0.01], "log": True}}
    budget = {"trials": 24, "max_parallel": 8, "confirm_seeds": 3}
    data = experiment("planned", space, {"name": "random", "seed": 0}, budget, **{"eval.stop_at_target": False})
    if table is not None:
        data["runner"]["simulation"]["table"] = str(table)
    return data


def write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def piloted(tmp_path_factory):
    """A database holding the grid pilot, and the table `hpo table` wrote of it."""
    directory = tmp_path_factory.mktemp("pilot")
    db = f"sqlite:///{directory / 'hpo.db'}"
    code, _, err = cli("--db", db, "run", str(write(directory / "pilot.yaml", pilot())), "--quiet",
                       "--run-dir", str(directory / "run"))  # fmt: skip
    assert code == 0, err
    table = directory / "pilot.jsonl"
    code, _, err = cli("--db", db, "table", "pilot", "-o", str(table))
    assert code == 0, err
    assert "wrote 18 runs of experiment pilot" in err and "seeds 0, 1, 2" in err
    return {"db": db, "table": table, "directory": directory}


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_the_grid_pilot_runs_every_combination_once(piloted):
    with SqlStorage(piloted["db"]) as storage:
        trials = storage.list_trials(storage.get_experiment_by_name("pilot").id)
    combos = sorted((t.params["optimizer.name"], t.params["optimizer.lr"], t.params["seed"]) for t in trials)
    assert combos == sorted((o, lr, s) for o in ("adamw", "lamb") for lr in LRS for s in SEEDS)


def test_the_pilots_table_is_the_source_tables_runs_at_its_points(piloted):
    source = {(r["optimizer"], r["lr"], r["warmup_steps"], r["global_batch_size"], r["seed"]): r
              for r in records(DEFAULT_TABLE)[1:]}  # fmt: skip
    meta, *runs = records(piloted["table"])
    assert meta["kind"] == "meta" and meta["grid"]["seed"] == SEEDS
    assert meta["fixed"] == {"budget.max_samples": 12288, "eval.every_samples": 1024, "eval.target_mlm_accuracy": 0.12,
                             "eval.stop_at_target": False}  # fmt: skip
    assert len(runs) == 18
    for run in runs:
        recorded = source[(run["optimizer"], run["lr"], 40, 32, run["seed"])]
        assert run["status"] == recorded["status"]
        assert run["samples"] == recorded["samples"]
        assert run["samples_to_target"] == recorded["samples_to_target"]
        assert [(s, pytest.approx(a, abs=1e-12)) for s, a in run["curve"]] == [tuple(p) for p in recorded["curve"]]


def test_hpo_table_reads_only_and_never_replaces_a_file(piloted):
    db_file = Path(piloted["db"].removeprefix("sqlite:///"))
    before = db_file.read_bytes()
    code, _, err = cli("--db", piloted["db"], "table", "pilot", "-o", str(piloted["table"]))
    assert code == 2 and f"{piloted['table']}: exists" in err
    code, _, err = cli("--db", piloted["db"], "table", "nope", "-o", str(piloted["directory"] / "new.jsonl"))
    assert code != 0 and "nope" in err
    assert db_file.read_bytes() == before and not (piloted["directory"] / "new.jsonl").exists()


def plan_json(db: str, path: Path, *extra: str, repetitions: int = 1) -> dict:
    """`hpo plan --json` of the file: one repetition, enough for which curves it reads and what it says of them."""
    code, out, err = cli("--db", db, "plan", str(path), "--repetitions", str(repetitions), "--json", *extra)
    assert code == 0, err
    return json.loads(out)


def test_plan_like_a_grid_pilot_plans_over_its_curves(piloted):
    directory = piloted["directory"]
    liked = plan_json(
        piloted["db"], write(directory / "planned.yaml", planned_file()), "--like", "pilot", repetitions=2
    )
    assert liked["pilot_curves"]["used"] is True
    assert "the pilot pilot's 18 runs (seeds 0, 1, 2)" in liked["pilot_curves"]["note"]
    assert liked["table"] is None  # not the temporary file the pilot's curves were written to, gone with the plan
    assert any("learning curves: the pilot pilot's 18 runs" in line for line in liked["lines"])
    direct = plan_json(piloted["db"], write(directory / "direct.yaml", planned_file(piloted["table"])), repetitions=2)
    for key in ("first_hit", "answer", "outcomes", "judged", "truth"):
        assert liked[key] == direct[key], key
    # the spread: the best configuration's 3 seeds in the grid, as the chances read them
    source = liked["chances"]["source"]
    assert any("3 of 3 runs (its best tuning run and its other seeds too)" in line for line in source)


def test_plan_like_a_pilot_that_stopped_at_the_target_keeps_the_files_table(piloted, tmp_path):
    db = f"sqlite:///{tmp_path / 'hpo.db'}"
    code, _, err = cli("--db", db, "run", str(write(tmp_path / "p.yaml", pilot("stopped", stop_at_target=True))),
                       "--quiet", "--run-dir", str(tmp_path / "run"))  # fmt: skip
    assert code == 0, err
    data = plan_json(db, write(tmp_path / "planned.yaml", planned_file()), "--like", "stopped")
    assert data["pilot_curves"]["used"] is False
    assert "ran with eval.stop_at_target: true" in data["pilot_curves"]["note"]
    assert data["table"] == str(DEFAULT_TABLE)
    # its table is written, with a note (it suggested the simulated runner over it without a word), and a file
    # the table cannot serve is told to run the pilot again, not `python -m bench.curves.generate`
    table = tmp_path / "stopped.jsonl"
    code, _, err = cli("--db", db, "table", "stopped", "-o", str(table))
    assert code == 0 and "note: experiment stopped stopped its runs at the target (eval.stop_at_target: true)" in err
    lines = table.read_text().splitlines(keepends=True)
    table.write_text("".join(lines[:-1]))  # a run the pilot lacks (a trial that failed, say)
    code, out, err = cli("--db", db, "run", str(write(tmp_path / "on.yaml", planned_file(table))), "--quiet",
                         "--run-dir", str(tmp_path / "on"))  # fmt: skip
    assert code == 2 and "the table holds the runs of experiment stopped (" in err, (out, err)
    assert "to the full budget (eval.stop_at_target: false)" in err and "bench.curves" not in err


def test_plan_like_a_pilot_whose_curves_do_not_cover_the_file_says_what_they_lack(piloted):
    wider = planned_file()
    wider["space"]["optimizer.lr"] = {"float": [3.1623e-4, 0.01], "log": True}  # below the pilot's lowest rate
    data = plan_json(piloted["db"], write(piloted["directory"] / "wider.yaml", wider), "--like", "pilot")
    assert data["pilot_curves"]["used"] is False
    note = data["pilot_curves"]["note"]
    assert note.startswith("not used: they cannot serve") and "outside the curve table's range [0.001, 0.01]" in note
    assert "the pilot pilot's table" in note and "hpo-plan-" not in note  # not the temporary file's name
    assert data["table"] == str(DEFAULT_TABLE)
    assert not math.isnan(data["answer"]["gpu_hours"]["median"])


def test_plan_like_a_pilot_moves_a_real_experiment_file_onto_its_curves(piloted):
    """A real file (local runner) is moved onto the pilot's table, which names no base config (its runs trained the
    pilot's model): the file's own base config stands in (it ended in a KeyError)."""
    real = planned_file()
    real["runner"] = {"name": "local"}
    real["resources"] = {"gpus": "none", "cpu_slots": 1}
    data = plan_json(piloted["db"], write(piloted["directory"] / "real.yaml", real), "--like", "pilot")
    assert data["pilot_curves"]["used"] is True, data["pilot_curves"]
    assert any("learning curves: the pilot pilot's 18 runs" in line for line in data["lines"])
    assert not math.isnan(data["answer"]["gpu_hours"]["median"])


def stopped_copy(piloted, tmp_path) -> str:
    """The pilot's database copied, the pilot recorded as stopped before it finished (as Ctrl-C leaves it)."""
    copy = tmp_path / "stopped.db"
    copy.write_bytes(Path(piloted["db"].removeprefix("sqlite:///")).read_bytes())
    db = f"sqlite:///{copy}"
    with SqlStorage(db) as storage:
        storage.set_experiment_status(storage.get_experiment_by_name("pilot").id, "stopped")
    return db


def test_a_table_of_a_pilot_that_has_not_finished_says_it_holds_the_runs_so_far(piloted, tmp_path):
    db = stopped_copy(piloted, tmp_path)
    code, _, err = cli("--db", db, "table", "pilot", "-o", str(tmp_path / "so_far.jsonl"))
    assert code == 0, err
    assert "experiment pilot has not finished, so the table holds only the runs that ended so far" in err
    assert "`hpo resume pilot` finishes it" in err
    _, _, finished = cli("--db", piloted["db"], "table", "pilot", "-o", str(tmp_path / "done.jsonl"))
    assert "has not finished" not in finished


def test_plan_like_a_pilot_that_has_not_finished_says_its_curves_and_spread_are_the_runs_so_far(piloted, tmp_path):
    db = stopped_copy(piloted, tmp_path)
    data = plan_json(db, write(tmp_path / "planned.yaml", planned_file()), "--like", "pilot")
    assert data["pilot_curves"]["used"] is True
    assert (
        "the pilot pilot's 18 runs that ended so far (it has not finished; it is stopped"
        in data["pilot_curves"]["note"]
    )
    assert "of the runs that ended so far (it has not finished; it is stopped" in data["chances"]["source"][0]


def test_a_pilot_stopped_before_any_run_ended_says_so_and_how_to_finish_it(tmp_path, monkeypatch):
    import hpo.engine.local as local

    def interrupted(*args, **kwargs):  # Ctrl-C while the study loads: the pilot is recorded, no trial
        raise KeyboardInterrupt

    monkeypatch.setattr(local, "Study", interrupted)
    db = f"sqlite:///{tmp_path / 'hpo.db'}"
    code, _, _ = cli("--db", db, "run", str(write(tmp_path / "p.yaml", pilot("early"))), "--quiet",
                     "--run-dir", str(tmp_path / "run"))  # fmt: skip
    assert code == 1
    code, _, err = cli("--db", db, "table", "early", "-o", str(tmp_path / "t.jsonl"))
    assert code != 0 and "no full-budget run ended" in err and "`hpo resume early` finishes it" in err
    assert not (tmp_path / "t.jsonl").exists()
    code, _, err = cli("--db", db, "plan", str(write(tmp_path / "planned.yaml", planned_file())), "--like", "early",
                       "--verdict-only")  # fmt: skip
    assert code != 0 and "Experiment early has not finished: it is stopped: `hpo resume early` finishes it" in err
    assert "confirm_seeds: 3" not in err  # not: run it again with confirmation runs
