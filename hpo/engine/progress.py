"""What `hpo run` shows while an experiment runs: a line per finished trial and a live status (trials done,
running and waiting of the total, the best so far per arm, elapsed time and an estimate of what remains: at the
pace of the trials this run saw finish, less what the running ones have done since the last of them, so that it
counts down while a trial runs and is re-estimated as each one ends).

The view reads the database in its own thread, so the study loop never prints. On a terminal it is a rich
`Live` display; otherwise (a log file, CI) it prints plain lines: each finished trial, and the status line
when it changes, at most every `interval_s` seconds. While the database is away (the view's reads try once; the
storage counts since when it has been unreachable) the status line says so, "database unreachable for 42 s,
retrying" (or what holds it up: "database out of disk space for 42 s"), and once it is back, for how long it was
away.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

from hpo.errors import HpoError, StorageError
from hpo.experiment import spec_from_stored
from hpo.experiment.arms import arms, in_arm_order
from hpo.mlperf import imported
from hpo.nni.config import replaced_by_resume
from hpo.storage.base import ExperimentStatus, Storage, TrialRecord, TrialTally
from hpo.storage.retry import without_waiting
from hpo.trials import TrialKind, TrialState, objective_text

FINISHED = [s for s in TrialState if s.finished]

if TYPE_CHECKING:
    from rich.live import Live
    from rich.table import Table

    from hpo.experiment.schema import ExperimentSpec


def describe_trial(trial: TrialRecord) -> str:
    """One line about a finished trial: state, target, accuracy, samples, reason, objective."""
    parts = [trial.state.value]
    if trial.samples_to_target is not None:
        parts.append(f"target at {trial.samples_to_target:,} samples")
    if trial.best_mlm_accuracy is not None:
        parts.append(f"best mlm_accuracy {trial.best_mlm_accuracy:.4f}")
    if trial.metrics.get("samples"):
        parts.append(f"{trial.metrics['samples']:,} samples")
    if trial.reason:
        parts.append(trial.reason)
    if trial.objective is not None:
        parts.append(f"objective {objective_text(trial.objective)}")
    label = f"trial {trial.number}" + (f" [{trial.arm}]" if trial.arm else "")
    label += f" (budget {trial.budget:.2f})" if trial.budget < 1 else ""
    label += f" (confirmation, seed {trial.seed})" if trial.kind.value == "confirmation" else ""
    return f"{label}: {', '.join(parts)}"


def describe_requeue(trial: TrialRecord) -> str:
    """One line about a trial queued again for another attempt, and why."""
    label = f"trial {trial.number}" + (f" [{trial.arm}]" if trial.arm else "")
    return f"{label}: queued again (attempt {trial.attempt + 1}): {trial.reason or 'its attempt was lost'}"


class ProgressView:
    def __init__(self, storage: Storage, experiment_id: int, total: int, stream: TextIO | None = None,
                 interval_s: float = 5.0, refresh_s: float = 0.5, outage_s: float | None = None,
                 spec: ExperimentSpec | None = None):  # fmt: skip
        """`spec`: the experiment's, whose declared arm order the best per arm follows (None: the storage's)."""
        from rich.console import Console  # here, not at the top: `hpo status` reads `experiment_progress` only

        self.storage, self.experiment_id, self.total = storage, experiment_id, total
        self.spec = spec
        self.outage_s = outage_s  # how long the controller waits for the database (for the outage line)
        self._away_s: float | None = None  # how long the database had been away at the last tick
        self.console = Console(file=stream or sys.stderr, soft_wrap=True, markup=False, highlight=False)
        self.interval_s, self.refresh_s = interval_s, refresh_s
        self.started = time.monotonic()
        self._seen: set[int] = set()  # the numbers of the finished trials printed
        self._requeued: set[tuple[int, int]] = set()  # (number, attempt) of the trials queued again, printed
        self._below = 0  # every trial numbered below it is finished and printed
        self._last_line, self._last_print = "", 0.0
        self._done_before: int | None = None  # trials finished before this run (a resume's): not of its pace
        self._done, self._done_at = 0, self.started  # trials finished at the last count that grew, and when
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hpo-progress", daemon=True)
        self._live: Live | None = None

    def start(self) -> ProgressView:
        if self.console.is_terminal:
            from rich.live import Live

            self._live = Live(self._table(""), console=self.console, refresh_per_second=4, transient=True)
            self._live.start()
        self._thread.start()
        return self

    def stop(self, ended: bool = True) -> None:
        """The last line; `ended`: the experiment ran to its end, so what it created is its total (a stopped one's
        total stays the planned one)."""
        self._stop.set()
        self._thread.join(timeout=10)
        self._tick(final=ended)
        if self._live is not None:
            self._live.stop()
        self.console.print(self._last_line)

    def _run(self) -> None:
        while not self._stop.wait(self.refresh_s):
            self._tick()

    def _tick(self, final: bool = False) -> None:
        try:
            with without_waiting():  # the next tick tries again; meanwhile the line says the database is away
                counts = self.storage.count_trials_by_state(self.experiment_id)
                done = sum(n for s, n in counts.items() if s.finished)
                # Read the finished trials only when some are new, and only those numbered from the first not yet
                # printed (a large experiment is not re-read every tick).
                after = self._below - 1 if self._below else None
                new = done > len(self._seen)
                finished = self.storage.list_trials(self.experiment_id, state=FINISHED, after=after) if new else []
                requeued = self._newly_requeued() if counts.get(TrialState.QUEUED) else []
                best = self.storage.best_per_arm(self.experiment_id) or self._overall()
                if self.spec is not None and self.spec.compare:
                    best = in_arm_order(self.spec, best)
                note = self.storage.get_experiment(self.experiment_id).controller_note or ""
        except StorageError:
            self._show_outage(final)
            return  # busy or away for a moment: the next tick tries again
        for trial in requeued:  # a worker lost mid-trial (or a resume's interrupted trials): said as it happens
            self.console.print(describe_requeue(trial))
        for trial in sorted((t for t in finished if t.number not in self._seen), key=lambda t: t.number):
            self._seen.add(trial.number)
            self.console.print(describe_trial(trial))
        while self._below in self._seen:
            self._below += 1
        if self._show_outage(final):  # the reads answered, the writes do not: an SQLite file another writer locks
            return
        if self._away_s is not None:
            self.console.print(f"database reachable again (it was away for at least {self._away_s:.0f} s)")
            self._away_s = None
        self._show(self.status_line(counts, best, note, final), final, best)

    def _newly_requeued(self) -> list[TrialRecord]:
        """The queued trials past their first attempt not yet printed (read by their versions, then each new one)."""
        versions = self.storage.list_trial_versions(self.experiment_id, state=TrialState.QUEUED)
        new = [v for v in versions if v.attempt and (v.number, v.attempt) not in self._requeued]
        self._requeued.update((v.number, v.attempt) for v in new)
        return self.storage.get_trials([v.id for v in new]) if new else []

    def _show_outage(self, final: bool) -> bool:
        """The outage line, while some call of this process finds the database unreachable; whether it showed."""
        away = self.storage.unreachable_for()
        if away is None:
            return False
        self._away_s = away
        self._show(self.outage_line(away, self.storage.outage_state()), final)
        return True

    def outage_line(self, away_s: float, state: str = "unreachable") -> str:
        """The status line while the database is away (`state`: what holds it up, `Storage.outage_state`)."""
        if self.outage_s and away_s >= self.outage_s:  # running trials train on; the next write ends the run
            return (f"database {state} for {away_s:.0f} s, past the {self.outage_s:g} s the controller waits "
                    "(database.outage_s): it stops at its next write")  # fmt: skip
        bound = f" (the controller waits up to {self.outage_s:g} s: database.outage_s)" if self.outage_s else ""
        return f"database {state} for {away_s:.0f} s, retrying{bound}"

    def _show(self, line: str, final: bool, best: dict[str, TrialRecord] | None = None) -> None:
        if self._live is not None:
            self._live.update(self._table(line, best))
        elif not final and line != self._last_line and time.monotonic() - self._last_print >= self.interval_s:
            self.console.print(line)
            self._last_print = time.monotonic()
        self._last_line = line

    def _overall(self) -> dict[str, TrialRecord]:
        overall = self.storage.best_trial(self.experiment_id)
        return {"overall": overall} if overall else {}

    def status_line(self, counts: dict[TrialState, int], best: dict[str, TrialRecord], note: str,
                    final: bool = False) -> str:  # fmt: skip
        """The live status; `final`: the experiment ended, so what it created is its total (sequential
        confirmations plan up to a cap and may stop earlier)."""
        done = sum(n for s, n in counts.items() if s.finished)
        running = counts.get(TrialState.RUNNING, 0)
        created = sum(counts.values())
        total = created if final else max(self.total, created)
        waiting = total - done - running
        now = time.monotonic()
        if self._done_before is None:
            self._done_before = self._done = done
        if done > self._done:
            self._done, self._done_at = done, now
        elapsed = _duration(now - self.started)
        line = f"trials: {done}/{total} done, {running} running, {waiting} waiting | elapsed {elapsed}"
        left = time_left(self._done_at - self.started, self._done - self._done_before, total - done, waiting,
                         now - self._done_at)  # fmt: skip
        stopped = self._stop.is_set()  # the last line: nothing runs now, and why trials waited is past
        if left is not None and not stopped:
            line += f", about {_duration(left)} left"
        if "waiting:" in note and waiting and not stopped:
            line += f" ({note.split('waiting: ', 1)[1]})"
        if note.startswith("confirmations:"):  # sequential confirmations (hpo.engine.study): the round and the verdict
            line += f" | {note.split(';', 1)[0]}"
        if best:
            line += " | best: " + "; ".join(
                f"{arm}: trial {t.number} ({objective_text(t.objective)})" for arm, t in best.items()
            )
        return line

    def _table(self, line: str, best: dict[str, TrialRecord] | None = None) -> Table:
        from rich.table import Table

        table = Table(show_header=False, box=None, pad_edge=False)
        table.add_row(line.split(" | best:")[0] or "starting ...")
        for arm, trial in (best or {}).items():
            table.add_row(f"  best {arm}: trial {trial.number}, objective {objective_text(trial.objective)}")
        return table


def time_left(window_s: float, finished: int, unfinished: int, waiting: int, since_last_s: float) -> float | None:
    """Seconds until the `unfinished` trials (`waiting` of them not started) are done, at the pace of the `finished`
    trials this run saw end in its first `window_s` seconds (up to the last of them): that pace for each unfinished
    trial, less the `since_last_s` seconds the running ones have worked since, but never less than the waiting
    trials' share alone. None before a trial of this run has finished, or when none is left."""
    if finished <= 0 or unfinished <= 0:
        return None
    per_trial = window_s / finished
    return max(per_trial * unfinished - since_last_s, per_trial * waiting)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def why_none_completed(storage: Storage, experiment_id: int, name: str) -> str:
    """Where to read why an experiment has no completed trial: its trials' reasons, or, where no trial ran (a run
    stopped as it started), the experiment's state."""
    if storage.count_trials(experiment_id):
        return f"`hpo trials {name}` says why"
    return f"no trial has run (`hpo status {name}` says where the experiment stands)"


