"""bench.clipping_overhead and bench.noise_scale_overhead: with one rank the model runs as the trainer runs one
process (no DDP, so bucket-wise clipping clips the whole gradient), `--ddp always` and `--ddp both` put it in DDP
all the same, and the runs are labelled and compared with `none` run the same way."""

from __future__ import annotations

import sys

import pytest
import torch

from bench.clipping_overhead import build, ddp_modes, parse_args, report, run_label
from tests.trainer.conftest import make_model_config
from trainer.distributed import DistEnv

ONE_PROCESS = DistEnv(0, 1, 0, 1)


def test_one_rank_runs_without_ddp_as_the_trainer_does():
    model, clipper, _, _ = build("bucketwise", make_model_config(), ONE_PROCESS, torch.device("cpu"), 25.0)
    assert not isinstance(model, torch.nn.parallel.DistributedDataParallel)
    assert clipper.ddp is None and clipper.hook_state is None
    assert clipper.local_clip  # the whole gradient, by max_norm


def parsed(monkeypatch, *arguments):
    monkeypatch.setattr(sys, "argv", ["bench", *arguments])
    return parse_args("test")


def test_ddp_modes_and_labels(monkeypatch):
    assert ddp_modes(parsed(monkeypatch, "--nproc", "1")) == [None]
    assert ddp_modes(parsed(monkeypatch, "--nproc", "1", "--ddp", "always")) == [True]
    assert ddp_modes(parsed(monkeypatch, "--nproc", "1", "--ddp", "both")) == [None, True]
    assert run_label("bucketwise", None, 1) == "bucketwise"
    assert run_label("bucketwise", True, 1) == "bucketwise, DDP"
    assert run_label("bucketwise", True, 2) == "bucketwise"  # with 2+ ranks every run is in DDP


def test_both_ways_is_refused_with_two_ranks(monkeypatch, capsys):
    with pytest.raises(SystemExit):
        parsed(monkeypatch, "--nproc", "2", "--ddp", "both")
    assert "--ddp both is for one rank" in capsys.readouterr().err


def test_each_run_is_compared_with_none_run_the_same_way(monkeypatch, capsys):
    args = parsed(monkeypatch, "--nproc", "1", "--ddp", "both", "--strategies", "bucketwise")
    no_hook = type("Clipper", (), {"hook_state": None})()
    runs = {label: (None, no_hook, None, None) for label in ("none", "bucketwise", "none, DDP", "bucketwise, DDP")}
    times = {"none": [0.1, 0.1], "bucketwise": [0.11, 0.11], "none, DDP": [0.2, 0.2], "bucketwise, DDP": [0.25, 0.25]}
    report(args, runs, times)
    lines = capsys.readouterr().out.splitlines()
    assert "DDP buckets=-" in lines[0]
    assert lines[2].split()[-4:] == ["ms/step", "x1.100", "vs", "none"]
    assert lines[4].split()[-5:] == ["ms/step", "x1.250", "vs", "none,", "DDP"]
