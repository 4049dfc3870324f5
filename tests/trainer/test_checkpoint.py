"""Checkpoint files: a save cut short leaves the latest checkpoint as it was and nothing half-written beside it."""

from __future__ import annotations

import shutil

import pytest
import torch

from trainer import checkpoint
from trainer.checkpoint import TrainState, latest_checkpoint, load_checkpoint, save_checkpoint
from trainer.errors import CheckpointError, DiskFullError


def test_a_save_cut_short_leaves_the_latest_checkpoint_and_no_partial_file(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, {"model": {"w": torch.ones(3)}}, TrainState(step=1, samples=8))
    before = sorted(p.name for p in tmp_path.iterdir())

    real_save = torch.save

    def cut_short(obj, f, *args, **kwargs):  # SIGTERM (a KeyboardInterrupt) after part of the file was written
        real_save(obj, f, *args, **kwargs)
        with open(f, "r+b") as out:
            out.truncate(10)
        raise KeyboardInterrupt("SIGTERM")

    monkeypatch.setattr(checkpoint.torch, "save", cut_short)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, {"model": {"w": torch.zeros(3)}}, TrainState(step=2, samples=16))

    assert sorted(p.name for p in tmp_path.iterdir()) == before
    payload, state = load_checkpoint(latest_checkpoint(tmp_path))
    assert state.samples == 8 and payload["model"]["w"].tolist() == [1.0, 1.0, 1.0]


def test_a_save_sweeps_what_an_earlier_killed_save_left(tmp_path):
    (tmp_path / ".ckpt-000000000008.pt.tmp").write_bytes(b"half")  # a save killed with SIGKILL
    (tmp_path / ".latest.pt.tmp").write_bytes(b"")
    (tmp_path / "notes.tmp").write_text("not ours")
    save_checkpoint(tmp_path, {"model": {}}, TrainState(step=2, samples=16))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-000000000016.pt", "latest.pt", "notes.tmp"]


def test_a_full_disk_is_said_with_the_free_space_and_leaves_the_latest_checkpoint(tmp_path, monkeypatch):
    """torch's writer says a full disk as `[enforce fail at inline_container.cc] unexpected pos`: the error now names
    checkpoint.dir, the space left and what to do. /dev/full stands for the full disk (writes to it fail, ENOSPC)."""
    save_checkpoint(tmp_path, {"model": {"w": torch.ones(3)}}, TrainState(step=1, samples=8))
    before = sorted(p.name for p in tmp_path.iterdir())
    real_save = torch.save
    monkeypatch.setattr(checkpoint.torch, "save", lambda obj, f, *a, **k: real_save(obj, "/dev/full", *a, **k))
    with pytest.raises(CheckpointError) as error:
        save_checkpoint(tmp_path, {"model": {"w": torch.zeros(3)}}, TrainState(step=2, samples=16))
    message = str(error.value)
    assert message.startswith(f"checkpoint.dir: cannot save {tmp_path / 'ckpt-000000000016.pt'}: "), message
    assert "unexpected pos" in message and "MiB free on its disk: free space there, or choose another" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert not isinstance(error.value, DiskFullError)  # its own disk has room: not called full


def test_a_write_that_fails_with_next_to_nothing_free_is_a_full_disk(tmp_path, monkeypatch):
    """torch's writer does not say why a write failed: where it fails with less than FULL_BELOW_BYTES free on the
    checkpoint's disk (measured before its part-written file is removed), the disk was full, and the error says so
    (a trial then leaves the attempt to be run again instead of failing its configuration). The threshold is raised
    above this disk's free space to stand for a disk with next to nothing free."""
    real_save = torch.save
    monkeypatch.setattr(checkpoint.torch, "save", lambda obj, f, *a, **k: real_save(obj, "/dev/full", *a, **k))
    monkeypatch.setattr(checkpoint, "FULL_BELOW_BYTES", shutil.disk_usage(tmp_path).free + (1 << 30))
    with pytest.raises(DiskFullError, match="free space there, or choose another checkpoint.dir"):
        save_checkpoint(tmp_path, {"model": {"w": torch.zeros(3)}}, TrainState(step=2, samples=16))
    assert list(tmp_path.iterdir()) == []


def test_an_enospc_error_is_a_full_disk_whatever_the_free_space(tmp_path, monkeypatch):
    def no_space(obj, f, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", no_space)
    with pytest.raises(DiskFullError, match="No space left on device; .* MiB free on its disk"):
        save_checkpoint(tmp_path, {"model": {}}, TrainState(step=2, samples=16))


def test_the_number_of_ranks_of_a_checkpoint_that_does_not_record_it_is_that_of_its_random_states():
    """A checkpoint written before its position said its number of ranks: a run whose ranks saved together holds each
    rank's random state (`rng_ranks`), so as many ranks; without them (one process, or rank 0 of a failed run saving
    alone) it is not known."""
    from trainer.checkpoint import saved_world_size

    older = TrainState(step=2, samples=16)  # world_size None: what an older file's state loads as
    assert saved_world_size({"rng_ranks": [{}, {}]}, older) == 2
    assert saved_world_size({"rng": {}}, older) is None
    assert saved_world_size({"rng_ranks": [{}, {}]}, TrainState(world_size=1)) == 1  # its own record first


def test_keep_deletes_the_older_saves_beyond_it_and_every_save_deletes_those_of_more_samples(tmp_path):
    """checkpoint.keep 2: after each save the newest two stay (latest.pt the newest). Without keep every save of a
    run stays, but saves of more samples than the one just made go either way (an earlier run's, started afresh with
    checkpoint.resume false: left there, the folder held two runs' saves, and the repair hint for a lost latest.pt
    named the other run's newest)."""

    def saved() -> list[int]:
        return sorted(int(p.name[5:17]) for p in tmp_path.glob("ckpt-*.pt"))

    for step in range(1, 5):
        weights = {"model": {"w": torch.full((1,), float(step))}}
        save_checkpoint(tmp_path, weights, TrainState(step=step, samples=8 * step), keep=2)
    assert saved() == [24, 32]
    payload, state = load_checkpoint(latest_checkpoint(tmp_path))
    assert state.samples == 32 and payload["model"]["w"].item() == 4.0
    save_checkpoint(tmp_path, {"model": {}}, TrainState(step=1, samples=8))  # a run started afresh, keep None
    assert saved() == [8]
    save_checkpoint(tmp_path, {"model": {}}, TrainState(step=2, samples=16))
    assert saved() == [8, 16]  # every save of the run stays
    save_checkpoint(tmp_path, {"model": {}}, TrainState(step=3, samples=24), keep=1)
    assert saved() == [24]
    assert load_checkpoint(latest_checkpoint(tmp_path))[1].samples == 24


def test_a_run_with_keep_ends_with_its_newest_saves(tmp_path):
    from tests.trainer.conftest import make_train_overrides
    from trainer.__main__ import main

    ck = tmp_path / "ck"
    overrides = {"checkpoint.dir": str(ck), "checkpoint.every_samples": 16, "checkpoint.keep": 2,
                 "budget.max_samples": 64}  # fmt: skip
    assert main(make_train_overrides(tmp_path, **overrides)) == 0
    assert sorted(p.name for p in ck.glob("ckpt-*.pt")) == [f"ckpt-{48:012d}.pt", f"ckpt-{64:012d}.pt"]
    assert main(make_train_overrides(tmp_path, **{"checkpoint.keep": 2})) == 2  # without checkpoint.dir: refused
