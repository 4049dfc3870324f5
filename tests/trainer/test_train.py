"""End-to-end runs of the training loop on tiny models and random data (CPU, seconds each)."""

from __future__ import annotations

import gc
import math
import warnings
from types import SimpleNamespace

import pytest
import torch

import trainer.run as run_module
import trainer.train as train_module
from tests.trainer.conftest import act_at_step, make_shards, make_train_overrides
from trainer.__main__ import main
from trainer.attention import flash_device
from trainer.balance import plan_epoch
from trainer.checkpoint import latest_checkpoint, load_checkpoint
from trainer.config import load_config
from trainer.data.shards import load_samples
from trainer.errors import TrainerError
from trainer.report import JsonLinesReporter, read_jsonl
from trainer.train import train


def run(tmp_path, **extra):
    cfg = load_config(None, make_train_overrides(tmp_path, **extra))
    reporter = JsonLinesReporter(cfg.log.jsonl)
    try:
        result = train(cfg, reporter)
    finally:
        reporter.close()
    return result, read_jsonl(cfg.log.jsonl)


def losses(records):
    return [r["loss"] for r in records if r.get("event") == "progress"]


def test_budget_run_reports_progress_evals_and_a_final_result(tmp_path):
    result, records = run(tmp_path)
    assert result.status == "budget_exhausted"
    assert result.samples == 96 and result.steps == 12  # 96 samples / global batch 8
    assert len(losses(records)) == 12
    evals = [r for r in records if r.get("event") == "eval"]
    assert [e["samples"] for e in evals] == [32, 64, 96]
    assert all(e["masked_tokens"] > 0 for e in evals)
    finals = [r for r in records if r["kind"] == "final"]
    assert len(finals) == 1 and finals[0]["status"] == "budget_exhausted"
    assert finals[0]["samples_to_target"] is None
    assert finals[0]["tokens_per_s"] > 0


def test_each_progress_line_gives_the_learning_rate_its_step_ran_with(tmp_path):
    """Step n (from 1) runs with the schedule's rate of index n - 1 (the first update with warmup's 0, MLPerf's
    convention), which is what its progress record says; not the next step's, which the optimizer holds by then."""
    _, records = run(tmp_path, **{"schedule.warmup_steps": 4, "schedule.total_steps": 12, "optimizer.lr": 1e-3})
    progress = [r for r in records if r.get("event") == "progress"]
    assert [r["step"] for r in progress] == list(range(1, 13))
    warmup = [0.0, 2.5e-4, 5e-4, 7.5e-4]  # 1e-3 * (n - 1) / 4, then the linear decay 1e-3 * (1 - (n - 1) / 12)
    expected = warmup + [1e-3 * (1 - i / 12) for i in range(4, 12)]
    assert [r["lr"] for r in progress] == pytest.approx(expected, rel=1e-12, abs=1e-18)


