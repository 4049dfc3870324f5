"""trainer/distributed.py on 2 gloo ranks in processes of their own: `any_rank`, which the training loop asks before
it stops (a time budget, a loss that is not finite), gives every rank the same answer when only one raised a flag;
had each rank decided alone, one would stop while the other waited for it in the next collective."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed as dist

from tests.trainer.conftest import start_ranks
from trainer.distributed import DistEnv, any_rank

pytestmark = pytest.mark.distributed

# What each rank raises, call by call: [out of time, diverged]
RAISED = {0: [[True, False], [False, False], [False, True]], 1: [[False, False], [False, False], [False, False]]}


def worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    env = DistEnv(rank=rank, world_size=2, local_rank=rank, local_world_size=2)
    answers = [any_rank(flags, torch.device("cpu"), env) for flags in RAISED[rank]]
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(answers, f)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


def test_every_rank_learns_a_flag_that_one_rank_raised(tmp_path):
    start_ranks(worker, (str(tmp_path / "init"), str(tmp_path)), 2)
    answers = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    expected = [[a or b for a, b in zip(*calls, strict=True)] for calls in zip(RAISED[0], RAISED[1], strict=True)]
    assert answers[0] == answers[1] == expected == [[True, False], [False, False], [False, True]]


def test_one_process_answers_its_own_flags():
    assert any_rank([True, False], torch.device("cpu"), DistEnv()) == [True, False]
