"""`python steps_recorder.py OUT [key=value ...]`: the trainer's CLI, each rank writing the samples of every optimizer
step it trains to OUT.rank<r>, one JSON line a step (a torchrun of the trainer runs it as its script); `read_steps`
reads them back, every rank's samples of a step together: what tests compare runs by."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def recording_step(out: Path, real_step):
    """`trainer.train.train_step` that first writes the step's samples to `out`.rank<r>."""

    def step(run, micro_batches, number):
        with open(f"{out}.rank{run.env.rank}", "a") as f:
            f.write(json.dumps({"step": number, "samples": [int(i) for b in micro_batches for i in b]}) + "\n")
        return real_step(run, micro_batches, number)

    return step


def read_steps(out: Path) -> list[list[int]]:
    """The samples of every step the run recorded to `out` trained, over all its ranks, sorted, in step order."""
    steps: dict[int, list[int]] = {}
    for path in out.parent.glob(f"{out.name}.rank*"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            steps.setdefault(record["step"], []).extend(record["samples"])
    return [sorted(steps[step]) for step in sorted(steps)]


if __name__ == "__main__":
    import trainer.train as train_module
    from trainer.__main__ import main

    train_module.train_step = recording_step(Path(sys.argv[1]), train_module.train_step)
    sys.exit(main(sys.argv[2:]))
