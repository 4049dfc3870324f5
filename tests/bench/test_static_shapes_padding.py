"""bench.static_shapes_padding: the share of padding, counted by hand on three micro-batches."""

from __future__ import annotations

import numpy as np
import pytest

from bench.static_shapes_padding import epoch_padding, main, padding_share
from trainer.data.batch import ShapeBudget


def test_the_share_of_padding_is_the_padding_over_the_padded_tokens():
    tokens = np.array([100, 150, 190])  # padded to 128, 192 and 192: 512 tokens, 72 of them padding
    assert padding_share(tokens, ShapeBudget((128, 192), 8)) == pytest.approx(72 / 512)
    assert padding_share(tokens, ShapeBudget((192,), 8)) == pytest.approx(1 - 440 / 576)


def test_more_lengths_pad_less_and_the_table_has_a_row_a_method_and_micro_batch(capsys):
    lengths = np.random.default_rng(1).integers(16, 513, 4096)
    levels, one, lengths_of = epoch_padding(lengths, "none", 32, 0)
    assert 0 < levels < one and len(lengths_of) == 4
    main(["--sequences", "2048", "--micro", "16,64"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| none") or
            line.startswith("| stratified")]  # fmt: skip
    assert len(rows) == 4