def trials_done(tuning_done: int, tuning_planned: int, confirmations_done: int, confirmations_planned: int) -> str:
    """`3/3 tuning trials done, 1/2 confirmation runs`: tuning trials against the tuning budget and the
    confirmation runs (budget.confirm_seeds per arm, the cap with auto) against their own plan, never one against
    the other's."""
    line = f"{tuning_done}/{tuning_planned} tuning trials done"
    if confirmations_planned or confirmations_done:
        line += f", {confirmations_done}/{confirmations_planned} confirmation runs"
    return line


def experiment_progress(storage: Storage, record, tallies: Sequence[TrialTally] | None = None) -> str:
    """`trials_done` of a stored experiment: its tuning budget, and confirm_seeds for each of its arms; for an imported
    experiment (hpo.mlperf) what it holds: `imported (mlperf): 3 runs in 2 configurations, 2 reached the target`.
    From the trials' counts (`Storage.tally_trials`, read here unless given), not the trials."""
    tallies = storage.tally_trials(record.id) if tallies is None else tallies
    tuning = [t for t in tallies if t.kind is TrialKind.TUNING]
    confirmations = [t for t in tallies if t.kind is not TrialKind.TUNING]
    info = imported(record)
    if info:
        # a trial an import was writing when it stopped is no run: the import wrote that run again as another
        runs, hits = _finished(tallies), sum(t.reached for t in tallies)
        return (f"imported ({info.get('kind')}): {runs} run(s) in {_finished(tuning)} configuration(s), "
                f"{hits} reached the target")  # fmt: skip
    created = sum(t.trials for t in confirmations)
    budget, planned = _planned(record)
    if record.status is ExperimentStatus.FINISHED:  # auto confirmations plan up to a cap and may end before it
        planned = created
    replaced = _replaced(storage, record, tuning)  # engine: nni: not of the budget, a new trial took each one's place
    return trials_done(_finished(tuning) - replaced, max(budget, sum(t.trials for t in tuning) - replaced),
                       _finished(confirmations), max(planned, created))  # fmt: skip


