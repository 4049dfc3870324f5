"""bench.saved_activations counts what autograd keeps for the backward. With the bf16 residual stream a layer's two
LayerNorms keep their inputs in bf16, 2 bytes a token and hidden unit each instead of fp32's 4 (the matrix products
after them keep the bf16 LayerNorm outputs, where they kept autocast's bf16 copies of the fp32 ones); on the CPU their
statistics (mean and 1/std, 2 a token each) are kept in bf16 too instead of fp32; and the two LayerNorms keep their
weight and bias cast to bf16. Checked byte for byte on a tiny model on the CPU."""

from __future__ import annotations

import numpy as np
import torch

from bench.saved_activations import saved_bytes
from tests.trainer.conftest import make_model_config, make_samples
from trainer.data.batch import pack_batch
from trainer.model import BertForPreTraining

LENGTHS = [64, 17, 40, 64, 9, 33]


def test_the_half_residual_stream_keeps_four_bytes_a_token_and_hidden_unit_less_per_layer():
    samples = make_samples(LENGTHS)
    batch = pack_batch(samples, np.arange(len(LENGTHS)))
    counted = {}
    for half in (False, True):
        for layers in (1, 2):
            cfg = make_model_config(num_hidden_layers=layers, half_residual=half)
            torch.manual_seed(0)
            counted[half, layers] = saved_bytes(BertForPreTraining(cfg).train(), batch, torch.device("cpu"),
                                                torch.bfloat16)  # fmt: skip
    layer = {half: counted[half, 2] - counted[half, 1] for half in (False, True)}
    hidden = make_model_config().hidden_size
    tokens = sum(LENGTHS)
    inputs, statistics, parameters = 2 * 2 * hidden * tokens, 4 * 2 * tokens, 4 * 2 * hidden
    assert layer[False] - layer[True] == inputs + statistics - parameters
