"""MLPerf training logs of a run: the `mllog` events of MLPerf's BERT rules, written with `mlperf_logging.mllog`.

Off unless `log.mlperf` names a file; only rank 0 writes (every other rank, and a run without the file, gets a
log that does nothing). The file is replaced when the run starts (its folder is created), and every line is
flushed as it is written, so a crashed run leaves the events up to the crash. Lines are MLPerf's
`:::MLLOG {"namespace": "", "time_ms": ..., "event_type": ..., "key": ..., "value": ..., "metadata": {...}}`;
`python -m mlperf_logging.compliance_checker --usage training --ruleset 5.0.0 FILE` checks them
(tests/trainer/test_mlperf_log.py runs it on a real run).

The events, in the order they are written (BERT counts epochs in training samples, so every `epoch_num`,
`first_epoch_num` and `epoch_count` below is a number of training sequences):

1. `cache_clear` (value: `log.mlperf_submission.cache_cleared`; the trainer does not drop the OS caches itself,
   the launcher does and says so), `init_start`, then the submission keys: `submission_benchmark` "bert",
   `submission_org`, `submission_division`, `submission_platform` (default `<ranks>x<device name>`),
   `submission_status`, from `log.mlperf_submission`.
2. Once the shards are read and checked and the model, optimizer and schedule are built (and a checkpoint
   restored), the run's settings: `seed`, `global_batch_size`, `gradient_accumulation_steps` (micro-batches per
   rank per step), `max_sequence_length` (the shards' width), `max_predictions_per_seq`, `opt_name` ("lamb" or
   "adamw"), and the optimizer and schedule under the keys of the BERT rules: `opt_base_learning_rate`
   (optimizer.lr), `opt_lamb_epsilon`, `opt_lamb_beta_1`, `opt_lamb_beta_2`, `opt_lamb_weight_decay_rate`,
   `opt_lamb_learning_rate_decay_poly_power` (schedule.power), `opt_learning_rate_warmup_steps` and
   `num_warmup_steps` (schedule.warmup_steps), `start_warmup_step`, `opt_learning_rate_training_steps` (the decay
   horizon T) and `opt_end_learning_rate` (schedule.end_lr). An AdamW run fills the same `opt_lamb_*` keys with
   AdamW's values (its epsilon, betas and decoupled weight decay), as published ADAM submissions to the BERT
   benchmark do; `opt_name` says which optimizer it was. Then the clipping: `opt_gradient_clipping` (this
   trainer's key: clipping.strategy, none, after_allreduce, before_allreduce or bucketwise) and, where it clips,
   mllog's `opt_gradient_clip_norm` (clipping.max_norm), so that runs of different strategies read back
   (`hpo import mlperf`) as different configurations. Then `init_stop` and `run_start`.
3. Blocks: training between two evaluations is one block. `block_start` (metadata `first_epoch_num`: samples
   trained so far, `epoch_count`: samples until the next evaluation or the budget) comes before the block's first
   step; each evaluation writes `eval_start`, `eval_stop` and `eval_accuracy` (value: the masked-LM accuracy,
   metadata `epoch_num`: samples trained) and then `block_stop` (metadata `first_epoch_num` of its block).
4. At the end, however the run ended (also on a crash): `block_stop` of a block still open, `run_stop` with
   metadata `status` "success" when the run reached eval.target_mlm_accuracy and "aborted" otherwise (budget
   spent, diverged, out of memory, crashed), `train_samples` (sequences trained) and `eval_samples` (the size
   of the evaluation set). A run whose data is refused before any step stops after `init_start` and the
   submission keys: it never started. One whose data.train or data.eval names no shard file writes no log (the last
   run's stays as it was).

What the log does not make MLPerf-compliant by itself: the shards are read and checked before `run_start`
(inside the init interval), while MLPerf's closed rules start the clock when the data is first touched; a
resumed run writes a new log from its resume point (MLPerf results come from uninterrupted runs), except a
finished run's command run again, which trains nothing and keeps the run's log; and the closed
division needs eval_accuracy >= 0.720 with MLPerf's data, model and hyperparameter rules, which is the
submitter's job. `submission_division` "open" (the default) is what a run of this trainer honestly is.
"""

