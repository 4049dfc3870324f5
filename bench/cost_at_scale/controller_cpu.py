"""The controller's own CPU time per trial: each tuner's ask/tell timed on the simulated runner."""

from __future__ import annotations

import contextlib
import io
import statistics
import time
from pathlib import Path
from typing import Any

from bench.cost_at_scale.common import experiment
from hpo.trials import TrialState


class _Timed:
    """A controller whose ask and tell are timed (process CPU), per trial in the order asked; `on_ask` is called
    before each ask (the CPU limit)."""

    def __init__(self, inner, log: list[float], on_ask):
        self.inner, self.log, self.on_ask, self.handles = inner, log, on_ask, {}

    def ask(self):
        self.on_ask()
        begin = time.process_time()
        suggestion = self.inner.ask()
        self.handles[id(suggestion)] = len(self.log)
        self.log.append(time.process_time() - begin)
        return suggestion

    def tell(self, suggestion, cost):
        begin = time.process_time()
        self.inner.tell(suggestion, cost)
        index = self.handles.pop(id(suggestion), None)
        if index is not None:
            self.log[index] += time.process_time() - begin

    def replay(self, params, budget, cost):
        self.inner.replay(params, budget, cost)


class _TimedRunner:
    """The simulated runner with the CPU of its submit and poll (the trials' own work) summed."""

    def __init__(self, inner):
        self.inner, self.cpu_s = inner, 0.0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def submit(self, launch):
        begin = time.process_time()
        try:
            return self.inner.submit(launch)
        finally:
            self.cpu_s += time.process_time() - begin

    def poll(self):
        begin = time.process_time()
        try:
            return self.inner.poll()
        finally:
            self.cpu_s += time.process_time() - begin


def controller_cpu(tuner: str, trials: int, args, directory: Path) -> dict[str, Any]:
    """Our study loop alone on the simulated runner, one arm over the whole space: CPU per trial and per decision
    as the history grows (see the module docstring); stopped after `args.cpu_limit_s` CPU seconds."""
    from hpo.engine.study import Study
    from hpo.experiment import experiment_from_dict, stored_form
    from hpo.runners import build_runner
    from hpo.storage import SqlStorage

    name, slots = f"cpu-{tuner}-{trials}", args.cpu_slots
    data = experiment(name, args.run_table, tuner, 0, args.batch, args.lr, slots, trials, 0, compare=False)
    spec = experiment_from_dict(data, name, base_dir=directory)
    url = f"sqlite:///{directory / f'{name}.db'}"
    storage = SqlStorage(url, upgrade=True)
    run_dir = directory / name
    eid = storage.create_experiment(spec.name, stored_form(spec, run_dir), spec.direction)
    runner = _TimedRunner(build_runner(spec))
    runner.attach(storage, eid)
    study = Study(spec, storage, eid, run_dir, runner, url)
    decisions: list[float] = []
    wall, cpu = time.perf_counter(), time.process_time()

    def limit() -> None:  # the study stops at its loop's next turn (the asks of this turn still run)
        if study.stop_reason is None and time.process_time() - cpu > args.cpu_limit_s:
            study.stop_reason = "the benchmark's CPU limit"

    for arm in study.arms:
        arm.controller = _Timed(arm.controller, decisions, limit)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        study.run()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    done = storage.count_trials(eid, state=TrialState.COMPLETED) + storage.count_trials(eid, state=TrialState.DIVERGED)
    storage.close()
    last = decisions[len(decisions) - max(1, len(decisions) // 10) :]
    per_decision = statistics.fmean(last) if last else None
    tenth = max(1, len(decisions) // 10)  # the trend: mean ms per decision over each tenth of the asks
    trend = [(min(i + tenth, len(decisions)), 1000 * statistics.fmean(decisions[i : i + tenth]))
             for i in range(0, len(decisions), tenth)]  # fmt: skip
    return {
        "tuner": tuner, "trials": trials, "slots": slots, "asked": len(decisions), "finished": done,
        "stopped": len(decisions) < trials or done < trials, "wall_s": wall, "cpu_s": cpu,
        "runner_cpu_s": runner.cpu_s, "loop_ms_per_trial": 1000 * (cpu - runner.cpu_s) / max(len(decisions), 1),
        "tuner_ms_per_decision_last_tenth": None if per_decision is None else 1000 * per_decision,
        "decisions_per_cpu_s": None if not per_decision else 1 / per_decision, "trend_ms": trend,
    }  # fmt: skip


# ------------------------------------------------------------------------------------------------ the tables
