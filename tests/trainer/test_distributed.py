"""trainer/distributed.py on 2 gloo ranks in processes of their own: `any_rank`, which the training loop asks before
it stops (a time budget, a loss that is not finite), gives every rank the same answer when only one raised a flag;
had each rank decided alone, one would stop while the other waited for it in the next collective. And the loop
itself: two ranks whose clocks disagree about the time budget stop at the same step."""

from __future__ import annotations

import json
import os
import socket
import types
import warnings
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from tests.trainer.conftest import make_train_overrides, start_ranks
from trainer.distributed import DistEnv, all_gather_scalars, any_rank

pytestmark = pytest.mark.distributed

# What each rank raises, call by call: [out of time, diverged]
RAISED = {0: [[True, False], [False, False], [False, True]], 1: [[False, False], [False, False], [False, False]]}
# What each rank gathers: float64 values a float32 would round (0.1, 2**53 - 1), a count, a huge one
SCALARS = {0: [0.1, 2.0**53 - 1, 7.0], 1: [-1e300, 3.0, 0.0]}


def worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    env = DistEnv(rank=rank, world_size=2, local_rank=rank, local_world_size=2)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")  # a deprecation torch would print once per rank
        answers = [any_rank(flags, torch.device("cpu"), env) for flags in RAISED[rank]]
        gathered = all_gather_scalars(SCALARS[rank], torch.device("cpu"), env)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"answers": answers, "gathered": gathered, "warnings": [str(w.message) for w in said]}, f)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


def test_every_rank_learns_a_flag_that_one_rank_raised(tmp_path):
    """And `all_gather_scalars`, which `any_rank` asks, gives every rank every rank's values in rank order, exactly,
    without a word: torch 2.13 deprecated the collective it called (all_gather_into_tensor), and its FutureWarning
    was printed once per rank under torchrun."""
    start_ranks(worker, (str(tmp_path / "init"), str(tmp_path)), 2)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    expected = [[a or b for a, b in zip(*calls, strict=True)] for calls in zip(RAISED[0], RAISED[1], strict=True)]
    assert ranks[0]["answers"] == ranks[1]["answers"] == expected == [[True, False], [False, False], [False, True]]
    assert ranks[0]["gathered"] == ranks[1]["gathered"] == [SCALARS[0], SCALARS[1]]
    assert ranks[0]["warnings"] == ranks[1]["warnings"] == []


def test_one_process_answers_its_own_flags():
    assert any_rank([True, False], torch.device("cpu"), DistEnv()) == [True, False]


def training_worker(rank: int, directory: str, port: int) -> None:
    """One rank of a 2-rank run of the tiny model; rank 1's clock runs 1,000 times fast (a stand-in for ranks whose
    clocks differ), so by it the time budget (1 s) is spent after the first step, and by rank 0's never."""
    import time
    from pathlib import Path

    import trainer.distributed
    import trainer.train
    from trainer.config import load_config
    from trainer.report import JsonLinesReporter

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
    torch.set_num_threads(1)
    trainer.distributed.COLLECTIVE_TIMEOUT = timedelta(seconds=30)  # a rank left waiting fails in 30 s, not 300
    if rank == 1:
        trainer.train.time = types.SimpleNamespace(perf_counter=lambda: 1000 * time.perf_counter())
    # Each rank writes its own copy of the (seeded, identical) shards: two writers of one HDF5 file collide
    overrides = make_train_overrides(Path(directory) / f"data{rank}", **{
        "budget.max_time_s": 1.0, "budget.max_samples": 96, "log.every_steps": 3, "eval.every_samples": 10**6,
        "log.jsonl": str(Path(directory) / f"rank{rank}.jsonl")})  # fmt: skip
    cfg = load_config(None, overrides)
    reporter = JsonLinesReporter(cfg.log.jsonl)
    result = trainer.train.train(cfg, reporter)
    reporter.close()
    (Path(directory) / f"result{rank}.json").write_text(json.dumps([result.status.value, result.steps]))
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


def test_ranks_whose_clocks_disagree_about_the_time_budget_stop_at_the_same_step(tmp_path):
    """Rank 1 is out of time after step 1, rank 0 is not: they decide together at their first read (step 3) and
    both stop there. Had rank 1 stopped alone at step 1, rank 0 would have waited for it in step 2's all-reduce."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start_ranks(training_worker, (str(tmp_path), port), 2)
    results = [json.loads((tmp_path / f"result{r}.json").read_text()) for r in (0, 1)]
    assert results == [["budget_exhausted", 3], ["budget_exhausted", 3]]
