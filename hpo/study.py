"""The local engine: controller -> runner -> storage, with several trials in flight.

Every `compare` arm gets its own controller over the arm's sub-space (the compare keys fixed) and the same
share of the trial budget, so ADAM and LAMB are tuned with equal effort. The loop keeps every free slot busy,
streams each trial's reports into the database, and tells the controller each result. Failures are data:
every way a trial can end becomes a recorded `TrialResult`, and the experiment goes on.

Resume: trials a dead controller left RUNNING are re-queued (their leftover processes killed first) and run
again; finished trials are replayed into the new controllers and never run again; the total number of trials
stays `budget.trials`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hpo.controllers import Controller, Suggestion, build_controller
from hpo.experiment import ExperimentSpec, arm_label, arms, objective_value, trial_config
from hpo.launch import LaunchSpec, build_launch, free_port
from hpo.progress import Progress
from hpo.resources import Slot, SlotPool, discover_gpus, plan_slots, select_gpus
from hpo.runner import TrialProcess, classify
from hpo.storage.base import ExperimentStatus, MetricPoint, Storage, TrialRecord
from hpo.trials import TrialResult, TrialSpec, TrialState
from search_spaces.space import SearchSpace

POLL_INTERVAL_S = 0.02
METRIC_KEYS = ("loss", "train_mlm_accuracy", "lr", "sequences_per_s", "tokens_per_s", "token_imbalance",
               "mlm_accuracy", "mlm_loss", "nsp_accuracy")  # fmt: skip


# --------------------------------------------------------------------------- arms


def arm_subspace(space: SearchSpace, fixed: dict[str, Any]) -> SearchSpace:
    """The space of one arm: compare keys removed, parameters whose condition the arm rules out dropped."""
    kept: dict[str, dict[str, Any]] = {}
    as_dict = space.to_dict()
    for name in space.names:
        if name in fixed:
            continue
        param = as_dict[name]
        clauses = space[name].when
        if any(c.key in fixed and not c.holds(fixed[c.key]) for c in clauses):
            continue
        if any(c.key not in fixed and c.key not in kept for c in clauses):
            continue  # its parent was dropped
        when = {c.key: c.to_yaml() for c in clauses if c.key not in fixed}
        kept[name] = {k: v for k, v in param.items() if k != "when"} | ({"when": when} if when else {})
    return SearchSpace.from_dict(kept)


@dataclass
class Arm:
    label: str | None
    fixed: dict[str, Any]
    quota: int
    controller: Controller
    created: int = 0


def arm_quotas(total: int, n: int) -> list[int]:
    """Equal shares of the trial budget; the first arms take the remainder."""
    return [total // n + (1 if i < total % n else 0) for i in range(n)]


# --------------------------------------------------------------------------- the loop


@dataclass
class RunningTrial:
    record: TrialRecord
    suggestion: Suggestion
    arm: Arm
    slot: Slot
    process: TrialProcess
    config: Any  # TrainerConfig


class Study:
    """Drives one experiment to completion (or until stopped)."""

    def __init__(self, spec: ExperimentSpec, storage: Storage, experiment_id: int, run_dir: Path,
                 progress: Progress | None = None, launch_builder=build_launch):  # fmt: skip
        self.spec = spec
        self.storage = storage
        self.experiment_id = experiment_id
        self.run_dir = Path(run_dir)
        self.progress = progress or Progress(quiet=True)
        self.launch_builder = launch_builder  # (LaunchSpec, env) -> (cmd, env); the trainer by default
        self.pool = self._slot_pool()
        self.arms = self._build_arms()
        self.queue: list[tuple[TrialRecord, Suggestion, Arm]] = []
        self.running: list[RunningTrial] = []

    # -- set-up ----------------------------------------------------------------------------------------

    def _slot_pool(self) -> SlotPool:
        res = self.spec.resources
        inventory = [] if res.gpus == "none" else discover_gpus()
        gpus, skipped = select_gpus(inventory, res.gpus if inventory else "none")
        slots = plan_slots(gpus, res.gpus_per_trial, res.trials_per_gpu, cpu_slots=res.cpu_slots)
        return SlotPool(slots[: self.spec.budget.max_parallel], skipped)

    def _build_arms(self) -> list[Arm]:
        all_arms = arms(self.spec)
        quotas = arm_quotas(self.spec.budget.trials, len(all_arms))
        built = []
        for i, (fixed, quota) in enumerate(zip(all_arms, quotas, strict=True)):
            label = arm_label(fixed) if fixed else None
            sub = arm_subspace(self.spec.space, fixed) if fixed else self.spec.space
            controller = self._controller(sub, quota, self.run_dir / "tuner" / f"arm{i}")
            built.append(Arm(label, fixed, quota, controller))
        return built

    def _controller(self, space: SearchSpace, quota: int, output_dir: Path) -> Controller:
        tuner, budget = self.spec.tuner, self.spec.budget
        name = tuner.name if len(space) else "random"  # nothing to tune in this arm
        fidelity = {"min_budget": budget.min_budget, "max_budget": budget.max_budget, "eta": budget.eta}
        return build_controller(name, space, tuner.seed, quota, output_dir, dict(tuner.options),
                                **(fidelity if name == "smac_hyperband" else {}))  # fmt: skip

    # -- resume ----------------------------------------------------------------------------------------

    def restore(self) -> None:
        """Replay finished trials into the controllers and queue the ones a dead controller left running."""
        for record in self.storage.list_trials(self.experiment_id, state=TrialState.RUNNING):
            _kill_leftover(record)
        requeued = {r.id for r in self.storage.requeue_interrupted(self.experiment_id)}
        by_label = {a.label: a for a in self.arms}
        for record in self.storage.list_trials(self.experiment_id):
            arm = by_label.get(record.arm, self.arms[0])
            arm.created += 1
            params = {k: v for k, v in record.params.items() if k not in arm.fixed}
            if record.state.finished:
                cost = record.objective if record.objective is None else self._cost(record.objective)
                arm.controller.replay(params, record.budget, cost)
            elif record.id in requeued or record.state == TrialState.QUEUED:
                self.queue.append((record, Suggestion(params, record.budget), arm))

    def _cost(self, objective: float) -> float:
        return -objective if self.spec.direction == "maximize" else objective

    # -- the loop --------------------------------------------------------------------------------------

    def run(self) -> ExperimentStatus:
        """Run trials until every arm has used its share; returns how the experiment ended."""
        self.progress.start(self)
        try:
            while True:
                if self._stop_requested():
                    self._stop_all("experiment stopped by request")
                    return ExperimentStatus.STOPPED
                while self.pool.free and self._start_next():
                    pass
                finished = self._poll()
                if not self.running and not self.queue and not self._arm_with_quota():
                    return ExperimentStatus.FINISHED
                self.progress.update(self)
                self._write_status()
                if not finished:
                    time.sleep(POLL_INTERVAL_S)
        finally:
            self.progress.finish(self)

    def _stop_requested(self, every_s: float = 1.0) -> bool:
        """Polls the database's stop flag (set by the server's stop action) at most once a second."""
        now = time.monotonic()
        if now - getattr(self, "_stop_checked", 0.0) < every_s:
            return False
        self._stop_checked = now
        return self.storage.is_stop_requested(self.experiment_id)

    def _arm_with_quota(self) -> Arm | None:
        """The arm with quota left that has created the fewest trials (round robin)."""
        open_arms = [a for a in self.arms if a.created < a.quota]
        return min(open_arms, key=lambda a: a.created) if open_arms else None

    def _start_next(self) -> bool:
        if self.queue:
            record, suggestion, arm = self.queue.pop(0)
        else:
            arm = self._arm_with_quota()
            if arm is None:
                return False
            suggestion = arm.controller.ask()
            params = {**arm.fixed, **suggestion.params}
            cfg_batch = self._global_batch(params)
            spec = TrialSpec(self.storage.next_trial_number(self.experiment_id), params, arm.label,
                             suggestion.budget, (), cfg_batch)  # fmt: skip
            record = self.storage.get_trial(self.storage.create_trial(self.experiment_id, spec))
            arm.created += 1
        self._launch(record, suggestion, arm)
        return True

    def _global_batch(self, params: dict[str, Any]) -> int | None:
        try:
            return trial_config(self.spec, params).batch.global_batch_size
        except Exception:
            return None  # an invalid configuration is recorded as a failed trial when it is launched

    def _launch(self, record: TrialRecord, suggestion: Suggestion, arm: Arm) -> None:
        slot = self.pool.acquire()
        trial_dir = self.run_dir / "trials" / f"{record.number:05d}"
        params = {**arm.fixed, **suggestion.params}
        try:
            cfg = self._trial_config(params, suggestion.budget, trial_dir, record)
        except Exception as e:  # a configuration the trainer rejects: a failed trial, not a dead controller
            self.pool.release(slot)
            self._finish(record, suggestion, arm, TrialResult(TrialState.FAILED, f"invalid trial config: {e}"))
            return
        cmd, env = self.launch_builder(self._launch_spec(cfg, trial_dir, slot), dict(os.environ))
        (trial_dir / "report.jsonl").unlink(missing_ok=True)
        process = TrialProcess.start(cmd, env, trial_dir, self.spec.budget.trial_timeout_s,
                                     self.spec.resources.memory_limit_mb)  # fmt: skip
        self.storage.mark_trial_running(record.id, slot.gpus, pid=process.popen.pid, host=socket.gethostname())
        self.running.append(RunningTrial(record, suggestion, arm, slot, process, cfg))

    def _trial_config(self, params: dict[str, Any], budget: float, trial_dir: Path, record: TrialRecord):
        cfg = trial_config(self.spec, params, fidelity=min(budget, 1.0))
        updates = {"log": cfg.log.model_copy(update={"jsonl": str(trial_dir / "report.jsonl")})}
        if self.spec.tuner.name == "smac_hyperband":  # a promoted configuration continues from its checkpoint
            ckpt = self.run_dir / "checkpoints" / _params_key(params)
            updates["checkpoint"] = cfg.checkpoint.model_copy(update={"dir": str(ckpt), "resume": True})
        cfg = cfg.model_copy(update=updates)
        trial_dir.mkdir(parents=True, exist_ok=True)
        (trial_dir / "trial.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
        return cfg

    def _launch_spec(self, cfg, trial_dir: Path, slot: Slot) -> LaunchSpec:
        ranks = self.spec.resources.ranks_per_trial(on_gpu=bool(slot.gpus))
        cores = os.cpu_count() or 1
        threads = None if slot.gpus else max(1, cores // (len(self.pool.slots) * ranks))
        port = free_port() if ranks > 1 else None
        return LaunchSpec(trial_dir / "trial.yaml", slot.gpus, ranks, port, threads)

    def _poll(self) -> int:
        """Stream reports of running trials into storage; finish those that ended. Returns how many ended."""
        ended = 0
        for trial in list(self.running):
            self._store_metrics(trial)
            code = trial.process.poll()
            if code is None:
                continue
            self._store_metrics(trial)
            state, reason = classify(code, trial.process.final, trial.process.stderr_tail(), trial.process.timed_out)
            self.running.remove(trial)
            self.pool.release(trial.slot)
            self._finish(trial.record, trial.suggestion, trial.arm, self._result(trial, state, reason))
            ended += 1
        return ended

    def _store_metrics(self, trial: RunningTrial) -> None:
        points = []
        for r in trial.process.read_new_records():
            if r.get("kind") == "intermediate":
                values = {k: float(r[k]) for k in METRIC_KEYS if isinstance(r.get(k), (int, float))}
                points.append(MetricPoint(int(r.get("step", 0)), r.get("samples"), values))
        if points:
            self.storage.add_metrics(trial.record.id, points)

    def _result(self, trial: RunningTrial, state: TrialState, reason: str | None) -> TrialResult:
        final = trial.process.final or {}
        objective = objective_value(self.spec, final, trial.config)
        stored = -objective if self.spec.direction == "maximize" else objective
        return TrialResult(
            state, reason, stored, final.get("samples_to_target"), final.get("time_to_target_s"),
            final.get("best_mlm_accuracy"), trial.process.elapsed_s, final,
        )  # fmt: skip

    def _finish(self, record: TrialRecord, suggestion: Suggestion, arm: Arm, result: TrialResult) -> None:
        self.storage.finish_trial(record.id, result)
        usable = result.state in (TrialState.COMPLETED, TrialState.DIVERGED, TrialState.TIMEOUT)
        cost = self._cost(result.objective) if usable and result.objective is not None else None
        if suggestion.handle is not None:
            arm.controller.tell(suggestion, cost)
        else:
            arm.controller.replay(suggestion.params, suggestion.budget, cost)
        self.progress.trial_finished(self, record, result)

    def _stop_all(self, reason: str) -> None:
        for trial in list(self.running):
            trial.process.kill()
            trial.process.popen.wait()
            self.running.remove(trial)
            self.pool.release(trial.slot)
            self.storage.finish_trial(trial.record.id, TrialResult(TrialState.FAILED, reason))

    def _write_status(self, every_s: float = 2.0) -> None:
        """A small file `hpo status` reads: what the controller sees and why trials wait."""
        now = time.time()
        if now - getattr(self, "_status_time", 0.0) < every_s:
            return
        self._status_time = now
        status = {"time": now, "line": self.progress.status_line(self), "waiting": self.waiting_reason()}
        tmp = self.run_dir / ".status.json.tmp"
        tmp.write_text(json.dumps(status))
        tmp.replace(self.run_dir / "status.json")

    # -- what the progress display asks ------------------------------------------------------------------

    def waiting_reason(self) -> str:
        if self.queue or self._arm_with_quota():
            return self.pool.why_waiting()
        return ""


def _params_key(params: dict[str, Any]) -> str:
    import hashlib

    return hashlib.sha1(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _kill_leftover(record: TrialRecord) -> None:
    """A trial process group that outlived its controller would run twice: end it before re-queuing."""
    if record.pid and record.host == socket.gethostname():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(record.pid, signal.SIGKILL)
