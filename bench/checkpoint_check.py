"""What the resume's integrity check costs beside the load it guards: `trainer.checkpoint.check_intact` (the CRC-32
of every record of the checkpoint, read whole) against `torch.load` of the same file, both as a resume runs them,
on a checkpoint `save_checkpoint` wrote of a model of the given size with AdamW's moments (BERT-large: about 4 GB).

    python -m bench.checkpoint_check                    # BERT-large
    python -m bench.checkpoint_check --size base --repeat 3

The file is read from the page cache after the first pass (the figures are the best of --repeat); a cold disk adds
its read time to both alike.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from bench.trainer_throughput import SIZES
from trainer.checkpoint import TrainState, check_intact, load_checkpoint, save_checkpoint
from trainer.config import ModelConfig
from trainer.model import BertForPreTraining


def best_of(repeat: int, work) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="large")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    model = BertForPreTraining(ModelConfig(**SIZES[args.size]))
    optimizer = torch.optim.AdamW(model.parameters())
    for p in model.parameters():  # moments of the size a run's checkpoint holds
        p.grad = torch.zeros_like(p)
    optimizer.step()
    with tempfile.TemporaryDirectory() as directory:
        path = save_checkpoint(directory, {"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                               TrainState())  # fmt: skip
        gb = Path(path).stat().st_size / 1e9
        load = best_of(args.repeat, lambda: load_checkpoint(path))
        check = best_of(args.repeat, lambda: check_intact(path))
    print(f"size={args.size} checkpoint {gb:.2f} GB: torch.load {load:.2f} s, check_intact {check:.2f} s "
          f"({check / gb:.2f} s a GB), the check {check / load:.2f}x the load")  # fmt: skip


if __name__ == "__main__":
    main()
