"""hpo.export.production: a best trial as a complete trainer config (YAML/JSON) or a torchrun line; pure, no
processes."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from hpo.errors import ExperimentFileError
from hpo.experiment import experiment_from_dict, spec_from_stored
from hpo.experiment.arms import trial_config
from hpo.export.production import (
    CONFIG_PATH_PATTERN,
    FORMATS,
    MLPERF_LOG,
    SIMULATED,
    ExportError,
    check_arm,
    micro_batch_for,
    render,
    torchrun_command,
)
from hpo.storage.base import Direction, ExperimentRecord, ExperimentStatus, TrialRecord
from hpo.trials import TrialState
from server.storage import SpecCache
from tests.server.conftest import tiny_overrides
from trainer.config import TrainerConfig, load_config
from trainer.errors import ConfigError

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def make_record(tmp_path, current_rules: bool = True, **spec_fields) -> ExperimentRecord:
    data = {
        "name": "exp", "base_config": {},
        "overrides": {**tiny_overrides(tmp_path / "data"), "log.jsonl": None, "budget.max_samples": 480},
        "space": {"optimizer.name": {"choice": ["adamw", "lamb"]}, "optimizer.lr": {"float": [1e-4, 1e-2]}},
        "compare": ["optimizer.name"], "tuner": {"name": "random"}, "budget": {"trials": 2},
        "resources": {"gpus": "none"}, **spec_fields,
    }  # fmt: skip
    spec = experiment_from_dict(data, "exp.yaml", base_dir=tmp_path, current_rules=current_rules)
    stored = {"experiment": spec.self_contained(), "run_dir": str(tmp_path / "run")}
    return ExperimentRecord(1, "exp", Direction.MINIMIZE, ExperimentStatus.FINISHED, stored, False, NOW, NOW)


def make_trial(number=3, params=None, reached=True, budget=1.0) -> TrialRecord:
    params = params or {"optimizer.name": "lamb", "optimizer.lr": 0.004}
    return TrialRecord(
        id=7, experiment_id=1, number=number, state=TrialState.COMPLETED, params=params,
        arm=f"optimizer.name={params['optimizer.name']}", budget=budget, gpus=(), global_batch_size=8, reason=None,
        objective=160.0 if reached else 1900.0, samples_to_target=160 if reached else None,
        time_to_target_s=1.5 if reached else None, best_mlm_accuracy=0.01 if reached else 0.005, duration_s=3.0,
        metrics={"status": "reached_target" if reached else "budget_exhausted"}, host="h", pid=1, created_at=NOW,
        started_at=NOW, finished_at=NOW,
    )  # fmt: skip


def test_yaml_is_base_plus_overrides_plus_params_at_full_budget_with_provenance(tmp_path):
    record = make_record(tmp_path)
    trial = make_trial(budget=1 / 3)  # a multi-fidelity trial: the export trains the full budget
    exported = render(record, trial, "yaml")
    config = yaml.safe_load(exported.text)
    spec = experiment_from_dict(record.spec["experiment"])
    expected = trial_config(spec, trial.params, fidelity=1.0).model_dump(mode="json")
    expected["log"]["mlperf"] = "mlperf/result_0.txt"  # every export writes an MLPerf log
    assert config == expected
    assert config["budget"]["max_samples"] == 480 and config["optimizer"] == {**config["optimizer"], "lr": 0.004}
    assert config["log"]["jsonl"] is None and config["checkpoint"]["dir"] is None  # nothing trial-specific
    comments = [line for line in exported.text.splitlines() if line.startswith("#")]
    assert comments[0] == "# Best configuration of experiment exp, exported by `hpo export`."
    assert "# trial 3, arm optimizer.name=lamb" in comments
    assert "# objective: samples_to_target = 160 (minimize)" in comments
    assert comments[-1] == "# run: torchrun --standalone --nnodes 1 --nproc_per_node 1 -m trainer --config best.yaml"
    assert [w for w in exported.warnings if "short rung" not in w] == []  # only that it ran a third of the budget
    full = make_trial()
    assert render(record, full, "yaml").warnings == () and "WARNING" not in render(record, full, "yaml").text


def test_every_export_writes_an_mlperf_log_unless_the_experiment_names_one(tmp_path):
    record, trial = make_record(tmp_path), make_trial()
    exported = render(record, trial, "yaml")
    assert yaml.safe_load(exported.text)["log"]["mlperf"] == MLPERF_LOG == "mlperf/result_0.txt"
    note = "# MLPerf log (mllog events of rank 0): mlperf/result_0.txt, relative to the directory the command runs in"
    assert note in exported.text.splitlines()
    assert json.loads(render(record, trial, "json").text)["config"]["log"]["mlperf"] == MLPERF_LOG
    assert note in render(record, trial, "torchrun").text.splitlines()
    own = tmp_path / "logs" / "lamb.txt"
    named = make_record(tmp_path, overrides={**record.spec["experiment"]["overrides"], "log.mlperf": str(own)})
    exported = render(named, trial, "yaml")
    assert yaml.safe_load(exported.text)["log"]["mlperf"] == str(own)
    assert f"# MLPerf log (mllog events of rank 0): {own}" in exported.text.splitlines()  # absolute: no "relative"


def test_an_experiment_stored_before_the_equal_arms_rule_exports_from_the_command_line_and_the_api(tmp_path):
    """An experiment recorded by a version that allowed arms tuning different hyperparameters without a reason
    (`allow_unequal_arms`) is read as it ran, as every other reader of stored experiments reads it."""
    space = {"optimizer.name": {"choice": ["adamw", "lamb"]}, "optimizer.lr": {"float": [1e-4, 1e-2]},
             "optimizer.beta2": {"float": [0.9, 0.999], "when": {"optimizer.name": "lamb"}}}  # fmt: skip
    record = make_record(tmp_path, current_rules=False, space=space)
    with pytest.raises(ExperimentFileError, match="do not tune the same hyperparameters"):
        experiment_from_dict(record.spec["experiment"], "today's rule")
    trial = make_trial(params={"optimizer.name": "lamb", "optimizer.lr": 0.004, "optimizer.beta2": 0.95})
    config = yaml.safe_load(render(record, trial, "yaml").text)  # `hpo export` and GET /export
    assert (config["optimizer"]["name"], config["optimizer"]["beta2"]) == ("lamb", 0.95)
    specs = SpecCache()
    assert check_arm(specs.spec(record), "optimizer.name=lamb") is None  # the API's arms
    assert specs.config(record, trial)["optimizer"]["beta2"] == 0.95  # GET /best


def test_an_experiment_stored_before_newer_rules_is_still_read_as_it_ran(tmp_path):
    """A tuner seed SMAC3 would refuse (random search took it), a base seed whose confirmation seeds pass 2**31 - 1
    and bf16 set where fp16 is now refused on CPU slots: recorded by an earlier version, read for its report."""
    overrides = {**tiny_overrides(tmp_path / "data"), "log.jsonl": None, "budget.max_samples": 480,
                 "seed": 2**31 - 2, "precision.dtype": "fp16"}  # fmt: skip
    record = make_record(tmp_path, current_rules=False, tuner={"name": "random", "seed": 2**40}, overrides=overrides,
                         budget={"trials": 2, "confirm_seeds": 3})  # fmt: skip
    with pytest.raises(ExperimentFileError, match="tuner.seed"):
        experiment_from_dict(record.spec["experiment"], "today's rules")
    spec = spec_from_stored(record)
    assert (spec.tuner.seed, spec.resolved_base()["seed"]) == (2**40, 2**31 - 2)
    assert yaml.safe_load(render(record, make_trial(), "yaml").text)["precision"]["dtype"] == "fp16"


def test_a_stored_experiment_that_is_not_a_mapping_is_named_in_the_error(tmp_path):
    record = dataclasses.replace(make_record(tmp_path), spec=None)
    with pytest.raises(ExperimentFileError, match=r"^experiment exp \(stored\): .*mapping"):
        spec_from_stored(record)


def test_a_best_that_missed_the_target_warns_in_the_file(tmp_path):
    exported = render(make_record(tmp_path), make_trial(reached=False), "yaml")
    assert len(exported.warnings) == 1 and "no trial of experiment exp reached the target" in exported.warnings[0]
    assert f"# WARNING: {exported.warnings[0]}" in exported.text.splitlines()
    as_json = json.loads(render(make_record(tmp_path), make_trial(reached=False), "json").text)
    assert as_json["warnings"] == list(exported.warnings) and as_json["provenance"]["reached_target"] is False


def test_a_simulated_experiment_says_no_training_happened_wherever_its_export_is_read(tmp_path):
    record = make_record(tmp_path, runner={"name": "simulated", "simulation": {"table": "curves.jsonl"}})
    exported = render(record, make_trial(), "yaml")
    comments = [line for line in exported.text.splitlines() if line.startswith("#")]
    assert comments[0].endswith("exported by `hpo export`. SIMULATED: no training happened.")
    simulated = "(simulated: read from a learning-curve table, not trained)"
    assert f"# reached the target mlm_accuracy 0.008 after 160 samples {simulated}" in comments
    assert exported.warnings == (SIMULATED.format(experiment="exp"),)  # the console and X-HPO-Warning say it too
    assert f"# WARNING: {exported.warnings[0]}" in comments and exported.warnings[0].isascii()
    body = json.loads(render(record, make_trial(), "json").text)
    assert body["provenance"]["simulated"] is True and body["warnings"] == list(exported.warnings)
    assert "SIMULATED" in render(record, make_trial(), "torchrun").text.splitlines()[0]
    missed = render(record, make_trial(reached=False), "yaml").warnings  # a miss is still said first
    assert len(missed) == 2 and missed[0].startswith("no trial of experiment exp reached the target")
    trained = render(make_record(tmp_path), make_trial(), "json").text
    assert json.loads(trained)["provenance"]["simulated"] is False and "simulated runner" not in trained


def test_the_comments_write_objectives_and_samples_as_the_other_commands_do(tmp_path):
    """Whole samples with every digit and commas, as `hpo trials` and the run's summary print them."""
    trial = dataclasses.replace(make_trial(), objective=98_304.0, samples_to_target=98_304)
    comments = render(make_record(tmp_path), trial, "yaml").text.splitlines()
    assert "# objective: samples_to_target = 98,304 (minimize)" in comments
    assert any(line.startswith("# reached the target mlm_accuracy 0.008 after 98,304 samples") for line in comments)


