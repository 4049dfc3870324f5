"""Fixtures that build tiny configs, samples and batches for the trainer tests, and how their gloo ranks start."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest

from trainer.config import ModelConfig
from trainer.data.shards import PretrainingSamples


def make_model_config(**overrides) -> ModelConfig:
    """A tiny BERT; vocab 99 is deliberately not a multiple of 8 so vocabulary padding is exercised."""
    base = dict(
        vocab_size=99,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    base.update(overrides)
    return ModelConfig(**base)


def make_samples(lengths, seq_len=64, max_pred=8, vocab_size=99, seed=0) -> PretrainingSamples:
    """Random MLPerf-layout rows with the given valid lengths: [CLS]=2 ... [SEP]=3, masked positions inside."""
    rng = np.random.default_rng(seed)
    n = len(lengths)
    input_ids = np.zeros((n, seq_len), np.int32)
    input_mask = np.zeros((n, seq_len), np.int8)
    segment_ids = np.zeros((n, seq_len), np.int8)
    positions = np.zeros((n, max_pred), np.int32)
    labels = np.zeros((n, max_pred), np.int32)
    for i, length in enumerate(lengths):
        input_ids[i, :length] = rng.integers(5, vocab_size, length)
        input_ids[i, 0], input_ids[i, length - 1] = 2, 3
        input_mask[i, :length] = 1
        segment_ids[i, length // 2 : length] = 1
        k = min(max_pred, max(1, (length - 2) // 4)) if length > 2 else 0  # [CLS] x [SEP]: one maskable token
        pos = np.sort(rng.choice(np.arange(1, length - 1), size=k, replace=False))
        positions[i, :k] = pos
        labels[i, :k] = input_ids[i, pos]
        input_ids[i, pos] = 4  # [MASK]
    nsp = rng.integers(0, 2, n).astype(np.int8)
    return PretrainingSamples(input_ids, input_mask, segment_ids, positions, labels, nsp)


@pytest.fixture
def mixed_samples() -> PretrainingSamples:
    return make_samples([7, 33, 64, 12, 50, 3 + 2])


def make_shards(directory, n_train=96, n_eval=32, seq_len=64, seed=0):
    """Write a train and an eval shard of random MLPerf-layout samples; returns (train_dir, eval_dir)."""
    from trainer.data.shards import write_shard

    rng = np.random.default_rng(seed)
    train_dir, eval_dir = directory / "train", directory / "eval"
    train_dir.mkdir(parents=True, exist_ok=True)
    eval_dir.mkdir(parents=True, exist_ok=True)
    write_shard(train_dir / "part-00000.h5", make_samples(rng.integers(8, seq_len + 1, n_train), seq_len, seed=seed))
    write_shard(eval_dir / "part-00000.h5", make_samples(rng.integers(8, seq_len + 1, n_eval), seq_len, seed=seed + 1))
    return train_dir, eval_dir


def make_train_overrides(directory, **extra) -> list[str]:
    """Overrides for a seconds-long CPU run of the tiny model on `make_shards` data."""
    train_dir, eval_dir = make_shards(directory)
    base = {
        "device": "cpu",
        "model.vocab_size": 99,
        "model.hidden_size": 32,
        "model.num_hidden_layers": 2,
        "model.num_attention_heads": 2,
        "model.intermediate_size": 64,
        "model.max_position_embeddings": 64,
        "data.train": str(train_dir),
        "data.eval": str(eval_dir),
        "optimizer.lr": 1e-3,
        "batch.global_batch_size": 8,
        "batch.micro_batch_size": 4,
        "eval.every_samples": 32,
        "eval.target_mlm_accuracy": 1.0,
        "eval.batch_size": 16,
        "budget.max_samples": 96,
        "log.every_steps": 1,
        "log.jsonl": str(directory / "report.jsonl"),
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def buckets_by_hand(param_bytes: list[int], cap_bytes: int) -> int:
    """How many gradient buckets DDP's rule makes of parameters of these sizes (in registration order), written out:
    taken in the reverse order, a bucket closes as soon as it holds `cap_bytes` or more; what is left is one more."""
    count, held = 0, 0
    for size in reversed(param_bytes):
        held += size
        if held >= cap_bytes:
            count, held = count + 1, 0
    return count + (held > 0)


# What a rank of the in-process gloo tests imports before it runs: the fork server imports it once. torch._dynamo
# (with sympy and Inductor) is imported by the first optimizer step or zero_grad of a process: 2 s of every rank.
RANK_PRELOAD = ["torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo", "trainer.clipping",
                "trainer.noise_scale", "trainer.balance", "trainer.model"]  # fmt: skip


def start_ranks(worker, args: tuple, nprocs: int) -> None:
    """`worker(rank, *args)` on `nprocs` processes, joined (torch.multiprocessing.start_processes).

    The ranks are forked from a fork server (started once per test session, single-threaded, it imported
    RANK_PRELOAD): each rank is a fresh process, as a spawned one would be, without importing torch again (seconds
    per rank on a busy 2-core machine). Forking the test process itself could inherit a lock held by one of its
    threads."""
    multiprocessing.get_context("forkserver").set_forkserver_preload(RANK_PRELOAD)  # read when the server starts
    from torch import multiprocessing as torch_mp

    torch_mp.start_processes(worker, args=args, nprocs=nprocs, start_method="forkserver", join=True)


def act_at_step(monkeypatch, at: int, act) -> None:
    """From now on the trainer's step `at` first calls `act()` (which raises, or sends this process a signal), then
    runs as usual; `monkeypatch.undo()` puts the real step back."""
    import trainer.train as train_module

    real_step = train_module.train_step

    def step_that_acts(run, micro_batches, step):
        if step == at:
            act()
        return real_step(run, micro_batches, step)

    monkeypatch.setattr(train_module, "train_step", step_that_acts)
