"""User errors the CLI refuses before any work (exit code 2, a message naming the key and the path, no traceback),
and a run stopped with Ctrl-C: no traceback, and the same command resumes it to the uninterrupted run's numbers."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess

import numpy as np
import pytest
import yaml

import trainer.run
import trainer.train as train_module
from tests.trainer.conftest import act_at_step, make_shards, make_train_overrides
from trainer.__main__ import main
from trainer.errors import ConfigError, Terminated
from trainer.report import read_jsonl


def cli(tmp_path, capsys, **extra):
    """`python -m trainer` in this process on the tiny test run: (exit code, stderr, report records)."""
    overrides = make_train_overrides(tmp_path, **extra)
    code = main(overrides)
    err = capsys.readouterr().err
    report = tmp_path / "report.jsonl"
    return code, err, read_jsonl(report) if report.is_file() else []


def losses(records):
    return [r["loss"] for r in records if r.get("event") == "progress"]


def test_a_checkpoint_dir_that_is_a_file_is_refused_before_any_work(tmp_path, capsys):
    taken = tmp_path / "notes.txt"
    taken.write_text("mine\n")
    code, err, records = cli(tmp_path, capsys, **{"checkpoint.dir": str(taken)})
    assert code == 2, err
    assert err.startswith(f"error: checkpoint.dir: {taken} is a file, not a directory"), err
    assert "Traceback" not in err and "training BERT" not in err and records == []
    assert taken.read_text() == "mine\n"


def test_a_checkpoint_dir_that_cannot_be_written_is_refused_before_any_work(tmp_path, capsys):
    """A directory nobody can make (under /proc, where even root cannot): the run would train, then fail to save."""
    unwritable = "/proc/hpo-trainer-checkpoints"
    code, err, records = cli(tmp_path, capsys, **{"checkpoint.dir": unwritable})
    assert code == 2, err
    assert err.startswith(f"error: checkpoint.dir: cannot write checkpoints in {unwritable} ("), err
    assert "Traceback" not in err and "training BERT" not in err and records == []


def test_resuming_with_another_micro_batch_is_refused_before_the_mlperf_log_is_touched(tmp_path, capsys):
    ck, mlperf = tmp_path / "ck", tmp_path / "mlperf.log"
    common = {"checkpoint.dir": str(ck), "log.mlperf": str(mlperf)}
    code, err, _ = cli(tmp_path, capsys, **common, **{"budget.max_samples": 16})
    assert code == 0, err
    kept = mlperf.read_text()
    code, err, records = cli(tmp_path, capsys, **common, **{"budget.max_samples": 32, "batch.micro_batch_size": 2})
    assert code == 2, err
    assert err.startswith(f"error: batch.micro_batch_size: {ck / 'latest.pt'} was trained with 4, this run has 2"), err
    assert "Traceback" not in err and "training BERT" not in err
    assert mlperf.read_text() == kept
    code, err, _ = cli(tmp_path, capsys, **common, **{"budget.max_samples": 32, "batch.micro_batch_size": "auto"})
    assert code == 0 and "resumed from" in err, err  # auto keeps the checkpoint's


def test_a_resume_on_ranks_the_checkpoints_micro_batch_cannot_split_the_batch_over_says_so(tmp_path, capsys,
                                                                                           monkeypatch):  # fmt: skip
    """Resumed on 2 ranks with micro-batch 2, a checkpoint of micro-batch 4 (batch 8) said "set 4", which on 2 ranks
    the batch (8 = 4 x 2) takes, but on 4 ranks it does not: the message named no way out. The check as each rank
    runs it (WORLD_SIZE as torchrun sets it)."""
    from trainer.config import load_config
    from trainer.preflight import check_resume

    ck = tmp_path / "ck"
    code, err, _ = cli(tmp_path, capsys, **{"checkpoint.dir": str(ck), "budget.max_samples": 16})
    assert code == 0, err
    cfg = load_config(None, make_train_overrides(tmp_path, **{"checkpoint.dir": str(ck), "budget.max_samples": 32,
                                                               "batch.micro_batch_size": 2}))  # fmt: skip
    for world, says in (("2", False), ("4", True)):
        monkeypatch.setenv("WORLD_SIZE", world)
        with pytest.raises(ConfigError) as refused:
            check_resume(cfg)
        assert str(refused.value).startswith(f"batch.micro_batch_size: {ck / 'latest.pt'} was trained with 4, this "
                                             "run has 2"), refused.value  # fmt: skip
        ranks = (f"set 4 (or auto, which keeps the checkpoint's) on a number of ranks that 4-sequence micro-batches "
                 f"divide the batch over (not {world}: batch.global_batch_size 8), or start afresh")  # fmt: skip
        assert (ranks in str(refused.value)) is says, refused.value


def test_saves_without_latest_pt_are_refused_not_written_over_by_a_fresh_start(tmp_path, capsys):
    """latest.pt removed (or a copy that left it out): the run started afresh without a word, writing over the saves."""
    ck = tmp_path / "ck"
    common = {"checkpoint.dir": str(ck), "checkpoint.every_samples": 16}
    code, err, _ = cli(tmp_path, capsys, **common, **{"budget.max_samples": 32})
    assert code == 0, err
    (ck / "latest.pt").unlink()
    kept = {path.name: path.read_bytes() for path in ck.iterdir()}
    newest = ck / "ckpt-000000000032.pt"
    code, err, records = cli(tmp_path, capsys, **common, **{"budget.max_samples": 64})
    assert code == 2, err
    assert err.startswith(
        f"error: checkpoint.dir: {ck} holds 2 checkpoint(s), the newest {newest.name}, but no latest.pt, which a "
        f"resume starts from: to resume from the newest, `ln -f {newest} {ck / 'latest.pt'}`;"
    ), err
    assert {path.name: path.read_bytes() for path in ck.iterdir()} == kept and "training BERT" not in err
    (ck / "latest.pt").hardlink_to(newest)  # as the message says
    code, err, _ = cli(tmp_path, capsys, **common, **{"budget.max_samples": 64})
    assert code == 0 and f"resumed from {ck / 'latest.pt'}" in err, err


def test_an_unreadable_latest_checkpoint_is_refused_naming_the_earlier_save_that_reads(tmp_path, capsys):
    ck = tmp_path / "ck"
    common = {"checkpoint.dir": str(ck), "checkpoint.every_samples": 16}
    code, err, _ = cli(tmp_path, capsys, **common, **{"budget.max_samples": 32})
    assert code == 0, err
    latest = ck / "latest.pt"
    damaged = latest.read_bytes()[:1000]
    latest.unlink()  # a hard link of the newest save: a copy of the directory has two files
    latest.write_bytes(damaged)
    (ck / "ckpt-000000000032.pt").write_bytes(damaged)  # the newest save damaged too: the one before reads
    code, err, records = cli(tmp_path, capsys, **common, **{"budget.max_samples": 48})
    assert code == 2, err
    assert err.startswith(f"error: checkpoint.dir: cannot read {latest}, the checkpoint a resume starts from ("), err
    older = ck / "ckpt-000000000016.pt"
    assert f"ckpt-000000000016.pt, saved at 16 samples, reads: `ln -f {older} {latest}` makes it the latest" in err
    assert "not a copy over latest.pt, a link to the newest save, which a copy would write over" in err
    assert "Traceback" not in err and "training BERT" not in err
    assert latest.read_bytes() == damaged  # nothing removed
    subprocess.run(["bash", "-c", f"ln -f {older} {latest}"], check=True)  # as said: the saves stay as they were
    assert latest.samefile(older) and (ck / "ckpt-000000000032.pt").read_bytes() == damaged


def test_a_latest_checkpoint_changed_on_disk_is_refused_not_trained_from(tmp_path, capsys):
    """Bytes overwritten inside a tensor of latest.pt (a bad disk, a partial copy over it): torch.load reads the
    file all the same, as other weights. The resume is refused before any work, naming the save that is intact."""
    import struct
    import zipfile

    import torch

    ck = tmp_path / "ck"
    common = {"checkpoint.dir": str(ck), "checkpoint.every_samples": 16}
    code, err, first = cli(tmp_path, capsys, **common, **{"budget.max_samples": 32})
    assert code == 0, err
    latest = ck / "latest.pt"
    with zipfile.ZipFile(latest) as archive:  # the largest tensor record
        info = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    data = bytearray(latest.read_bytes())
    name_length, extra_length = struct.unpack_from("<HH", data, info.header_offset + 26)  # its local header
    start = info.header_offset + 30 + name_length + extra_length
    data[start : start + 4096] = bytes(4096)  # 1,024 float32 weights set to zero
    latest.unlink()  # a hard link of the newest save: change this copy only
    latest.write_bytes(data)
    torch.load(latest, weights_only=False)  # torch reads it without a word
    code, err, records = cli(tmp_path, capsys, **common, **{"budget.max_samples": 48})
    assert code == 2, err
    assert err.startswith(f"error: checkpoint.dir: cannot read {latest}, the checkpoint a resume starts from (its "
                          f"record {info.filename} does not match the checksum saved with it"), err  # fmt: skip
    assert f"ckpt-000000000032.pt, saved at 32 samples, reads: `ln -f {ck / 'ckpt-000000000032.pt'} {latest}`" in err
    assert "Traceback" not in err and "training BERT" not in err and records == first  # nothing more reported
    assert latest.read_bytes() == data  # nothing removed


@pytest.mark.parametrize("key", ["log.jsonl", "log.mlperf"])
@pytest.mark.parametrize("where", ["directory", "under_a_file"])
def test_a_report_or_mlperf_file_that_cannot_be_written_is_refused_naming_it_before_any_file_is_made(
    tmp_path, capsys, where, key
):
    """A log.mlperf under a file was refused after the report file and checkpoint.dir had been made."""
    (tmp_path / "a_file").write_text("x")
    path = tmp_path if where == "directory" else tmp_path / "a_file" / "out.txt"
    ck, report = tmp_path / "new" / "ck", tmp_path / "new" / "report.jsonl"
    other = {"log.jsonl": str(report)} if key == "log.mlperf" else {}
    code, err, _ = cli(tmp_path, capsys, **{key: str(path), "checkpoint.dir": str(ck)}, **other)
    assert code == 2, err
    said = {
        "directory": f"{path} is a directory; give the path of a file (its folder is made if missing)",
        "under_a_file": f"{path}'s folder {path.parent} is a file, not a directory; give a path in a directory",
    }[where]
    assert err.startswith(f"error: {key}: {said}"), err
    assert "Traceback" not in err and "training BERT" not in err
    assert not (tmp_path / "new").exists() and (tmp_path / "a_file").read_text() == "x"


@pytest.mark.parametrize(
    "override",
    [
        {"batch.global_batch_size": 30},
        {"model.attention": "varlen"},
        {"precision.dtype": "fp16"},
        {"batch.global_batch_size": 400},  # more than the training set's 96 sequences
    ],
    ids=["batch-that-does-not-split", "varlen-on-cpu", "fp16-on-cpu", "batch-larger-than-the-data"],
)
def test_a_run_this_machine_refuses_makes_no_report_file_and_no_checkpoint_dir(tmp_path, capsys, override):
    """These were refused (exit 2, nothing trained) after `python -m trainer` had made the report file, empty, and
    checkpoint.dir, with the folders above them."""
    new = tmp_path / "new"
    settings = {"log.jsonl": str(new / "report.jsonl"), "checkpoint.dir": str(new / "ck"), **override}
    code, err, _ = cli(tmp_path, capsys, **settings)
    assert code == 2 and err.startswith("error: ") and "Traceback" not in err, err
    assert not new.exists()


def test_missing_training_data_is_named_by_its_key_and_leaves_the_mlperf_log_of_the_last_run_as_it_was(
    tmp_path, capsys, monkeypatch
):
    """A data.train that does not exist (a typo, or a relative path run from another folder) replaced the last run's
    MLPerf log with a 7-line start, and the message named neither the key nor why no shard was found."""
    mlperf = tmp_path / "mlperf.log"
    code, err, _ = cli(tmp_path, capsys, **{"log.mlperf": str(mlperf), "budget.max_samples": 16})
    assert code == 0, err
    kept = mlperf.read_text()
    monkeypatch.chdir(tmp_path)
    code, err, records = cli(tmp_path, capsys, **{"log.mlperf": str(mlperf), "data.train": "data/trian"})
    assert code == 1, err
    said = (f"data.train: no shard files found for 'data/trian' (it does not exist; a relative path is read from the "
            f"current directory, {tmp_path}): give a directory with *.h5/*.hdf5 files")  # fmt: skip
    assert err.startswith(f"error: {said}"), err
    assert "Traceback" not in err and "training BERT" not in err
    assert mlperf.read_text() == kept
    final = records[-1]
    assert final["status"] == "failed" and final["error"] == "data" and final["reason"].startswith(said), final


def test_a_missing_init_checkpoint_is_refused_before_any_work(tmp_path, capsys):
    code, err, records = cli(tmp_path, capsys, **{"model.init_checkpoint": str(tmp_path / "bert.pt")})
    assert code == 2, err
    assert err.startswith(f"error: model.init_checkpoint: {tmp_path / 'bert.pt'} does not exist"), err
    assert records == []


@pytest.mark.parametrize("weights", ["empty", "other_shape", "a_list", "not_torch"])
def test_initial_weights_that_cannot_be_used_end_the_run_with_a_final_record(tmp_path, capsys, weights):
    """model.init_checkpoint exists but cannot serve: the run is refused before its first step, as bad data is
    (exit 1, a final record of kind "data": not the hyperparameters' fault), naming the file and why (a list ended
    in a traceback; a file torch.load refused passed on PyTorch's advice to load it with weights_only=False)."""
    import torch

    path = tmp_path / "bert.pt"
    if weights == "empty":
        path.write_bytes(b"")
        why = f"cannot read weights file {path} (model.init_checkpoint): the file is empty"
    elif weights == "other_shape":
        torch.save({"bert.embeddings.word_embeddings.weight": torch.zeros(3, 3)}, path)
        why = f"model.init_checkpoint {path}: weights key 'bert.embeddings.word_embeddings.weight' has shape (3, 3)"
    elif weights == "a_list":
        torch.save([1, 2], path)
        why = f"weights file {path} (model.init_checkpoint) holds a list, not a state dict"
    else:
        path.write_bytes(bytes(range(256)) * 40)
        why = f"cannot read weights file {path} (model.init_checkpoint): not tensors that torch.load reads without"
    code, err, records = cli(tmp_path, capsys, **{"model.init_checkpoint": str(path)})
    assert code == 1, err
    assert why in err and "Traceback" not in err and "weights_only" not in err
    if weights != "other_shape":  # a file that is no state dict: what to give instead
        assert err.rstrip().endswith("; give an HF state dict (.bin/.pt) or .safetensors file, or none"), err
    final = records[-1]
    assert (final["kind"], final["status"], final["error"], final["steps"]) == ("final", "failed", "data", 0)
    assert why in final["reason"]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"model.hidden_size": 64, "model.intermediate_size": 128}, "model.hidden_size 32 there, 64 here"),
        ({"model.num_hidden_layers": 3}, "model.num_hidden_layers 2 there, 3 here"),
        ({"optimizer.name": "adamw"}, "optimizer.name lamb there, adamw here"),
        ({"seed": 7}, "seed 1234 there, 7 here"),
        ({"data.shuffle": False}, "data.shuffle true there, false here"),
        ({"balance.method": "stratified"}, "balance.method none there, stratified here"),
        ({"batch.global_batch_size": 16}, "batch.global_batch_size 8 there, 16 here"),
        ({"eval.target_mlm_accuracy": 0.5}, "eval.target_mlm_accuracy 1.0 there, 0.5 here"),
    ],
    ids=["hidden", "layers", "optimizer", "seed", "shuffle", "balance", "global-batch", "target"],
)
def test_resuming_a_checkpoint_of_another_model_optimizer_or_data_order_is_refused_naming_the_keys(
    tmp_path, capsys, change, named
):
    """Another shuffle or balancing (as another seed) deals the epoch out otherwise, and the position a resume starts
    from counts the epoch's micro-batches: some samples would be trained twice, others not at all. Another global
    batch: the schedule counts its steps (a larger one resumed past the end of its shorter schedule, and trained at
    learning rate 0)."""
    ck = tmp_path / "ck"
    code, err, _ = cli(tmp_path, capsys, **{"checkpoint.dir": str(ck), "budget.max_samples": 16})
    assert code == 0, err
    saved = (ck / "latest.pt").read_bytes()
    code, err, records = cli(tmp_path, capsys, **{"checkpoint.dir": str(ck), **change})
    assert code == 2, err
    assert err.startswith(
        f"error: checkpoint.dir: {ck / 'latest.pt'} was written by another model, optimizer, seed, global batch, "
        "target or data order"
    ), err
    assert named in err and "checkpoint.resume: false" in err
    assert "Traceback" not in err and "training BERT" not in err
    assert (ck / "latest.pt").read_bytes() == saved
    assert len(records) == len([r for r in records if r.get("samples", 0) <= 16])  # the second run added nothing


