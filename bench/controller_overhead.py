"""Controller overhead: N trials of a fixed-length dummy workload on S slots through the real local engine.

Everything but the trainer is real: the experiment spec, the tuner's ask/tell, trial configs written to disk,
processes started and polled, reports streamed into SQLite, results recorded. The workload is
`sleep SECONDS` followed by the trainer's final JSON line. Ideal time = ceil(N / S) x SECONDS;
overhead = wall time / ideal time - 1. (Ray Tune documents 14 % for 1-second trials.)

    python -m bench.controller_overhead                       # 200 trials x 1 s on 4 slots, random search
    python -m bench.controller_overhead --tuner smac_bo --trials 60
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

from hpo.experiment import experiment_from_dict
from hpo.launch import LaunchSpec
from hpo.storage import SqlStorage
from hpo.study import Study
from hpo.trials import TrialState


def dummy_launch(seconds: float):
    """A launch builder whose trial sleeps, then writes the trainer's final record where the trainer would."""

    def build(spec: LaunchSpec, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        report = Path(spec.config_path).parent / "report.jsonl"
        final = json.dumps({"kind": "final", "status": "reached_target", "samples": 64, "samples_to_target": 64,
                            "best_mlm_accuracy": 0.9})  # fmt: skip
        return ["/bin/sh", "-c", f"sleep {seconds}; echo '{final}' >> '{report}'"], env

    return build


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--tuner", default="random", choices=["random", "smac_bo"])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        spec = experiment_from_dict({
            "name": "overhead", "base_config": {}, "overrides": {"device": "cpu"},
            "space": {"optimizer.lr": {"float": [1e-4, 1e-2], "log": True},
                      "optimizer.name": {"choice": ["adamw", "lamb"]}},
            "compare": ["optimizer.name"], "tuner": {"name": args.tuner, "seed": 0},
            "budget": {"trials": args.trials, "max_parallel": args.slots},
            "resources": {"gpus": "none", "cpu_slots": args.slots},
        }, "overhead.yaml")  # fmt: skip
        storage = SqlStorage(f"sqlite:///{tmp}/hpo.db", upgrade=True)
        eid = storage.create_experiment(spec.name, spec.self_contained(), spec.direction)
        study = Study(spec, storage, eid, Path(tmp) / "run", launch_builder=dummy_launch(args.seconds))
        start = time.perf_counter()
        study.run()
        wall = time.perf_counter() - start
        done = storage.count_trials(eid, state=TrialState.COMPLETED)
    ideal = math.ceil(args.trials / args.slots) * args.seconds
    overhead = 100 * (wall / ideal - 1)
    print(f"{args.trials} trials x {args.seconds:g} s on {args.slots} slots, tuner {args.tuner}: "
          f"{done} completed, wall {wall:.2f} s, ideal {ideal:.2f} s, overhead {overhead:.1f} %")  # fmt: skip


if __name__ == "__main__":
    main()
