"""Packing a batch's sequences into rows of a grid (`model.attention: packed`), checked cell by cell."""

from __future__ import annotations

import numpy as np
import pytest

from tests.trainer.conftest import make_samples
from trainer.data.batch import IGNORE, ShapeBudget, first_fit_rows, masked_counts, pack_batch


@pytest.mark.parametrize("seed", range(20))
def test_every_sequence_lies_whole_in_one_row_and_no_two_share_a_cell(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(5, 65, int(rng.integers(1, 40)))
    batch = pack_batch(make_samples(lengths.tolist(), seed=seed), np.arange(len(lengths)))
    rows = batch.row_packing()
    assert rows.width == lengths.max()
    grid = rows.segments.numpy().reshape(rows.rows, rows.width)
    slots = rows.slots.numpy()
    assert len(np.unique(slots)) == len(slots) == lengths.sum()  # a cell for every token, none shared
    for sequence, length in enumerate(lengths):
        start = batch.cu_seqlens[sequence].item()
        cells = slots[start : start + length]
        row, column = divmod(cells[0], rows.width)
        assert np.array_equal(cells, row * rows.width + column + np.arange(length))  # in order, in one row
        assert (grid[row, column : column + length] == sequence).all()
    assert (grid == -1).sum() == rows.rows * rows.width - lengths.sum()  # the rest is padding
    used = (grid != -1).sum(axis=1)
    assert rows.rows <= len(lengths) and (used > 0).all()
    # First fit leaves at most one row half empty (a second one's sequences would have fit in the first)
    assert (used <= rows.width / 2).sum() <= 1


def test_first_fit_decreasing_places_longest_first_each_in_the_first_row_with_room():
    # rows of 10: [10], [7, 3], [6, 4], [5, 2] (the 5 fits in no row before it; the 2 only beside the 5)
    row, start, rows = first_fit_rows(np.array([3, 10, 6, 7, 4, 5, 2]))
    assert rows == 4
    assert row.tolist() == [1, 0, 2, 1, 2, 3, 3]
    assert start.tolist() == [7, 0, 0, 0, 6, 0, 5]


def test_a_batch_of_sequences_of_one_length_packs_one_to_a_row():
    lengths = [40] * 6
    batch = pack_batch(make_samples(lengths), np.arange(6))
    assert (batch.row_packing().rows, batch.row_packing().width) == (6, 40)
    assert batch.row_packing() is batch.row_packing()  # built once
    moved = batch.to("meta")  # the lengths travel with the batch (on the host); the packing is built where asked
    assert moved.row_packing().slots.device.type == "meta" and moved.row_packing().rows == 6


def test_a_budget_is_the_next_multiple_above_the_tokens_and_holds_the_masked_positions():
    assert ShapeBudget.fitting(100, 13) == ShapeBudget((128,), 16)
    assert ShapeBudget.fitting(128, 16) == ShapeBudget((192,), 16)  # always a padding token past the sequences
    assert ShapeBudget.fitting(5, 0) == ShapeBudget((64,), 8)
    budget = ShapeBudget((128,), 16)
    assert budget.holding(127, 16) is budget
    assert budget.holding(128, 3) == ShapeBudget((128, 192), 16)  # a longer micro-batch adds a length
    assert budget.holding(10, 17) == ShapeBudget((128,), 24)


def test_a_budgets_lengths_are_evenly_spaced_down_from_above_the_largest_all_above_the_smallest():
    """From 1,001 up to 1,600 tokens in 4 lengths: 1,664 (the multiple of 64 above 1,600) down by 192 (a quarter of
    the 663 between, rounded up to a multiple of 64); each micro-batch padded to the smallest above it."""
    budget = ShapeBudget.fitting(1600, 200, smallest=1001, count=4)
    assert budget.levels == (1088, 1280, 1472, 1664) and budget.tokens == 1664
    assert [budget.pad_to(t) for t in (1001, 1087, 1088, 1300, 1600, 1664)] == [1088, 1088, 1280, 1472, 1664, None]
    assert ShapeBudget.fitting(1600, 200, smallest=1500, count=4).levels == (1536, 1600, 1664)  # none at or below
    assert ShapeBudget.fitting(1600, 200, smallest=1001, count=1).levels == (1664,)


def test_a_batch_padded_to_a_budget_keeps_its_sequences_and_pads_with_ignored_positions_on_padding_tokens():
    samples = make_samples([7, 33, 64, 12], seed=3)
    plain = pack_batch(samples, np.arange(4))
    padded = pack_batch(samples, np.arange(4), ShapeBudget((128, 192), 40))  # 116 tokens: padded to 128
    tokens, masked = plain.num_tokens, plain.num_masked
    assert (tokens, masked) == (116, len(plain.masked_labels)) and masked > 0
    assert (padded.num_tokens, padded.num_masked, padded.padded, plain.padded) == (tokens, masked, True, False)
    assert padded.input_ids.shape == padded.segment_ids.shape == padded.position_ids.shape == (128,)
    assert padded.masked_positions.shape == padded.masked_labels.shape == (40,)
    for name in ("input_ids", "segment_ids", "position_ids"):
        assert getattr(padded, name)[:tokens].equal(getattr(plain, name)), name
        assert (getattr(padded, name)[tokens:] == 0).all(), name
    assert padded.masked_positions[:masked].equal(plain.masked_positions)
    assert padded.masked_labels[:masked].equal(plain.masked_labels)
    assert (padded.masked_positions[masked:] == 127).all() and (padded.masked_labels[masked:] == IGNORE).all()
    assert padded.cu_seqlens.equal(plain.cu_seqlens) and padded.next_sentence_labels.equal(plain.next_sentence_labels)
    bigger = pack_batch(samples, np.arange(4), ShapeBudget((64,), 8))  # a budget too small grows for the batch
    assert (bigger.input_ids.numel(), bigger.masked_labels.numel(), bigger.num_tokens) == (
        128,
        8 * -(-masked // 8),
        116,
    )
    assert masked_counts(samples).tolist() == [len(pack_batch(samples, [i]).masked_labels) for i in range(4)]