def test_the_objective_of_a_trial_that_missed_the_target_is_called_the_penalty_it_is(tmp_path):
    """A miss's score under samples_to_target is the penalty (here 1,900), which the comment called samples to target
    (the JSON's samples_to_target is null)."""
    missed = dataclasses.replace(make_trial(reached=False), metrics={"status": "budget_exhausted", "samples": 480})
    comments = render(make_record(tmp_path), missed, "yaml").text.splitlines()
    objective = next(line for line in comments if line.startswith("# objective:"))
    assert objective.startswith(
        "# objective: samples_to_target = 1,900 (minimize): the target was not reached in 480 samples"
    ), objective
    assert objective.endswith("so this is the penalty of a miss, not samples to target")
    assert not any(line.startswith("# reached the target") for line in comments)
    reached = render(make_record(tmp_path), make_trial(), "yaml").text.splitlines()
    assert "# objective: samples_to_target = 160 (minimize)" in reached


def short_rung_db(tmp_path) -> str:
    """Experiment `rungs` of the asha tuner (eta 3: rungs of 160 and 480 samples): AdamW's best trial reached the
    target after 128 samples on the short rung, where it was finished; LAMB's after 320 on the full budget."""
    from hpo.experiment import stored_form
    from hpo.storage import SqlStorage
    from hpo.trials import TrialKind, TrialResult, TrialSpec

    data = {
        "name": "rungs", "base_config": {},
        "overrides": {**tiny_overrides(tmp_path / "data"), "log.jsonl": None, "budget.max_samples": 480},
        "space": {"optimizer.name": {"choice": ["adamw", "lamb"]}, "optimizer.lr": {"float": [1e-4, 1e-2]}},
        "compare": ["optimizer.name"], "tuner": {"name": "asha", "options": {"eta": 3, "min_samples": 160}},
        "budget": {"trials": 8}, "resources": {"gpus": "none"},
    }  # fmt: skip
    spec = experiment_from_dict(data, "rungs.yaml", base_dir=tmp_path)
    db = f"sqlite:///{tmp_path / 'rungs.db'}"
    with SqlStorage(db, upgrade=True) as storage:
        eid = storage.create_experiment("rungs", stored_form(spec, tmp_path / "rungs"), spec.direction)
        for optimizer, budget, samples in (("adamw", 1 / 3, 128), ("lamb", 1.0, 320)):
            params = {"optimizer.name": optimizer, "optimizer.lr": 0.004}
            trial_id = storage.create_trial(eid, TrialSpec(None, params, f"optimizer.name={optimizer}", budget, (), 8,
                                                           TrialKind.TUNING, None))  # fmt: skip
            storage.mark_trial_running(trial_id, pid=1, host="h")
            final = {"status": "reached_target", "samples": samples}
            storage.finish_trial(trial_id, TrialResult(TrialState.COMPLETED, objective=float(samples),
                                                       samples_to_target=samples, best_mlm_accuracy=0.01,
                                                       metrics=final))  # fmt: skip
    return db


