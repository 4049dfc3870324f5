"""bench.step_floor's counts against the model's shapes worked out by hand: a linear layer of n inputs and m outputs
costs 2·n·m FLOPs a token forward and twice that backward (the gradients of its input and of its weight)."""

from __future__ import annotations

import numpy as np

from bench.step_floor import attention_flops, matmul_flops
from tests.trainer.conftest import make_model_config, make_samples
from trainer.data.batch import pack_batch

LENGTHS = [64, 17, 40, 64, 9, 33]


def test_matrix_product_flops_are_those_of_the_layers_shapes():
    cfg = make_model_config()
    batch = pack_batch(make_samples(LENGTHS), np.arange(len(LENGTHS)))
    h, i, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    tokens, masked, sequences = sum(LENGTHS), batch.masked_labels.numel(), len(LENGTHS)
    encoder = tokens * layers * (3 * h * h + h * h + 2 * h * i)  # query/key/value, attention output, FFN in and out
    heads = masked * (h * h + h * cfg.padded_vocab_size)  # the MLM transform and decoder, on masked tokens only
    pooler = sequences * (h * h + 2 * h)  # the pooler and the next-sentence classifier, one token a sequence
    assert matmul_flops(cfg, batch) == 6 * (encoder + heads + pooler)


def test_attention_flops_count_each_sequence_against_itself():
    assert attention_flops(np.array([3, 4]), hidden=8, layers=2) == 12 * 8 * 2 * (9 + 16)