@pytest.mark.parametrize(
    ("method", "change", "named"),
    [
        ("stratified", {"balance.bins": "[24,40,64]"}, "balance.bins [16, 32, 48, 64] there, [24, 40, 64] here"),
        ("local_presort", {"balance.bins": "[24,40,64]"}, "balance.bins [16, 32, 48, 64] there, [24, 40, 64] here"),
        ("stratified", {"data.max_seq_length": 48}, "data.max_seq_length null there, 48 here"),
        ("none", {"balance.bins": "[24,40,64]", "data.max_seq_length": 48}, None),
    ],
    ids=["stratified-bins", "presort-bins", "stratified-cut", "none-both"],
)
def test_resuming_with_other_length_bins_is_refused_where_the_method_bins_by_length(
    tmp_path, capsys, method, change, named
):
    """Stratified and presorted batches take each micro-batch's sequences bin by bin: other bins, or lengths cut
    otherwise (data.max_seq_length), deal the epoch out in another order, so the rest of it from the position a
    resume starts at would train some of the first 16 samples again and others never (here 13 and 13 of 96).
    Under `none` the plan is a permutation of the samples' count alone: the resume trains on."""
    from trainer.balance import plan_epoch
    from trainer.data.shards import load_samples

    ck = tmp_path / "ck"
    first = {"checkpoint.dir": str(ck), "balance.method": method, "balance.bins": "[16,32,48,64]"}
    code, err, _ = cli(tmp_path, capsys, **first, **{"budget.max_samples": 16})
    assert code == 0, err
    lengths = load_samples(str(tmp_path / "train")).lengths
    before = plan_epoch(lengths, method, [16, 32, 48, 64], 8, 1, 1, 1234, 0)
    after = plan_epoch(np.minimum(lengths, change.get("data.max_seq_length", 64)), method,
                       yaml.safe_load(change.get("balance.bins", "[16,32,48,64]")), 8, 1, 1, 1234, 0)  # fmt: skip
    again = np.intersect1d(np.concatenate([s[0] for s in before[:2]]), np.concatenate([s[0] for s in after[2:]]))
    assert (len(again) > 0) == (named is not None)  # what a resume in the other order would train twice
    saved = (ck / "latest.pt").read_bytes()
    code, err, records = cli(tmp_path, capsys, **{**first, **change})
    if named is None:
        assert code == 0 and f"resumed from {ck / 'latest.pt'} at step 2, 16 samples" in err, err
        return
    assert code == 2, err
    assert err.startswith(
        f"error: checkpoint.dir: {ck / 'latest.pt'} was written by another model, optimizer, seed, global batch, "
        "target or data order "
        f"({named}), so it cannot be resumed"
    ), err
    assert (ck / "latest.pt").read_bytes() == saved
    assert len(records) == len([r for r in records if r.get("samples", 0) <= 16])  # the second run added nothing


