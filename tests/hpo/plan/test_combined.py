"""hpo.plan.combined: a real file whose batch sizes no one shipped table has to their budgets is planned over the
shipped tables batch size by batch size, where they share their set-up, or refused saying which batch size, which
budget and what each table has. The expected runs and budgets are read here from the table files and the preset's
YAML, not from the module."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import yaml

from hpo.cli.main import main
from hpo.errors import HpoError
from hpo.experiment import load_experiment
from hpo.plan.combined import covering_table
from hpo.plan.forecast import PlanOptions, prepare_plan
from hpo.simulation.table import TABLES, load_table

ROOT = Path(__file__).resolve().parents[3]
PRESET = ROOT / "search_spaces" / "presets" / "batch_scaling_demo_cpu.yaml"


def records(table: str) -> list[dict]:
    return [json.loads(line) for line in (TABLES / f"{table}.jsonl").read_text().splitlines() if line.strip()]


def runs_at(table: str, batch: int) -> list[tuple]:
    """(optimizer, lr, warmup, seed, curve) of every run of a shipped table at one batch size."""
    return sorted((r["optimizer"], r["lr"], r["warmup_steps"], r["seed"], str(r["curve"]))
                  for r in records(table)[1:] if r["global_batch_size"] == batch)  # fmt: skip


def file_budgets(data: dict) -> dict[int, int]:
    """The preset's budget at each batch size: its one-value choices conditioned on the batch size."""
    return {p["when"]["batch.global_batch_size"]: p["choice"][0] for name, p in data["space"].items()
            if name.startswith("budget.max_samples@")}  # fmt: skip


def test_each_batch_size_is_read_from_the_shipped_table_that_has_it_to_the_files_budget():
    data = yaml.safe_load(PRESET.read_text())
    budgets = file_budgets(data)
    assert budgets == {32: 12288, 128: 49152}
    curves, large = records("curves")[0], records("large_batch")[0]
    assert curves["fixed"]["budget.max_samples"] == budgets[32] < budgets[128]  # curves.jsonl stops 128 at 12,288
    assert large["grid"]["batches"]["128"]["max_samples"] == budgets[128] and "32" not in large["grid"]["batches"]
    plan = prepare_plan(str(PRESET), PlanOptions(repetitions=1))
    table = load_table(plan.table)
    assert plan.assumptions == () and plan.data["space"] == data["space"]  # the file as it is: nothing moved
    assert plan.spec.runner.simulation.sample_scale == 256  # the default conversion, as for any file planned as it is
    for batch, source in ((32, "curves"), (128, "large_batch")):
        assert sorted((r.optimizer, r.lr, r.warmup_steps, r.seed, str([list(p) for p in r.curve])) for r in table.runs
                      if r.global_batch_size == batch) == runs_at(source, batch)  # fmt: skip
        assert table.max_samples_for(batch) == budgets[batch]
    assert table.grid_values("schedule.warmup_steps", 32) == curves["grid"]["warmup_steps"]  # both of its warmups
    assert table.eval_every_for(32) == curves["fixed"]["eval.every_samples"]
    assert table.eval_every_for(128) == large["grid"]["batches"]["128"]["every"]
    # no run of curves.jsonl reaches the target at batch 128; the truth there is large_batch.jsonl's, past 12,288
    assert all(r["samples_to_target"] is None for r in records("curves")[1:] if r["global_batch_size"] == 128)
    at_128 = [a.figure for a in plan.truth.arms if a.label.endswith("batch.global_batch_size=128")]
    assert len(at_128) == 2 and all(budgets[32] < figure <= budgets[128] for figure in at_128)
    # a batch-size study: the truth at each batch size, the optimizers' arms there (read here from their labels)
    for batch in budgets:
        there = {a.label.split(",")[0].removeprefix("optimizer.name="): a.figure for a in plan.truth.arms
                 if a.label.endswith(f"batch.global_batch_size={batch}")}  # fmt: skip
        truth = plan.batch_truths[batch]
        assert {a.label: a.figure for a in truth.arms} == there and truth.better == min(there, key=there.get)
    assert list(plan.batch_truths) == [32, 128]