def test_a_progress_lines_throughput_leaves_out_the_time_of_evaluations_and_checkpoints(tmp_path, monkeypatch):
    """On a clock that only the stand-ins below move (a step 1 s, an evaluation 100 s, a checkpoint 50 s), every
    progress line says 8 sequences/s (8 sequences a step), also the lines after an evaluation or a checkpoint."""
    clock = [0.0]
    monkeypatch.setattr(train_module, "time", SimpleNamespace(perf_counter=lambda: clock[0]))

    def advancing(function, seconds):
        def wrapped(*args, **kwargs):
            clock[0] += seconds
            return function(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(train_module, "train_step", advancing(train_module.train_step, 1.0))
    monkeypatch.setattr(train_module, "run_eval", advancing(train_module.run_eval, 100.0))
    monkeypatch.setattr(train_module, "checkpoint", advancing(train_module.checkpoint, 50.0))
    _, records = run(tmp_path, **{"eval.every_samples": 16, "checkpoint.dir": str(tmp_path / "ck"),
                                  "checkpoint.every_samples": 24})  # fmt: skip
    progress = [r for r in records if r.get("event") == "progress"]
    assert len(progress) == 12 and len([r for r in records if r.get("event") == "eval"]) == 6
    assert [r["sequences_per_s"] for r in progress] == [8.0] * 12


def test_the_split_into_micro_batches_changes_neither_the_losses_nor_the_training(tmp_path):
    """Without dropout, one micro-batch of 8 and four of 2 (whose masked tokens a sequence differ) train the same:
    each micro-batch's MLM loss counts by its share of the step's masked tokens and its NSP loss by its share of
    the sequences, so the step's loss and gradient are those of the whole batch, up to rounding."""
    no_dropout = {"model.hidden_dropout_prob": 0.0, "model.attention_probs_dropout_prob": 0.0}
    losses_of = {}
    for micro in (8, 2):
        _, records = run(tmp_path / str(micro), **no_dropout, **{"batch.micro_batch_size": micro})
        losses_of[micro] = losses(records)
    assert len(losses_of[8]) == 12
    assert losses_of[2] == pytest.approx(losses_of[8], rel=1e-5)


def test_fixed_shapes_train_as_the_unpadded_batches(tmp_path, capfd):
    """`model.static_shapes` pads every micro-batch to the first epoch's budget (and every evaluation batch to the
    evaluation set's): without dropout the losses, evaluations and throughput's token counts are those of the run
    without padding, with accumulation (micro-batches of 2) and over more than one epoch (96 sequences)."""
    no_dropout = {"model.hidden_dropout_prob": 0.0, "model.attention_probs_dropout_prob": 0.0,
                  "batch.micro_batch_size": 2, "budget.max_samples": 128}  # fmt: skip
    plain, plain_records = run(tmp_path / "plain", **no_dropout)
    capfd.readouterr()
    static, static_records = run(tmp_path / "static", **no_dropout, **{"model.static_shapes": True})
    printed = capfd.readouterr()
    line = next(line for line in (printed.out + printed.err).splitlines() if "fixed shapes" in line)
    # The lengths from the first epoch's plan (micro-batches of 2 of the 96 sequences): from the next multiple of 64
    # above its largest micro-batch's tokens down by a quarter of the way to the smallest (rounded up to 64), while
    # above the smallest; the padding, each micro-batch to the smallest length above it
    cfg = load_config(None, make_train_overrides(tmp_path / "static", **no_dropout))
    lengths = load_samples(cfg.data.train).lengths
    plan = plan_epoch(lengths, cfg.balance.method, cfg.balance.bins, 2, 1, 1, cfg.seed, 0, cfg.data.shuffle)
    tokens = [int(lengths[b].sum()) for step in plan for b in step]
    top = 64 * (max(tokens) // 64 + 1)
    down = 64 * math.ceil(math.ceil((top - min(tokens)) / 4) / 64)
    levels = sorted(top - k * down for k in range(4) if top - k * down > min(tokens))
    padding = 1 - sum(tokens) / sum(min(level for level in levels if level > t) for t in tokens)
    assert f"micro-batches padded to {', '.join(map(str, levels))} tokens" in line, line
    assert f"({padding:.1%} of the tokens padding in the first epoch)" in line, line
    assert len(losses(plain_records)) == 16
    assert losses(static_records) == pytest.approx(losses(plain_records), rel=1e-5)
    evals = [[r["mlm_accuracy"], r["masked_tokens"]] for r in plain_records if r.get("event") == "eval"]
    assert [[r["mlm_accuracy"], r["masked_tokens"]] for r in static_records if r.get("event") == "eval"] == evals
    assert static.samples == plain.samples == 128


def test_the_default_decay_horizon_counts_the_short_last_step_of_each_epoch(tmp_path):
    """100 sequences at global batch 8: an epoch is 12 full steps and one of 4 sequences, so 208 samples take 27
    steps, not 208 / 8 = 26; the rate decays over those 27 and is not yet 0 at the last."""
    train_dir, eval_dir = make_shards(tmp_path / "data100", n_train=100)
    _, records = run(tmp_path, **{"data.train": str(train_dir), "data.eval": str(eval_dir),
                                  "budget.max_samples": 208, "eval.every_samples": 10**6,
                                  "schedule.warmup_steps": 0, "optimizer.lr": 1e-3})  # fmt: skip
    progress = [r for r in records if r.get("event") == "progress"]
    epoch = [*range(8, 97, 8), 100]
    assert [r["samples"] for r in progress] == epoch + [100 + n for n in epoch] + [208]
    assert [r["lr"] for r in progress] == pytest.approx([1e-3 * (1 - k / 27) for k in range(27)], rel=1e-9)
    # A short run given the full run's horizon in samples (as a multi-fidelity trial is) is its prefix
    _, short = run(tmp_path / "short", **{"data.train": str(train_dir), "data.eval": str(eval_dir),
                                          "budget.max_samples": 104, "schedule.horizon_samples": 208,
                                          "eval.every_samples": 10**6, "schedule.warmup_steps": 0,
                                          "optimizer.lr": 1e-3})  # fmt: skip
    short_lrs = [r["lr"] for r in short if r.get("event") == "progress"]
    assert short_lrs == [r["lr"] for r in progress][: len(short_lrs)] and len(short_lrs) == 14


def test_each_rank_draws_from_a_stream_of_its_own():
    """Ranks would otherwise draw the same dropout masks (every rank seeds the same weights first); no rank's stream
    is another rank's or that of one process with a nearby seed (a confirmation run's), and rank 0 keeps its own."""
    draws = {}
    for seed, rank in [(1234, 0), (1234, 1), (1234, 2), (1235, 0), (1235, 1)]:
        torch.manual_seed(seed)
        run_module.seed_rank_stream(seed, rank)
        draws[seed, rank] = torch.rand(8)
    torch.manual_seed(1234)
    assert torch.equal(draws[1234, 0], torch.rand(8))  # one process, or rank 0: the seed's own stream
    rows = list(draws.values())
    assert all(not torch.equal(a, b) for i, a in enumerate(rows) for b in rows[i + 1 :])


def test_a_checkpoint_of_other_ranks_gives_each_resuming_rank_a_stream_of_its_own():
    """Saved for this many ranks, each rank resumes its own stream; saved by another number of ranks (or by rank 0
    alone), rank 0 resumes rank 0's and every other rank draws from a stream of its own, not rank 0's masks."""

    def state_after(draws):
        torch.manual_seed(draws)
        return {"torch": torch.get_rng_state()}

    saved = [state_after(seed) for seed in (11, 12)]

    def resumed(payload, rank, world_size, step=5):
        run_module.restore_rank_rng(payload, rank, world_size, seed=1234, step=step)
        return torch.rand(8)

    def continued(state):
        torch.set_rng_state(state["torch"])
        return torch.rand(8)

    two = {"rng": saved[0], "rng_ranks": saved}
    assert [torch.equal(resumed(two, r, 2), continued(saved[r])) for r in (0, 1)] == [True, True]
    for payload in ({"rng": saved[0]}, {"rng": saved[0], "rng_ranks": saved}):  # rank 0's alone; saved by 2 ranks
        streams = [resumed(payload, rank, 3) for rank in range(3)]
        assert torch.equal(streams[0], continued(saved[0]))
        assert not any(torch.equal(a, b) for i, a in enumerate(streams) for b in streams[i + 1 :])
    assert not torch.equal(resumed({"rng": saved[0]}, 1, 3, step=5), resumed({"rng": saved[0]}, 1, 3, step=6))


def test_loss_decreases_on_repeated_data(tmp_path):
    # Random tokens cannot be generalized, but 6 epochs over 96 samples can be memorized a little (at lr 1e-2 the
    # last epoch's mean loss is about 0.16 below the first's; 12 epochs at 3e-3 got 0.12 in twice the steps).
    result, records = run(tmp_path, **{"budget.max_samples": 96 * 6, "optimizer.lr": 1e-2, "eval.every_samples": 10**6})
    seq = losses(records)
    assert sum(seq[-12:]) / 12 < sum(seq[:12]) / 12 - 0.1


def test_reaching_the_target_stops_and_records_samples_to_target(tmp_path):
    result, _ = run(tmp_path, **{"eval.target_mlm_accuracy": 1e-6, "eval.every_samples": 16})
    assert result.status == "reached_target"
    assert result.samples_to_target == 16
    assert 0 < result.time_to_target_s <= result.train_time_s  # the training time counts that evaluation too
    assert result.best_mlm_accuracy >= 1e-6


def test_training_on_past_the_target_records_the_first_hit_and_the_whole_curve(tmp_path):
    result, records = run(
        tmp_path, **{"eval.target_mlm_accuracy": 1e-6, "eval.every_samples": 16, "eval.stop_at_target": False}
    )
    evals = [r["samples"] for r in records if r.get("event") == "eval"]
    assert evals == [16, 32, 48, 64, 80, 96]  # every evaluation to the budget, not stopped at the first
    assert result.status == "reached_target" and result.samples == 96
    assert result.samples_to_target == 16


def test_a_diverged_run_reports_its_last_step_whole(tmp_path):
    """Read back every 5 steps, a loss that is NaN from step 2 on ends the run at step 5, whose progress record is
    step 5's: its learning rate too (not the first NaN step's)."""
    _, records = run(tmp_path, **{"optimizer.name": "adamw", "optimizer.lr": 1e30, "optimizer.eps": 1e-30,
                                  "log.every_steps": 5, "schedule.warmup_steps": 10, "schedule.total_steps": 20,
                                  "eval.every_samples": 10**6})  # fmt: skip
    (last,) = [r for r in records if r.get("event") == "progress"]
    assert last["step"] == 5 and last["samples"] == 40 and not math.isfinite(last["loss"])
    assert last["lr"] == pytest.approx(1e30 * 4 / 10, rel=1e-12)  # step 5 runs with warmup's rate of index 4


def test_a_diverged_run_leaves_its_last_finite_checkpoint_the_latest(tmp_path):
    """A checkpoint every step; the loss is NaN from step 2 on: the checkpoint of step 1 stays the latest, with
    finite weights, instead of one of the diverged weights."""
    result, _ = run(tmp_path, **{"optimizer.name": "adamw", "optimizer.lr": 1e30, "optimizer.eps": 1e-30,
                                 "eval.every_samples": 10**6, "checkpoint.dir": str(tmp_path / "ck"),
                                 "checkpoint.every_samples": 8})  # fmt: skip
    assert result.status == "diverged" and result.samples == 16
    payload, state = load_checkpoint(latest_checkpoint(tmp_path / "ck"))
    assert state.samples == 8
    assert all(torch.isfinite(t).all() for t in payload["model"].values())


def test_nan_loss_ends_the_run_as_diverged(tmp_path):
    result, records = run(tmp_path, **{"optimizer.name": "adamw", "optimizer.lr": 1e30, "optimizer.eps": 1e-30})
    assert result.status == "diverged"
    assert result.steps < 12
    assert not all(math.isfinite(x) for x in losses(records))


def test_losses_read_back_every_few_steps_are_those_of_every_step(tmp_path):
    """The loss stays on the device between reads: reading every 5 steps reports, at steps 5 and 10 and at the last
    one (12), the losses a run that reads every step reports there, and the run ends the same way."""
    every, records_every = run(tmp_path / "each")
    fifth, records_fifth = run(tmp_path / "fifth", **{"log.every_steps": 5})
    assert [r["step"] for r in records_fifth if r.get("event") == "progress"] == [5, 10, 12]
    by_step = {r["step"]: r for r in records_every if r.get("event") == "progress"}
    for record in (r for r in records_fifth if r.get("event") == "progress"):
        assert record["loss"] == by_step[record["step"]]["loss"]
        assert record["train_mlm_accuracy"] == by_step[record["step"]]["train_mlm_accuracy"]
    assert (fifth.status, fifth.samples, fifth.steps) == (every.status, every.samples, every.steps)


def test_a_run_that_fails_between_reads_checkpoints_the_noise_scale_of_every_step_it_finished(tmp_path, monkeypatch):
    """A step that fails (here the 4th, with a trainer error) ends the run with its norms of steps 1-3 still on the
    device when reads come every 5 steps: they are read back on the way out, so the checkpoint written after the
    failure holds the noise-scale estimate that a run reading every step holds."""

    def fails():
        raise TrainerError("a step that fails")

    act_at_step(monkeypatch, 4, fails)
    saved = {}
    for every in (1, 5):
        directory = tmp_path / f"every{every}"
        result, _ = run(directory, **{"log.every_steps": every, "checkpoint.dir": str(directory / "ck")})
        assert (result.status, result.error, result.steps) == ("failed", "crash", 3)
        payload, state = load_checkpoint(latest_checkpoint(directory / "ck"))
        assert state.step == 3
        saved[every] = payload["noise_scale"]
    assert saved[1]["weight"] > 0  # steps 1-3 were measured (2 micro-batches a step)
    assert saved[5] == saved[1]


def test_one_process_stops_at_the_step_its_time_budget_runs_out_even_between_reads(tmp_path):
    result, records = run(tmp_path, **{"budget.max_time_s": 1e-6, "log.every_steps": 5})
    assert (result.status, result.steps, result.samples) == ("budget_exhausted", 1, 8)
    assert [r["samples"] for r in records if r.get("event") == "eval"] == [8]  # the final evaluation


def test_a_nan_between_reads_ends_the_run_as_diverged_at_the_next_read(tmp_path, capfd):
    result, records = run(tmp_path, **{"optimizer.name": "adamw", "optimizer.lr": 1e30, "optimizer.eps": 1e-30,
                                       "log.every_steps": 4})  # fmt: skip
    assert result.status == "diverged" and result.steps % 4 == 0 and result.steps < 12
    assert f"(read at step {result.steps}): diverged" in capfd.readouterr().err


def test_the_noise_scale_measured_every_third_step_is_the_every_step_measurement_at_those_steps(tmp_path):
    """With accumulation (micro-batches are the small batches), `log.noise_scale_every: 3` measures steps 3, 6, 9
    and 12 only, with the norms the every-step run measured there; training is the same, and its noise scale is
    the EMA (decay 0.5) of those four measurements, computed here from the formulas of the two-batch estimate."""
    _, each = run(tmp_path / "each", **{"log.noise_scale_decay": 0.5})
    _, third = run(tmp_path / "third", **{"log.noise_scale_decay": 0.5, "log.noise_scale_every": 3})
    each, third = ([r for r in records if r.get("event") == "progress"] for records in (each, third))
    assert [r["loss"] for r in third] == [r["loss"] for r in each]
    assert [r["step"] for r in third if r["grad_sq_norm_small"] is not None] == [3, 6, 9, 12]
    grad_ema = trace_ema = 0.0
    for mine, every in zip(third, each, strict=True):
        if mine["step"] % 3:
            continue
        assert (mine["grad_sq_norm_small"], mine["grad_sq_norm_big"]) == (every["grad_sq_norm_small"],
                                                                          every["grad_sq_norm_big"])  # fmt: skip
        small, big = every["grad_sq_norm_small"], every["grad_sq_norm_big"]  # micro-batch 4, batch 8
        grad_sq, trace = (8 * big - 4 * small) / 4, (small - big) / (1 / 4 - 1 / 8)
        grad_ema, trace_ema = 0.5 * grad_ema + 0.5 * grad_sq, 0.5 * trace_ema + 0.5 * trace
        expected = trace_ema / grad_ema if grad_ema > 0 else None
        assert mine["noise_scale"] == (pytest.approx(expected, rel=1e-9) if expected is not None else None)


def test_an_epochs_short_last_step_measures_the_noise_scale_with_its_micro_batches_own_size(tmp_path):
    """96 sequences in micro-batches of 8, 5 to a step: the epoch's steps have 5, 5 and 2 micro-batches. The small
    batch of every step is a micro-batch, 8 sequences (not the step's sequences / 5, which the last step is not):
    the estimator the run saves holds the EMAs (decay 0.5) of the three steps' two-batch estimates, computed here
    from their norms."""
    ck = tmp_path / "ck"
    _, records = run(tmp_path, **{"batch.global_batch_size": 40, "batch.micro_batch_size": 8,
                                  "log.noise_scale_decay": 0.5, "checkpoint.dir": str(ck)})  # fmt: skip
    steps = [r for r in records if r.get("event") == "progress"]
    samples = [0] + [r["samples"] for r in steps]
    big_batches = [b - a for a, b in zip(samples, samples[1:], strict=False)]
    assert big_batches == [40, 40, 16]
    grad_ema = trace_ema = 0.0
    for record, b_big in zip(steps, big_batches, strict=True):
        small, big, b_small = record["grad_sq_norm_small"], record["grad_sq_norm_big"], 8
        grad_sq = (b_big * big - b_small * small) / (b_big - b_small)
        trace = (small - big) / (1 / b_small - 1 / b_big)
        grad_ema, trace_ema = 0.5 * grad_ema + 0.5 * grad_sq, 0.5 * trace_ema + 0.5 * trace
    saved = load_checkpoint(latest_checkpoint(ck))[0]["noise_scale"]
    assert (saved["grad_sq"], saved["trace"]) == (pytest.approx(grad_ema, rel=1e-9), pytest.approx(trace_ema, rel=1e-9))


def test_a_step_whose_micro_batches_differ_in_size_is_not_measured(tmp_path):
    """96 sequences in micro-batches of 7, 5 to a step: the epoch's last step has micro-batches of 7, 7, 7 and 5, for
    which B_small is undefined: it reports no norms, and the estimator the run saves holds steps 1 and 2 only."""
    ck = tmp_path / "ck"
    _, records = run(tmp_path, **{"batch.global_batch_size": 35, "batch.micro_batch_size": 7,
                                  "log.noise_scale_decay": 0.5, "checkpoint.dir": str(ck)})  # fmt: skip
    steps = [r for r in records if r.get("event") == "progress"]
    assert [r["samples"] for r in steps] == [35, 70, 96]
    assert steps[2]["grad_sq_norm_small"] is None and steps[2]["grad_sq_norm_big"] is None
    grad_ema = trace_ema = 0.0
    for record in steps[:2]:
        small, big = record["grad_sq_norm_small"], record["grad_sq_norm_big"]
        grad_sq, trace = (35 * big - 7 * small) / (35 - 7), (small - big) / (1 / 7 - 1 / 35)
        grad_ema, trace_ema = 0.5 * grad_ema + 0.5 * grad_sq, 0.5 * trace_ema + 0.5 * trace
    saved = load_checkpoint(latest_checkpoint(ck))[0]["noise_scale"]
    assert (saved["grad_sq"], saved["trace"]) == (pytest.approx(grad_ema, rel=1e-9), pytest.approx(trace_ema, rel=1e-9))


@pytest.mark.parametrize("static", [False, True], ids=["any-shapes", "fixed-shapes"])
def test_resume_continues_the_same_loss_sequence(tmp_path, static):
    """With dropout, also with fixed shapes (model.static_shapes: the resumed run pads each micro-batch as the
    uninterrupted run did, so the dropout draws are the same)."""
    full_dir, part_dir = tmp_path / "full", tmp_path / "part"
    full_dir.mkdir()
    part_dir.mkdir()
    common = {
        "optimizer.lr": 3e-3,
        "schedule.warmup_steps": 3,
        "schedule.total_steps": 12,
        "model.hidden_dropout_prob": 0.1,
        "checkpoint.every_samples": 40,
        "model.static_shapes": static,
    }
    _, uninterrupted = run(full_dir, **common, **{"checkpoint.dir": str(full_dir / "ck")})
    # Stop after 5 steps (a checkpoint at 40 samples), then resume with the full budget.
    first, part1 = run(part_dir, **common, **{"budget.max_samples": 40, "checkpoint.dir": str(part_dir / "ck")})
    assert first.status == "budget_exhausted" and first.samples == 40
    second, records = run(part_dir, **common, **{"checkpoint.dir": str(part_dir / "ck")})
    resumed = losses(records)[len(losses(part1)) :]
    assert second.samples == 96
    assert losses(part1) + resumed == pytest.approx(losses(uninterrupted), abs=1e-6)
    assert len(resumed) == 7


def test_a_run_resumed_with_another_learning_rate_trains_with_it(tmp_path):
    """The schedule after a resume is the resuming run's: stopped at step 5 with optimizer.lr 3e-3, resumed with
    1e-3, its steps 6 to 12 run with 1e-3 on the same warmup and decay (the checkpoint kept 3e-3 before)."""
    common = {"schedule.warmup_steps": 3, "schedule.total_steps": 12, "checkpoint.dir": str(tmp_path / "ck")}
    run(tmp_path, **common, **{"optimizer.lr": 3e-3, "budget.max_samples": 40, "checkpoint.every_samples": 40})
    _, records = run(tmp_path, **common, **{"optimizer.lr": 1e-3})
    resumed = [r for r in records if r.get("event") == "progress"][5:]
    assert [r["step"] for r in resumed] == list(range(6, 13))
    assert [r["lr"] for r in resumed] == pytest.approx([1e-3 * (1 - k / 12) for k in range(5, 12)], rel=1e-12)


def test_a_run_resumed_with_other_optimizer_settings_trains_with_them(tmp_path):
    """Betas, eps and weight decay after a resume are the resuming run's config's (bias and LayerNorm keep no weight
    decay); the moments are the checkpoint's."""
    common = {"checkpoint.dir": str(tmp_path / "ck"), "optimizer.name": "adamw"}
    run(tmp_path, **common, **{"budget.max_samples": 40, "checkpoint.every_samples": 40})
    new = {"optimizer.beta1": 0.8, "optimizer.beta2": 0.95, "optimizer.eps": 1e-8, "optimizer.weight_decay": 0.05}
    run(tmp_path, **common, **new)
    payload, state = load_checkpoint(latest_checkpoint(tmp_path / "ck"))
    assert state.samples == 96
    groups = payload["optimizer"]["param_groups"]
    assert {(g["betas"], g["eps"]) for g in groups} == {((0.8, 0.95), 1e-8)}
    assert sorted(g["weight_decay"] for g in groups) == [0.0, 0.05]


@pytest.mark.parametrize("extra", [{}, {"eval.target_mlm_accuracy": 1e-6}], ids=["budget", "target"])
def test_the_same_command_again_after_the_run_finished_trains_nothing_and_keeps_its_mlperf_log(tmp_path, extra):
    """With checkpoint.dir (resume is on by default) a finished run's command run again resumes from its final
    checkpoint: it has nothing left to train, so it takes no step and its MLPerf log stays as the run wrote it."""
    overrides = {"checkpoint.dir": str(tmp_path / "ck"), "log.mlperf": str(tmp_path / "result_0.txt"), **extra}
    first, before = run(tmp_path, **overrides)
    log = (tmp_path / "result_0.txt").read_bytes()
    again, records = run(tmp_path, **overrides)
    records = records[len(before) :]  # the report appends
    assert (again.status, again.samples, again.steps) == (first.status, first.samples, first.steps)
    expected = ("reached_target", 32) if extra else ("budget_exhausted", 96)  # the first evaluation, the budget
    assert (first.status, first.samples) == expected
    assert again.samples_to_target == first.samples_to_target
    assert losses(records) == [] and (tmp_path / "result_0.txt").read_bytes() == log


@pytest.mark.parametrize("mlperf", [True, False], ids=["mlperf-log", "none"])
def test_a_finished_run_run_again_speaks_of_its_mlperf_log_only_where_it_has_one(tmp_path, capsys, mlperf):
    overrides = {"checkpoint.dir": str(tmp_path / "ck"), "budget.max_samples": 16}
    if mlperf:
        overrides["log.mlperf"] = str(tmp_path / "result_0.txt")
    run(tmp_path, **overrides)
    capsys.readouterr()
    run(tmp_path, **overrides)
    said = next(line for line in capsys.readouterr().err.splitlines() if "checkpoint of a finished run" in line)
    assert said.endswith("nothing is left to train" + " (its MLPerf log is kept)" * mlperf), said


def cli(tmp_path, capsys, **extra) -> tuple[int, str]:
    """`python -m trainer` in this process on the tiny test run (`trainer.__main__.main`, as the process runs it):
    its exit code and what it printed on stderr."""
    code = main(make_train_overrides(tmp_path, **extra))
    return code, capsys.readouterr().err


def test_cli_run_writes_jsonl_and_exits_zero(tmp_path, capsys):
    code, stderr = cli(tmp_path, capsys, **{"budget.max_samples": 16})
    assert code == 0, stderr
    assert "seq/s" in stderr and "tok/s" in stderr and "mlm_accuracy" in stderr
    final = read_jsonl(tmp_path / "report.jsonl")[-1]
    assert final["kind"] == "final" and final["status"] == "budget_exhausted"


@pytest.mark.parametrize("key", ["log.jsonl", "log.mlperf"])
def test_a_log_on_a_full_disk_ends_the_run_with_one_line_naming_it(tmp_path, capsys, key):
    # /dev/full answers every write with ENOSPC ("No space left on device"), as a disk that filled up mid-run does;
    # the MLPerf log's writes went through logging, which printed each failure (to sys.stderr, read when it prints)
    # and went on with events missing
    code, stderr = cli(tmp_path, capsys, **{"budget.max_samples": 16, key: "/dev/full"})
    assert code == 1, stderr
    assert "Traceback" not in stderr and "Logging error" not in stderr, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: a file of the run could not be written: No space left on device (") and (
        f"{key} /dev/full: " in last
    ), last
    assert last.endswith("free space there, or choose other paths; then run it again"), last


def test_a_log_file_on_a_full_disk_is_closed_when_the_run_ends(tmp_path):
    """The MLPerf log's file stayed open when its first write failed (a ResourceWarning at collection, a descriptor
    held by a process that goes on, as an hpo launcher does)."""
    overrides = make_train_overrides(tmp_path, **{"budget.max_samples": 16, "log.mlperf": "/dev/full"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(overrides) == 1
        gc.collect()  # an unclosed file says so when it is collected
    assert not [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


def test_varlen_attention_on_the_cpu_is_refused_before_any_step(tmp_path, capsys):
    code, stderr = cli(tmp_path, capsys, **{"model.attention": "varlen"})
    assert code == 2, stderr
    assert "error: model.attention: varlen needs a CUDA GPU of compute capability 8.0 or newer" in stderr
    assert "(this run: cpu, fp32, heads of 16)" in stderr
    assert "training BERT" not in stderr


def test_cudnn_varlen_attention_where_the_varlen_attention_does_not_run_is_refused_before_any_step(tmp_path, capsys):
    code, stderr = cli(tmp_path, capsys, **{"model.varlen_kernel": "cudnn"})
    assert code == 2, stderr
    assert ("error: model.varlen_kernel: cudnn is a kernel of the varlen attention, which needs a CUDA GPU of compute "
            "capability 8.0 or newer") in stderr  # fmt: skip
    assert "(this run: cpu, fp32: attention packed); set model.varlen_kernel: flash" in stderr
    assert "training BERT" not in stderr


def test_cli_diverged_exit_code(tmp_path, capsys):
    code, stderr = cli(tmp_path, capsys, **{"optimizer.name": "adamw", "optimizer.lr": 1e30, "optimizer.eps": 1e-30})
    assert code == 3, stderr


FLASH_ONLY = pytest.mark.skipif(
    not (__import__("torch").cuda.is_available() and flash_device(__import__("torch").device("cuda"))),
    reason="needs a GPU the flash kernel runs on (compute capability 8.0 or newer)",
)


@pytest.mark.parametrize(
    ("optimizer", "strategy", "attention", "noise_every"),
    [("lamb", "after_allreduce", "auto", 1), ("adamw", "before_allreduce", "padded", 1),
     ("lamb", "bucketwise", "padded", 1000), ("adamw", "none", "auto", 1000), ("lamb", "none", "static", 1)],
)  # fmt: skip
def test_a_training_step_reads_nothing_back_from_the_device_checked_on_the_meta_device(
    tmp_path, optimizer, strategy, attention, noise_every
):
    """Tensors on PyTorch's meta device have shapes and no values: anything that reads one back to the host (`.item()`,
    `.tolist()`, `if tensor`, an output whose size depends on the values) raises there. A whole training step of the
    tiny model with BERT's dropout, 2 micro-batches, clipping and the noise scale measured or not runs on it, on the
    packed grid and on the padded one, so nothing in a step reads a value back (the GPU test below also checks, under
    CUDA's sync debug mode, that no copy waits); the loss stays on the device until read back every
    `log.every_steps`, which is where a read then fails."""
    import torch

    from trainer.checkpoint import TrainState
    from trainer.distributed import dist_env_from_environ
    from trainer.mlperf_log import open_log
    from trainer.readback import read_back
    from trainer.report import NullReporter
    from trainer.run import build_run
    from trainer.train import epoch_steps, train_step

    overrides = {"optimizer.name": optimizer, "clipping.strategy": strategy, "model.hidden_dropout_prob": 0.1,
                 "model.attention_probs_dropout_prob": 0.1, "log.noise_scale_every": noise_every,
                 "model.attention": attention}  # fmt: skip
    if attention == "static":  # fixed shapes (model.static_shapes) on the padded grid
        overrides.update({"model.attention": "padded", "model.static_shapes": True})
    cfg = load_config(None, make_train_overrides(tmp_path, **overrides))
    env, device = dist_env_from_environ(), torch.device("meta")
    run = build_run(cfg, env, device, NullReporter(), open_log(cfg, env, device))
    assert {p.device.type for p in run.model.parameters()} == {"meta"}
    stats = train_step(run, next(epoch_steps(run, TrainState()))[0], 1)
    assert (stats.sequences, len(stats.micro_batch_sizes), stats.loss_sum.device.type) == (8, 2, "meta")
    assert (stats.grad_sq_norms is not None) == (noise_every == 1)  # the noise scale measured in the step, or not
    with pytest.raises(NotImplementedError, match="meta"):  # reading the loss back is what the meta device refuses
        read_back([(1, stats)])


@pytest.mark.parametrize("micro_batch, graphs", [(4, False), (8, True)], ids=["accumulating", "one-micro-batch"])
def test_the_compiled_model_may_replay_cuda_graphs_only_where_a_step_is_one_micro_batch(tmp_path, micro_batch, graphs):
    """`model.compile_model`: a backward graph's replay writes its gradients where the last replay's lie, which the
    parameters' .grad still holds while a step accumulates micro-batches (PyTorch issue 169545), so the run built for
    a global batch of 8 in micro-batches of 4 keeps the model off CUDA graphs, and in one micro-batch of 8 lets it
    (the model reads the switch at each forward, on a GPU with fixed shapes and the varlen kernel)."""
    import torch

    from trainer.distributed import dist_env_from_environ
    from trainer.mlperf_log import open_log
    from trainer.report import NullReporter
    from trainer.run import build_run

    overrides = {"model.compile_model": True, "model.static_shapes": True, "batch.micro_batch_size": micro_batch}
    cfg = load_config(None, make_train_overrides(tmp_path, **overrides))
    env, device = dist_env_from_environ(), torch.device("meta")
    run = build_run(cfg, env, device, NullReporter(), open_log(cfg, env, device))
    assert (run.accumulation, run.model.cuda_graphs) == (8 // micro_batch, graphs)


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(
    ("attention", "noise_every", "optimizer"),
    # each optimizer with and without the noise scale measured, each kernel at least once (the tests check of
    # scripts/gpu_checks.sh has a minute for every gpu test; the meta-device test above reads nothing back in the
    # CPU's kernels' steps, with the noise scale measured or not)
    [("padded", 1000, "adamw"), ("auto", 1, "lamb"), ("packed", 1, "adamw"),
     pytest.param("varlen", 1, "adamw", marks=FLASH_ONLY), pytest.param("varlen", 1000, "lamb", marks=FLASH_ONLY)],
    ids=lambda value: {1000: "noise-scale-not-due", 1: "noise-scale-measured"}.get(value, value),
)  # fmt: skip
def test_on_the_gpu_a_training_step_never_waits_for_the_device(tmp_path, optimizer, noise_every, attention):
    """CUDA's sync debug mode raises at any operation that makes the host wait for the GPU: a bf16 step of the
    tiny model with BERT's dropout (the padded grid; the packed grid; auto, the varlen kernel where it runs) and 2
    micro-batches runs without one, with the noise scale measured in it (its norms stay on the device until read
    back with the loss) or not."""
    import torch

    from trainer.checkpoint import TrainState
    from trainer.distributed import dist_env_from_environ
    from trainer.mlperf_log import open_log
    from trainer.readback import read_back
    from trainer.report import NullReporter
    from trainer.run import build_run
    from trainer.train import epoch_steps, train_step

    overrides = {"device": "cuda", "precision.dtype": "bf16", "optimizer.name": optimizer,
                 "model.hidden_dropout_prob": 0.1, "model.attention_probs_dropout_prob": 0.1,
                 "log.noise_scale_every": noise_every, "model.attention": attention}  # fmt: skip
    cfg = load_config(None, make_train_overrides(tmp_path, **overrides))
    env, device = dist_env_from_environ(), torch.device("cuda")
    run = build_run(cfg, env, device, NullReporter(), open_log(cfg, env, device))
    steps = epoch_steps(run, TrainState())
    train_step(run, next(steps)[0], 1)  # the first step allocates and initializes
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        stats = train_step(run, next(steps)[0], 2)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    (reading,) = read_back([(2, stats)])
    assert math.isfinite(reading.loss)
    assert (reading.grad_sq_norms is not None) == (noise_every == 1)


def test_the_start_line_says_the_precision_residual_stream_attention_kernel_and_compiled_layers(monkeypatch):
    import torch

    from trainer.run import execution

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))  # an H100 or H200
    dropout = load_config(None, [])  # BERT's attention dropout 0.1
    no_dropout = load_config(None, ["model.attention_probs_dropout_prob=0.0", "model.compile=true"])
    assert execution(dropout, cpu, None) == "fp32, attention packed"
    assert execution(dropout, cuda, torch.bfloat16) == "bf16, attention varlen"  # with dropout: 1.56x padded
    assert execution(no_dropout, cuda, torch.float16) == "fp16, attention varlen, compiled layers"
    half = load_config(None, ["model.half_residual=true"])
    assert execution(half, cuda, torch.bfloat16) == "bf16 with a bf16 residual stream, attention varlen"
    assert execution(half, cuda, None) == "fp32, attention padded"  # no autocast: no flash kernel
    assert execution(half, cpu, None) == "fp32, attention packed"  # no autocast: nothing is half
    cudnn = load_config(None, ["model.varlen_kernel=cudnn"])
    assert execution(cudnn, cuda, torch.bfloat16) == "bf16, attention varlen on cuDNN"
    assert execution(cudnn, cpu, None) == "fp32, attention packed"  # (refused before any work: check_varlen_kernel)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))  # a V100: no flash kernel
    assert execution(dropout, cuda, torch.bfloat16) == "bf16, attention padded"
    assert execution(no_dropout, cuda, torch.float16) == "fp16, attention padded, compiled layers"
    whole = load_config(None, ["model.compile_model=true", "model.static_shapes=true"])
    assert execution(whole, cuda, torch.bfloat16) == "bf16, attention padded, compiled model"  # grids: no graphs
    assert execution(whole, cpu, None) == "fp32, attention packed, compiled model"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert execution(whole, cuda, torch.bfloat16) == "bf16, attention varlen, compiled model on CUDA graphs"
    assert execution(whole, cuda, torch.bfloat16, accumulation=2) == (
        "bf16, attention varlen, compiled model (no CUDA graphs: gradients accumulate over micro-batches)"
    )
    dynamic = load_config(None, ["model.compile_model=true"])  # for any number of tokens: no graphs
    assert execution(dynamic, cuda, torch.bfloat16) == "bf16, attention varlen, compiled model"


def test_data_max_seq_length_trains_on_rows_cut_to_it(tmp_path):
    """Shards 64 wide on a model whose position table has 32 rows: refused as they are, trained once
    data.max_seq_length cuts them to 32 (the MLPerf log says the width trained)."""
    short = {"model.max_position_embeddings": 32, "budget.max_samples": 16}
    refused, _ = run(tmp_path / "as_is", **short)
    assert (refused.status, refused.error) == ("failed", "data")
    assert "model.max_position_embeddings = 32" in refused.reason
    mlperf = tmp_path / "cut" / "mlperf.log"
    result, records = run(tmp_path / "cut", **short, **{"data.max_seq_length": 32, "log.mlperf": str(mlperf)})
    assert (result.status, result.samples) == ("budget_exhausted", 16)
    assert all(math.isfinite(loss) for loss in losses(records))
    assert '"key": "max_sequence_length", "value": 32' in mlperf.read_text()