@pytest.mark.parametrize(
    ("first", "then", "says"),
    [
        ({"balance.method": "stratified", "balance.bins": "[16,32,48,64]"}, {},
         "was saved on 1 rank, this run has 2: balance.method stratified deals an epoch's sequences out by length in "
         "rounds that the number of ranks decides, so the rest of epoch 0 from where it was saved (micro-batch 4 of 24 "
         "on each rank) would train some of its sequences again and others never; resume on 1 rank (torchrun "
         "--nproc-per-node 1, or one process), or start afresh"),
    ],
    ids=["stratified"],
)  # fmt: skip
def test_resuming_on_another_number_of_ranks_where_the_epoch_would_not_go_on_after_its_samples_is_refused(
    tmp_path, capsys, monkeypatch, first, then, says
):
    """A checkpoint of one process, resumed on 2 ranks (rank 0's view: refused before any work, so
    before the process group). Stratified batches are drawn in rounds the number of ranks decides: the plans part
    (tests/trainer/test_balance.py). Under `none` the samples come in the same order, but a global batch of 4 stopped
    at 12, not a whole number of the resumed run's steps of 8. Resumed the same on 1 process, both train on; under
    `none` and the same global batch, 2 ranks go on after the same samples (tests/trainer/test_distributed_train.py)."""
    ck = tmp_path / "ck"
    code, err, _ = cli(tmp_path, capsys, **{"budget.max_samples": 16, **first, "checkpoint.dir": str(ck)})
    assert code == 0, err
    saved = (ck / "latest.pt").read_bytes()
    with monkeypatch.context() as patch:
        for key, value in {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}.items():
            patch.setenv(key, value)
        code, err, records = cli(
            tmp_path, capsys, **{**first, "budget.max_samples": 32, **then, "checkpoint.dir": str(ck)}
        )
    assert code == 2, err
    assert err.startswith(f"error: checkpoint.dir: {ck / 'latest.pt'} {says}"), err
    assert "checkpoint.resume: false" in err and "Traceback" not in err and "training BERT" not in err
    assert (ck / "latest.pt").read_bytes() == saved
    assert len(records) == len([r for r in records if r.get("samples", 0) <= 16])  # the second run added nothing
    code, err, _ = cli(tmp_path, capsys, **{**first, "checkpoint.dir": str(ck), "budget.max_samples": 32})
    assert code == 0 and f"resumed from {ck / 'latest.pt'} at step " in err and "saved on" not in err, err