from __future__ import annotations

import contextlib
import logging
import platform
from pathlib import Path
from typing import Any

import torch
from mlperf_logging.mllog import constants as keys
from mlperf_logging.mllog.mllog import MLLogger

from trainer.config import TrainerConfig
from trainer.data.shards import PretrainingSamples
from trainer.distributed import DistEnv
from trainer.errors import ConfigError
from trainer.result import TrainResult, TrainStatus

BENCHMARK = keys.BERT
CLIPPING_KEY = "opt_gradient_clipping"  # clipping.strategy: no key of mllog's names where a run clips


def hyperparameters(
    cfg: TrainerConfig, accumulation: int, total_steps: int, max_sequence_length: int, max_predictions: int
) -> dict[str, Any]:
    """The run's settings under the keys of MLPerf's BERT rules, in the order they are logged (see step 2)."""
    opt, schedule = cfg.optimizer, cfg.schedule
    return {
        keys.SEED: cfg.seed,
        keys.GLOBAL_BATCH_SIZE: cfg.batch.global_batch_size,
        keys.GRADIENT_ACCUMULATION_STEPS: accumulation,
        keys.MAX_SEQUENCE_LENGTH: max_sequence_length,
        "max_predictions_per_seq": max_predictions,
        keys.OPT_NAME: keys.LAMB if opt.name == "lamb" else keys.ADAMW,
        keys.OPT_BASE_LR: opt.lr,
        keys.OPT_LAMB_EPSILON: opt.eps,
        keys.OPT_LAMB_BETA_1: opt.beta1,
        keys.OPT_LAMB_BETA_2: opt.beta2,
        keys.OPT_LAMB_WEIGHT_DECAY: opt.weight_decay,
        keys.OPT_LAMB_LR_DECAY_POLY_POWER: schedule.power,
        keys.OPT_LR_WARMUP_STEPS: schedule.warmup_steps,
        keys.NUM_WARMUP_STEPS: schedule.warmup_steps,
        keys.START_WARMUP_STEP: schedule.start_warmup_step,
        keys.OPT_LR_TRAINING_STEPS: schedule.total_steps or total_steps,
        keys.OPT_END_LR: schedule.end_lr,
        CLIPPING_KEY: cfg.clipping.strategy,
        **({keys.OPT_GRADIENT_CLIP_NORM: cfg.clipping.max_norm} if cfg.clipping.strategy != "none" else {}),
    }


