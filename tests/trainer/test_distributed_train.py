"""The trainer under torchrun with 2 gloo ranks: DDP, bucket-wise clipping, local presorting, crash handling."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import trainer.train as train_module
from tests.trainer.conftest import buckets_by_hand, make_model_config, make_shards, make_train_overrides
from tests.trainer.steps_recorder import read_steps, recording_step
from trainer.__main__ import main
from trainer.model import BertForPreTraining
from trainer.report import read_jsonl

pytestmark = pytest.mark.distributed


def torchrun(nproc: int, overrides: list[str], program: tuple[str, ...] = ("-m", "trainer")) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        *program,
        *overrides,
    ]


def child_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TRAINER_COLLECTIVE_TIMEOUT_S": "60"}


@pytest.mark.parametrize(
    "global_batch",
    [pytest.param(8, marks=pytest.mark.slow), 16],  # each a torchrun of its own
    ids=["no-accumulation", "accumulate-2"],
)
def test_two_ranks_bucketwise_local_presort(tmp_path, global_batch):
    """By default with accumulation only: the trainer under torchrun with bucket-wise clipping and local presorting.
    Without accumulation (slow) the bucket hook also measures the noise scale's norms; that, on 2 gloo ranks under
    every strategy, is tests/trainer/test_noise_scale.py::test_ranks_recover_the_closed_form_noise_scale
    [*-2ranks-ranks], and the trainer without accumulation under torchrun runs in tests/hpo/engine/test_stop.py."""
    overrides = make_train_overrides(
        tmp_path,
        **{
            "batch.global_batch_size": global_batch,
            "clipping.strategy": "bucketwise",
            "clipping.max_norm": 0.5,
            "clipping.bucket_cap_mb": 0.02,
            "balance.method": "local_presort",
            "balance.bins": "[16,32,48,64]",
            "budget.max_samples": 64,
        },
    )
    proc = subprocess.run(torchrun(2, overrides), capture_output=True, text=True, timeout=240, env=child_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_jsonl(tmp_path / "report.jsonl")
    finals = [r for r in records if r["kind"] == "final"]
    assert len(finals) == 1  # only rank 0 reports
    assert finals[0]["world_size"] == 2 and finals[0]["samples"] == 64
    progress = [r for r in records if r.get("event") == "progress"]
    assert len(progress) == 64 // global_batch  # logged every step
    assert all(1.0 <= r["token_imbalance"] < 2.0 for r in progress)
    # The noise scale's norms at every step: a rank's batch against the global one, or with accumulation a
    # micro-batch against a rank's batch (taken before the clip, under bucket-wise clipping)
    assert all(r["grad_sq_norm_small"] > 0 and r["grad_sq_norm_big"] > 0 for r in progress)
    assert proc.stderr.count("training BERT") == 1  # only rank 0 prints
    # ... naming DDP's buckets, which decide what bucketwise clips: the model's, counted by DDP's rule here
    settings = dict(o.split("=", 1) for o in overrides)
    model = BertForPreTraining(make_model_config(**{k[6:]: v for k, v in settings.items() if k.startswith("model.")}))
    buckets = buckets_by_hand([p.numel() * p.element_size() for p in model.parameters()], int(0.02 * 1024 * 1024))
    assert buckets >= 3
    assert f"clipping bucketwise ({buckets} DDP buckets at clipping.bucket_cap_mb 0.02)," in proc.stderr


@pytest.mark.slow  # a torchrun of its own (make test-all)
def test_two_ranks_with_an_auto_micro_batch_take_the_same_choice_and_train(tmp_path):
    """batch.micro_batch_size auto on 2 gloo ranks of one host: each measures and plans for its share of the host's
    memory, with DDP's bucket copy of the gradient; the ranks take the smallest choice (here a whole rank's batch,
    8), and the run trains with it and records it."""
    overrides = make_train_overrides(
        tmp_path, **{"batch.global_batch_size": 16, "batch.micro_batch_size": "auto", "budget.max_samples": 32}
    )
    proc = subprocess.run(torchrun(2, overrides), capture_output=True, text=True, timeout=240, env=child_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("batch.micro_batch_size auto: 8 of 8 sequences a rank") == 1  # rank 0 says it
    assert "global batch 16 = 8 x 1 accumulation x 2 ranks" in proc.stderr
    finals = [r for r in read_jsonl(tmp_path / "report.jsonl") if r["kind"] == "final"]
    assert [(f["micro_batch_size"], f["samples"], f["status"]) for f in finals] == [(8, 32, "budget_exhausted")]


@pytest.mark.slow  # a torchrun of its own (make test-all)
def test_an_epoch_with_fewer_sequences_left_than_ranks_ends_without_them(tmp_path):
    """97 sequences on 2 ranks of 4 x 1: 12 full steps leave one sequence, which a step of its own would give one
    rank and not the other; the rank without one could not join the gradient's all-reduce and the ranks would wait
    for each other until the collective timeout. It is left out of the epoch: the next step starts epoch 1."""
    train_dir, eval_dir = make_shards(tmp_path / "data97", n_train=97)
    overrides = make_train_overrides(tmp_path, **{"data.train": train_dir, "data.eval": eval_dir,
                                                  "budget.max_samples": 104, "eval.every_samples": 10**6})  # fmt: skip
    env = {**child_env(), "TRAINER_COLLECTIVE_TIMEOUT_S": "30"}
    proc = subprocess.run(torchrun(2, overrides), capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_jsonl(tmp_path / "report.jsonl")
    assert [r["samples"] for r in records if r.get("event") == "progress"] == list(range(8, 105, 8))
    finals = [r for r in records if r["kind"] == "final"]
    assert [(f["status"], f["steps"], f["samples"]) for f in finals] == [("budget_exhausted", 13, 104)]


@pytest.mark.slow  # three torchruns; the default suite resumes on ranks in the next test
@pytest.mark.parametrize("clipping", [{}, {"clipping.strategy": "bucketwise", "clipping.max_norm": 0.05,
                                           "clipping.bucket_cap_mb": 0.02}], ids=["default", "bucketwise"])  # fmt: skip
def test_two_ranks_resumed_with_dropout_train_on_as_an_uninterrupted_run(tmp_path, clipping):
    """Each rank draws its own dropout masks, so a checkpoint keeps every rank's random state: two ranks stopped at
    32 samples and resumed to 64 give the losses of a run of 64 never stopped (rank 1's masks differed before).
    Bucket-wise clipping over several buckets: DDP builds its buckets anew after its first iteration, so a resumed
    run's first step had the first iteration's buckets, not the later ones an uninterrupted run clips there (its
    losses parted from the 2nd step after the resume): the checkpoint keeps the layout, which that step clips by."""
    settings = {"schedule.total_steps": 100, "eval.every_samples": 10**6, "model.hidden_dropout_prob": 0.1,
                "model.attention_probs_dropout_prob": 0.1, **clipping}  # fmt: skip

    def torchrun_to(directory, samples, checkpoints=None):
        extra = {"budget.max_samples": samples, **settings}
        if checkpoints is not None:
            extra["checkpoint.dir"] = str(checkpoints)
        proc = subprocess.run(torchrun(2, make_train_overrides(directory, **extra)), capture_output=True, text=True,
                              timeout=240, env=child_env())  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        return [r["loss"] for r in read_jsonl(directory / "report.jsonl") if r.get("event") == "progress"]

    uninterrupted = torchrun_to(tmp_path / "whole", 64)
    first = torchrun_to(tmp_path / "first", 32, tmp_path / "ck")
    then = torchrun_to(tmp_path / "then", 64, tmp_path / "ck")
    assert len(uninterrupted) == 8 and len(first) == 4 and len(then) == 4
    assert first + then == uninterrupted


# Each direction a torchrun (and 2 runs in this process); one of them by default
@pytest.mark.parametrize("ranks", [pytest.param((2, 1), marks=pytest.mark.slow), (1, 2)], ids=["2-to-1", "1-to-2"])
def test_a_checkpoint_resumed_on_another_number_of_ranks_trains_the_samples_of_an_uninterrupted_run(
    tmp_path, monkeypatch, capsys, ranks
):
    """A checkpoint's position counts the micro-batches of each rank: 2 ranks stopped at 16 samples (2 micro-batches
    of 4 a rank) and resumed on one process went on after its 2nd micro-batch, training samples 8 to 16 again; one
    process stopped at 16 and resumed on 2 ranks skipped 16. Under balance.method none an epoch's samples come in
    the same order on any number of ranks: each goes on after the samples it trained, and step by step trains those
    of a run of one process never stopped (which are a run of 2 ranks' too)."""
    settings = {"eval.every_samples": 10**6, "batch.global_batch_size": 8, "batch.micro_batch_size": 4}

    def one_process(name: str, samples: int, checkpoints: Path | None = None) -> list[list[int]]:
        extra = {**settings, "budget.max_samples": samples, "log.jsonl": str(tmp_path / f"{name}.jsonl")}
        if checkpoints is not None:
            extra["checkpoint.dir"] = str(checkpoints)
        with monkeypatch.context() as patch:
            patch.setattr(train_module, "train_step", recording_step(tmp_path / name, train_module.train_step))
            assert main(make_train_overrides(tmp_path, **extra)) == 0
        said[name] = capsys.readouterr().err
        return read_steps(tmp_path / name)

    def two_ranks(name: str, samples: int, checkpoints: Path) -> list[list[int]]:
        extra = {**settings, "budget.max_samples": samples, "checkpoint.dir": str(checkpoints),
                 "log.jsonl": str(tmp_path / f"{name}.jsonl")}  # fmt: skip
        recorder = (str(Path(__file__).parent / "steps_recorder.py"), str(tmp_path / name))
        proc = subprocess.run(torchrun(2, make_train_overrides(tmp_path, **extra), recorder), capture_output=True,
                              text=True, timeout=240, env=child_env())  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        said[name] = proc.stderr
        return read_steps(tmp_path / name)

    said: dict[str, str] = {}
    on = {1: one_process, 2: two_ranks}
    before, after = ranks
    uninterrupted = one_process("whole", 32)
    assert len(uninterrupted) == 4 and len({i for step in uninterrupted for i in step}) == 32
    assert on[before]("first", 16, tmp_path / "ck") + on[after]("then", 32, tmp_path / "ck") == uninterrupted
    saved = {2: "saved on 2 ranks: epoch 0 goes on at micro-batch 4 of 24 a rank",
             1: "saved on 1 rank: epoch 0 goes on at micro-batch 2 of 12 a rank"}  # fmt: skip
    assert f"16 samples ({saved[before]}" in said["then"]


@pytest.mark.slow  # a torchrun of its own (make test-all)
def test_two_ranks_stop_for_time_together_where_they_read_back(tmp_path):
    """The ranks' clocks differ, so the time budget is decided together where they read back their losses (every
    3 steps here): both stop at step 3, although each was out of time after its first step."""
    overrides = make_train_overrides(
        tmp_path, **{"budget.max_time_s": 1e-6, "log.every_steps": 3, "budget.max_samples": 10**6}
    )
    proc = subprocess.run(torchrun(2, overrides), capture_output=True, text=True, timeout=240, env=child_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    finals = [r for r in read_jsonl(tmp_path / "report.jsonl") if r["kind"] == "final"]
    assert [(f["status"], f["steps"], f["samples"]) for f in finals] == [("budget_exhausted", 3, 24)]


@pytest.mark.slow  # a torchrun of its own (make test-all)
def test_ctrl_c_under_torchrun_is_said_once_with_one_final_record_and_the_run_resumes(tmp_path):
    """Ctrl-C reaches torchrun and every rank (one process group): each rank printed the "interrupted" line."""
    settings = {"checkpoint.dir": str(tmp_path / "ck"), "checkpoint.every_samples": 16, "eval.every_samples": 10**7}
    overrides = make_train_overrides(tmp_path, **{"budget.max_samples": 10**7, **settings})
    proc = subprocess.Popen(torchrun(2, overrides), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env(), start_new_session=True)  # fmt: skip
    report = tmp_path / "report.jsonl"
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (report.exists() and report.read_text().count("progress") >= 3):
            time.sleep(0.5)
        assert report.exists(), "training never started"
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert stderr.count("error: interrupted (Ctrl-C) at step") == 1, stderr[-3000:]
    finals = [r for r in read_jsonl(report) if r["kind"] == "final"]
    assert [(f["status"], f["error"]) for f in finals] == [("failed", "interrupted")]
    resumed = subprocess.run(torchrun(2, make_train_overrides(tmp_path, **{"budget.max_samples": 64, **settings})),
                             capture_output=True, text=True, timeout=240, env=child_env())  # fmt: skip
    assert resumed.returncode == 0 and "resumed from" in resumed.stderr, resumed.stderr[-3000:]


@pytest.mark.slow  # by default: hpo's torchrun [SIGKILL] and test_stop's torchrun stop (see the docstring)
def test_a_killed_rank_ends_the_run_with_an_error(tmp_path):
    """torchrun tears down the surviving trainer rank and names the one killed. By default, a killed rank ending the
    run, named: tests/hpo/trial/test_torchrun.py::test_the_first_failed_ranks_code_and_a_line_naming_it_end_the_run
    [os.kill(os.getpid(), signal.SIGKILL)-...]; trainer ranks ended mid-training without a hang:
    tests/hpo/engine/test_stop.py::test_an_api_stop_ends_both_ranks_of_a_torchrun_trial_and_closes_its_record."""
    overrides = make_train_overrides(tmp_path, **{"budget.max_samples": 10**7, "eval.every_samples": 10**7})
    proc = subprocess.Popen(
        torchrun(2, overrides),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
        start_new_session=True,
    )
    report = tmp_path / "report.jsonl"
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (report.exists() and "progress" in report.read_text()):
            time.sleep(0.5)
        assert report.exists(), "training never started"
        ranks = subprocess.run(["pgrep", "-f", "-P", str(proc.pid), "trainer"], capture_output=True, text=True)
        pids = [int(p) for p in ranks.stdout.split()]
        assert len(pids) == 2, ranks.stdout
        os.kill(pids[-1], signal.SIGKILL)
        _, stderr = proc.communicate(timeout=120)  # no hang: the launcher tears down the surviving rank
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    assert f"Signal 9 (SIGKILL) received by PID {pids[-1]}" in stderr, stderr[-3000:]  # the rank killed, named


@pytest.mark.slow  # a torchrun of its own; rank 0 says an error once in missing-data below
def test_a_config_error_is_said_once_by_rank_0_and_the_run_ends_at_once(tmp_path):
    """Every rank refused the same config and printed it: 2 copies on 2 ranks (N on N). Rank 0 says it and exits 2,
    the first failure torchrun observes; rank 1 waits quietly and torchrun ends it (rank 1 exiting first could end
    rank 0 before it said anything)."""
    proc = subprocess.run(torchrun(2, make_train_overrides(tmp_path, **{"optimizer.lrr": 1})), capture_output=True,
                          text=True, timeout=120, env=child_env())  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]  # torchrun's own exit code for a failed rank
    said = "error: invalid trainer config (defaults + overrides):\n  optimizer.lrr: unknown key"
    assert proc.stderr.count(said) == 1 and proc.stderr.count("unknown key") == 1, proc.stderr
    root_cause = proc.stderr.split("Root Cause")[-1]
    assert re.search(r"rank\s*:\s*0 \(local_rank: 0\)\s*exitcode\s*:\s*2 ", root_cause), proc.stderr


def unreadable_shard(tmp_path) -> dict[str, str]:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "part-00000.h5").write_text("not HDF5")
    return {"data.train": str(bad)}