def test_a_best_trial_that_ran_a_short_rung_says_so_wherever_its_export_is_read(tmp_path, capsys):
    """The best trial ran a third of the budget (asha's lower rung): the export trains the full budget, and said
    nothing of it. Now a comment, a warning (the file, stderr, the JSON, X-HPO-Warning) and the JSON's provenance
    say how many samples the trial trained and on what budget; the other arm's best, on the full budget, says
    nothing of it."""
    from fastapi.testclient import TestClient

    from hpo.cli.main import main
    from server.app import create_app
    from server.settings import Settings

    db, out = short_rung_db(tmp_path), tmp_path / "best.yaml"
    full, rung, trained = 480, 480 // 3, 128  # the experiment's budget, its lower rung (eta 3), the trial's samples
    warning = (f"trial 0 ran only a fraction of the sample budget: it trained {trained} samples on a short rung of the "
               f"multi-fidelity tuner (budget.max_samples {rung} of {full}); this config has the full budget of {full} "
               f"samples, and how it trains past {trained} samples is untested")  # fmt: skip
    assert main(["--db", db, "export", "rungs", "-o", str(out)]) == 0
    assert f"warning: {warning}" in capsys.readouterr().err.splitlines()
    text = out.read_text()
    assert yaml.safe_load(text)["budget"]["max_samples"] == full
    comments = [line for line in text.splitlines() if line.startswith("#")]
    chosen = comments.index("# chosen as the best trial of any arm: the verdict names no winner yet (--arm exports an "
                            "arm's best)")  # fmt: skip
    assert comments[chosen + 1] == (f"# trial budget: a short rung, budget.max_samples {rung} of the full {full}, "
                                    f"trained {trained} samples; exported at the full budget")  # fmt: skip
    assert f"# WARNING: {warning}" in comments
    assert main(["--db", db, "export", "rungs", "--format", "json"]) == 0
    body = json.loads(capsys.readouterr().out)
    provenance = body["provenance"]
    assert (provenance["trial"], provenance["samples_trained"], provenance["trial_max_samples"],
            provenance["max_samples"]) == (0, trained, rung, full)  # fmt: skip
    assert body["warnings"] == [warning] and body["config"]["budget"]["max_samples"] == full
    with TestClient(create_app(Settings(database_url=db))) as client:
        answer = client.get("/api/v1/experiments/rungs/export", params={"format": "json"})
        lamb = client.get("/api/v1/experiments/rungs/export", params={"arm": "optimizer.name=lamb"})
    assert answer.status_code == 200 and answer.json() == body
    assert answer.headers.get_list("x-hpo-warning") == [warning]
    assert lamb.status_code == 200 and "x-hpo-warning" not in lamb.headers
    assert "short rung" not in lamb.text and "# trial budget" not in lamb.text
    assert main(["--db", db, "export", "rungs", "--arm", "optimizer.name=lamb", "--format", "json"]) == 0
    captured = capsys.readouterr()
    assert "warning" not in captured.err and json.loads(captured.out)["warnings"] == []
    lamb_origin = json.loads(captured.out)["provenance"]
    budgets = (lamb_origin["samples_trained"], lamb_origin["trial_max_samples"], lamb_origin["max_samples"])
    assert budgets == (320, full, full)


def test_json_and_torchrun_formats(tmp_path):
    record, trial = make_record(tmp_path), make_trial()
    body = json.loads(render(record, trial, "json", nodes=2, gpus_per_node=4).text)
    assert body["provenance"]["trial"] == 3 and body["provenance"]["objective"] == 160.0
    assert body["config"]["batch"] == {"global_batch_size": 8, "micro_batch_size": 1}  # 8 ranks share 8 sequences
    line = render(record, trial, "torchrun", gpus_per_node=2, config_path="my best.yaml").text.splitlines()[-1]
    assert line == "torchrun --standalone --nnodes 1 --nproc_per_node 2 -m trainer --config 'my best.yaml'"
    with pytest.raises(ExportError, match="unknown export format"):
        render(record, trial, "xml")


def test_an_export_for_several_ranks_of_a_cpu_config_says_it_trains_on_the_cpu(tmp_path):
    record, trial = make_record(tmp_path), make_trial()
    assert render(record, trial, "yaml").warnings == ()  # one rank: as the experiment ran
    exported = render(record, trial, "yaml", nodes=2, gpus_per_node=4)
    assert exported.warnings == ("the config trains on device cpu (from the experiment's base config), so its 8 ranks "
                                 "are CPU processes; set device: cuda (or auto) to train on GPUs",)  # fmt: skip
    assert f"# WARNING: {exported.warnings[0]}" in exported.text.splitlines() and exported.warnings[0].isascii()
    gpu = make_record(tmp_path, overrides={**tiny_overrides(tmp_path / "data"), "log.jsonl": None, "device": "auto"})
    assert render(gpu, trial, "yaml", nodes=2, gpus_per_node=4).warnings == ()


def test_torchrun_command_for_several_nodes():
    line = torchrun_command("best.yaml", nodes=4, gpus_per_node=8, run_id="adam_vs_lamb")
    assert line.startswith("torchrun --nnodes 4 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint ")
    assert '"${MASTER_ADDR:?set MASTER_ADDR to the first node}:${MASTER_PORT:-29400}"' in line
    assert line.endswith("--rdzv_id adam_vs_lamb -m trainer --config best.yaml")
    with pytest.raises(ExportError):
        torchrun_command("best.yaml", nodes=0)