def default_platform(env: DistEnv, device: torch.device) -> str:
    """`<ranks>x<device name>`: 8xNVIDIA H100 80GB HBM3, 1xCPU-x86_64."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU-{platform.machine() or 'unknown'}"
    return f"{env.world_size}x{name}"


class MLPerfLog:
    """The MLPerf log of one run; every method does nothing when the log is off (no file, or not rank 0)."""

    def __init__(self, cfg: TrainerConfig, logger: logging.Logger | None) -> None:
        self.cfg = cfg
        self._logger = logger
        self._mllog = MLLogger(logger=logger, default_stack_offset=2) if logger is not None else None
        self._block_first: int | None = None  # first_epoch_num of the open block, None: no block open
        self._eval_samples = 0
        self._started = False

    @property
    def enabled(self) -> bool:
        return self._mllog is not None

    def _emit(self, kind: str, key: str, value: Any = None, metadata: dict[str, Any] | None = None) -> None:
        if self._mllog is not None:  # stack offset 2: the file and line of the method that called _emit
            getattr(self._mllog, kind)(key=key, value=value, metadata=metadata)

    def init_start(self, env: DistEnv, device: torch.device) -> None:
        """Step 1: cache_clear, init_start and the submission keys."""
        sub = self.cfg.log.mlperf_submission
        self._emit("event", keys.CACHE_CLEAR, sub.cache_cleared)
        self._emit("start", keys.INIT_START)
        self._emit("event", keys.SUBMISSION_BENCHMARK, BENCHMARK)
        self._emit("event", keys.SUBMISSION_ORG, sub.org)
        self._emit("event", keys.SUBMISSION_DIVISION, sub.division)
        self._emit("event", keys.SUBMISSION_PLATFORM, sub.platform or default_platform(env, device))
        self._emit("event", keys.SUBMISSION_STATUS, sub.status)

    def run_start(
        self, accumulation: int, total_steps: int, train: PretrainingSamples, evaluation: PretrainingSamples
    ) -> None:
        """Step 2: the run's settings, init_stop and run_start."""
        settings = hyperparameters(self.cfg, accumulation, total_steps, train.max_seq_length, train.max_predictions)
        for key, value in settings.items():
            self._emit("event", key, value)
        self._emit("end", keys.INIT_STOP)
        self._emit("start", keys.RUN_START)
        self._eval_samples, self._started = len(evaluation), True

    def training(self, samples: int, next_eval_samples: int) -> None:
        """Before a step: opens a block when none is open (the first step after run_start or an evaluation)."""
        if self._block_first is not None or not self.enabled:
            return
        end = min(next_eval_samples, self.cfg.budget.max_samples)
        self._block_first = samples
        self._emit("start", keys.BLOCK_START, metadata={keys.FIRST_EPOCH_NUM: samples, keys.EPOCH_COUNT: end - samples})

    def eval_start(self, samples: int) -> None:
        self._emit("start", keys.EVAL_START, metadata={keys.EPOCH_NUM: samples})

    def eval_stop(self, samples: int, mlm_accuracy: float) -> None:
        """eval_stop, eval_accuracy, and the block_stop of the block this evaluation ends."""
        self._emit("end", keys.EVAL_STOP, metadata={keys.EPOCH_NUM: samples})
        self._emit("event", keys.EVAL_ACCURACY, float(mlm_accuracy), metadata={keys.EPOCH_NUM: samples})
        self._block_stop()

    def _block_stop(self) -> None:
        if self._block_first is not None:
            self._emit("end", keys.BLOCK_STOP, metadata={keys.FIRST_EPOCH_NUM: self._block_first})
            self._block_first = None

    def run_stop(self, result: TrainResult) -> None:
        """Step 4 (when the run started), then the file is closed (also when a write fails: a full disk)."""
        try:
            if self._started:
                self._started = False
                self._block_stop()
                status = keys.SUCCESS if result.status is TrainStatus.REACHED_TARGET else keys.ABORTED
                self._emit("end", keys.RUN_STOP, metadata={keys.STATUS: status})
                self._emit("event", keys.TRAIN_SAMPLES, result.samples)
                self._emit("event", keys.EVAL_SAMPLES, self._eval_samples)
        finally:
            self.close()

    def close(self) -> None:
        """Close the file; what a failed write left in its buffer is dropped (the write's error was raised)."""
        if self._logger is not None:
            for handler in list(self._logger.handlers):
                self._logger.removeHandler(handler)
                with contextlib.suppress(OSError):  # the bytes a failed write left: its error is the one raised
                    handler.close()  # (every record is flushed as it is written: nothing else is left to flush)
            self._logger, self._mllog = None, None


class _FileHandler(logging.FileHandler):
    """A log file whose failed write (a full disk) stops the run, as the report's does: logging's own handler prints
    the error and goes on, leaving a log with events missing that would pass for the run's."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        raise  # the write's own error, being handled in `emit`


def open_log(cfg: TrainerConfig, env: DistEnv, device: torch.device) -> MLPerfLog:
    """The run's MLPerf log, started (step 1): writing to `log.mlperf` on rank 0, doing nothing elsewhere."""
    if cfg.log.mlperf is None or not env.is_main:
        return MLPerfLog(cfg, None)
    path = Path(cfg.log.mlperf)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = _FileHandler(path, mode="w", encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"log.mlperf: cannot write the MLPerf log {str(path)!r}: {e}") from None
    # A logger of its own, outside logging's registry: nothing reaches stdout (the reports) or other handlers.
    logger = logging.Logger("trainer.mlperf", logging.INFO)
    logger.addHandler(handler)
    log = MLPerfLog(cfg, logger)
    try:
        log.init_start(env, device)
    except BaseException:  # a full disk: the file is closed, the error raised
        log.close()
        raise
    return log