def garbage_weights(tmp_path) -> dict[str, str]:
    (tmp_path / "weights.bin").write_text("not tensors")
    return {"model.init_checkpoint": str(tmp_path / "weights.bin")}


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        (lambda tmp_path: {"data.train": str(tmp_path / "missing")}, "error: data.train: no shard files found for "),
        pytest.param(unreadable_shard, "part-00000.h5: not a readable HDF5 file", marks=pytest.mark.slow),
        pytest.param(
            garbage_weights, "(model.init_checkpoint): not tensors that torch.load reads", marks=pytest.mark.slow
        ),  # each a torchrun; missing-data says it once by default
    ],
    ids=["missing-data", "unreadable-shard", "unreadable-init-weights"],
)
def test_a_data_error_is_said_once_by_rank_0_with_exit_code_1(tmp_path, settings, said):
    """Every rank reads the same files and refused them alike, each printing it: 2 copies on 2 ranks. Rank 0 says
    it, exits 1 (a failed run, as on one process) and writes the final record; rank 1 waits quietly for torchrun to
    end it, as for a config error."""
    overrides = make_train_overrides(tmp_path, **settings(tmp_path))
    proc = subprocess.run(torchrun(2, overrides), capture_output=True, text=True, timeout=120, env=child_env())
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.count(said) == 1 and proc.stderr.count("error: ") == 1, proc.stderr
    root_cause = proc.stderr.split("Root Cause")[-1]
    assert re.search(r"rank\s*:\s*0 \(local_rank: 0\)\s*exitcode\s*:\s*1 ", root_cause), proc.stderr
    finals = [r for r in read_jsonl(tmp_path / "report.jsonl") if r["kind"] == "final"]
    assert [(f["status"], f["error"], f["steps"]) for f in finals] == [("failed", "data", 0)]


