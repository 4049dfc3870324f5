"""Fixtures that build tiny configs, samples and batches for the trainer tests."""

from __future__ import annotations

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
        k = min(max_pred, max(1, (length - 2) // 4))
        pos = np.sort(rng.choice(np.arange(1, length - 1), size=k, replace=False))
        positions[i, :k] = pos
        labels[i, :k] = input_ids[i, pos]
        input_ids[i, pos] = 4  # [MASK]
    nsp = rng.integers(0, 2, n).astype(np.int8)
    return PretrainingSamples(input_ids, input_mask, segment_ids, positions, labels, nsp)


@pytest.fixture
def mixed_samples() -> PretrainingSamples:
    return make_samples([7, 33, 64, 12, 50, 3 + 2])