def _replaced(storage: Storage, record, tuning: Sequence[TrialTally]) -> int:
    """engine: nni: the tuning trials a stop interrupted that a resume replaced by new ones (failed, never charged,
    `hpo.nni.config.replaced_by_resume`); read only when the experiment has a failed tuning trial."""
    if record.spec.get("experiment", {}).get("engine") != "nni" or not any(
            t.state is TrialState.FAILED for t in tuning):  # fmt: skip
        return 0
    failed = storage.list_trials(record.id, state=TrialState.FAILED)
    return sum(replaced_by_resume(t.kind.value, t.state.value, t.reason) for t in failed)


def _finished(tallies: Sequence[TrialTally]) -> int:
    return sum(t.trials for t in tallies if t.state.finished)


def _planned(record) -> tuple[int, int]:
    """(tuning trials, confirmation runs) a stored experiment plans; from the raw stored budget when the stored
    spec no longer validates (a listing must not fail on one old experiment)."""
    try:
        spec = spec_from_stored(record)
    except HpoError:
        budget = record.spec.get("experiment", {}).get("budget", {})
        seeds = budget.get("confirm_seeds", 0)
        return int(budget.get("trials", 0)), int(seeds) if str(seeds).isdigit() else 0
    return spec.budget.trials, spec.budget.most_confirm_seeds * len(arms(spec))
