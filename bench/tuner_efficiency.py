"""Tuner efficiency: what an HPO service costs to reach an answer, in training samples.

On the CPU demo problem (search_spaces/presets/adam_vs_lamb_demo_cpu.yaml, one arm: LAMB, the same space for
every tuner; trials capped by samples, never seconds), each tuner runs `--trials` trials one at a time, for
`--seeds` seeds:

- smac_bo, smac_hyperband (promoted configurations continue from their checkpoint; only the new samples count),
  random: the local engine (`hpo run`);
- nni_tpe: the NNI engine (`hpo run --engine nni`, with its median-stop assessor);
- optuna_tpe: Optuna's TPE sampler with its median pruner, fed the same intermediate accuracies (negated: the
  study minimizes samples to target), training in this process with the same trainer configs.

Two numbers per run: the training samples spent until the first trial reaches the target (the samples of every
earlier trial + the hitting trial's samples_to_target; None when no trial hits), and the best objective
(samples_to_target, with the experiment's penalty for misses) among the trials finished within
`--sample-budget` samples; a Hyperband trial that missed on a partial budget has no comparable objective.
Reported per tuner: median and range over seeds.

    python -m bench.tuner_efficiency                         # 5 tuners x 3 seeds x 12 trials (hours on 2 cores)
    python -m bench.tuner_efficiency --seeds 1 --trials 2 --max-samples 576   # smoke run

LAMB's learning rate ranges over `--lr` (default 1e-4..1e-1, wider than the preset's 6e-3..3e-2, where nearly
every configuration reaches the target and every tuner hits with its first trial).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from hpo.experiment import experiment_from_dict
from hpo.experiment.arms import arm_subspace, params_key, trial_config
from search_spaces import preset_path

TUNERS = ("smac_bo", "smac_hyperband", "random", "nni_tpe", "optuna_tpe")
ARM = {"optimizer.name": "lamb"}
# The preset's LAMB learning rates (6e-3..3e-2) nearly all reach the target: every tuner hits with its first
# trial. Over 1e-4..1e-1 only about a sixth of the log-range does (1e-2..3e-2 at 12,288 samples).
LR_RANGE = (1e-4, 1e-1)


# ------------------------------------------------------------------------------------------------ the problem
def problem(
    trials: int, seed: int, tuner: str, max_samples: int | None, lr: tuple[float, float] = LR_RANGE
) -> dict[str, Any]:
    """The experiment file (as a mapping) of one run: the demo preset's LAMB arm with its learning rate over
    `lr` (wider than the preset's, so that a tuner has something to find), sample budgets only."""

    path = preset_path("adam_vs_lamb_demo_cpu")
    # The preset without its arms (one arm here), so only what this benchmark uses of it is validated.
    preset = experiment_from_dict({**yaml.safe_load(path.read_text()), "compare": []}, str(path), path.parent)
    base = preset.resolved_base()
    full = max_samples or base["budget"]["max_samples"]
    # 16 evaluations per full trial: the pruner and the assessor see a curve, and Hyperband's smallest budget
    # (1/9) still ends after an evaluation.
    overrides = {"budget.max_time_s": None, "optimizer.name": ARM["optimizer.name"], "budget.max_samples": full,
                 "eval.every_samples": max(base["batch"]["global_batch_size"], full // 16)}  # fmt: skip
    engine = "nni" if tuner.startswith("nni_") else "local"
    budget = {"trials": trials, "max_parallel": 1, "trial_timeout_s": 1800}
    if tuner == "smac_hyperband":
        budget |= {"min_budget": 1 / 9, "max_budget": 1.0, "eta": 3}
    return {
        "name": f"eff-{tuner.replace('_', '-')}-s{seed}",
        "base_config": base,
        "overrides": overrides,
        "space": arm_subspace(preset.space, ARM).to_dict() | {"optimizer.lr@lamb": {"float": list(lr), "log": True}},
        "objective": preset.objective.model_dump(),
        "tuner": {"name": tuner, "seed": seed, "options": {}},
        "budget": budget,
        "resources": {"gpus": "none", "cpu_slots": 1},
        "engine": engine,
    }


# ------------------------------------------------------------------------------------------------ runs
def run_hpo(data: dict[str, Any], workdir: Path) -> list[dict[str, Any]]:
    """Run one experiment through `hpo run` (local or NNI engine); its trials in the order they finished."""
    from hpo.storage import SqlStorage

    path = workdir / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    db = f"sqlite:///{workdir / 'hpo.db'}"
    cmd = [sys.executable, "-m", "hpo", "--db", db, "run", str(path), "--run-dir", str(workdir / data["name"]),
           "--quiet"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{data['name']}: hpo run failed:\n{done.stderr[-3000:]}")
    with SqlStorage(db) as storage:
        eid = storage.get_experiment_by_name(data["name"]).id
        rows = sorted(storage.list_trials(eid), key=lambda t: (t.finished_at is None, t.finished_at, t.number))
        return [_trial_row(storage, t, data["tuner"]["name"] == "smac_hyperband") for t in rows]


def _trial_row(storage, t, continued: bool) -> dict[str, Any]:
    samples = t.metrics.get("samples")
    if samples is None:  # stopped from outside (e.g. NNI's assessor): the last evaluation it reported
        points = storage.get_metrics(t.id, "mlm_accuracy")
        samples = max((p.samples or 0 for p in points), default=0)
    # A miss on a partial budget (Hyperband) is penalized against its own shorter cap: not comparable.
    comparable = t.state.value == "completed" and (t.samples_to_target is not None or t.budget >= 1.0)
    return {"params": t.params, "samples": int(samples), "samples_to_target": t.samples_to_target,
            "objective": t.objective if comparable else None, "continued": continued}  # fmt: skip


def run_optuna(data: dict[str, Any], workdir: Path) -> list[dict[str, Any]]:
    """Optuna TPE + median pruner over the same space, the trainer in this process; trials in order."""
    import optuna

    # The spec only builds trial configs and scores them here; Optuna, not `tuner`, picks the parameters.
    spec = experiment_from_dict({**data, "tuner": {"name": "random"}}, data["name"], base_dir=workdir)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=data["tuner"]["seed"]),
                                pruner=optuna.pruners.MedianPruner(n_startup_trials=2))  # fmt: skip
    rows: list[dict[str, Any]] = []
    study.optimize(lambda trial: _optuna_trial(trial, spec, workdir, rows), n_trials=data["budget"]["trials"])
    return rows


class _Pruned(Exception):
    pass


class _OptunaReporter:
    def __init__(self, trial):
        self.trial, self.samples, self.result = trial, 0, None

    def intermediate(self, metrics: dict[str, Any]) -> None:
        self.samples = max(self.samples, int(metrics.get("samples") or 0))
        if metrics.get("mlm_accuracy") is not None:
            self.trial.report(-float(metrics["mlm_accuracy"]), step=self.samples)
            if self.trial.should_prune():
                raise _Pruned()

    def final(self, result) -> None:
        self.result = result


def _optuna_trial(trial, spec, workdir: Path, rows: list) -> float:
    import optuna

    from hpo.objective import objective_value
    from trainer.train import train

    params = {name: _suggest(trial, name, spec.space[name]) for name in spec.space}
    cfg = trial_config(spec, params)
    cfg = cfg.model_copy(
        update={"log": cfg.log.model_copy(update={"jsonl": str(workdir / f"optuna{trial.number}.jsonl")})}
    )
    reporter = _OptunaReporter(trial)
    try:
        train(cfg, reporter)
    except _Pruned:
        rows.append({"params": params, "samples": reporter.samples, "samples_to_target": None, "objective": None,
                     "continued": False})  # fmt: skip
        raise optuna.TrialPruned() from None
    result = reporter.result
    objective = objective_value(spec, result, cfg)
    rows.append({"params": params, "samples": result.samples, "samples_to_target": result.samples_to_target,
                 "objective": objective if result.status.normal_end else None, "continued": False})  # fmt: skip
    return objective


def _suggest(trial, name: str, param) -> Any:
    from search_spaces.space import CategoricalParam, FloatParam

    if isinstance(param, CategoricalParam):
        return trial.suggest_categorical(name, list(param.choices))
    if isinstance(param, FloatParam):
        return trial.suggest_float(name, param.low, param.high, log=param.log)
    return trial.suggest_int(name, param.low, param.high, log=param.log)


# ------------------------------------------------------------------------------------------------ figures
def spent_per_trial(rows: list[dict[str, Any]]) -> list[int]:
    """Samples each trial added: a continued configuration (Hyperband) only adds what it trained beyond its
    checkpoint."""
    seen: dict[str, int] = {}
    spent = []
    for row in rows:
        key = params_key(row["params"])
        before = seen.get(key, 0) if row["continued"] else 0
        spent.append(max(0, row["samples"] - before))
        seen[key] = max(seen.get(key, 0), row["samples"])
    return spent


def samples_to_first_hit(rows: list[dict[str, Any]]) -> int | None:
    total = 0
    for row, spent in zip(rows, spent_per_trial(rows), strict=True):
        if row["samples_to_target"] is not None:
            before = row["samples"] - spent  # a continued trial reached its target after its checkpoint
            return total + max(0, row["samples_to_target"] - before)
        total += spent
    return None


def best_within(rows: list[dict[str, Any]], budget: int) -> float | None:
    total, best = 0, None
    for row, spent in zip(rows, spent_per_trial(rows), strict=True):
        total += spent
        if total > budget:
            break
        if row["objective"] is not None:
            best = row["objective"] if best is None else min(best, row["objective"])
    return best


def summary(values: list[float | None]) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return f"- (0/{len(values)})"
    spread = f" [{min(got):,.0f}-{max(got):,.0f}]" if len(got) > 1 else ""
    return f"{statistics.median(got):,.0f}{spread} ({len(got)}/{len(values)})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tuners", default=",".join(TUNERS), help=f"comma-separated, of {', '.join(TUNERS)}")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per tuner (first-seed, first-seed + 1, ...)")
    parser.add_argument("--first-seed", type=int, default=0, help="the first seed (to split a long run; default 0)")
    parser.add_argument("--trials", type=int, default=12, help="trials per run")
    parser.add_argument("--max-samples", type=int, help="override the demo's budget.max_samples (smoke runs)")
    parser.add_argument("--sample-budget", type=int, help="samples for 'best objective' (default 6 full trials)")
    parser.add_argument("--out", type=Path, help="write every run's trials as JSON lines here")
    parser.add_argument("--lr", default=f"{LR_RANGE[0]},{LR_RANGE[1]}", help="LAMB's learning rate range LOW,HIGH")
    args = parser.parse_args(argv)
    try:
        lr = tuple(float(x) for x in args.lr.split(","))
        if len(lr) != 2 or not 0 < lr[0] < lr[1]:
            raise ValueError
    except ValueError:
        parser.error(f"--lr {args.lr!r}: give two learning rates LOW,HIGH with 0 < LOW < HIGH, e.g. 1e-4,1e-1")
    tuners = args.tuners.split(",")
    unknown = [t for t in tuners if t not in TUNERS]
    if unknown:
        parser.error(f"unknown tuner(s) {unknown}; use {', '.join(TUNERS)}")
    results: dict[str, list[tuple[int | None, float | None]]] = {}
    with tempfile.TemporaryDirectory(prefix="tuner-efficiency-") as tmp:
        for tuner in tuners:
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                data = problem(args.trials, seed, tuner, args.max_samples, lr)
                full = data["overrides"]["budget.max_samples"]
                budget = args.sample_budget or 6 * full
                workdir = Path(tmp) / data["name"]
                workdir.mkdir()
                rows = run_optuna(data, workdir) if tuner == "optuna_tpe" else run_hpo(data, workdir)
                hit, best = samples_to_first_hit(rows), best_within(rows, budget)
                results.setdefault(tuner, []).append((hit, best))
                print(f"{tuner} seed {seed}: samples to first hit {hit}, best objective within {budget:,} "
                      f"samples {best}, {len(rows)} trials", flush=True)  # fmt: skip
                if args.out:
                    with args.out.open("a") as f:
                        f.write(json.dumps({"tuner": tuner, "seed": seed, "trials": rows}) + "\n")
    print(f"\n| tuner | samples to first hit: median [range] (runs that hit) | best objective within {budget:,} "
          "samples: median [range] |\n|---|---|---|")  # fmt: skip
    for tuner, values in results.items():
        print(f"| {tuner} | {summary([h for h, _ in values])} | {summary([b for _, b in values])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
