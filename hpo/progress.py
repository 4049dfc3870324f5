"""What an experiment shows while it runs: one line per finished trial and a status line (trials done,
running and waiting, why they wait, the best so far per arm). On a terminal the status line updates in
place; otherwise it is printed when it changes, at most every few seconds."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from hpo.trials import TrialResult, TrialState


def describe_result(result: TrialResult) -> str:
    m = result.metrics or {}
    acc = result.best_mlm_accuracy
    parts = [result.state.value]
    if result.samples_to_target is not None:
        parts.append(f"target at {result.samples_to_target:,} samples")
    if acc is not None:
        parts.append(f"best mlm_accuracy {acc:.4f}")
    if m.get("samples"):
        parts.append(f"{m['samples']:,} samples")
    if result.reason:
        parts.append(result.reason)
    if result.objective is not None:
        parts.append(f"objective {result.objective:,.4g}")
    return ", ".join(parts)


class Progress:
    def __init__(self, stream: TextIO | None = None, quiet: bool = False, interval_s: float = 5.0):
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.tty = self.stream.isatty()
        self.interval_s = interval_s
        self._last_line = ""
        self._last_time = 0.0

    def start(self, study: Any) -> None:
        self._say(f"experiment {study.spec.name}: {study.spec.budget.trials} trials, tuner {study.spec.tuner.name}, "
                  f"{len(study.pool.slots)} slot(s): {', '.join(s.label for s in study.pool.slots)}")  # fmt: skip

    def trial_finished(self, study: Any, record: Any, result: TrialResult) -> None:
        arm = f" [{record.arm}]" if record.arm else ""
        budget = f" (budget {record.budget:.2f})" if record.budget < 1 else ""
        self._say(f"trial {record.number}{arm}{budget}: {describe_result(result)}")

    def update(self, study: Any) -> None:
        now = time.monotonic()
        if self.quiet or now - self._last_time < (0.5 if self.tty else self.interval_s):
            return  # the status line costs database queries: build it only when it may be shown
        line = self.status_line(study)
        self._last_time = now
        if self.tty:
            self.stream.write("\r\033[K" + line)
            self.stream.flush()
        elif line != self._last_line:
            self._say(line)
        self._last_line = line

    def finish(self, study: Any) -> None:
        if not self.quiet:
            self._say(self.status_line(study))

    def status_line(self, study: Any) -> str:
        counts = study.storage.count_trials_by_state(study.experiment_id)
        done = sum(n for s, n in counts.items() if s.finished)
        running = counts.get(TrialState.RUNNING, 0)
        left = study.spec.budget.trials - done - running
        line = f"trials: {done} done, {running} running, {left} waiting"
        why = study.waiting_reason()
        if why and left:
            line += f" ({why})"
        best = study.storage.best_per_arm(study.experiment_id)
        if best:
            line += " | best: " + "; ".join(f"{arm}: trial {t.number} ({t.objective:,.4g})" for arm, t in best.items())
        else:
            overall = study.storage.best_trial(study.experiment_id)
            if overall is not None:
                line += f" | best: trial {overall.number} ({overall.objective:,.4g})"
        return line

    def _say(self, line: str) -> None:
        if self.quiet:
            return
        if self.tty:
            self.stream.write("\r\033[K")
        self.stream.write(line + "\n")
        self.stream.flush()