def test_a_checkpoint_that_does_not_say_its_number_of_ranks_resumes_as_before(tmp_path, capsys):
    """A checkpoint written before the number of ranks was saved with its position is taken to be of this run's
    number (as every resume was): one process resumes it at its position, to the uninterrupted run's losses."""
    import torch

    fixed = {"schedule.total_steps": 100}  # the same decay in every run
    code, err, whole = cli(tmp_path / "whole", capsys, **fixed, **{"budget.max_samples": 32})
    assert code == 0, err
    ck = tmp_path / "ck"
    code, err, first = cli(tmp_path, capsys, **fixed, **{"checkpoint.dir": str(ck), "budget.max_samples": 16})
    assert code == 0, err
    latest = ck / "latest.pt"
    payload = torch.load(latest, weights_only=False)
    assert payload["state"].pop("world_size") == 1
    latest.unlink()  # a file of its own, not the hard link to the ckpt-*.pt it was
    torch.save(payload, latest)
    code, err, then = cli(tmp_path, capsys, **fixed, **{"checkpoint.dir": str(ck), "budget.max_samples": 32})
    assert code == 0 and f"resumed from {latest} at step 2, 16 samples\n" in err, err
    assert losses(then) == losses(whole)


def test_ctrl_c_stops_without_a_traceback_and_the_same_command_resumes_to_the_uninterrupted_numbers(
    tmp_path, capsys, monkeypatch
):
    """Ctrl-C (KeyboardInterrupt) in the 6th step: the checkpoint at 32 samples (step 4) is the last one; the
    command run again continues from it, and its losses and evaluations are those of a run never interrupted
    (dropout on: the RNG state is restored too)."""
    common = {"model.hidden_dropout_prob": 0.1, "checkpoint.every_samples": 16, "schedule.warmup_steps": 3}
    full_dir, cut_dir = tmp_path / "full", tmp_path / "cut"
    code, err, uninterrupted = cli(full_dir, capsys, **common, **{"checkpoint.dir": str(full_dir / "ck")})
    assert code == 0, err

    def ctrl_c():
        raise KeyboardInterrupt

    act_at_step(monkeypatch, 6, ctrl_c)
    code, err, first = cli(cut_dir, capsys, **common, **{"checkpoint.dir": str(cut_dir / "ck")})
    assert code == 130, err
    assert "Traceback" not in err
    assert "error: interrupted (Ctrl-C) at step 5, 40 samples; run the same command again to resume" in err
    final = first[-1]
    assert (final["kind"], final["status"], final["error"], final["steps"]) == ("final", "failed", "interrupted", 5)
    assert final["reason"].startswith("interrupted (Ctrl-C)")
    monkeypatch.undo()

    code, err, records = cli(cut_dir, capsys, **common, **{"checkpoint.dir": str(cut_dir / "ck")})
    assert code == 0, err
    assert "resumed from" in err and "at step 4, 32 samples" in err
    resumed = records[len(first) :]
    assert losses(first)[:4] + losses(resumed) == pytest.approx(losses(uninterrupted), abs=1e-6)
    evals = [(r["samples"], r["mlm_loss"]) for r in uninterrupted if r.get("event") == "eval"]
    assert [(r["samples"], r["mlm_loss"]) for r in first[:-1] + resumed if r.get("event") == "eval"] == [
        (s, pytest.approx(v, abs=1e-6)) for s, v in evals
    ]
    assert resumed[-1]["samples"] == uninterrupted[-1]["samples"] == 96


