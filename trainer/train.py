"""The BERT pretraining loop.

Read top to bottom: one optimizer step, the loop, then `train`, the run from start to end. `train` refuses what
cannot work before any work (trainer/preflight.py), builds the components (data, model, optimizer, schedule,
sampler, clipper: trainer/run.py), optionally resumes, then loops: a step is `accumulation` micro-batches (DDP
`no_sync` on all but the last), clipping, one optimizer step; evaluate every `eval.every_samples`; stop at the target
accuracy, at the budget, or on a NaN/inf loss. The host never waits for the device inside a step: losses stay on the
device and are read back every `log.every_steps` steps, at evaluations, checkpoints and the end
(trainer/readback.py), so a NaN ends the run at the next read. Only rank 0 prints and reports. The result says how
the run ended and how fast it got to the target.
"""

from __future__ import annotations

import math
import time
import warnings
from contextlib import nullcontext, suppress
from dataclasses import asdict
from pathlib import Path

import torch

from trainer.checkpoint import TrainState, final_save_interrupted, finished_checkpoint, finished_status, kept_checkpoint
from trainer.config import TrainerConfig
from trainer.data.batch import PackedBatch, pack_batch
from trainer.data.shards import find_shards
from trainer.distributed import DistEnv, any_rank, dist_env_from_environ, init_process_group, log, pick_device
from trainer.errors import (
    CheckpointError,
    DataError,
    DataWarning,
    DiskFullError,
    FinalSaveError,
    Terminated,
    TrainerError,
    crash_reason,
)
from trainer.evaluate import evaluate
from trainer.memory import out_of_memory
from trainer.mlperf_log import MLPerfLog, open_log
from trainer.model import pretraining_loss
from trainer.noise_scale import NOT_MEASURED, NoiseScale
from trainer.precision import autocast
from trainer.preflight import refuse_before_work
from trainer.readback import Reading, StepStats, read_back
from trainer.report import Reporter
from trainer.result import TrainResult, TrainStatus
from trainer.run import Run, build_run, checkpoint, restore, say_start

# --------------------------------------------------------------------------- one optimizer step