@pytest.mark.slow  # a torchrun of its own; rank 0 names a data error once in missing-data above
def test_an_empty_shard_is_named_once_by_rank_0(tmp_path):
    """Every rank reads the same shards and skipped the empty one alike, each warning of it: rank 0 names it."""
    from trainer.data.shards import read_shard, write_shard

    overrides = make_train_overrides(tmp_path, **{"budget.max_samples": 16})
    empty_shard = tmp_path / "train" / "part-00001.h5"
    write_shard(empty_shard, read_shard(tmp_path / "train" / "part-00000.h5").subset(slice(0, 0)))
    proc = subprocess.run(torchrun(2, overrides), capture_output=True, text=True, timeout=240, env=child_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count(f"warning: {empty_shard}: data.train shard has no rows") == 1, proc.stderr
    assert "DataWarning" not in proc.stderr  # said as the trainer's other warnings are, not as Python's


@pytest.mark.slow  # each rank compiles the whole model: about a minute on 2 cores
def test_two_ranks_with_the_compiled_model_train_as_the_eager_model_with_buckets_below_ddps_first(tmp_path):
    """`model.compile_model` under DDP (2 gloo ranks, bucket-wise clipping at a bucket cap of 0.02 MiB, below DDP's
    first bucket of 1 MiB, which Dynamo's DDP optimizer refuses: the compiled model keeps one graph) trains the
    eager run's losses at every step, within float32's rounding of other kernels (without dropout: the compiled
    model draws its masks from Inductor's generator)."""
    losses = {}
    for compiled in (False, True):
        directory = tmp_path / f"compiled-{compiled}"
        overrides = make_train_overrides(directory, **{
            "model.compile_model": compiled, "batch.global_batch_size": 16, "clipping.strategy": "bucketwise",
            "clipping.max_norm": 0.5, "clipping.bucket_cap_mb": 0.02, "budget.max_samples": 64,
            "model.hidden_dropout_prob": 0.0, "model.attention_probs_dropout_prob": 0.0,  # compiled dropout draws anew
        })  # fmt: skip
        proc = subprocess.run(torchrun(2, overrides), capture_output=True, text=True, timeout=400, env=child_env())
        assert proc.returncode == 0, proc.stderr[-3000:]
        losses[compiled] = [r["loss"] for r in read_jsonl(directory / "report.jsonl") if r.get("event") == "progress"]
    assert len(losses[True]) == 4
    assert losses[True] == pytest.approx(losses[False], rel=1e-5)