def test_an_interrupted_run_that_saved_no_checkpoint_yet_says_the_command_starts_afresh(tmp_path, capsys, monkeypatch):
    """`checkpoint.dir` without `checkpoint.every_samples` saves at the end only: stopped before it, the run said
    "run the same command again to resume from the last checkpoint" with no checkpoint there, and the same command
    then trained from step 0. It says no checkpoint was saved yet and how to save some along the way."""
    ck = tmp_path / "ck"
    act_at_step(monkeypatch, 6, lambda: os.kill(os.getpid(), signal.SIGTERM))
    code, err, _ = cli(tmp_path, capsys, **{"checkpoint.dir": str(ck)})
    assert code == 143, err
    assert "resume from the last checkpoint" not in err
    assert (f"no checkpoint is saved in {ck} yet (without checkpoint.every_samples only the run's end is): the same "
            "command starts afresh; set checkpoint.every_samples to save along the way") in err  # fmt: skip
    monkeypatch.undo()
    code, err, records = cli(tmp_path, capsys, **{"checkpoint.dir": str(ck)})
    assert code == 0 and "resumed from" not in err, err


def test_sigterm_ends_the_run_as_interrupted_with_its_final_record_and_the_same_command_resumes(
    tmp_path, capsys, monkeypatch
):
    """A scheduler's or a container's stop (SIGTERM) in the 6th step: exit 143, the final record says so, and the
    command run again resumes from the checkpoint at 32 samples to the end."""
    common = {"checkpoint.every_samples": 16, "checkpoint.dir": str(tmp_path / "ck")}
    real_final = train_module.final_result

    def terminated_again_while_recording(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # a launcher passing its own SIGTERM on: ignored, the record is made
        return real_final(*args, **kwargs)

    before = signal.getsignal(signal.SIGTERM)
    # the handler raises in this thread, at the next bytecode
    act_at_step(monkeypatch, 6, lambda: os.kill(os.getpid(), signal.SIGTERM))
    monkeypatch.setattr(train_module, "final_result", terminated_again_while_recording)
    code, err, first = cli(tmp_path, capsys, **common)
    assert code == 143, err
    assert "Traceback" not in err
    assert "error: interrupted (SIGTERM) at step " in err and "run the same command again to resume" in err
    final = first[-1]
    assert (final["kind"], final["status"], final["error"]) == ("final", "failed", "interrupted")
    assert final["reason"].startswith("interrupted (SIGTERM)")
    assert signal.getsignal(signal.SIGTERM) is before  # the CLI's handler is gone with the run
    monkeypatch.undo()
    code, err, records = cli(tmp_path, capsys, **common)
    assert code == 0, err
    assert "resumed from" in err and "at step 4, 32 samples" in err and records[-1]["samples"] == 96


def test_sigterm_while_the_final_checkpoint_is_saved_says_the_run_had_ended_and_leaves_no_partial_file(
    tmp_path, capsys, monkeypatch
):
    """A stop that lands after the final record, while the last checkpoint is written: exit 143, the message says
    the run had ended and which save stays the latest (not "before training began"), no second final record, and
    no half-written file; the command run again finds the run finished or trains the rest."""
    common = {"checkpoint.every_samples": 32, "checkpoint.dir": str(tmp_path / "ck"), "budget.max_samples": 88}
    real_final, real_save = train_module.final_result, trainer.run.save_checkpoint
    ended = []

    def final_result(*args, **kwargs):
        ended.append(True)
        return real_final(*args, **kwargs)

    def save_checkpoint(*args, **kwargs):
        if ended:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler raises in this thread, at the next bytecode
        return real_save(*args, **kwargs)

    monkeypatch.setattr(train_module, "final_result", final_result)
    monkeypatch.setattr(trainer.run, "save_checkpoint", save_checkpoint)
    code, err, first = cli(tmp_path, capsys, **common)
    assert code == 143, err
    assert "Traceback" not in err and "before training began" not in err, err
    assert "error: interrupted (SIGTERM) while the final checkpoint was saved, after the run ended (budget_exh" in err
    assert "; the checkpoint at 64 samples stays the latest; run the same command again to resume" in err, err
    assert [r["status"] for r in first if r["kind"] == "final"] == ["budget_exhausted"]
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == [
        "ckpt-000000000032.pt", "ckpt-000000000064.pt", "latest.pt"]  # fmt: skip
    monkeypatch.undo()
    code, err, records = cli(tmp_path, capsys, **common)
    assert code == 0, err
    assert "resumed from" in err and "at step 8, 64 samples" in err and records[-1]["samples"] == 88


def test_an_unexpected_error_leaves_a_final_record_naming_it(tmp_path, capsys, monkeypatch):
    """What a peer rank's death looks like to gloo (or a bug): the error is raised on with its traceback, and the
    final record says what it was, as the kind "crash"."""

    def peer_gone():
        raise RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:21313")

    act_at_step(monkeypatch, 3, peer_gone)
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        cli(tmp_path, capsys)
    final = read_jsonl(tmp_path / "report.jsonl")[-1]
    assert (final["kind"], final["status"], final["error"], final["steps"]) == ("final", "failed", "crash", 2)
    assert final["reason"] == (
        "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:21313"
    )


@pytest.mark.parametrize("ending", ["sigterm", "error"])
def test_a_run_that_ends_before_its_first_step_still_leaves_a_final_record(tmp_path, capsys, monkeypatch, ending):
    """SIGTERM or an unexpected error while the run is set up (the data loading, the model's build): the loop never
    ran, so the CLI writes the final record."""

    def ended_while_building(*args, **kwargs):
        if ending == "sigterm":
            raise Terminated
        raise RuntimeError("gloo: Connection closed by peer")

    monkeypatch.setattr(train_module, "build_run", ended_while_building)
    if ending == "sigterm":
        code, err, records = cli(tmp_path, capsys)
        assert code == 143 and "error: interrupted (SIGTERM) before training began" in err, err
    else:
        with pytest.raises(RuntimeError, match="Connection closed by peer"):
            cli(tmp_path, capsys)
        records = read_jsonl(tmp_path / "report.jsonl")
    (final,) = [r for r in records if r["kind"] == "final"]
    expected = ("interrupted", "interrupted (SIGTERM) before training began") if ending == "sigterm" else (
        "crash", "RuntimeError: gloo: Connection closed by peer")  # fmt: skip
    assert (final["status"], final["error"], final["reason"], final["steps"]) == ("failed", *expected, 0)


def test_options_and_overrides_may_come_in_any_order(tmp_path, capsys):
    overrides = make_train_overrides(tmp_path)
    assert main([*overrides[:3], "--print-config", *overrides[3:], "seed=4242"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["seed"] == 4242 and printed["model"]["hidden_size"] == 32


def test_a_warmup_longer_than_the_run_is_said_with_the_highest_rate_it_reaches(tmp_path, capsys):
    """96 samples at batch 8 are steps 0..11; with warmup 1,000 the last of them runs at lr x 11 / 1000."""
    code, err, records = cli(tmp_path, capsys, **{"schedule.warmup_steps": 1000, "optimizer.lr": 1e-3})
    assert code == 0, err
    assert (
        "warning: schedule.warmup_steps 1000 is longer than the run (12 steps): the learning rate rises to 1.1e-05 "
        "at most, never to optimizer.lr 0.001" in err
    )
    code, err, _ = cli(tmp_path / "short", capsys, **{"schedule.warmup_steps": 11})  # the peak at step 11, the last
    assert code == 0 and "warning: schedule.warmup_steps" not in err


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ({"batch.global_batch_size": 30}, "batch."),
        ({"model.attention": "varlen"}, "varlen"),
        ({"precision.dtype": "fp16"}, "precision.dtype: fp16 needs a CUDA device"),
    ],
    ids=["batch-that-does-not-split", "varlen-on-cpu", "fp16-on-cpu"],
)
def test_a_run_this_machine_refuses_leaves_the_mlperf_log_of_the_last_run_as_it_was(tmp_path, capsys, override, says):
    """These were refused after the MLPerf log had been opened, which replaced it with a 7-line start."""
    mlperf = tmp_path / "mlperf.log"
    code, err, _ = cli(tmp_path, capsys, **{"log.mlperf": str(mlperf), "budget.max_samples": 16})
    assert code == 0, err
    kept = mlperf.read_text()
    code, err, _ = cli(tmp_path, capsys, **{"log.mlperf": str(mlperf), "budget.max_samples": 16}, **override)
    assert code == 2 and says in err, err
    assert "Traceback" not in err and "training BERT" not in err
    assert mlperf.read_text() == kept


def test_a_final_checkpoint_that_cannot_be_saved_fails_the_command_after_one_final_record(tmp_path, capsys):
    """It wrote the run's final record (a success), then ended in a traceback: the exit code and the record now agree
    on what happened, and the message says what was not saved and why."""
    ck = tmp_path / "ck"
    (ck / "latest.pt").mkdir(parents=True)  # in the way of the save's last step
    code, err, records = cli(tmp_path, capsys, **{"checkpoint.dir": str(ck), "budget.max_samples": 16})
    assert code == 1, err
    said = "error: the run ended (budget_exhausted) and its final record is written, but its final checkpoint was "
    assert f"{said}not saved: checkpoint.dir: cannot make {ck / 'latest.pt'} point at" in err, err
    assert "Is a directory: fix that, or choose another checkpoint.dir; no checkpoint stays the latest" in err, err
    assert "Traceback" not in err
    finals = [r for r in records if r.get("kind") == "final"]
    assert [r["status"] for r in finals] == ["budget_exhausted"]


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ({"checkpoint.dir": "''"}, "checkpoint.dir: an empty path: give a path"),  # wrote into the cwd
        ({"data.eval": "''"}, "data.eval: an empty path: give a path"),  # "no shard files found for ''"
        ({"optimizer.impl": "apex"}, "optimizer.impl: apex needs NVIDIA apex, which cannot be imported"),  # a crash
        # settings the run would not read (trainer.config.unread_settings): said, not ignored
        ({"checkpoint.every_samples": 16}, "error: checkpoint.every_samples: 16, but checkpoint.dir is not set, so "
                                           "no checkpoint is saved: set checkpoint.dir, or remove"),
        ({"checkpoint.resume": "false"}, "error: checkpoint.resume: false, but checkpoint.dir is not set, so there "
                                         "is no checkpoint to resume from: remove checkpoint.resume"),
        ({"schedule.total_steps": 100, "schedule.horizon_samples": 80}, "error: schedule.horizon_samples: 80, but "
                                                                        "schedule.total_steps (100) sets the decay "
                                                                        "horizon, in steps: set one of them"),
        ({"log.noise_scale": "false", "log.noise_scale_every": 4, "log.noise_scale_decay": 0.5},
         "error: settings this run would not read:\n  log.noise_scale_every: 4, but log.noise_scale is false, so no "
         "noise scale is measured: set log.noise_scale to true, or remove log.noise_scale_every (where a base "
         "config sets it, set log.noise_scale_every=null)\n  "
         "log.noise_scale_decay: 0.5, but log.noise_scale is false"),
    ],
    ids=["empty-checkpoint-dir", "empty-eval-data", "apex-not-installed", "checkpoints-without-dir",
         "no-resume-without-dir", "two-decay-horizons", "noise-scale-settings-with-it-off"],
)  # fmt: skip
def test_settings_this_run_cannot_use_are_refused_before_any_work(tmp_path, capsys, monkeypatch, override, says):
    pytest.importorskip("torch")
    if "optimizer.impl" in override and importlib.util.find_spec("apex") is not None:
        pytest.skip("apex is installed here")
    monkeypatch.chdir(tmp_path)
    code, err, records = cli(tmp_path, capsys, **override)
    assert code == 2, err
    assert says in err and "Traceback" not in err and "training BERT" not in err, err
    assert records == [] and not list(tmp_path.glob("*.pt"))


