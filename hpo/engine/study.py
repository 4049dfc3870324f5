"""The study loop: suggestions from controllers to a runner, results from storage to the tuners.

    controller.ask -> storage.create_trial -> runner.submit -> (the trial records itself) -> storage
    -> controller.tell

Every `compare` arm gets its own controller over the arm's sub-space (the compare keys fixed) and the same
share of the trial budget. The loop keeps the runner's free slots busy and tells each controller what the
storage says about its trials; it does not start processes, read trial files or print (runners, the trial
entry and the progress view do). Only a trial that ended without recording a result is finished here
(`classify_exit`). With `budget.confirm_seeds: k`, each arm's best configuration runs k more times with other
training seeds, as confirmation trials, queued as soon as that arm's tuning is over (its whole quota created and
none of its tuning trials running or queued), while other arms may still tune: no slot idles while work is
known. With `confirm_seeds: auto` that is the first round; once every arm finished a round, the verdict at that
look decides whether another round is queued (`hpo.evidence.confirmations`). Tuning trials start before confirmation
trials (the tuners' next questions wait on them).

Resume (`restore`): the processes of every unfinished trial a dead or stopped controller left are ended where
the runner can (a queued trial may have been started), and trials left RUNNING or INTERRUPTED are re-queued as a
new attempt; finished trials are told to the new controllers through the same `tuner_feedback` as live, between
the same asks and in the same order as live (each trial's `told_before` and `told_order`, stamped when the next
trial was created; those told after the newest trial, unstamped, in the order they finished), so the tuners'
history is the same as in an uninterrupted run, also with several trials in flight; nothing finished runs again
and the total stays `budget.trials`. An arm with stored confirmation trials has them queued: they are neither
queued twice nor forgotten, and a round the dead controller left short is completed.

A database that is away: the storage waits for it inside each call, retrying, up to `database.outage_s`
(`hpo.storage.retry`), so the loop stays where it is (its running trials keep running, nothing new starts) and
goes on once the database is back. Past the bound, or when a stop is asked for while it waits, the loop stops as
on SIGTERM: it ends every running attempt and leaves (`database_error` says why); the records it could not write
stay RUNNING, which a resume re-queues. An attempt that ended without a result in the database may have kept its
outcome in its directory (`hpo.trial.outcome`): the loop stores that before anything else (and a resume does, for
every unfinished trial); an attempt that gave up on the database before it had an outcome is re-queued.

A full disk: an attempt that ended without a result because it could not write (its process said so,
`EXIT_DISK_FULL`, or the disk of its directory has next to nothing free, `hpo.files.full_disk`) is not its
configuration's failure: it is re-queued, nothing is told to its tuner, and the loop stops as past a database outage
(`disk_error` says why), so that the next trial does not meet the same disk; `hpo resume` runs it once there is space.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hpo.controllers import Controller, Suggestion, build_controller
from hpo.errors import ClaimLostError, DatabaseUnavailableError, StorageError
from hpo.evidence.confirmations import rounds_note, runs_to_queue, stored_evidence
from hpo.experiment import ExperimentSpec
from hpo.experiment.arms import arm_plans, trial_config
from hpo.experiment.rungs import asha_plan
from hpo.files import full_disk
from hpo.objective import NOT_TOLD, missed_objective, reached_target_at_most, tuner_feedback
from hpo.runners.base import Runner, TrialExit, TrialLaunch, classify_exit
from hpo.storage.base import ExperimentStatus, Storage, TrialRecord
from hpo.trial.outcome import EXIT_DATABASE_UNREACHABLE, EXIT_DISK_FULL, store_kept_outcome
from hpo.trials import TrialKind, TrialResult, TrialSpec, TrialState
from search_spaces.space import SearchSpace
from trainer.config import config_from_dict

POLL_INTERVAL_S = 0.1  # longest idle wait: runners wake the loop as soon as an attempt ends
MAX_REQUEUES = 1  # a trial whose worker is lost runs again once, then fails (attempts a resume made not counted)
MAX_LOST_BEFORE_START = 3  # workers lost before their trial started, in a row, that stop the loop


@dataclass
class Arm:
    label: str | None
    fixed: dict[str, Any]
    quota: int
    controller: Controller
    created: int = 0  # tuning trials created in this arm


@dataclass(frozen=True)
class Pending:
    """A trial the loop owns: what to tell its controller when it ends."""

    trial_id: int
    number: int
    attempt: int
    suggestion: Suggestion | None  # None for confirmation trials (nothing to tell)
    arm: Arm
    kind: TrialKind = TrialKind.TUNING


class Study:
    """Drives one experiment to completion (or until stopped)."""

    def __init__(self, spec: ExperimentSpec, storage: Storage, experiment_id: int, run_dir: Path, runner: Runner,
                 database_url: str):  # fmt: skip
        self.spec, self.storage, self.experiment_id = spec, storage, experiment_id
        self.run_dir, self.runner, self.database_url = Path(run_dir), runner, database_url
        self.arms = self._build_arms()
        self.queue: list[Pending] = []
        self.running: dict[int, Pending] = {}
        self.confirmed: set[str | None] = set()  # labels of the arms whose first confirmation round is queued
        self.rounds_over = False  # no further round of confirmations to queue (hpo.evidence.confirmations)
        self.round_note = ""  # where sequential confirmations stand, for the heartbeat and the progress line
        self.note = ""  # what the controller sees, for the heartbeat (and so `hpo status`)
        self._stop_checked = 0.0
        self.stop_reason: str | None = None  # set (e.g. by a signal handler) to stop at the loop's next turn
        self.database_error: str | None = None  # why the loop stopped when the database stayed away
        self.claim_lost: Callable[[], bool] = lambda: False  # the heartbeat's: another controller took over
        self.controller: tuple[str, int] | None = None  # (host, pid) of the claim this controller holds, where set
        self.lost_claim = False  # another controller took over, seen by the heartbeat or by a refused write
        self.lost_workers: dict[int, int] = {}  # trial id -> attempts of it whose worker was lost (not resumes)
        self.lost_before_start = 0  # attempts in a row whose worker was lost before the trial started
        self.workers_error: str | None = None  # why the loop stopped when workers kept being lost before a start
        self.disk_error: str | None = None  # why the loop stopped when a trial found its disk full
        self.told: list[int] = []  # trials told to their tuners since the newest trial was created (not yet stamped)

    # -- set-up ------------------------------------------------------------------------------------------

    def _build_arms(self) -> list[Arm]:
        return [
            Arm(
                plan.label,
                plan.fixed,
                plan.quota,
                self._controller(plan.space, plan.quota, self.run_dir / "tuner" / f"arm{plan.index}"),
            )  # fmt: skip
            for plan in arm_plans(self.spec)
        ]

    def _controller(self, space: SearchSpace, quota: int, output_dir: Path) -> Controller:
        tuner, budget = self.spec.tuner, self.spec.budget
        name = tuner.name if len(space) else "random"  # nothing to tune in this arm
        extra: dict[str, Any] = {}
        if name == "smac_hyperband":
            extra = {"min_budget": budget.min_budget, "max_budget": budget.max_budget, "eta": budget.eta}
        elif name == "asha":
            base = config_from_dict(self.spec.resolved_base())
            extra = {"plan": asha_plan(self.spec, base.budget.max_samples, base.eval.every_samples),
                     "reached_target_at_most": reached_target_at_most(self.spec, base)}  # fmt: skip
        if name in ("smac_bo", "smac_hyperband"):
            extra["save_history"] = self.spec.runner.name != "simulated"
        return build_controller(name, space, tuner.seed, quota, output_dir, dict(tuner.options), **extra)

    def _arm(self, label: str | None) -> Arm:
        return next((a for a in self.arms if a.label == label), self.arms[0])

    # -- resume ------------------------------------------------------------------------------------------

    def restore(self) -> None:
        """Bring fresh controllers to where the dead one was, and queue the trials it left behind.

        The controllers see the history they saw live: the asks and tells of the stored trials are replayed in
        the order the loop made them (`_history_events`), so a tuner asked again proposes the very configurations
        it proposed before and is told their results between the same asks. A trial that finished while a tuner
        was being asked, for one, was told after that ask, not when it finished."""
        unfinished = (TrialState.QUEUED, TrialState.RUNNING, TrialState.INTERRUPTED)
        for record in self.storage.list_trials(self.experiment_id, state=unfinished):  # queued: maybe started
            self.runner.kill_leftover(record.host, record.pid, self._launch_of(record).tag, record.started_at)
            store_kept_outcome(self.storage, self._launch_of(record).workdir, record.id, record.attempt)
        self.storage.requeue_interrupted(self.experiment_id)
        records = self.storage.list_trials(self.experiment_id)
        suggestions: dict[int, Suggestion | None] = {}
        for _, event, record in sorted(_history_events(records), key=lambda e: e[0]):
            arm = self._arm(record.arm)
            if event == "ask":
                suggestions[record.id] = self._ask_again(arm, record)
            else:
                self._tell(suggestions[record.id], record)
        for record in records:  # an arm with confirmations has them topped up to its first round (a controller
            # that died while creating them), as `_queue_confirmations` does once its tuning is over
            if record.state == TrialState.QUEUED:
                arm = self._arm(record.arm)
                self.queue.append(Pending(record.id, record.number, record.attempt, suggestions.get(record.id), arm,
                                          record.kind))  # fmt: skip

    def _ask_again(self, arm: Arm, record: TrialRecord) -> Suggestion | None:
        """The controller's suggestion for a stored trial: asked again (the same one, for a deterministic
        tuner), or, if it proposes something else, the stored parameters to be told as a replay."""
        if record.kind is not TrialKind.TUNING:
            return None
        arm.created += 1
        params = self.spec.space.as_read_now(record.params)  # an experiment recorded by an earlier version
        stored = Suggestion({k: v for k, v in params.items() if k not in arm.fixed}, record.budget)
        asked = arm.controller.ask()
        return asked if (asked.params, asked.budget) == (stored.params, stored.budget) else stored

    # -- the loop ----------------------------------------------------------------------------------------

    def run(self) -> ExperimentStatus:
        """Run trials until every arm has used its share and its confirmations ran; how the experiment ended
        (STOPPED also when the database stayed away for longer than the bound: see `database_error`)."""
        try:
            return self._run()
        except ClaimLostError:  # a trial this one would have created: another controller took the experiment over
            self.abandon()
            return ExperimentStatus.RUNNING  # under the other controller
        except DatabaseUnavailableError as exc:
            self.database_error = str(exc)
            self.stop_reason = self.stop_reason or (
                "the database was unreachable for longer than database.outage_s; `hpo resume` runs it again"
            )
            self.stop(self.stop_reason)
            return ExperimentStatus.STOPPED
        except Exception as exc:  # a trial that cannot start, a tuner's error: its running trials end first
            if self._taken_over():  # a trial the other controller started first ("it is not queued"), say
                self.abandon()
                return ExperimentStatus.RUNNING
            said = f"the controller failed ({type(exc).__name__}: {exc})"
            with contextlib.suppress(Exception):  # the error may say what a resume does (a lost Dask scheduler)
                self.stop(said if "hpo resume" in str(exc) else f"{said}; `hpo resume` runs it again")
            raise

    def _run(self) -> ExperimentStatus:
        while True:
            if self.claim_lost():
                self.abandon()
                return ExperimentStatus.RUNNING  # under the other controller
            if self.stop_reason is None and self._stop_requested():
                self.stop_reason = "experiment stopped by request"
            if self.stop_reason is not None:
                self.stop(self.stop_reason)
                return ExperimentStatus.STOPPED
            self._queue_confirmations()
            while self.runner.free_slots() > 0 and self._start_next():
                pass
            exits = self.runner.poll()
            self._handle(exits)
            if not self.running and not self.queue and self._arm_with_quota() is None and self._all_confirmed():
                self._update_note(every_s=0)  # the last round's note, for the final progress line and heartbeat
                self.storage.check_file()  # not finished into a deleted file (checked once a second before)
                return ExperimentStatus.FINISHED
            self._update_note()
            if not exits:
                self.runner.wait(POLL_INTERVAL_S)

    def _stop_requested(self, every_s: float = 1.0) -> bool:
        """Polls the database's stop flag (set by the API's stop action) at most once a second."""
        now = time.monotonic()
        if now - self._stop_checked < every_s:
            return False
        self._stop_checked = now
        self.storage.check_file()  # a SQLite file deleted under the controller: it stops (StorageError)
        return self.storage.is_stop_requested(self.experiment_id)

    def _arm_with_quota(self) -> Arm | None:
        """The arm with quota left that has created the fewest trials (round robin)."""
        open_arms = [a for a in self.arms if a.created < a.quota]
        return min(open_arms, key=lambda a: a.created) if open_arms else None

    def _start_next(self) -> bool:
        """Start one trial: a queued tuning trial (re-queued or resumed), else a new one from the tuner of the arm
        with quota left, else a queued confirmation trial. False when there is nothing to start."""
        pending = self._take_queued(TrialKind.TUNING)
        if pending is None and (arm := self._arm_with_quota()) is not None:
            suggestion = arm.controller.ask()
            params = {**arm.fixed, **suggestion.params}
            spec = TrialSpec(None, params, arm.label, suggestion.budget, (), self._global_batch(params))
            record = self.storage.get_trial(self._create_trial(spec))
            arm.created += 1
            pending = Pending(record.id, record.number, record.attempt, suggestion, arm)
        pending = pending or self._take_queued(TrialKind.CONFIRMATION)
        if pending is None:
            return False
        self.runner.submit(self._launch(pending))
        self.running[pending.trial_id] = pending
        return True

    def _take_queued(self, kind: TrialKind) -> Pending | None:
        """The first queued trial of this kind, taken off the queue."""
        pending = next((p for p in self.queue if p.kind is kind), None)
        if pending is not None:
            self.queue.remove(pending)
        return pending

    def _global_batch(self, params: dict[str, Any]) -> int | None:
        try:
            return trial_config(self.spec, params).batch.global_batch_size
        except Exception:
            return None  # an invalid configuration: the trial entry records it as a failed trial

    def _launch(self, pending: Pending) -> TrialLaunch:
        res, budget = self.spec.resources, self.spec.budget
        workdir = self.run_dir / "trials" / f"{pending.number:05d}"
        gpus = 0 if res.gpus == "none" else res.gpus_per_trial
        return TrialLaunch(pending.trial_id, pending.number, pending.attempt, self.database_url, workdir, gpus,
                           res.cpu_ranks_per_trial, budget.trial_timeout_s, res.memory_limit_mb)  # fmt: skip

    def _launch_of(self, record: TrialRecord) -> TrialLaunch:
        """The launch of a stored trial's current attempt, as it was (or would be) submitted."""
        return self._launch(Pending(record.id, record.number, record.attempt, None, self.arms[0]))

    def _handle(self, exits: list[TrialExit]) -> None:
        """Finish what ended without a result, re-queue lost attempts, tell tuners in finishing order."""
        ended, lost_before_start = [], False
        for exit in exits:
            pending = self.running.pop(exit.trial_id, None)
            if pending is None or pending.attempt != exit.attempt:
                continue
            record = self.storage.get_trial(exit.trial_id)
            if not record.state.finished and self._store_kept(pending, exit.attempt):
                record = self.storage.get_trial(exit.trial_id)  # its outcome, kept while the database was away
            if exit.lost and record.state is TrialState.QUEUED:  # the trial never started: not its fault
                self._requeue_unstarted(pending, record, exit.lost)
                lost_before_start = True
                continue
            self.lost_before_start = 0
            if not record.state.finished and (full := self._full_disk(pending, exit)):
                record = self.storage.requeue_trial(record.id, record.attempt, f"interrupted: {full}; re-queued")
                self.queue.insert(0, replace(pending, attempt=record.attempt))
                self._stop_for_disk(record, full)
                continue
            lost = exit.lost and self.lost_workers.get(record.id, 0) < MAX_REQUEUES
            if not record.state.finished and (lost or exit.returncode == EXIT_DATABASE_UNREACHABLE):
                why = exit.lost if lost else "the database was unreachable before it had a result"
                if lost:
                    self.lost_workers[record.id] = self.lost_workers.get(record.id, 0) + 1
                record = self.storage.requeue_trial(record.id, record.attempt, f"interrupted: {why}; re-queued")
                self.queue.insert(0, replace(pending, attempt=record.attempt))
                continue
            if not record.state.finished:
                record = self._reconcile(record, exit)
            ended.append((pending, record))
        if lost_before_start:  # one poll's losses count once: a worker that dies ends every attempt it held
            self._lost_before_start()
        for pending, record in sorted(ended, key=lambda e: _finish_order(e[1])):
            self._tell(pending.suggestion, record)

    def _requeue_unstarted(self, pending: Pending, record: TrialRecord, lost: str) -> None:
        """An attempt whose worker went before the trial started (a worker that restarts, e.g. at its memory limit):
        the trial is queued again, its allowance of lost workers kept, nothing told to a tuner."""
        why = f"interrupted: {lost.removesuffix(' while it ran')} before the trial started; re-queued"
        record = self.storage.requeue_trial(record.id, record.attempt, why)
        self.queue.insert(0, replace(pending, attempt=record.attempt))

    def _lost_before_start(self) -> None:
        """A poll that found workers lost before their trials started: after MAX_LOST_BEFORE_START such polls in
        a row (no trial started between them) the loop stops, the trials left queued for `hpo resume`."""
        self.lost_before_start += 1
        if self.lost_before_start >= MAX_LOST_BEFORE_START and self.stop_reason is None:
            self.workers_error = (
                f"the runner's workers were lost {self.lost_before_start} times in a row before a trial started on "
                "them: a worker that keeps restarting, for example at its memory limit (its log says why). The "
                "trials are queued; once the workers stay up, `hpo resume` runs them"
            )
            self.stop_reason = self.workers_error

    def _full_disk(self, pending: Pending, exit: TrialExit) -> str | None:
        """Why an attempt that ended without a result failed for a full disk (it said so, or the disk of its
        directory has next to nothing free), else None: an error of its own, or ended by a signal or a stop."""
        if exit.lost or exit.timed_out or exit.returncode is None or exit.returncode <= 0:
            return None
        workdir = self._launch(pending).workdir
        if full := full_disk(workdir):
            return full
        if exit.returncode != EXIT_DISK_FULL:
            return None
        if said := _trial_said(exit):
            return f"its disk is full ({said[:300]})"
        return f"the disk of {workdir} is full (exit code {EXIT_DISK_FULL}; its stderr.log names the write that failed)"

    def _stop_for_disk(self, record: TrialRecord, full: str) -> None:
        """A trial that could not write for a full disk is queued again (not failed: its configuration is not to
        blame), and the loop stops as for a database away, before the next trial meets the same disk."""
        if self.disk_error is None:
            self.disk_error = (
                f"trial {record.number} could not write its files: {full}. It is queued again; free space on that "
                f"disk, then `hpo resume {self.spec.name}` runs it and the rest"
            )
        self.stop_reason = self.stop_reason or self.disk_error

    def _store_kept(self, pending: Pending, attempt: int) -> bool:
        """Store the outcome the attempt kept in its directory (hpo.trial.outcome); whether there was one."""
        return store_kept_outcome(self.storage, self._launch(pending).workdir, pending.trial_id, attempt)

    def _reconcile(self, record: TrialRecord, exit: TrialExit) -> TrialRecord:
        """Record an attempt that ended without a final record (killed, timed out, crashed, lost)."""
        state, reason = classify_exit(exit)
        if exit.lost:
            reason = f"{reason} (its worker lost {self.lost_workers.get(record.id, 0) + 1} times)"
        result = TrialResult(state, reason, self._missed_objective(record), duration_s=exit.duration_s)
        with contextlib.suppress(StorageError):  # it recorded itself at this very moment: its own record wins
            self.storage.finish_trial(record.id, result, attempt=exit.attempt)
        return self.storage.get_trial(record.id)

    def _missed_objective(self, record: TrialRecord) -> float | None:
        """The objective of a run that produced no result: its penalty, from the best accuracy it reported."""
        try:
            cfg = trial_config(self.spec, record.params, fidelity=min(record.budget, 1.0))
        except Exception:
            return None
        evals = [m.value for m in self.storage.get_metrics(record.id, "mlm_accuracy") if m.value == m.value]
        return missed_objective(self.spec, cfg, max(evals) if evals else None)

    def _tell(self, suggestion: Suggestion | None, record: TrialRecord) -> None:
        if suggestion is None or record.kind is not TrialKind.TUNING:
            return
        feedback = tuner_feedback(self.spec, record.state, record.objective, record.metrics)
        if feedback is NOT_TOLD:
            return
        controller = self._arm(record.arm).controller
        if suggestion.handle is not None:
            controller.tell(suggestion, feedback)
        else:
            controller.replay(suggestion.params, suggestion.budget, feedback)
        if record.told_before is None:  # told now, live or by a resume: before the next trial is created
            self.told.append(record.id)

    def _tuning_over(self, arm: Arm) -> bool:
        """The arm created its whole quota and none of its tuning trials is running or queued."""
        if arm.created < arm.quota:
            return False
        owned = [*self.running.values(), *self.queue]
        return not any(p.arm is arm and p.kind is TrialKind.TUNING for p in owned)

    def _all_confirmed(self) -> bool:
        return all(arm.label in self.confirmed for arm in self.arms) and self.rounds_over

    def _queue_confirmations(self) -> None:
        """The first round for each arm whose tuning is over (its best configuration, as the storage names it now,
        all its tuning trials finished), with the training seeds after the config's; with `confirm_seeds: auto`,
        the next round for every arm once all finished the current one and the verdict says "not yet"
        (`hpo.evidence.confirmations`). An arm without a completed trial queues nothing (the verdict says so)."""
        first = self.spec.budget.confirmation_rounds[:1]
        for arm in self.arms:
            if arm.label in self.confirmed or not self._tuning_over(arm):
                continue
            self.confirmed.add(arm.label)
            for _ in range(first[0] - self._confirmations_created(arm) if first else 0):  # a resume may find some
                self._queue_confirmation(arm)
        if self.rounds_over or not self._all_confirmed_started() or self._confirmations_pending():
            return
        self.rounds_over = True
        if not self.spec.budget.sequential:
            return
        trials = self.storage.list_trials(self.experiment_id)
        evidence = stored_evidence(self.storage, self.experiment_id)
        verdicts = evidence.deciding(self.spec)
        target = runs_to_queue(self.spec, trials, verdicts.values(), evidence.best)
        self.round_note = f"confirmations: {rounds_note(verdicts)}"
        for arm in self.arms:
            created = sum(1 for t in trials if t.kind is TrialKind.CONFIRMATION and t.arm == arm.label)
            for _ in range(target - created if created else 0):
                self.rounds_over = False
                self._queue_confirmation(arm)

    def _confirmations_created(self, arm: Arm) -> int:
        return sum(1 for t in self.storage.list_trials(self.experiment_id, arm=arm.label)
                   if t.kind is TrialKind.CONFIRMATION)  # fmt: skip

    def _all_confirmed_started(self) -> bool:
        return all(arm.label in self.confirmed for arm in self.arms)

    def _confirmations_pending(self) -> bool:
        return any(p.kind is TrialKind.CONFIRMATION for p in (*self.running.values(), *self.queue))

    def _queue_confirmation(self, arm: Arm) -> None:
        """One more confirmation run of the arm's best configuration, with the next training seed."""
        best = self.storage.best_trial(self.experiment_id, arm=arm.label)
        if best is None:
            return  # no trial of this arm completed: nothing to confirm
        seeds = [t.seed for t in self.storage.list_trials(self.experiment_id, arm=arm.label)
                 if t.kind is TrialKind.CONFIRMATION and t.params == best.params]  # fmt: skip
        seed = max(seeds, default=trial_config(self.spec, best.params).seed) + 1
        spec = TrialSpec(None, best.params, arm.label, 1.0, (), best.global_batch_size, TrialKind.CONFIRMATION, seed)
        record = self.storage.get_trial(self._create_trial(spec))
        self.queue.append(Pending(record.id, record.number, record.attempt, None, arm, TrialKind.CONFIRMATION))

    def _taken_over(self) -> bool:
        """Whether the experiment's claim is another controller's now (False where this one's is unknown, or the
        database cannot say)."""
        if self.controller is None:
            return False
        try:
            record = self.storage.get_experiment(self.experiment_id)
        except StorageError:
            return False
        return (record.controller_host, record.controller_pid) != tuple(self.controller)

    def _create_trial(self, spec: TrialSpec) -> int:
        """Create a trial, stamping the trials told since the previous one with its number (`told_before`); only
        while this controller holds the claim (ClaimLostError otherwise: `run` leaves the experiment to the other)."""
        trial_id = self.storage.create_trial(self.experiment_id, spec, told=self.told, controller=self.controller)
        self.told = []
        return trial_id

    def stop(self, reason: str) -> None:
        """End every process of the running attempts, then record them as INTERRUPTED with `reason` (a resume runs
        them again, as it runs the queued trials). The record is closed only once the processes are gone, so no
        rank writes a metric after it."""
        for exit in self.runner.cancel_all():
            pending = self.running.pop(exit.trial_id, None)
            if pending is None:
                continue
            # it recorded its own result just before, or the database is away (the record stays for a resume)
            with contextlib.suppress(StorageError):
                if not self._store_kept(pending, exit.attempt):  # it finished while the database was away
                    self.storage.interrupt_trial(exit.trial_id, reason, attempt=exit.attempt)

    def abandon(self) -> None:
        """Another controller took the experiment over (`hpo resume` while this one looked dead: paused, or cut off
        from the database): end this one's trial processes, whose attempts the other re-runs, and leave the trial
        records, the queue and the experiment's status to it."""
        self.stop_reason = "another controller took the experiment over"
        self.lost_claim = True
        self.runner.cancel_all()
        self.running.clear()
        self.queue.clear()

    def _update_note(self, every_s: float = 1.0) -> None:
        now = time.monotonic()
        if now - getattr(self, "_noted", 0.0) < every_s:
            return
        self._noted = now
        waiting = self.queue or self._arm_with_quota() is not None
        why = self.runner.why_waiting() if waiting else ""
        self.note = f"{len(self.running)} running, {len(self.queue)} queued" + (f"; waiting: {why}" if why else "")
        if self.round_note:
            self.note = f"{self.round_note}; {self.note}"