@pytest.mark.parametrize(
    "global_batch, micro, ranks, expected",
    [(8, 8, 1, 8), (8, 8, 2, 4), (65536, 64, 512, 64), (65536, 256, 512, 128), (24, 8, 4, 6), (96, 5, 2, 4)],
)
def test_micro_batch_is_the_largest_that_splits_the_global_batch(global_batch, micro, ranks, expected):
    got = micro_batch_for(global_batch, micro, ranks)
    assert got == expected and (global_batch // ranks) % got == 0 and got <= micro


def test_bad_ranks_and_arms_are_refused_with_the_fix(tmp_path):
    with pytest.raises(ExportError, match="cannot be split evenly over 3 ranks"):
        micro_batch_for(8, 8, 3)
    record = make_record(tmp_path)
    spec = experiment_from_dict(record.spec["experiment"])
    check_arm(spec, "optimizer.name=lamb")
    with pytest.raises(ExportError, match="its arms are optimizer.name=adamw, optimizer.name=lamb"):
        check_arm(spec, "optimizer.name=sgd")


# --------------------------------------------------------------------------- text that must not break the file

# Every character that ends a line for YAML or Python's str.splitlines, ones YAML cannot carry, and YAML syntax.
NASTY = ["\x85", "\x96", "\u2028", "\u2029", "\x00", "\n", "\r\n", "\x0b", "\x0c", "\x1c", "\x7f", "\t", "\ufeff",
         "\udc80", "'", '"', " # not a comment", ": x", "- [", "&a *a !!python/object"]  # fmt: skip
# Those a comment shows as escapes: all but U+FEFF (which YAML carries, and no one splits a line at) and syntax.
ESCAPED = "\x85\x96\u2028\u2029\x00\n\r\x0b\x0c\x1c\x7f\t\udc80"


def nasty_record(tmp_path, text: str) -> ExperimentRecord:
    """An experiment whose stored text carries `text` everywhere a user can put it: a path in the overrides, the
    choices of a tuned string field, and (as if read from an older database) the experiment's name."""
    in_path = text.replace("\x00", "0")  # a file name cannot hold NUL; a string field can
    record = make_record(
        tmp_path,
        overrides={**tiny_overrides(tmp_path / "data"), "budget.max_samples": 480, "log.jsonl": f"log{in_path}.jsonl"},
        space={
            "optimizer.name": {"choice": ["adamw", "lamb"]},
            "optimizer.lr": {"float": [1e-4, 1e-2]},
            "model.init_checkpoint": {"choice": ["plain.bin", f"ckpt{text}.bin"]},
        },
    )
    return dataclasses.replace(record, name=f"exp{text}name")


def nasty_trial(text: str) -> TrialRecord:
    params = {"optimizer.name": "lamb", "optimizer.lr": 0.004, "model.init_checkpoint": f"ckpt{text}.bin"}
    return dataclasses.replace(make_trial(params=params, reached=False), arm=f"optimizer.name=lamb{text}")


def comment_block(text: str, body: str) -> list[str]:
    """The lines before `body` in `text`, split wherever YAML or Python would end a line."""
    assert text.endswith(body)
    head = text[: len(text) - len(body)]
    lines = head.splitlines()
    assert len(lines) == head.count("\n")  # no line break but "\n": neither Python nor YAML sees another line
    return lines


@pytest.mark.parametrize("text", NASTY, ids=ascii)
def test_no_stored_text_breaks_the_exported_yaml_and_the_trainer_loads_it(tmp_path, text):
    record, trial = nasty_record(tmp_path, text), nasty_trial(text)
    config_path = f"my 'best' \"{text.isprintable() and text or 'x'}\" ü.yaml"
    exported = render(record, trial, "yaml", config_path=config_path)
    expected = trial_config(experiment_from_dict(record.spec["experiment"]), trial.params).model_dump(mode="json")
    expected["log"]["mlperf"] = MLPERF_LOG
    assert yaml.safe_load(exported.text) == expected  # the comments are comments, the config round-trips
    assert expected["model"]["init_checkpoint"] == f"ckpt{text}.bin"
    lines = comment_block(exported.text, yaml.safe_dump(expected, sort_keys=False))
    assert all(line.startswith("#") for line in lines)
    shown = "".join(ascii(c)[1:-1] if c in ESCAPED else c for c in text)
    assert f"# trial 3, arm optimizer.name=lamb{shown}" in lines
    run = lines[-1].removeprefix("# run: ")
    assert shlex.split(run)[-1] == config_path  # the run line names the path exactly, quoted for the shell

    path = tmp_path / "best.yaml"
    path.write_text(exported.text)
    assert load_config(path).model_dump(mode="json") == expected  # what `python -m trainer --config` reads

    body = json.loads(render(record, trial, "json", config_path=config_path).text)
    assert body["config"] == expected and body["provenance"]["experiment"] == record.name
    command = render(record, trial, "torchrun", nodes=2, config_path=config_path).text
    assert all(line.startswith("#") for line in comment_block(command, command.splitlines(True)[-1]))
    tokens = shlex.split(command, comments=True)
    assert tokens[0] == "torchrun" and tokens[-2:] == ["--config", config_path]


@pytest.mark.parametrize("bad", ["\x00", "\n", "\r", "\x0b", "\x0c", "\x1c", "\x1e", "\x7f", "\x85", "\x96",
                                 "\u2028", "\u2029", "\t", "\udc80", "\uffff"], ids=ascii)  # fmt: skip
def test_a_config_path_with_control_or_line_break_characters_is_refused(tmp_path, bad):
    record = make_record(tmp_path)
    for fmt in FORMATS:
        with pytest.raises(ExportError, match=rf"config path .* character {re.escape(repr(bad))} \(position 4\)"):
            render(record, make_trial(), fmt, config_path=f"best{bad}.yaml")
    if bad != "\udc80":  # the API's pattern says the same (a query string, decoded from UTF-8, has no surrogate)
        assert re.fullmatch(CONFIG_PATH_PATTERN, f"best{bad}.yaml") is None
    assert re.fullmatch(CONFIG_PATH_PATTERN, "runs/my best 'ü' \"x\".yaml")


def test_an_export_with_line_breaks_in_its_data_path_trains(tmp_path, monkeypatch, capsys):
    from trainer.__main__ import main as trainer_main

    text = "\u2028\x85\x96\n'\" # :"
    record = make_record(tmp_path, overrides=tiny_overrides(tmp_path / f"da{text}ta", **{"budget.max_samples": 16}))
    path = tmp_path / "best.yaml"
    path.write_text(render(record, make_trial(), "yaml").text)
    monkeypatch.chdir(tmp_path)  # where the command runs: its MLPerf log is written there
    capsys.readouterr()
    code = trainer_main(["--config", str(path)])  # `python -m trainer --config PATH`, in this process
    trained = capsys.readouterr()
    assert code == 0, trained.err
    final = json.loads([line for line in trained.out.splitlines() if line.startswith("{")][-1])
    assert final["status"] in ("reached_target", "budget_exhausted") and final["samples"] >= 16
    # The exported config's MLPerf log, where the command ran, passes MLPerf's own checker (open division).
    checked = subprocess.run([sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
                              "--ruleset", "5.0.0", "--log_output", str(tmp_path / "checker.log"),
                              str(tmp_path / MLPERF_LOG)], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert checked.returncode == 0 and "SUCCESS" in checked.stderr, checked.stdout + checked.stderr


# --------------------------------------------------------------------------- the command line: ranks and files


def pilot_db(tmp_path) -> str:
    """A database holding experiment `pilot` (global batch 32, micro batch 4) with completed trials of both arms."""
    from tests.hpo.plan.test_plan import write_pilot

    write_pilot(tmp_path / "pilot.db", "pilot", {"adamw": [(9000, [])], "lamb": [(8000, [])]})
    return f"sqlite:///{tmp_path / 'pilot.db'}"


def trainer_steps(config: dict, ranks: int) -> int:
    """The accumulation steps the trainer runs `config` with on `ranks` ranks (its own check; ConfigError if none)."""
    from trainer.distributed import DistEnv
    from trainer.preflight import accumulation_steps

    return accumulation_steps(TrainerConfig.model_validate(config), DistEnv(world_size=ranks, local_world_size=1))


def test_the_torchrun_line_refuses_a_config_file_exported_for_other_ranks(tmp_path, capsys):
    """A YAML exported for one rank (micro batch 4 of global batch 32) cannot run on 2 x 8 ranks (2 sequences a
    rank): the torchrun line naming it is refused, nothing is written; exported for those ranks, it runs there."""
    from hpo.cli.main import main

    db, best, line = pilot_db(tmp_path), tmp_path / "best.yaml", tmp_path / "run.sh"
    assert main(["--db", db, "export", "pilot", "-o", str(best)]) == 0
    one_rank = yaml.safe_load(best.read_text())
    assert one_rank["batch"] == {"global_batch_size": 32, "micro_batch_size": 4} and trainer_steps(one_rank, 1) == 8
    with pytest.raises(ConfigError):  # what torchrun would meet on 16 ranks: 32 is no multiple of 4 x 16
        trainer_steps(one_rank, 16)
    capsys.readouterr()
    torchrun = ["--db", db, "export", "pilot", "--format", "torchrun", "--nodes", "2", "--gpus-per-node", "8",
                "--config-path", str(best), "-o", str(line)]  # fmt: skip
    assert main(torchrun) == 2 and not line.exists()
    err = capsys.readouterr().err
    assert f"{best} has batch.micro_batch_size 4" in err and "16 ranks" in err
    assert "hpo export pilot --nodes 2 --gpus-per-node 8 -o" in err and "Traceback" not in err
    assert main(["--db", db, "export", "pilot", "--nodes", "2", "--gpus-per-node", "8", "-o", str(best)]) == 0
    sixteen = yaml.safe_load(best.read_text())
    assert sixteen["batch"] == {"global_batch_size": 32, "micro_batch_size": 2} and trainer_steps(sixteen, 16) == 1
    assert main(torchrun) == 0
    assert line.read_text().splitlines()[-1].startswith("torchrun --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d")


def test_an_empty_config_path_or_a_folder_is_refused_from_the_command_line(tmp_path, capsys):
    from hpo.cli.main import main

    db = pilot_db(tmp_path)
    assert main(["--db", db, "export", "pilot", "--format", "torchrun", "--config-path", ""]) == 2
    captured = capsys.readouterr()
    assert "the config path is empty" in captured.err and captured.out == ""
    folder = tmp_path / "configs"
    folder.mkdir()  # a torchrun line naming a folder could only fail ("config file ... is a directory")
    assert main(["--db", db, "export", "pilot", "--format", "torchrun", "--config-path", str(folder)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (
        f"error: --config-path {folder} is a directory: name the config file the torchrun line runs (e.g. "
        f"--config-path {folder / 'best.yaml'})\n"
    )


@pytest.mark.parametrize("nodes, gpus", [(1, 1), (1, 4), (2, 2), (2, 4)])
def test_every_export_says_how_its_global_batch_splits(tmp_path, nodes, gpus):
    record, trial = make_record(tmp_path), make_trial()  # global batch 8, micro batch 8 (tiny_overrides)
    ranks = nodes * gpus
    for fmt in ("yaml", "torchrun"):
        text = render(record, trial, fmt, nodes=nodes, gpus_per_node=gpus).text
        config = json.loads(render(record, trial, "json", nodes=nodes, gpus_per_node=gpus).text)["config"]
        micro, steps = 8 // ranks, trainer_steps(config, ranks)
        assert config["batch"] == {"global_batch_size": 8, "micro_batch_size": micro} and micro * ranks * steps == 8
        assert (f"# batch: global_batch_size 8 = micro_batch_size {micro} x {ranks} rank(s) x {steps} accumulation "
                f"step(s)") in text.splitlines()  # fmt: skip


def test_an_output_file_that_is_not_an_earlier_export_is_not_replaced(tmp_path, capsys):
    """-o replaces what an earlier export wrote (in each format: exporting again updates it) and refuses anything
    else, which is left byte for byte as it was."""
    from hpo.cli.main import main

    db = pilot_db(tmp_path)
    for fmt in FORMATS:
        out = tmp_path / f"best.{fmt}"
        assert main(["--db", db, "export", "pilot", "--format", fmt, "-o", str(out)]) == 0
        first = out.read_bytes()
        out.write_bytes(first.replace(b"pilot", b"pilot", 1) + b"\n")  # an earlier export, touched
        assert main(["--db", db, "export", "pilot", "--format", fmt, "-o", str(out)]) == 0
        assert out.read_bytes() == first
    capsys.readouterr()
    mine = tmp_path / "mine.yaml"
    for text in (b"model:\n  hidden_size: 64\n", b"# Best configuration of my own\n", b"\n", b"\xff\xfe",
                 b'{"config": {}}'):  # fmt: skip
        mine.write_bytes(text)
        assert main(["--db", db, "export", "pilot", "-o", str(mine)]) == 2
        assert mine.read_bytes() == text
        err = capsys.readouterr().err
        assert f"-o {mine}: exists and is not an earlier `hpo export`" in err and "Traceback" not in err
    mine.write_bytes(b"")  # nothing to lose: an empty file (a shell's `>` made it) is written
    assert main(["--db", db, "export", "pilot", "-o", str(mine)]) == 0 and mine.read_text().startswith("# Best")


def test_the_trainer_given_a_json_export_says_its_config_member_is_the_config(tmp_path, capsys):
    """`hpo export --format json -o best.json && python -m trainer --config best.json` listed provenance, warnings,
    command and config, each with a whole dump of its value, as unknown keys of a trainer config. The trainer says
    the file is a JSON export and where its config is; that member, on its own, is a config the trainer runs."""
    from hpo.cli.main import main
    from trainer.__main__ import main as trainer_main

    db, exported = pilot_db(tmp_path), tmp_path / "best.json"
    assert main(["--db", db, "export", "pilot", "--format", "json", "-o", str(exported)]) == 0
    capsys.readouterr()
    assert trainer_main(["--config", str(exported), "--print-config"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {exported} is an `hpo export --format json` answer") and "unknown key" not in err
    config = tmp_path / "config.json"
    config.write_text(json.dumps(json.loads(exported.read_text())["config"]))
    assert load_config(config) == TrainerConfig.model_validate(json.loads(config.read_text()))


def test_a_yaml_written_to_one_file_whose_run_line_names_another_says_so(tmp_path, monkeypatch, capsys):
    """`-o a.yaml --config-path b.yaml` wrote a.yaml and said `run it with: torchrun ... --config b.yaml`, a file
    that is not there, and no more: the next line says that the command names b.yaml, not the file written. Where -o
    is the config path (by default, or the same file by another name), the command is the last line."""
    from hpo.cli.main import main

    db = pilot_db(tmp_path)
    monkeypatch.chdir(tmp_path)

    def after_run_line(*args: str) -> list[str]:
        assert main(["--db", db, "export", "pilot", *args]) == 0
        lines = capsys.readouterr().err.splitlines()
        command = (tmp_path / "a.yaml").read_text().split("# run: ", 1)[1].splitlines()[0]
        at = lines.index(f"run it with: {command}")  # the command alone, to paste
        return lines[at + 1 :]

    assert after_run_line("-o", "a.yaml", "--config-path", "b.yaml") == [
        "that command names b.yaml, as --config-path asked, not a.yaml, the file written"
    ]
    assert not (tmp_path / "b.yaml").exists()
    for args in (["-o", "a.yaml"], ["-o", "a.yaml", "--config-path", "./a.yaml"]):
        assert after_run_line(*args) == []


def test_an_earlier_export_replaced_by_o_is_said_with_what_it_held(tmp_path, capsys):
    """-o over an earlier export replaced it without a word (`wrote json of trial 1 (...) to best.yaml`), whatever
    it held: the YAML config a torchrun line runs, say. The line says what it replaced, in each format; a file that
    was not there is only written."""
    from hpo.cli.main import main

    db, out = pilot_db(tmp_path), tmp_path / "best.yaml"
    assert main(["--db", db, "export", "pilot", "--format", "json"]) == 0
    trial = json.loads(capsys.readouterr().out)["provenance"]["trial"]
    assert main(["--db", db, "export", "pilot", "-o", str(out)]) == 0
    assert "replacing" not in capsys.readouterr().err
    previous = "yaml"
    for fmt in ("json", "torchrun", "yaml", "yaml"):
        paths = ["--config-path", "other.yaml"] if fmt == "torchrun" else []
        assert main(["--db", db, "export", "pilot", "--format", fmt, *paths, "-o", str(out)]) == 0
        wrote = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("wrote "))
        assert wrote.startswith(f"wrote {fmt} of trial {trial} (")
        assert wrote.endswith(f"to {out}, replacing a {previous} export of trial {trial} of experiment pilot there")
        previous = fmt


@pytest.mark.parametrize("config_path", [None, "best.yaml", "./best.yaml"])
def test_a_torchrun_line_is_not_written_over_the_config_it_runs(tmp_path, monkeypatch, capsys, config_path):
    """`--format torchrun -o best.yaml` replaced the exported config best.yaml with a line that runs
    `--config best.yaml` (the default config path): the config was lost and the line ran a shell line as its
    config. It is refused before anything is read or written, naming both options."""
    from hpo.cli.main import main

    db = pilot_db(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["--db", db, "export", "pilot", "-o", "best.yaml"]) == 0
    config = (tmp_path / "best.yaml").read_bytes()
    capsys.readouterr()
    paths = ["--config-path", config_path] if config_path else []
    assert main(["--db", db, "export", "pilot", "--format", "torchrun", *paths, "-o", "best.yaml"]) == 2
    assert (tmp_path / "best.yaml").read_bytes() == config
    err = capsys.readouterr().err
    assert "-o best.yaml: is the config file the torchrun line runs" in err and "Traceback" not in err
    assert main(["--db", db, "export", "pilot", "--format", "torchrun", *paths, "-o", "run.sh"]) == 0
    assert (tmp_path / "run.sh").read_text().splitlines()[-1].endswith("--config best.yaml" if not config_path else
                                                                        f"--config {config_path}")  # fmt: skip


def test_a_refused_export_says_why_before_any_warning_and_writes_nothing(tmp_path, monkeypatch, capsys):
    """Every refusal of `hpo export`'s arguments, on an experiment whose export warns (simulated; and for 2 CPU
    ranks): the error, exit 2, nothing on stdout, no `warning:` line before or after it, and no file written. A file
    that cannot be written (/dev/full: a full disk) was said after the warnings of the export that did not happen."""
    from hpo.cli.main import main

    db = lucky_loser_db(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["--db", db, "export", "lucky", "--gpus-per-node", "2", "-o", "two.yaml"]) == 0
    assert main(["--db", db, "export", "lucky", "-o", "best.yaml"]) == 0  # one rank: micro batch 4 of 32
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
    assert len(warned) == 3  # simulated and 2 CPU ranks, then simulated: these exports warn
    (tmp_path / "mine.yaml").write_text("model:\n  hidden_size: 64\n")
    torchrun = ["--format", "torchrun"]
    refusals = [
        (["lucky", *torchrun, "-o", "best.yaml"], "-o best.yaml: is the config file the torchrun line runs"),
        (["lucky", *torchrun, "--gpus-per-node", "2", "--config-path", "two.yaml", "-o", "two.yaml"],
         "-o two.yaml: is the config file the torchrun line runs"),
        (["lucky", "-o", "missing/best.yaml"], "the directory missing does not exist"),
        (["lucky", "-o", "."], "-o .: is a directory"),
        (["lucky", "-o", "mine.yaml"], "-o mine.yaml: exists and is not an earlier `hpo export`"),
        (["nope", "-o", "nope.yaml"], "nope"),
        (["lucky", "--arm", "optimizer.name=sgd", "-o", "sgd.yaml"], "has no arm 'optimizer.name=sgd'"),
        (["lucky", "--batch-size", "64", "-o", "64.yaml"], "no completed trial with global batch size 64"),
        (["lucky", "--gpus-per-node", "3", "-o", "three.yaml"], "cannot be split evenly over 3 ranks"),
        (["lucky", *torchrun, "--gpus-per-node", "2", "--config-path", ""], "the config path is empty"),
        (["lucky", *torchrun, "--nodes", "2", "--gpus-per-node", "8", "--config-path", "best.yaml", "-o", "run.sh"],
         "best.yaml has batch.micro_batch_size 4 of batch.global_batch_size 32"),
        (["lucky", *torchrun, "--gpus-per-node", "2", "-o", "/dev/full"], "-o /dev/full: cannot write it"),
    ]  # fmt: skip
    if not Path("/dev/full").exists():
        refusals.pop()
    files = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    for command, message in refusals:
        assert main(["--db", db, "export", *command]) == 2, command
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.startswith("error: ") and message in captured.err, command
        assert "warning" not in captured.err.lower() and "Traceback" not in captured.err, command
        assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == files, command


# --------------------------------------------------------------------------- which trial: the verdict's winner


def lucky_loser_db(tmp_path) -> str:
    """Experiment `lucky`: AdamW's tuning trial reached the target after 5,000 samples (a lucky seed: the best trial
    overall), its three confirmation runs after about 9,000; LAMB's tuning trial and confirmation runs after about
    6,000. The verdict (computed in the test from these numbers) names LAMB."""
    from hpo.experiment import stored_form
    from hpo.storage import SqlStorage
    from hpo.trials import TrialKind, TrialResult, TrialSpec
    from tests.hpo.plan.test_plan import small_preset

    runs = {"adamw": (5000, [9000, 9100, 8950]), "lamb": (6100, [6000, 6050, 5950])}
    spec = experiment_from_dict(small_preset(name="lucky"), "lucky.yaml")
    db = f"sqlite:///{tmp_path / 'lucky.db'}"
    with SqlStorage(db, upgrade=True) as storage:
        eid = storage.create_experiment("lucky", stored_form(spec, tmp_path / "lucky"), spec.direction)
        for optimizer, (tuning, confirmations) in runs.items():
            params = {"optimizer.name": optimizer, "optimizer.lr": 1e-3, "schedule.warmup_steps": 0}
            for seed, samples in [(None, tuning)] + list(enumerate(confirmations, start=1001)):
                kind = TrialKind.TUNING if seed is None else TrialKind.CONFIRMATION
                trial_id = storage.create_trial(eid, TrialSpec(None, params, f"optimizer.name={optimizer}", 1.0, (),
                                                               32, kind, seed))  # fmt: skip
                storage.mark_trial_running(trial_id, pid=1, host="h")
                storage.finish_trial(trial_id, TrialResult(TrialState.COMPLETED, objective=float(samples),
                                                           samples_to_target=samples, best_mlm_accuracy=0.13,
                                                           metrics={"samples": 12288}))  # fmt: skip
    return db


def test_without_an_arm_the_export_is_the_best_trial_of_the_verdicts_winner(tmp_path, capsys):
    """The best trial overall is AdamW's lucky tuning run, but the confirmation runs name LAMB: `hpo export` and the
    API export LAMB's best trial (the best of its tuning trials, as `hpo best --arm` gives it), and say why; so does
    an export at the batch size the confirmation runs trained at (the verdict compared them there); an arm asked for
    still gets what was asked."""
    from hpo.cli.main import main
    from hpo.evidence.verdict import ArmRuns, Outcome, decide

    verdict = decide([ArmRuns("optimizer.name=adamw", (9000, 9100, 8950), 12288),
                      ArmRuns("optimizer.name=lamb", (6000, 6050, 5950), 12288)])  # fmt: skip
    assert verdict.outcome is Outcome.WINNER and verdict.winner == "optimizer.name=lamb"  # the premise
    db = lucky_loser_db(tmp_path)
    assert main(["--db", db, "best", "lucky"]) == 0
    assert "optimizer.name: adamw" in capsys.readouterr().out  # the best trial overall: AdamW's lucky run

    def exported(*args: str) -> dict:
        assert main(["--db", db, "export", "lucky", "--format", "json", *args]) == 0
        return json.loads(capsys.readouterr().out)["provenance"]

    winner = exported()
    assert (winner["arm"], winner["samples_to_target"]) == ("optimizer.name=lamb", 6100)  # LAMB's tuning trial
    assert winner["chosen"] == "the best trial of the verdict's winner"
    asked = exported("--arm", "optimizer.name=adamw")
    assert (asked["arm"], asked["samples_to_target"], asked["chosen"]) == (
        "optimizer.name=adamw", 5000, "the best trial of the arm asked for")  # fmt: skip
    at_batch = exported("--batch-size", "32")  # every arm's confirmed configuration trained at 32: the same verdict
    assert (at_batch["arm"], at_batch["samples_to_target"]) == ("optimizer.name=lamb", 6100)
    assert at_batch["chosen"] == "the best trial of the verdict's winner at the global batch size asked for"
    assert main(["--db", db, "export", "lucky"]) == 0
    comments = capsys.readouterr().out.splitlines()[:3]
    assert comments[1:] == ["# trial 4, arm optimizer.name=lamb", "# chosen as the best trial of the verdict's winner"]

    from fastapi.testclient import TestClient

    from server.app import create_app
    from server.settings import Settings

    with TestClient(create_app(Settings(database_url=db))) as client:
        answer = client.get("/api/v1/experiments/lucky/export", params={"format": "json"})
    assert answer.status_code == 200 and answer.json()["provenance"] == winner


def missed_db(tmp_path, lamb: int | None) -> str:
    """Experiment `missed`: an AdamW tuning trial that missed the target (its objective the miss's penalty) and a LAMB
    one that reached it after `lamb` samples (None: missed too); no confirmation runs, so no verdict."""
    from hpo.experiment import stored_form
    from hpo.storage import SqlStorage
    from hpo.trials import TrialResult, TrialSpec
    from tests.hpo.plan.test_plan import small_preset

    spec = experiment_from_dict(small_preset(name="missed"), "missed.yaml")
    db = f"sqlite:///{tmp_path / 'missed.db'}"
    with SqlStorage(db, upgrade=True) as storage:
        eid = storage.create_experiment("missed", stored_form(spec, tmp_path / "missed"), spec.direction)
        for optimizer, samples in (("adamw", None), ("lamb", lamb)):
            params = {"optimizer.name": optimizer, "optimizer.lr": 1e-3, "schedule.warmup_steps": 0}
            trial_id = storage.create_trial(eid, TrialSpec(None, params, f"optimizer.name={optimizer}", 1.0, (), 32))
            storage.mark_trial_running(trial_id, pid=1, host="h")
            storage.finish_trial(trial_id, TrialResult(TrialState.COMPLETED, objective=float(samples or 24576),
                                                       samples_to_target=samples, best_mlm_accuracy=0.13 if samples
                                                       else 0.09, metrics={"samples": 12288}))  # fmt: skip
    return db


def test_a_best_that_missed_the_target_says_of_which_trials_none_reached_it(tmp_path, capsys):
    """AdamW's best missed the target and LAMB's reached it: `--arm optimizer.name=adamw` warned that no trial of the
    experiment reached the target, which LAMB's trial had. The warning names the arm (and a batch size asked for),
    on the console, in the file and from the API; a miss of every trial is still the experiment's."""
    from fastapi.testclient import TestClient

    from hpo.cli.main import main
    from server.app import create_app
    from server.settings import Settings

    db = missed_db(tmp_path, lamb=6000)

    def warning(*args: str) -> str | None:
        assert main(["--db", db, "export", "missed", *args]) == 0
        out, err = capsys.readouterr()
        missed = [line.removeprefix("warning: ") for line in err.splitlines() if "reached the target" in line]
        assert [line.removeprefix("# WARNING: ") for line in out.splitlines() if "reached the target" in line
                and line.startswith("# WARNING")] == missed  # fmt: skip
        return missed[0] if missed else None

    assert warning() is None  # the best of any arm: LAMB's, which reached the target
    of_arm = warning("--arm", "optimizer.name=adamw")
    assert of_arm.startswith("no trial of arm optimizer.name=adamw of experiment missed reached the target")
    at_batch = warning("--arm", "optimizer.name=adamw", "--batch-size", "32")
    assert at_batch.startswith("no trial of arm optimizer.name=adamw at global batch size 32 of experiment missed ")
    with TestClient(create_app(Settings(database_url=db))) as client:
        answer = client.get("/api/v1/experiments/missed/export", params={"arm": "optimizer.name=adamw"})
    assert answer.status_code == 200 and of_arm in answer.headers.get_list("X-HPO-Warning")
    (tmp_path / "all").mkdir()
    db = missed_db(tmp_path / "all", lamb=None)  # what `warning` exports from now on
    assert warning().startswith("no trial of experiment missed reached the target mlm_accuracy")


def lucky_batch_db(tmp_path, lamb_64: tuple[int, list[int]] = (8100, [8000, 8050, 7950])) -> str:
    """Experiment `lucky_batch`, a batch-size study (AdamW and LAMB at global batch 32 and 64): at each batch size
    AdamW's tuning trial is a lucky seed (the best trial there), while LAMB's confirmation runs need a third fewer
    samples than AdamW's, so the verdict at each batch size (the report's) names LAMB. `lamb_64`: LAMB's tuning
    trial and confirmation runs at 64."""
    from hpo.experiment import stored_form
    from hpo.storage import SqlStorage
    from hpo.trials import TrialKind, TrialResult, TrialSpec

    data = {
        "name": "lucky_batch", "base_config": "demo_cpu",
        "overrides": {"eval.every_samples": 1024, "budget.max_samples": 12288},
        "space": {"optimizer.name": {"choice": ["adamw", "lamb"]}, "batch.global_batch_size": {"choice": [32, 64]},
                  "optimizer.lr": {"float": [1e-4, 1e-2], "log": True}},
        "objective": {"metric": "samples_to_target", "direction": "minimize"},
        "compare": ["optimizer.name", "batch.global_batch_size"],
        "tuner": {"name": "random", "seed": 0}, "budget": {"trials": 4, "confirm_seeds": 3},
        "resources": {"gpus": "none", "cpu_slots": 1},
    }  # fmt: skip
    runs = {("adamw", 32): (5000, [9000, 9100, 8950]), ("lamb", 32): (6100, [6000, 6050, 5950]),
            ("adamw", 64): (7000, [12000, 12100, 11950]), ("lamb", 64): lamb_64}  # fmt: skip
    spec = experiment_from_dict(data, "lucky_batch.yaml")
    db = f"sqlite:///{tmp_path / 'lucky_batch.db'}"
    with SqlStorage(db, upgrade=True) as storage:
        eid = storage.create_experiment("lucky_batch", stored_form(spec, tmp_path), spec.direction)
        for (optimizer, batch), (tuning, confirmations) in runs.items():
            params = {"optimizer.name": optimizer, "batch.global_batch_size": batch, "optimizer.lr": 1e-3}
            arm = f"optimizer.name={optimizer},batch.global_batch_size={batch}"
            for seed, samples in [(None, tuning)] + list(enumerate(confirmations, start=1001)):
                kind = TrialKind.TUNING if seed is None else TrialKind.CONFIRMATION
                trial_id = storage.create_trial(eid, TrialSpec(None, params, arm, 1.0, (), batch, kind, seed))
                storage.mark_trial_running(trial_id, pid=1, host="h")
                storage.finish_trial(trial_id, TrialResult(TrialState.COMPLETED, objective=float(samples),
                                                           samples_to_target=samples, best_mlm_accuracy=0.13,
                                                           metrics={"samples": 12288}))  # fmt: skip
    return db


def test_at_a_batch_size_of_a_batch_size_study_the_export_is_the_best_trial_of_the_verdicts_winner_there(
    tmp_path, capsys
):
    """In a batch-size study the question is answered at each batch size (the report's verdict at each batch size):
    `hpo export --batch-size N` and the API's export at N give the best trial of that verdict's winner at N, not the
    loser's lucky seed that is the best trial there; where the verdict there names no winner, the best trial of any
    arm, and the comment says so."""
    from fastapi.testclient import TestClient

    from hpo.cli.main import main
    from hpo.report.data import load_experiment
    from hpo.report.scaling import batch_verdicts, experiment_runs, scaling_points
    from server.app import create_app
    from server.settings import Settings

    db = lucky_batch_db(tmp_path)
    from hpo.storage import SqlStorage

    with SqlStorage(db) as storage:
        experiments = [load_experiment(storage, "lucky_batch", with_noise=False)]
    verdicts = batch_verdicts(scaling_points(experiments, experiment_runs(experiments)))
    assert {batch: v.winner for batch, v in verdicts.items()} == {32: "lamb", 64: "lamb"}  # the report's, the premise

    def exported(*args: str) -> dict:
        assert main(["--db", db, "export", "lucky_batch", "--format", "json", *args]) == 0
        return json.loads(capsys.readouterr().out)["provenance"]

    for batch, samples in ((32, 6100), (64, 8100)):
        assert main(["--db", db, "best", "lucky_batch", "--batch-size", str(batch)]) == 0
        out = capsys.readouterr().out
        assert "optimizer.name: adamw" in out  # the best trial there: AdamW's lucky seed
        assert out.startswith(f"batch.global_batch_size={batch}:\n")  # named by its batch size, not "overall"
        at_batch = exported("--batch-size", str(batch))
        assert (at_batch["arm"], at_batch["samples_to_target"]) == (
            f"optimizer.name=lamb,batch.global_batch_size={batch}", samples)  # fmt: skip
        assert at_batch["chosen"] == "the best trial of the verdict's winner at the global batch size asked for"
        with TestClient(create_app(Settings(database_url=db))) as client:
            answer = client.get("/api/v1/experiments/lucky_batch/export",
                                params={"format": "json", "global_batch_size": batch})  # fmt: skip
        assert answer.status_code == 200 and answer.json()["provenance"] == at_batch


def test_without_a_batch_size_a_batch_size_study_exports_by_the_verdict_at_a_batch_size_not_across_them(
    tmp_path, capsys
):
    """LAMB at 64 needs about as many samples as at 32, so the experiment's verdict, which compares every arm with
    every other across batch sizes too, names no winner; the verdict at each batch size (the study's question, the
    report's) names LAMB at both. `hpo export` without --batch-size exports at the batch size of the best trial of
    any arm (32: the fewest samples) the best trial of the winner there, LAMB's, not AdamW's lucky seed, and says
    so; the API alike."""
    from fastapi.testclient import TestClient

    from hpo.cli.main import main
    from hpo.evidence.confirmations import stored_verdict
    from hpo.experiment import spec_from_stored
    from hpo.storage import SqlStorage
    from server.app import create_app
    from server.settings import Settings

    db = lucky_batch_db(tmp_path, lamb_64=(6300, [6200, 5900, 6350]))
    with SqlStorage(db) as storage:
        record = storage.get_experiment_by_name("lucky_batch")
        assert stored_verdict(storage, record.id, spec_from_stored(record)).winner is None  # the premise
        assert storage.best_trial(record.id).arm == "optimizer.name=adamw,batch.global_batch_size=32"
    assert main(["--db", db, "export", "lucky_batch", "--format", "json"]) == 0
    exported = json.loads(capsys.readouterr().out)["provenance"]
    assert (exported["arm"], exported["samples_to_target"]) == ("optimizer.name=lamb,batch.global_batch_size=32", 6100)
    assert exported["chosen"] == (
        "the best trial of the verdict's winner at global batch size 32, that of the best "
        "trial of any arm (a batch-size study: --batch-size exports another size's)"
    )
    with TestClient(create_app(Settings(database_url=db))) as client:
        answer = client.get("/api/v1/experiments/lucky_batch/export", params={"format": "json"})
    assert answer.status_code == 200 and answer.json()["provenance"] == exported


@pytest.mark.parametrize("strategy", ["before_allreduce", "bucketwise", "after_allreduce"])
def test_per_rank_clipping_exported_for_other_ranks_than_the_trial_trained_on_warns(tmp_path, strategy):
    """A trial of 2 CPU ranks whose clipping acts on each rank's gradient: exported for 1 rank (the default) or 4 it
    clips another gradient than the one its max norm was tuned on, and the export says so; for 2 ranks, or with
    clipping after the all-reduce (the averaged gradient, whatever the ranks), it does not."""
    overrides = {**tiny_overrides(tmp_path / "data"), "log.jsonl": None, "budget.max_samples": 480,
                 "clipping.strategy": strategy, "clipping.max_norm": 0.5, "batch.micro_batch_size": 2}  # fmt: skip
    record = make_record(tmp_path, overrides=overrides, resources={"gpus": "none", "cpu_ranks_per_trial": 2})
    for ranks, nodes, per_node in ((1, 1, 1), (4, 2, 2), (2, 1, 2)):
        warnings = [w for w in render(record, make_trial(), "yaml", nodes=nodes, gpus_per_node=per_node).warnings
                    if "clipping.strategy" in w]  # fmt: skip
        if strategy == "after_allreduce" or ranks == 2:
            assert warnings == []
        else:
            assert warnings == [
                f"trial 3 trained on 2 rank(s) with clipping.strategy {strategy}, which clips each rank's gradient "
                f"before the ranks average them: on {ranks} rank(s) it clips another gradient than the one its "
                "clipping.max_norm was tuned on; export for 2 rank(s) (--nodes x --gpus-per-node) to train what was "
                "tuned"
            ]


def test_the_api_sends_every_warning_of_an_export_as_its_own_header(tmp_path):
    """A simulated experiment exported for 2 CPU ranks has two warnings: the API sent only the first."""
    from fastapi.testclient import TestClient

    from server.app import create_app
    from server.settings import Settings

    db = lucky_loser_db(tmp_path)
    with TestClient(create_app(Settings(database_url=db))) as client:
        answer = client.get("/api/v1/experiments/lucky/export", params={"gpus_per_node": 2, "format": "json"})
    assert answer.status_code == 200
    warnings = answer.json()["warnings"]
    assert len(warnings) == 2 and answer.headers.get_list("x-hpo-warning") == warnings


def test_the_apis_export_at_a_batch_size_with_no_trial_names_the_sizes_there_are(tmp_path, capsys):
    """As `hpo export --batch-size` does: the API's 404 said only that there was no trial and to read the list."""
    from fastapi.testclient import TestClient

    from hpo.cli.main import main
    from server.app import create_app
    from server.settings import Settings

    db = lucky_loser_db(tmp_path)  # every trial at global batch size 32
    assert main(["--db", db, "export", "lucky", "--batch-size", "64"]) == 2
    assert "its completed trials have global batch size 32: use --batch-size 32" in capsys.readouterr().err
    with TestClient(create_app(Settings(database_url=db))) as client:
        answer = client.get("/api/v1/experiments/lucky/export", params={"global_batch_size": 64})
        arm = client.get("/api/v1/experiments/lucky/export",
                         params={"global_batch_size": 64, "arm": "optimizer.name=lamb"})  # fmt: skip
    assert answer.status_code == 404 and answer.json()["detail"] == (
        "experiment lucky has no completed trial with global batch size 64 to export; its completed trials have "
        "global batch size 32: ask global_batch_size=32")  # fmt: skip
    assert arm.status_code == 404 and "its completed trials of arm optimizer.name=lamb have global batch size 32" in (
        arm.json()["detail"])  # fmt: skip