def test_print_config_prints_a_config_with_unread_settings_and_refuses_it_as_a_run_would(capsys):
    """--print-config printed such a config and exited 0, so a config checked with it was then refused by the run."""
    from trainer.__main__ import main

    assert main(["--config", "bert_large", "log.noise_scale=false", "--print-config"]) == 2
    out, err = capsys.readouterr()
    assert "noise_scale: false" in out  # printed all the same
    assert err.startswith("error: log.noise_scale_every: 8, but log.noise_scale is false"), err
    assert main(["--config", "bert_large", "log.noise_scale=false", "log.noise_scale_every=null",
                 "--print-config"]) == 0  # fmt: skip


def test_the_noise_scale_switched_off_over_a_config_that_sets_its_interval_is_taken_with_the_interval_null():
    """bert_large.yaml sets log.noise_scale_every 8: `log.noise_scale=false` alone is refused (an unread setting) and
    the fix it named, removing the key, was not the user's to make; null undoes it (the default)."""
    from trainer.config import load_config, unread_settings

    off = load_config("bert_large", ["log.noise_scale=false"])
    assert "log.noise_scale_every" in unread_settings(off)
    off = load_config("bert_large", ["log.noise_scale=false", "log.noise_scale_every=null",
                                     "log.noise_scale_decay=null"])  # fmt: skip
    assert unread_settings(off) == {} and off.log.noise_scale_every == 1 and off.log.noise_scale_decay == 0.95