def _trial_said(exit: TrialExit) -> str:
    """The error line the trial entry wrote as its attempt ended (`error: trial NUMBER (id ID) attempt N: ...`, or
    `trial id ID` outside a run directory), where its stderr tail still holds it ("" where the lines other ranks
    and torchrun wrote after it pushed it out)."""
    own = re.compile(rf"error: trial (\d+ \(id {exit.trial_id}\)|id {exit.trial_id}) attempt {exit.attempt}: ")
    return next((line.strip() for line in reversed(exit.stderr_tail.splitlines()) if own.match(line)), "")


def _history_events(records: list[TrialRecord]):
    """(order, "ask" | "tell", record): the tuners' asks and tells in the order the controllers made them. A trial
    was asked when it was created (trial numbers are in creation order); its result was told before the trial
    numbered `told_before` was created, in the place `told_order` among the tells there, or after the newest one
    (None: those in the order the trials finished, the order in which the loop tells what one poll found ended)."""
    for record in records:
        yield (record.number, 1), "ask", record
        if record.state.finished:
            position = record.told_before if record.told_before is not None else float("inf")
            place = record.told_order if record.told_order is not None else float("inf")
            yield (position, 0, place, *_finish_order(record)), "tell", record


def _finish_order(record: TrialRecord) -> tuple[datetime, int]:
    return (record.finished_at or datetime.max.replace(tzinfo=timezone.utc), record.number)
