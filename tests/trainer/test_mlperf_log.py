"""The MLPerf log (trainer/mlperf_log.py): which events it writes, that it is off by default and rank 0 only, and
that MLPerf's own compliance checker (`mlperf_logging.compliance_checker`, ruleset training 5.0.0) passes the
log of a real CPU training run. Every seed here is fixed in the config or the data: nothing is drawn at run time.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from tests.trainer.conftest import make_samples
from tests.trainer.test_train import run
from trainer.config import load_config
from trainer.data.shards import write_shard
from trainer.distributed import DistEnv
from trainer.errors import ConfigError
from trainer.mlperf_log import hyperparameters, open_log
from trainer.result import TrainResult, TrainStatus

RULESET = "5.0.0"
CHECKER = [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training", "--ruleset", RULESET]
RULES = Path(importlib.util.find_spec("mlperf_logging.compliance_checker").submodule_search_locations[0])
CPU = torch.device("cpu")

# The BERT keys every run logs once, whatever the optimizer (closed_bert.yaml asks for these).
BERT_KEYS = [
    "seed", "global_batch_size", "gradient_accumulation_steps", "max_sequence_length", "max_predictions_per_seq",
    "opt_name", "opt_base_learning_rate", "opt_lamb_epsilon", "opt_lamb_beta_1", "opt_lamb_beta_2",
    "opt_lamb_weight_decay_rate", "opt_lamb_learning_rate_decay_poly_power", "opt_learning_rate_warmup_steps",
    "num_warmup_steps", "start_warmup_step", "opt_learning_rate_training_steps", "opt_end_learning_rate",
    "opt_gradient_clipping",  # ours: the clipping strategy (opt_gradient_clip_norm follows where it clips)
]  # fmt: skip


def check(log: Path, directory: Path) -> subprocess.CompletedProcess:
    """`python -m mlperf_logging.compliance_checker --usage training --ruleset 5.0.0 LOG`, its report in `directory`."""
    return subprocess.run([*CHECKER, "--log_output", str(directory / "checker.log"), str(log)], capture_output=True,
                          text=True, timeout=120, cwd=directory)  # fmt: skip


def events(path: Path) -> list[dict]:
    lines = path.read_text().splitlines()
    assert all(line.startswith(":::MLLOG {") for line in lines), lines
    return [json.loads(line.removeprefix(":::MLLOG ")) for line in lines]


def values(path: Path) -> dict:
    """key -> value of the point-in-time events (each logged once)."""
    return {e["key"]: e["value"] for e in events(path) if e["event_type"] == "POINT_IN_TIME"}


def train_logged(directory: Path, **extra) -> tuple[TrainResult, Path]:
    """A seconds-long CPU run of the tiny model (2 evaluations, 4 steps) with log.mlperf set."""
    log = directory / "mlperf" / "result_0.txt"
    overrides = {"log.mlperf": str(log), "budget.max_samples": 32, "eval.every_samples": 16, **extra}
    result, _ = run(directory, **overrides)
    return result, log


def majority_token_shards(directory: Path) -> dict[str, str]:
    """Data on which the tiny model passes 0.720 masked-LM accuracy in 2 steps: 85 % of the masked labels are one
    token (7), so predicting it scores ~0.85 (< 1.0, as the rules also ask). Only the log is under test here."""
    dirs = {}
    for key, n, seed in (("data.train", 96, 0), ("data.eval", 32, 1)):
        rng = np.random.default_rng(seed)
        samples = make_samples(rng.integers(8, 65, n), 64, seed=seed)
        masked = samples.masked_lm_positions > 0
        samples.masked_lm_ids[masked & (rng.random(masked.shape) < 0.85)] = 7
        path = directory / f"majority-{key.split('.')[1]}" / "part-00000.h5"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_shard(path, samples)
        dirs[key] = str(path.parent)
    return dirs


@pytest.fixture(scope="module")
def lamb_run(tmp_path_factory) -> tuple[TrainResult, Path]:
    """One real LAMB run to the budget (no target reached), default submission settings (open division)."""
    return train_logged(tmp_path_factory.mktemp("lamb"))


# --------------------------------------------------------------------------- real runs, MLPerf's checker


def test_a_real_run_passes_mlperfs_compliance_checker_in_the_open_division(lamb_run, tmp_path):
    result, log = lamb_run
    assert result.status is TrainStatus.BUDGET_EXHAUSTED
    checked = check(log, tmp_path)
    output = checked.stdout + checked.stderr
    assert checked.returncode == 0, output
    assert "INFO - SUCCESS" in output and "WARNING" not in output
    for rules in ("common.yaml", "open_common.yaml", "open_bert.yaml"):  # the division's BERT rules were applied
        assert f"training_{RULESET}/{rules}" in output


def test_the_real_log_says_what_the_run_did(lamb_run):
    result, log = lamb_run
    seen = events(log)
    order = [e["key"] for e in seen if e["event_type"] != "POINT_IN_TIME"]
    assert order == ["init_start", "init_stop", "run_start",
                     "block_start", "eval_start", "eval_stop", "block_stop",
                     "block_start", "eval_start", "eval_stop", "block_stop", "run_stop"]  # fmt: skip
    keys = [e["key"] for e in seen]
    assert keys[:2] == ["cache_clear", "init_start"] and keys[-2:] == ["train_samples", "eval_samples"]
    assert keys.index("submission_benchmark") < keys.index("init_stop")
    assert all(keys.count(key) == 1 for key in BERT_KEYS)
    blocks = [e["metadata"] for e in seen if e["key"] == "block_start"]
    assert [(b["first_epoch_num"], b["epoch_count"]) for b in blocks] == [(0, 16), (16, 16)]  # in samples
    accuracy = [e for e in seen if e["key"] == "eval_accuracy"]
    assert [e["metadata"]["epoch_num"] for e in accuracy] == [16, 32]  # epoch_num counts training samples
    assert accuracy[-1]["value"] == pytest.approx(result.final_mlm_accuracy)
    assert next(e for e in seen if e["key"] == "run_stop")["metadata"]["status"] == "aborted"  # target missed
    logged = values(log)
    assert logged["submission_division"] == "open" and logged["submission_org"] == "bert-hpo"
    assert logged["submission_status"] == "research" and logged["submission_platform"].startswith("1xCPU")
    assert logged["cache_clear"] is False  # the trainer does not drop the OS caches
    assert logged["opt_name"] == "lamb" and logged["global_batch_size"] == 8
    assert logged["gradient_accumulation_steps"] == 2 and logged["max_sequence_length"] == 64
    assert logged["opt_learning_rate_training_steps"] == 4  # 32 samples / global batch 8
    assert logged["train_samples"] == result.samples == 32 and logged["eval_samples"] == 32


def test_the_checker_is_not_vacuous_the_same_log_claimed_closed_fails_only_on_the_target(lamb_run, tmp_path):
    _, log = lamb_run
    closed = tmp_path / "closed.txt"
    closed.write_text(log.read_text().replace('"key": "submission_division", "value": "open"',
                                              '"key": "submission_division", "value": "closed"'))  # fmt: skip
    checked = check(closed, tmp_path)
    output = checked.stdout + checked.stderr
    assert checked.returncode == 1 and "ERROR - FAILED" in output
    assert "training_5.0.0/closed_bert.yaml" in output
    failures = [line for line in output.splitlines() if "Failed checks" in line or "Required" in line]
    assert failures == ["WARNING -  Failed checks for eval_accuracy : (v['value'] >= 0.720) and v['value'] < 1.0"]


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                           reason="needs a CUDA GPU")])],
)  # fmt: skip
def test_a_run_that_reaches_the_closed_target_passes_the_closed_division(tmp_path, device):
    # AdamW at a high learning rate learns the majority token in 2 steps; the checker then sees a closed-division
    # log that reached 0.720 and stopped with status success.
    result, log = train_logged(
        tmp_path,
        device=device,
        **majority_token_shards(tmp_path),
        **{"optimizer.name": "adamw", "optimizer.lr": 1e-2, "eval.target_mlm_accuracy": 0.72},
        **{"log.mlperf_submission.division": "closed", "log.mlperf_submission.cache_cleared": True},
        **{"clipping.strategy": "bucketwise"},  # its two keys (ours and mllog's) are no reason to fail the check
    )
    assert result.status is TrainStatus.REACHED_TARGET and 0.72 <= result.best_mlm_accuracy < 1.0
    checked = check(log, tmp_path)
    output = checked.stdout + checked.stderr
    assert checked.returncode == 0, output
    assert "training_5.0.0/closed_bert.yaml" in output and "INFO - SUCCESS" in output
    seen = events(log)
    assert next(e for e in seen if e["key"] == "run_stop")["metadata"]["status"] == "success"
    logged = values(log)
    assert logged["submission_division"] == "closed" and logged["cache_clear"] is True
    assert logged["opt_name"] == "adamw" and logged["opt_lamb_beta_2"] == 0.999  # AdamW's values, LAMB's keys
    assert (logged["opt_gradient_clipping"], logged["opt_gradient_clip_norm"]) == ("bucketwise", 1.0)
    if device == "cuda":
        assert logged["submission_platform"] == f"1x{torch.cuda.get_device_name()}"


# --------------------------------------------------------------------------- the module on its own


def config(*overrides: str, path: Path | None = None):
    return load_config(None, [*([f"log.mlperf={path}"] if path else []), *overrides])


def write_a_run(log, status: TrainStatus = TrainStatus.BUDGET_EXHAUSTED) -> None:
    """The calls train.py makes, for a run of 24 samples: evaluation at 16, budget 24, no checkpoint."""
    log.run_start(2, 3, make_samples([10, 20], seq_len=64, max_pred=8), make_samples([12, 30, 40]))
    log.training(0, 16)
    log.training(8, 16)  # a block is open: nothing
    log.eval_start(16)
    log.eval_stop(16, 0.25)
    log.training(16, 32)  # the budget (24) ends this block before the next evaluation
    log.run_stop(TrainResult(status=status, samples=24))


def test_lamb_values_under_the_bert_rules_keys():
    cfg = config("optimizer.name=lamb", "optimizer.lr=0.0035", "optimizer.eps=1e-6", "optimizer.beta1=0.6",
                 "optimizer.beta2=0.7", "optimizer.weight_decay=0.01", "schedule.warmup_steps=100",
                 "schedule.start_warmup_step=-76", "schedule.power=1.0", "batch.global_batch_size=448",
                 "batch.micro_batch_size=56", "seed=7")  # fmt: skip
    assert hyperparameters(cfg, accumulation=1, total_steps=7100, max_sequence_length=512, max_predictions=76) == {
        "seed": 7, "global_batch_size": 448, "gradient_accumulation_steps": 1, "max_sequence_length": 512,
        "max_predictions_per_seq": 76, "opt_name": "lamb", "opt_base_learning_rate": 0.0035,
        "opt_lamb_epsilon": 1e-6, "opt_lamb_beta_1": 0.6, "opt_lamb_beta_2": 0.7, "opt_lamb_weight_decay_rate": 0.01,
        "opt_lamb_learning_rate_decay_poly_power": 1.0, "opt_learning_rate_warmup_steps": 100,
        "num_warmup_steps": 100, "start_warmup_step": -76, "opt_learning_rate_training_steps": 7100,
        "opt_end_learning_rate": 0.0, "opt_gradient_clipping": "none",
    }  # fmt: skip
    assert list(hyperparameters(cfg, 1, 7100, 512, 76)) == BERT_KEYS


def test_adamw_fills_the_same_keys_with_its_own_values():
    cfg = config("optimizer.name=adamw", "optimizer.lr=0.0005", "optimizer.eps=1e-8", "optimizer.beta1=0.85",
                 "optimizer.beta2=0.98", "optimizer.weight_decay=0.1", "schedule.total_steps=900",
                 "schedule.power=0.5", "schedule.end_lr=1e-5")  # fmt: skip
    logged = hyperparameters(cfg, accumulation=4, total_steps=123, max_sequence_length=128, max_predictions=20)
    assert list(logged) == BERT_KEYS
    assert logged["opt_name"] == "adamw" and logged["opt_base_learning_rate"] == 0.0005
    assert (logged["opt_lamb_epsilon"], logged["opt_lamb_beta_1"], logged["opt_lamb_beta_2"]) == (1e-8, 0.85, 0.98)
    assert logged["opt_lamb_weight_decay_rate"] == 0.1 and logged["opt_lamb_learning_rate_decay_poly_power"] == 0.5
    assert logged["opt_learning_rate_training_steps"] == 900  # schedule.total_steps wins over the budget's steps
    assert logged["opt_end_learning_rate"] == 1e-5 and logged["gradient_accumulation_steps"] == 4


def required_keys() -> list[set[str]]:
    """What training 5.0.0's common, closed_common and closed_bert rules require: for each rule, the keys of
    which at least one must be logged (REQ EXACTLY_ONE / AT_LEAST_ONE / AT_LEAST_ONE_OR(...))."""
    required = []
    for name in ("common.yaml", "closed_common.yaml", "closed_bert.yaml"):
        for rule in yaml.safe_load((RULES / f"training_{RULESET}" / name).read_text()):
            key = rule.get("KEY")
            if key is None or "REQ" not in key:
                continue
            req = key["REQ"]
            if req.startswith("AT_LEAST_ONE_OR("):
                required.append({key["NAME"], *(k.strip() for k in req[len("AT_LEAST_ONE_OR(") : -1].split(","))})
            else:
                assert req in ("EXACTLY_ONE", "AT_LEAST_ONE"), req
                required.append({key["NAME"]})
    return required


@pytest.mark.parametrize("strategy", ["none", "after_allreduce", "before_allreduce", "bucketwise"])
def test_the_clipping_strategy_and_where_it_clips_its_threshold_are_logged(strategy):
    logged = hyperparameters(config(f"clipping.strategy={strategy}", "clipping.max_norm=0.5"), 1, 10, 128, 20)
    clipping = {k: v for k, v in logged.items() if "clip" in k}
    assert clipping == ({"opt_gradient_clipping": "none"} if strategy == "none" else
                        {"opt_gradient_clipping": strategy, "opt_gradient_clip_norm": 0.5})  # fmt: skip


@pytest.mark.parametrize("optimizer", ["lamb", "adamw"])
def test_every_key_the_closed_bert_rules_require_is_written(tmp_path, optimizer):
    path = tmp_path / "log.txt"
    write_a_run(open_log(config(f"optimizer.name={optimizer}", path=path), DistEnv(), CPU))
    written = [e["key"] for e in events(path)]
    required = required_keys()
    assert len(required) > 20 and {"opt_lamb_epsilon"} in required and {"cache_clear"} in required
    assert [r for r in required if not r & set(written)] == []
    exactly_once = ["submission_division", "submission_benchmark", "init_stop", "run_start", "run_stop",
                    "train_samples", "eval_samples", "gradient_accumulation_steps", *BERT_KEYS]  # fmt: skip
    assert [k for k in exactly_once if written.count(k) != 1] == []


@pytest.mark.parametrize(("status", "mlperf_status"), [(TrainStatus.REACHED_TARGET, "success"),
                                                       (TrainStatus.BUDGET_EXHAUSTED, "aborted"),
                                                       (TrainStatus.DIVERGED, "aborted"),
                                                       (TrainStatus.FAILED, "aborted")])  # fmt: skip
def test_blocks_and_the_run_stop_status(tmp_path, status, mlperf_status):
    path = tmp_path / "log.txt"
    write_a_run(open_log(config(path=path), DistEnv(), CPU), status)
    seen = [(e["key"], e["metadata"]) for e in events(path) if e["event_type"] != "POINT_IN_TIME"]
    meta = [(key, {k: v for k, v in m.items() if k not in ("file", "lineno")}) for key, m in seen]
    assert meta == [
        ("init_start", {}), ("init_stop", {}), ("run_start", {}),
        ("block_start", {"first_epoch_num": 0, "epoch_count": 16}),
        ("eval_start", {"epoch_num": 16}), ("eval_stop", {"epoch_num": 16}), ("block_stop", {"first_epoch_num": 0}),
        ("block_start", {"first_epoch_num": 16, "epoch_count": 16}),  # until the next evaluation, at 32
        ("block_stop", {"first_epoch_num": 16}),  # still open when the run ends: closed before run_stop
        ("run_stop", {"status": mlperf_status}),
    ]  # fmt: skip
    logged = values(path)
    assert logged["eval_accuracy"] == 0.25 and logged["train_samples"] == 24 and logged["eval_samples"] == 3
    assert logged["max_sequence_length"] == 64 and logged["max_predictions_per_seq"] == 8


def test_a_block_ends_at_the_budget_when_that_comes_before_the_next_evaluation(tmp_path):
    path = tmp_path / "log.txt"
    log = open_log(config("budget.max_samples=24", path=path), DistEnv(), CPU)
    log.run_start(1, 3, make_samples([10]), make_samples([10]))
    log.training(16, 32)
    starts = [e["metadata"] for e in events(path) if e["key"] == "block_start"]
    assert (starts[0]["first_epoch_num"], starts[0]["epoch_count"]) == (16, 8)


def test_off_by_default_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    cfg = config()
    assert cfg.log.mlperf is None
    log = open_log(cfg, DistEnv(), CPU)
    assert not log.enabled
    write_a_run(log)
    assert list(tmp_path.iterdir()) == []
    assert capsys.readouterr() == ("", "")


def test_only_rank_0_writes(tmp_path, capsys):
    path = tmp_path / "mlperf" / "result_0.txt"
    other = open_log(config(path=path), DistEnv(rank=1, world_size=2, local_rank=1, local_world_size=2), CPU)
    assert not other.enabled
    write_a_run(other)
    assert not path.exists() and not path.parent.exists()
    main = open_log(config(path=path), DistEnv(rank=0, world_size=2, local_rank=0, local_world_size=2), CPU)
    write_a_run(main)
    assert values(path)["submission_platform"].startswith("2xCPU")  # the ranks, from the device
    assert capsys.readouterr() == ("", "")  # the reports own stdout: nothing of the MLPerf log goes there


def test_submission_values_come_from_the_config_and_a_new_run_replaces_the_file(tmp_path):
    path = tmp_path / "log.txt"
    for _ in range(2):
        submission = {"org": "ACME", "platform": "8xH100-SXM", "status": "onprem", "division": "closed"}
        cfg = config(*(f"log.mlperf_submission.{k}={v}" for k, v in submission.items()), path=path)
        write_a_run(open_log(cfg, DistEnv(), CPU))
    keys = [e["key"] for e in events(path)]
    assert keys.count("init_start") == 1 and keys.count("run_stop") == 1
    logged = values(path)
    assert (logged["submission_benchmark"], logged["submission_org"], logged["submission_platform"]) == (
        "bert", "ACME", "8xH100-SXM")  # fmt: skip
    assert (logged["submission_division"], logged["submission_status"]) == ("closed", "onprem")


@pytest.mark.parametrize(
    ("override", "key"),
    [("log.mlperf_submission.division=semi", "log.mlperf_submission.division"),
     ("log.mlperf_submission.status=available", "log.mlperf_submission.status"),
     ("log.mlperf_submission.org=''", "log.mlperf_submission.org"),
     ("log.mlperf_submission.colour=red", "log.mlperf_submission.colour"),
     ("log.mlperf=''", "log.mlperf")],
)  # fmt: skip
def test_bad_settings_name_the_field(override, key):
    with pytest.raises(ConfigError, match=rf"\n  {key}: "):
        config(override)


def test_a_log_that_cannot_be_written_names_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"^log\.mlperf: cannot write the MLPerf log"):
        open_log(config(path=tmp_path), DistEnv(), CPU)  # a directory


def test_a_run_whose_data_is_refused_never_starts(tmp_path):
    train_dir = tmp_path / "damaged"
    train_dir.mkdir()
    (train_dir / "part-00000.h5").write_bytes(b"not HDF5")  # found, and refused as it is read
    result, log = train_logged(tmp_path, **{"data.train": str(train_dir)})
    assert result.status is TrainStatus.FAILED and result.error == "data"
    keys = [e["key"] for e in events(log)]
    assert keys[:2] == ["cache_clear", "init_start"] and "run_start" not in keys and "run_stop" not in keys


def test_a_run_whose_data_names_no_shard_writes_no_log(tmp_path):
    """A data.train or data.eval without shards (missing, an empty directory) is refused before the log is opened,
    which would replace the last run's log with a start."""
    (tmp_path / "empty").mkdir()
    for key, spec in (("data.train", tmp_path / "empty"), ("data.eval", tmp_path / "missing")):
        result, log = train_logged(tmp_path, **{key: str(spec)})
        assert result.status is TrainStatus.FAILED and result.error == "data"
        assert result.reason.startswith(f"{key}: no shard files found for {str(spec)!r}"), result.reason
        assert not log.exists()