@pytest.mark.parametrize("signal_name", ["Ctrl-C", "SIGTERM"])
def test_a_stop_while_pytorch_loads_ends_with_a_line_its_exit_code_and_a_final_record(
    tmp_path, capsys, monkeypatch, signal_name
):
    """The first second or two of `python -m trainer` imports PyTorch; Ctrl-C then printed a traceback from torch's
    import, and SIGTERM (a scheduler's stop) ended the process without a word or a final record. A finder that
    sends this process the signal as that import starts stands for the keypress or the scheduler, at that moment.
    The import goes on to its end first: raised inside an extension module's import (numpy's), the stop broke it
    ("ImportError: cannot load module more than once per process", a traceback)."""
    import sys

    class Stop:
        def find_spec(self, name, path=None, target=None):
            if name == "trainer.distributed":
                os.kill(os.getpid(), signal.SIGINT if signal_name == "Ctrl-C" else signal.SIGTERM)
            return None

    monkeypatch.delitem(sys.modules, "trainer.distributed")
    monkeypatch.setattr(sys, "meta_path", [Stop(), *sys.meta_path])
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own (a pytest-xdist worker's differs)
    try:
        handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
        code, err, records = cli(tmp_path, capsys)
        after = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGINT, before)
    assert hasattr(sys.modules["trainer.distributed"], "dist_env_from_environ")  # imported whole
    reason = f"interrupted ({signal_name}) while PyTorch loaded, before anything began"
    assert (code, err) == ({"Ctrl-C": 130, "SIGTERM": 143}[signal_name], f"error: {reason}\n")
    (final,) = records
    assert (final["kind"], final["status"], final["error"], final["reason"]) == ("final", "failed", "interrupted",
                                                                                 reason)  # fmt: skip
    assert after == handlers  # put back as they were


def test_ctrl_c_while_the_run_is_checked_ends_with_a_line_and_a_final_record(tmp_path, capsys, monkeypatch):
    """After PyTorch loaded, before the loop: the checks of the run (a checkpoint's checksums take 0.3 s a GB)."""
    import trainer.preflight

    def pressed(cfg):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer.preflight, "refuse_before_work", pressed)
    code, err, records = cli(tmp_path, capsys)
    assert (code, err) == (130, "error: interrupted (Ctrl-C) before training began\n")
    assert [(r["kind"], r["error"]) for r in records] == [("final", "interrupted")]


def test_a_model_too_large_for_the_memory_ends_as_out_of_memory_not_a_crash(tmp_path, capsys):
    """Built before the first step, it ended in the allocator's traceback, recorded as a crash; in the loop the same
    error is an `oom` (on a GPU: a model that does not fit the device). 10**13 vocabulary rows fit no machine."""
    code, err, records = cli(tmp_path, capsys, **{"model.vocab_size": 10**13})
    assert code == 1, err
    assert "error: out of memory before the first step: RuntimeError:" in err and "can't allocate memory" in err
    assert "Traceback" not in err and "training BERT" not in err
    finals = [r for r in records if r.get("kind") == "final"]
    assert [(r["status"], r["error"]) for r in finals] == [("failed", "oom")]


@pytest.mark.parametrize("change", ["shape", "missing", "extra"])
def test_a_checkpoint_whose_weights_do_not_fit_the_model_is_refused_before_any_file_of_the_run(
    tmp_path, capsys, change
):
    """A latest.pt that reads, of the same config, whose weights another model's code wrote (a tensor of another
    shape, one missing, one the model has not) is refused naming the tensor, before the run's report and MLPerf log
    are touched: it was found only as the weights loaded, after both had been restarted."""
    import torch

    ck, mlperf = tmp_path / "ck", tmp_path / "mlperf.log"
    settings = {"checkpoint.dir": str(ck), "log.mlperf": str(mlperf)}
    code, err, _ = cli(tmp_path, capsys, **settings, **{"budget.max_samples": 16})
    assert code == 0, err
    latest, report = ck / "latest.pt", tmp_path / "report.jsonl"
    payload = torch.load(latest, weights_only=False)
    name = "bert.encoder.layer.1.output.dense.weight"
    if change == "shape":
        payload["model"][name] = torch.zeros(32, 48)
    elif change == "missing":
        del payload["model"][name]
    else:
        payload["model"]["bert.encoder.layer.2.output.dense.weight"] = torch.zeros(32, 64)
    latest.unlink()
    torch.save(payload, latest)
    kept = (mlperf.read_text(), report.read_text())
    code, err, _ = cli(tmp_path, capsys, **settings, **{"budget.max_samples": 32})
    assert code == 2, err
    what = {"shape": f"'{name}' is [32, 48] there, [32, 64] in this run's model",
            "missing": f"it lacks 1 of the model's tensors, e.g. '{name}'",
            "extra": "it has 1 the model has not, e.g. 'bert.encoder.layer.2.output.dense.weight'"}[change]  # fmt: skip
    assert f"error: checkpoint.dir: {latest} does not fit this run ({what}); " in err, err
    assert "ckpt-000000000016.pt, saved at 16 samples, reads" in err and "Traceback" not in err
    assert (mlperf.read_text(), report.read_text()) == kept


def test_a_checkpoint_that_loads_but_lacks_what_a_resume_needs_is_named_not_a_traceback(tmp_path, capsys):
    """A latest.pt without its model weights (a damaged or foreign file that torch.load reads) ended in KeyError."""
    import torch

    ck = tmp_path / "ck"
    code, err, _ = cli(tmp_path, capsys, **{"checkpoint.dir": str(ck), "budget.max_samples": 16})
    assert code == 0, err
    latest = ck / "latest.pt"
    payload = torch.load(latest, weights_only=False)
    del payload["model"]
    latest.unlink()  # a file of its own, not the hard link to the ckpt-*.pt it was
    torch.save(payload, latest)
    code, err, _ = cli(tmp_path, capsys, **{"checkpoint.dir": str(ck), "budget.max_samples": 32})
    assert code == 2, err
    assert f"error: checkpoint.dir: {latest} does not fit this run (it has no 'model' entry); " in err, err
    assert "ckpt-000000000016.pt, saved at 16 samples, reads" in err and "Traceback" not in err


@pytest.mark.parametrize(("sequences", "refused"), [(7, True), (8, False)], ids=["one-short", "exactly-one-batch"])
def test_a_training_set_smaller_than_the_global_batch_is_refused_before_the_mlperf_log(
    tmp_path, capsys, sequences, refused
):
    """7 sequences trained 7 a step where the config says 8, without a word; 8 train two steps of 8 (the budget)."""
    mlperf = tmp_path / "mlperf.log"
    code, err, _ = cli(tmp_path, capsys, **{"log.mlperf": str(mlperf), "budget.max_samples": 16})
    assert code == 0, err
    kept = mlperf.read_text()
    train_dir, eval_dir = make_shards(tmp_path / f"data{sequences}", n_train=sequences)
    small = {"log.mlperf": str(mlperf), "budget.max_samples": 16, "data.train": train_dir, "data.eval": eval_dir}
    code, err, records = cli(tmp_path / "small", capsys, **small)
    if refused:
        assert code == 2, err
        assert err == (
            f"error: data.train: {train_dir} holds 7 sequences, fewer than the global batch of 8 "
            "(batch.global_batch_size): every step would train them all, a smaller batch than configured; set "
            "batch.global_batch_size to at most 7, or give data.train more data\n"
        )
        assert records == [] and mlperf.read_text() == kept
    else:
        assert code == 0, err
        progress = [r for r in records if r.get("event") == "progress"]
        assert [r["samples"] for r in progress] == [8, 16]