def forward_backward(
    run: Run, batch: PackedBatch, mlm_weight: float, nsp_weight: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """One micro-batch's forward and backward; its share of the step's loss (detached) and its MLM hits."""
    with autocast(run.device, run.autocast):
        loss = pretraining_loss(run.module(batch), batch, mlm_weight, nsp_weight)
    run.scaler.scale(loss.total).backward()
    return loss.total.detach(), loss.mlm_correct


def train_step(run: Run, micro_batches: list, step: int) -> StepStats:
    """Optimizer step number `step` (from 1) over `micro_batches`."""
    run.model.train()
    if run.cfg.model.compile_model and run.device.type == "cuda":
        torch.compiler.cudagraph_mark_step_begin()  # a new step: the last step's CUDA graph outputs may be reused
    measured = run.probe is not None and step % run.cfg.log.noise_scale_every == 0
    if run.probe is not None:
        run.probe.measure(measured)
    batches = [pack_batch(run.train_samples, idx, run.shapes).to(run.device) for idx in micro_batches]
    masked = sum(b.num_masked for b in batches)
    loss_sum = torch.zeros((), device=run.device)
    correct = torch.zeros((), device=run.device)
    sequences = sum(b.num_sequences for b in batches)
    for i, batch in enumerate(batches):
        # Each micro-batch's MLM loss weighed by its share of the step's masked tokens and its NSP loss by its share
        # of the sequences: their sum is the step's loss (MLM over all its masked tokens, NSP over all its
        # sequences), and its gradient the same however the step is split (up to rounding and dropout masks).
        mlm_weight, nsp_weight = batch.num_masked / max(masked, 1), batch.num_sequences / sequences
        probe = micro_batch_probe(run, mlm_weight) if measured else nullcontext()  # MLM's gradient dominates
        with run.clipper.backward_context(last_micro_batch=i == len(batches) - 1), probe:
            loss, ok = forward_backward(run, batch, mlm_weight, nsp_weight)
        loss_sum += loss
        correct += ok
    run.clipper.before_step(run.optimizer)
    grad_sq_norms = run.probe.take() if measured else None
    lr = run.optimizer.param_groups[0]["lr"]  # the scheduler's step below sets the next step's
    run.scaler.step(run.optimizer)
    run.scaler.update()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    return StepStats(
        loss_sum=loss_sum,
        mlm_correct=correct,
        mlm_count=masked,
        lr=lr,
        sequences=sequences,
        tokens=sum(b.num_tokens for b in batches),
        grad_sq_norms=grad_sq_norms,
        micro_batch_sizes=[b.num_sequences for b in batches],
    )


def micro_batch_probe(run: Run, weight: float):
    """With accumulation, the probe measures each micro-batch's gradient (the small batch)."""
    if run.probe is None or run.accumulation == 1:
        return nullcontext()
    return run.probe.micro_batch(weight, run.clipper.loss_scale())


def measure_noise_scale(run: Run, norms: tuple[float, float] | None, stats: StepStats) -> NoiseScale:
    """Feed a step's norms, once read back, to the estimator: small = a micro-batch and big = a rank's batch when
    accumulating, else small = a rank's batch and big = the global batch (DDP). A step whose small batches differ
    in size (an epoch's uneven last step) is not measured: B_small is undefined there."""
    sequences, micro = stats.sequences_per_rank, stats.micro_batch_sizes
    accumulating = run.accumulation > 1
    if norms is None or min(sequences) != max(sequences) or (accumulating and min(micro) != max(micro)):
        return NoiseScale(run.noise_scale.value(), None, None, None, None) if run.probe else NOT_MEASURED
    if accumulating:  # the micro-batches' own size: an epoch's last step may have fewer of them
        return run.noise_scale.update(*norms, micro[0], sequences[0])
    return run.noise_scale.update(*norms, sequences[0], sum(sequences))


# --------------------------------------------------------------------------- the loop


def epoch_steps(run: Run, state: TrainState):
    """Yield, one per optimizer step from the current position on, this rank's micro-batches (index lists) and
    every rank's [tokens, sequences] in the step, known from the epoch's plan: no rank waits for another's count."""
    while True:
        micro = list(run.sampler.batches(state.epoch))[state.batch_in_epoch :]
        loads = run.sampler.loads(state.epoch)[state.batch_in_epoch :]
        for start in range(0, len(micro), run.accumulation):
            yield micro[start : start + run.accumulation], loads[start : start + run.accumulation].sum(axis=0).tolist()
        state.epoch += 1
        state.batch_in_epoch = 0


def run_eval(run: Run, state: TrainState, elapsed: float) -> bool:
    """Evaluate, record, and say whether the target is reached."""
    run.mlperf.eval_start(state.samples)
    result = evaluate(run.model, run.eval_samples, run.cfg.eval.batch_size, run.device, run.env, run.autocast,
                      run.eval_shapes)  # fmt: skip
    run.mlperf.eval_stop(state.samples, result.mlm_accuracy)
    record = {"samples": state.samples, "step": state.step, "time_s": round(elapsed, 3), **asdict(result)}
    state.evals.append(record)
    state.best_mlm_accuracy = max(state.best_mlm_accuracy, result.mlm_accuracy)
    reached = result.mlm_accuracy >= run.cfg.eval.target_mlm_accuracy
    if reached and state.samples_to_target is None:
        state.samples_to_target, state.time_to_target_s = state.samples, elapsed
    run.reporter.intermediate({"event": "eval", **record})
    log(
        run.env,
        f"eval @ {state.samples:,} samples: mlm_accuracy {result.mlm_accuracy:.4f} "
        f"(target {run.cfg.eval.target_mlm_accuracy}), nsp_accuracy {result.nsp_accuracy:.3f}",
    )
    return reached


def progress(
    run: Run, state: TrainState, window: dict[str, float], reading: Reading, imbalance: float, noise: NoiseScale
) -> None:
    seconds = max(time.perf_counter() - window["t0"] - window["paused"], 1e-9)  # training only: no eval, no save
    record = {
        "event": "progress",
        "step": state.step,
        "samples": state.samples,
        "loss": reading.loss,
        "train_mlm_accuracy": reading.mlm_accuracy,
        "lr": reading.lr,  # the rate of the step whose loss this is (the optimizer already holds the next one's)
        "sequences_per_s": window["sequences"] / seconds,
        "tokens_per_s": window["tokens"] / seconds,
        "token_imbalance": imbalance,
        **noise.record(),
    }
    run.reporter.intermediate(record)
    log(
        run.env,
        f"step {state.step:>6} | samples {state.samples:>9,} | loss {reading.loss:7.4f} | "
        f"mlm_acc {record['train_mlm_accuracy']:.3f} | lr {record['lr']:.2e} | "
        f"{record['sequences_per_s']:8.1f} seq/s | {record['tokens_per_s']:10,.0f} tok/s | "
        f"imbalance {imbalance:.3f}" + (f" | noise scale {noise.noise_scale:,.0f}" if noise.noise_scale else ""),
    )


def read_pending(run: Run, pending: list[tuple[int, StepStats]]) -> tuple[list[Reading], NoiseScale]:
    """Read back the steps since the last read and feed their noise-scale norms to the estimator, in step order (it
    smooths); the estimate after the last of them is returned with the readings."""
    readings = read_back(pending)
    noise = NOT_MEASURED
    for reading, (_, stats) in zip(readings, pending, strict=True):
        noise = measure_noise_scale(run, reading.grad_sq_norms, stats)
    pending.clear()
    return readings, noise


def loop(run: Run, state: TrainState) -> TrainStatus:
    """Train until a stop condition; returns the final status. A run that fails (out of memory, say) still feeds
    the estimator the norms its last steps measured, so that the checkpoint written after the failure holds them."""
    pending: list[tuple[int, StepStats]] = []  # steps whose loss is still on the device
    try:
        return steps_until_stop(run, state, pending)
    except BaseException:
        if pending:
            with suppress(Exception):  # the device itself may be what failed
                read_pending(run, pending)
        raise


def new_window() -> dict[str, float]:
    """What a progress line's throughput is over: the sequences and tokens trained since the last line, and the
    seconds since then less those spent evaluating and saving checkpoints (`paused`)."""
    return {"t0": time.perf_counter(), "paused": 0.0, "sequences": 0.0, "tokens": 0.0}


def steps_until_stop(run: Run, state: TrainState, pending: list[tuple[int, StepStats]]) -> TrainStatus:
    cfg = run.cfg
    start = time.perf_counter() - state.train_time_s
    window = new_window()
    if (finished := finished_status(cfg, state)) is not None:  # resumed at the end of a finished run
        return finished
    for micro_batches, per_rank in epoch_steps(run, state):
        run.mlperf.training(state.samples, state.next_eval_samples)
        stats = train_step(run, micro_batches, state.step + 1)
        tokens, sequences = [r[0] for r in per_rank], [r[1] for r in per_rank]
        assert (tokens[run.env.rank], sequences[run.env.rank]) == (stats.tokens, stats.sequences), "plan != batches"
        state.step += 1
        state.batch_in_epoch += len(micro_batches)
        state.samples += int(sum(sequences))
        state.tokens += int(sum(tokens))
        state.train_time_s = time.perf_counter() - start
        window["sequences"] += sum(sequences)
        window["tokens"] += sum(tokens)
        stats.sequences_per_rank = sequences
        pending.append((state.step, stats))
        out_of_samples = state.samples >= cfg.budget.max_samples
        out_of_time = cfg.budget.max_time_s is not None and state.train_time_s >= cfg.budget.max_time_s  # my clock
        every = cfg.checkpoint.every_samples
        checkpoint_due = every and state.samples // every != (state.samples - int(sum(sequences))) // every
        logged = state.step % cfg.log.every_steps == 0
        read_due = logged or out_of_samples or checkpoint_due or state.samples >= state.next_eval_samples
        if read_due or (out_of_time and not run.env.enabled):  # the same steps on every rank (one process: also time)
            readings, noise = read_pending(run, pending)
            bad = next((r for r in readings if not math.isfinite(r.loss)), None)
            # Decisions that must not split the ranks: their clocks differ, and a NaN may show on one rank first
            out_of_time, diverged = any_rank([out_of_time, bad is not None], run.device, run.env)
            if logged or diverged or out_of_samples or out_of_time:  # the last step is reported too
                imbalance = max(tokens) / max(sum(tokens) / len(tokens), 1e-9)
                progress(run, state, window, readings[-1], imbalance, noise)
                window = new_window()
            if diverged:
                what = f"loss is {bad.loss} at step {bad.step}" if bad else "another rank's loss is not finite"
                log(run.env, f"{what} (read at step {state.step}): diverged")
                return TrainStatus.DIVERGED
        else:
            out_of_time = False  # several ranks: the time budget is decided together, where they read back
        out_of_budget = out_of_samples or out_of_time
        if state.samples >= state.next_eval_samples or out_of_budget:
            while state.next_eval_samples <= state.samples:
                state.next_eval_samples += cfg.eval.every_samples
            paused = time.perf_counter()
            reached = run_eval(run, state, paused - start)
            window["paused"] += time.perf_counter() - paused
            state.train_time_s = time.perf_counter() - start  # the evaluation's time too (time_to_target_s within)
            if reached and cfg.eval.stop_at_target:
                return TrainStatus.REACHED_TARGET
        if checkpoint_due:
            paused = time.perf_counter()
            checkpoint(run, state)
            window["paused"] += time.perf_counter() - paused
        if out_of_budget:  # with eval.stop_at_target off, a run that reached the target on the way says so
            return TrainStatus.BUDGET_EXHAUSTED if state.samples_to_target is None else TrainStatus.REACHED_TARGET
    raise AssertionError("unreachable: epoch_steps never ends")


# --------------------------------------------------------------------------- the run, start to end


def final_result(
    run: Run, state: TrainState, status: TrainStatus, reason: str | None, error: str | None = None
) -> TrainResult:
    seconds = max(state.train_time_s, 1e-9)
    return TrainResult(
        status=status,
        reason=reason,
        samples=state.samples,
        steps=state.step,
        samples_to_target=state.samples_to_target,
        time_to_target_s=state.time_to_target_s,
        best_mlm_accuracy=state.best_mlm_accuracy if state.evals else None,
        final_mlm_accuracy=state.evals[-1]["mlm_accuracy"] if state.evals else None,
        train_time_s=state.train_time_s,
        sequences_per_s=state.samples / seconds,
        tokens_per_s=state.tokens / seconds,
        world_size=run.env.world_size,
        global_batch_size=run.cfg.batch.global_batch_size,
        micro_batch_size=run.cfg.batch.micro_batch_size,
        target_mlm_accuracy=run.cfg.eval.target_mlm_accuracy,
        error=error,
    )


def failed_before_training(cfg: TrainerConfig, env: DistEnv, reporter: Reporter, error: TrainerError | str,
                kind: str = "data") -> TrainResult:  # fmt: skip
    """The result of a run whose data (the shards, or model.init_checkpoint's weights) was refused before any step:
    failed, with the error as its reason and "data" as its kind (not the hyperparameters' fault); or, of `kind`
    "oom", one whose model and data did not fit the device's memory."""
    result = TrainResult(
        status=TrainStatus.FAILED,
        reason=str(error),
        world_size=env.world_size,
        global_batch_size=cfg.batch.global_batch_size,
        micro_batch_size=cfg.batch.micro_batch_size if cfg.batch.micro_batch_size != "auto" else None,
        target_mlm_accuracy=cfg.eval.target_mlm_accuracy,
        error=kind,
    )
    if env.is_main:
        reporter.final(result)
    return result


def train(cfg: TrainerConfig, reporter: Reporter) -> TrainResult:
    """Run one training job as configured; returns (and reports) the final result."""
    refuse_before_work(cfg)
    env = dist_env_from_environ()
    device = pick_device(cfg.device, env)
    init_process_group(env, device)
    try:  # shards that are not there: the MLPerf log (which opening replaces) is left as it was
        found = {key: find_shards(spec, key) for spec, key in ((cfg.data.train, "data.train"),
                                                               (cfg.data.eval, "data.eval"))}  # fmt: skip
    except DataError as e:
        return failed_before_training(cfg, env, reporter, e)
    warn_evaluated_on_training_shards(found["data.train"], found["data.eval"])
    if (done := finished_checkpoint(cfg)) is not None:  # nothing to train: the run's own MLPerf log stays as it is
        kept = " (its MLPerf log is kept)" if cfg.log.mlperf is not None else ""
        log(env, f"{done} is the checkpoint of a finished run: nothing is left to train{kept}")
        mlperf = MLPerfLog(cfg, None)
    else:
        mlperf = open_log(cfg, env, device)  # MLPerf's init_start and submission keys, when log.mlperf names a file
    try:
        run = build_run(cfg, env, device, reporter, mlperf)
    except (DataError, CheckpointError) as e:  # bad data (or initial weights) is refused before the first step, as a
        mlperf.close()  # result of its own
        return failed_before_training(cfg, env, reporter, e)
    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as e:  # a model too large for the device, likewise
        mlperf.close()
        if not out_of_memory(e):
            raise
        return failed_before_training(
            cfg, env, reporter, f"out of memory before the first step: {crash_reason(e)}", "oom"
        )
    state = restore(run)
    mlperf.run_start(run.accumulation, run.total_steps, run.train_samples, run.eval_samples)
    say_start(run)
    status, reason, error = TrainStatus.FAILED, None, None
    try:
        status = loop(run, state)
        reason = "loss became NaN or inf" if status is TrainStatus.DIVERGED else None
    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as e:
        if not out_of_memory(e):
            reason, error = crash_reason(e), "crash"
            raise
        reason, error = f"out of memory: {e}", "oom"
    except TrainerError as e:
        kinds = {DataError: "data", DiskFullError: "disk_full"}
        reason, error = str(e), next((k for t, k in kinds.items() if isinstance(e, t)), "crash")
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: reported, and raised on with where the run was (the CLI
        what = "SIGTERM" if isinstance(e, Terminated) else "Ctrl-C"  # says what to do)
        reason, error = f"interrupted ({what}) at step {state.step}, {state.samples:,} samples", "interrupted"
        raise type(e)(reason) from None
    except Exception as e:  # a bug, or a peer rank gone (gloo/NCCL): the final record says what, the traceback where
        reason, error = crash_reason(e), "crash"
        raise
    finally:
        result = final_result(run, state, status, reason, error)
        run.reporter.final(result)
        mlperf.run_stop(result)
    if status is not TrainStatus.DIVERGED:  # its weights are not finite: the last checkpoint before stays the latest
        try:
            checkpoint(run, state, every_rank=status is not TrainStatus.FAILED)  # a failed rank may not get here
        except KeyboardInterrupt as e:  # after the final record: the message says so, the CLI how to go on
            raise type(e)(final_save_interrupted(cfg, e, result)) from None
        except CheckpointError as e:  # a full disk: the result stands, the CLI says what was not saved
            raise FinalSaveError(f"the run ended ({result.status.value}) and its final record is written, but its "
                                 f"final checkpoint was not saved: {e}; {kept_checkpoint(cfg)} stays the latest",
                                 result) from None  # fmt: skip
    return result


def warn_evaluated_on_training_shards(train: list[Path], evaluation: list[Path]) -> None:
    """A DataWarning where data.eval names shards data.train trains on: the accuracy would be measured on sequences
    the run learns, and a target reached on them says nothing of the model (it ran without a word)."""
    trained = {path.resolve() for path in train}
    shared = [path for path in evaluation if path.resolve() in trained]
    if shared:
        warnings.warn(
            f"data.eval names {len(shared)} of data.train's shards ({shared[0]}"
            f"{' and others' if len(shared) > 1 else ''}): the evaluation measures accuracy on sequences the run "
            "trains on; give a held-out set (`python -m trainer.data.prepare` writes one beside train/, in eval/)",
            DataWarning,
            stacklevel=2,
        )