@pytest.fixture(scope="module")
def demo_plan() -> dict:
    """`hpo plan PRESET --repetitions 1 --json`, once for the module: its "lines" are the text `hpo plan` prints
    without --json (hpo.cli.plan prints forecast_lines in both)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", str(PRESET), "--repetitions", "1", "--json"]) == 0
    return json.loads(out.getvalue())


def test_the_plan_of_the_demo_batch_preset_says_where_each_batch_size_is_read_from(demo_plan):
    out = "\n".join(demo_plan["lines"])
    assert ("learning curves: the shipped tables batch size by batch size: 32 from curves.jsonl (to 12,288 samples), "
            "128 from large_batch.jsonl (to 49,152 samples)") in out  # fmt: skip
    assert "assumption:" not in out and "stands for 4 of the file's" not in out
    assert "planned on the simulated runner over the shipped learning-curve tables, each batch size from one" in out


def test_the_json_plan_names_the_shipped_table_of_each_batch_size_not_the_temporary_combination(demo_plan):
    data = demo_plan
    assert data["table"] is None  # the combination was a temporary file, gone with the plan
    # a batch-size study: the verdict at each batch size, the study's question, forecast beside the experiment's
    assert sorted(data["at_batches"]) == ["128", "32"]
    for batch, there in data["at_batches"].items():
        assert (
            sum(s["count"] for s in there["outcomes"].values())
            == 1
            == sum(s["count"] for s in there["judged"].values())
        )
        assert set(there["outcomes"]) == {"winner adamw", "winner lamb", "equivalent", "not yet"}
        assert f"the verdict at batch {int(batch):,} (of 1 repetition" in "\n".join(data["lines"])
    assert data["tables_by_batch"] == {"32": str(TABLES / "curves.jsonl"), "128": str(TABLES / "large_batch.jsonl")}
    assert all(Path(path).is_file() for path in data["tables_by_batch"].values())


def test_a_budget_no_shipped_table_has_is_refused_naming_the_batch_size_the_budget_and_what_each_has(tmp_path, capsys):
    data = yaml.safe_load(PRESET.read_text())
    data["base_config"] = str((PRESET.parent / data["base_config"]).resolve())
    data["space"]["budget.max_samples@b128"]["choice"] = [98304]  # twice large_batch.jsonl's at 128
    data["overrides"]["budget.max_samples"] = 98304
    path = tmp_path / "longer.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["--db", f"sqlite:///{tmp_path / 'hpo.db'}", "plan", str(path), "--repetitions", "1"]) == 2
    captured = capsys.readouterr()
    assert "repetitions" not in captured.err.split("error:")[0] and captured.out == ""  # refused before any repetition
    assert "longer.yaml: cannot be planned" in captured.err
    assert ("no shipped learning-curve table has batch.global_batch_size=128 to 98,304 samples (the file's budget "
            "there): curves.jsonl has 32, 128 to 12,288 samples; large_batch.jsonl has 128 to 49,152, 512 to 163,840, "
            "1,024 to 327,680, 2,048 to 393,216 samples") in captured.err  # fmt: skip
    assert "`hpo plan FILE --like PILOT`" in captured.err
    assert not (tmp_path / "hpo.db").exists()


def test_tables_of_another_set_up_are_not_combined(tmp_path):
    spec = load_experiment(PRESET)
    lines = (TABLES / "large_batch.jsonl").read_text().splitlines()
    meta = json.loads(lines[0])
    meta["data_sha256"] = "0" * 64  # other data
    other = tmp_path / "other.jsonl"
    other.write_text("\n".join([json.dumps(meta), *lines[1:]]) + "\n")
    with pytest.raises(HpoError, match=r"curves\.jsonl and other\.jsonl, differ in data_sha256"):
        covering_table(spec, (TABLES / "curves.jsonl", other))
    with pytest.raises(HpoError, match="no shipped learning-curve table has batch.global_batch_size=128 to 49,152"):
        covering_table(spec, (TABLES / "curves.jsonl",))


def test_tables_made_by_other_revisions_of_the_trainer_are_not_combined(tmp_path):
    """A table made after a change to what the trainer trains (trainer.CURVES_REVISION) is not read as one with a
    table of before it; a meta line without a revision is revision 1."""
    spec = load_experiment(PRESET)
    lines = (TABLES / "large_batch.jsonl").read_text().splitlines()
    meta = json.loads(lines[0])
    meta["trainer_revision"] = meta.get("trainer_revision", 1) + 1
    other = tmp_path / "other.jsonl"
    other.write_text("\n".join([json.dumps(meta), *lines[1:]]) + "\n")
    with pytest.raises(HpoError, match=r"curves\.jsonl and other\.jsonl, differ in trainer revision"):
        covering_table(spec, (TABLES / "curves.jsonl", other))
    assert covering_table(spec, (TABLES / "curves.jsonl", TABLES / "large_batch.jsonl")).exists()  # one revision