def test_a_decay_horizon_shorter_than_a_run_nothing_stops_sooner_is_refused_naming_both(tmp_path, capsys):
    """96 samples at batch 8 are 12 steps; a horizon of 10 leaves steps 11 and 12 at learning rate 0, and with
    eval.stop_at_target off and no time budget the run is sure to take them."""
    settings = {"schedule.total_steps": 10, "eval.stop_at_target": False}
    code, err, records = cli(tmp_path, capsys, **settings)
    assert code == 2, err
    assert err == (
        "error: schedule.total_steps: 10 is shorter than the run: budget.max_samples 96 at batch.global_batch_size 8 "
        "takes at least 12 optimizer steps, and nothing stops it sooner (eval.stop_at_target false, no "
        "budget.max_time_s); steps 11 to 12 would train at learning rate 0 (schedule.end_lr) and change nothing: "
        "leave schedule.total_steps out (the decay then spans the run's own steps), set it to at least 12, or lower "
        "budget.max_samples to 80\n"
    )
    assert records == []
    code, err, _ = cli(tmp_path / "fits", capsys, **settings, **{"budget.max_samples": 80})  # as it says: 10 steps
    assert code == 0 and "learning rate 0" not in err, err


@pytest.mark.parametrize(
    ("horizon", "named", "unless"),
    [
        ({"schedule.total_steps": 10}, "schedule.total_steps 10", ", unless the run stops sooner (its target)"),
        (
            {"schedule.horizon_samples": 80},
            "schedule.horizon_samples 80, 10 steps",
            ", unless the run stops sooner (its target)",
        ),
        # never refused, and nothing can stop it sooner: the warning names no stop it cannot make
        ({"schedule.horizon_samples": 80, "eval.stop_at_target": False}, "schedule.horizon_samples 80, 10 steps", ""),
    ],  # fmt: skip
    ids=["total-steps", "horizon-samples", "horizon-samples-no-stop"],
)
def test_a_decay_horizon_shorter_than_a_run_that_may_stop_at_its_target_is_said_at_the_start(
    tmp_path, capsys, horizon, named, unless
):
    """The run may reach its target before the horizon, so it trains; the steps past it ran at learning rate 0
    without a word (here, target 1.0 unreached, they are steps 11 and 12: the records say 0 for those)."""
    code, err, records = cli(tmp_path, capsys, **horizon)
    assert code == 0, err
    said = (
        f"warning: the learning rate reaches 0 after step 10 ({named}), but budget.max_samples 96 takes 12 steps: "
        f"steps 11 to 12 would train at learning rate 0 and change nothing{unless}\n"
    )
    assert err.count(said) == 1, err
    assert [r["step"] for r in records if r.get("event") == "progress" and r["lr"] == 0] == [11, 12]


@pytest.mark.parametrize(
    ("wrong", "code", "said"),
    [
        ({"optimizer.lrr": 1}, 2, "invalid trainer config (defaults + overrides):\n  optimizer.lrr: "),
        ({"data.train": "{tmp_path}/missing"}, 1, "data.train: no shard files found for '{tmp_path}/missing'"),
    ],
    ids=["config", "data"],
)
@pytest.mark.parametrize("ended", [False, True], ids=["its-own-error", "ended-by-torchrun"])
def test_an_error_of_a_rank_past_0_is_said_only_where_torchrun_does_not_end_it(
    tmp_path, capsys, monkeypatch, ended, wrong, code, said
):
    """Rank 1 keeps an error every rank reaches alike (a config's, the data's) to itself while rank 0 (which says it)
    exits and torchrun ends the others with SIGTERM: then it exits with the error's code without a word. Still
    running after the wait, its error is its own (rank 0 went on): it says it, naming its rank. The SIGTERM here is a
    real one, to this process."""
    import threading

    import trainer.__main__ as cli_module

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(cli_module, "OWN_ERROR_AFTER_S", 60.0 if ended else 0.01)
    if ended:
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
    previous = signal.getsignal(signal.SIGTERM)
    wrong = {key: value.format(tmp_path=tmp_path) if isinstance(value, str) else value for key, value in wrong.items()}
    assert main(make_train_overrides(tmp_path, **wrong)) == code
    err = capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is previous
    if ended:
        assert err == ""
    else:
        assert err.startswith(f"error (rank 1): {said.format(tmp_path=tmp_path)}"), err


def test_the_trainer_run_with_nothing_given_is_refused_not_trained_as_bert_large(tmp_path, capsys, monkeypatch):
    """`python -m trainer` alone trained BERT-large with every default (on the CPU, from data/demo where it is there),
    as a config file that sets nothing did before it was refused; --print-config alone still prints the defaults."""
    monkeypatch.chdir(tmp_path)
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no config given: pass --config FILE, or the name of a shipped config ("), err
    assert "(to do so, pass a file holding {})" in err and not list(tmp_path.iterdir())
    assert main(["--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["model"]["num_hidden_layers"] == 24


def test_a_second_config_file_is_refused_naming_both(capsys):
    """`--config A --config B` trained with B alone: A's settings were lost without a word."""
    with pytest.raises(SystemExit) as stop:
        main(["--config", "demo_cpu", "--print-config", "--config", "bert_large"])
    assert stop.value.code == 2
    assert "error: --config given twice (demo_cpu and bert_large): a run has one config file" in capsys.readouterr().err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_printed_config_that_cannot_be_written_is_one_line_of_error_and_a_reader_that_left_is_quiet():
    """`--print-config > FILE` on a full disk (/dev/full) and `--print-config | head -1` printed tracebacks."""
    import sys

    argv = [sys.executable, "-m", "trainer", "--config", "demo_cpu", "--print-config"]
    with open("/dev/full", "w") as full:
        done = subprocess.run(argv, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (1, "error: cannot write the output: No space left on device\n")
    reader_left = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reader_left.stdout.close()  # before the config is printed: its write finds no reader (EPIPE)
    assert reader_left.wait(timeout=120) == 128 + signal.SIGPIPE
    assert reader_left.stderr.read() == ""
