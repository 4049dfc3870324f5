"""Packing padded MLPerf rows into one unpadded batch.

Real sequences have very different lengths, so the trainer never runs padding through the model: the valid
tokens of all sequences in a micro-batch are concatenated into one [T] stream and `cu_seqlens` (int32 prefix
sums of the lengths) says where each sequence starts. Masked-LM positions become indices into that stream,
so the MLM head runs only on the masked tokens.

For attention on a grid (`model.attention: packed`), the batch can also say where each token sits when the
sequences are packed into rows as wide as the longest one, several short sequences to a row (first-fit decreasing,
on the host, where the lengths are known: `PackedBatch.row_packing`, built the first time the model asks).

With fixed shapes (`model.static_shapes`), every micro-batch is padded to one of a few lengths (`ShapeBudget`; as
NVIDIA's packed BERT runs fixed-size packs): padding tokens after the last sequence and padding masked positions
whose labels are `IGNORE` (-100), so that the steps repeat a few shapes. The padding tokens run through the
per-token layers and are dropped before attention; the padding masked positions count in no loss and no accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np
import torch

from trainer.data.shards import PretrainingSamples

IGNORE = -100  # the label of a padding masked position: cross-entropy's ignore_index
TOKEN_MULTIPLE = 64  # a budget's tokens are a multiple of this (tensor-core friendly)
TOKEN_LEVELS = 4  # the trainer's budget: micro-batches padded to one of at most this many lengths
MASKED_MULTIPLE = 8


@dataclass
class PackedBatch:
    """One micro-batch without padding. T = valid tokens, B = sequences, M = masked tokens."""

    input_ids: torch.Tensor  # int64 [T]
    segment_ids: torch.Tensor  # int64 [T]
    position_ids: torch.Tensor  # int64 [T], 0..len-1 inside each sequence
    cu_seqlens: torch.Tensor  # int32 [B + 1], cu_seqlens[i] = first token of sequence i
    max_seqlen: int  # longest sequence in the batch
    min_seqlen: int  # shortest sequence in the batch (kernels that would otherwise read it from the device)
    masked_positions: torch.Tensor  # int64 [M], indices into the [T] stream
    masked_labels: torch.Tensor  # int64 [M], original token ids at those positions
    next_sentence_labels: torch.Tensor  # int64 [B], 0 = IsNext, 1 = NotNext
    lengths: np.ndarray | None = None  # int64 [B] on the host: each sequence's length (for `row_packing`)
    valid_tokens: int | None = None  # with padding (`ShapeBudget`): the sequences' tokens, the first of the stream
    valid_masked: int | None = None  # with padding: the real masked positions, the first of masked_positions
    _rows: RowPacking | None = field(default=None, init=False, repr=False, compare=False)  # once built

    @property
    def num_sequences(self) -> int:
        return self.cu_seqlens.numel() - 1

    @property
    def num_tokens(self) -> int:
        """The sequences' tokens (padding to a budget not counted)."""
        return self.input_ids.numel() if self.valid_tokens is None else self.valid_tokens

    @property
    def num_masked(self) -> int:
        """The masked positions of the sequences (padding to a budget not counted)."""
        return self.masked_labels.numel() if self.valid_masked is None else self.valid_masked

    @property
    def padded(self) -> bool:
        """Whether the stream has padding tokens after its sequences (`ShapeBudget`)."""
        return self.num_tokens < self.input_ids.numel()

    def to(self, device: torch.device | str) -> PackedBatch:
        """The batch on `device`; to a GPU from pinned memory, so the copies do not make the host wait."""
        return _to(self, device)

    def row_packing(self) -> RowPacking:
        """The sequences packed several to a row (`RowPacking`), on the batch's device: computed on the host from
        `lengths` the first time it is asked for, so batches that attend otherwise pay nothing for it."""
        if self._rows is None:
            if self.lengths is None:
                raise ValueError("row_packing needs the batch's lengths on the host (pack_batch gives them)")
            self._rows = pack_rows(self.lengths).to(self.input_ids.device)
        return self._rows


@dataclass
class RowPacking:
    """The sequences of a batch packed into `rows` rows of `width` tokens (width = the longest sequence), several
    short ones to a row: a grid of rows x width cells, most of them tokens, where one sequence to a row would leave
    more than half of them padding on MLPerf's length mix. Attention on it masks every pair of cells that are not
    in the same sequence, so each sequence still attends only within itself."""

    slots: torch.Tensor  # int64 [T]: row * width + column of each packed token
    segments: torch.Tensor  # int64 [rows * width]: the sequence in each cell, -1 where the cell is padding
    rows: int
    width: int

    def to(self, device: torch.device | str) -> RowPacking:
        return _to(self, device)


def _to(batch, device: torch.device | str):
    """A copy of the dataclass `batch` with its tensors on `device` (from pinned memory to a GPU)."""
    pin = torch.device(device).type == "cuda"
    moved = {}
    for f in fields(batch):
        if not f.init:
            continue
        value = getattr(batch, f.name)
        if isinstance(value, torch.Tensor):
            value = (value.pin_memory() if pin else value).to(device, non_blocking=True)
        moved[f.name] = value
    return type(batch)(**moved)


def first_fit_rows(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Sequences of `lengths` packed into rows as wide as the longest, longest first, each into the first row with
    room for it (first-fit decreasing): the row and the column where each starts, and the number of rows."""
    width = int(lengths.max())
    row = np.empty(len(lengths), dtype=np.int64)
    start = np.empty(len(lengths), dtype=np.int64)
    used = np.empty(len(lengths), dtype=np.int64)  # tokens already in each row (at most one row per sequence)
    rows = 0
    for i in np.argsort(-lengths, kind="stable"):
        room = np.flatnonzero(used[:rows] + lengths[i] <= width)
        r = int(room[0]) if room.size else rows
        if r == rows:
            used[rows], rows = 0, rows + 1
        row[i], start[i] = r, used[r]
        used[r] += lengths[i]
    return row, start, rows


def pack_rows(lengths: np.ndarray) -> RowPacking:
    """`RowPacking` of sequences of `lengths`, their tokens one after another in the packed stream."""
    lengths = np.asarray(lengths, dtype=np.int64)
    row, start, rows = first_fit_rows(lengths)
    width = int(lengths.max())
    sequence = np.repeat(np.arange(len(lengths)), lengths)
    position = np.arange(len(sequence)) - np.repeat(np.cumsum(lengths) - lengths, lengths)  # within its sequence
    slots = row[sequence] * width + start[sequence] + position
    segments = np.full(rows * width, -1, dtype=np.int64)
    segments[slots] = sequence
    return RowPacking(torch.from_numpy(slots), torch.from_numpy(segments), rows, width)


@dataclass(frozen=True)
class ShapeBudget:
    """The shapes micro-batches are padded to with fixed shapes: one of a few token counts (`levels`, ascending, each
    a multiple of TOKEN_MULTIPLE; the largest, `tokens`, more than any micro-batch's, so that each has a padding token
    for the padding masked positions to point at) and `masked` masked positions. A few levels instead of one keep the
    padding small where micro-batches differ in length (a few compilations instead of one)."""

    levels: tuple[int, ...]
    masked: int

    @property
    def tokens(self) -> int:
        return self.levels[-1]

    @staticmethod
    def fitting(largest: int, masked: int, smallest: int | None = None, count: int = 1) -> ShapeBudget:
        """`count` levels (at most) evenly spaced from just above `largest` tokens down towards `smallest` (the levels
        all above it), and room for `masked` masked positions (a multiple of MASKED_MULTIPLE)."""
        top = _round_up(largest + 1, TOKEN_MULTIPLE)
        levels = [top]
        if smallest is not None and count > 1:
            step = _round_up(-(-(top - smallest) // count), TOKEN_MULTIPLE)
            levels += [top - k * step for k in range(1, count) if top - k * step > smallest]
        return ShapeBudget(tuple(sorted(levels)), _round_up(max(masked, 1), MASKED_MULTIPLE))

    def pad_to(self, tokens: int) -> int | None:
        """The level a micro-batch of `tokens` tokens is padded to: the smallest above it (None: none is)."""
        return next((level for level in self.levels if level > tokens), None)

    def holding(self, tokens: int, masked: int) -> ShapeBudget:
        """This budget, or, for a micro-batch it cannot hold (an epoch's after the one it was made from), one with a
        level above the others for it and room for its masked positions (for that micro-batch: the padding depends
        on the micro-batch alone, so a resumed run pads as the uninterrupted one did)."""
        if self.pad_to(tokens) is not None and masked <= self.masked:
            return self
        bigger = ShapeBudget.fitting(max(tokens, self.tokens - 1), max(masked, self.masked))
        levels = self.levels if bigger.tokens == self.tokens else (*self.levels, bigger.tokens)
        return ShapeBudget(levels, bigger.masked)


def training_budget(tokens: np.ndarray, sequences: np.ndarray, masked: int) -> ShapeBudget:
    """The training micro-batches' budget (`model.static_shapes`) from an epoch's micro-batches (`tokens` and
    `sequences` of each, any shape) and the most masked positions one holds: TOKEN_LEVELS lengths from above the
    largest down towards the smallest full micro-batch (not the epoch's short last step)."""
    full = tokens[sequences == sequences.max()]
    return ShapeBudget.fitting(int(tokens.max()), masked, int(full.min()), TOKEN_LEVELS)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def masked_counts(samples: PretrainingSamples) -> np.ndarray:
    """int64 [N]: each sample's masked positions (its nonzero masked_lm_positions)."""
    return (np.asarray(samples.masked_lm_positions) > 0).sum(axis=1).astype(np.int64)


def pack_batch(samples: PretrainingSamples, index: np.ndarray, budget: ShapeBudget | None = None) -> PackedBatch:
    """Gather rows `index` of `samples` into a `PackedBatch` (valid tokens only; with `budget`, padded to it)."""
    index = np.asarray(index, dtype=np.int64)
    valid = samples.input_mask[index].astype(bool)  # [B, S]; valid tokens are a prefix of each row
    lengths = valid.sum(axis=1)
    cu_seqlens = np.zeros(len(index) + 1, dtype=np.int64)
    np.cumsum(lengths, out=cu_seqlens[1:])
    input_ids = samples.input_ids[index][valid]
    segment_ids = samples.segment_ids[index][valid]
    position_ids = np.arange(valid.shape[1])[None, :].repeat(len(index), 0)[valid]

    positions = samples.masked_lm_positions[index].astype(np.int64)  # [B, P], 0 = padding
    is_masked = positions > 0
    row_of_masked = np.nonzero(is_masked)[0]
    masked_positions = cu_seqlens[row_of_masked] + positions[is_masked]
    masked_labels = samples.masked_lm_ids[index][is_masked]
    extra = {}
    if budget is not None:
        tokens, masked = len(input_ids), len(masked_positions)
        budget = budget.holding(tokens, masked)
        padded = budget.pad_to(tokens)
        pad, pad_masked = padded - tokens, budget.masked - masked
        input_ids, segment_ids = np.pad(input_ids, (0, pad)), np.pad(segment_ids, (0, pad))  # [PAD], segment 0
        position_ids = np.pad(position_ids, (0, pad))
        masked_positions = np.pad(masked_positions, (0, pad_masked), constant_values=padded - 1)
        masked_labels = np.pad(masked_labels, (0, pad_masked), constant_values=IGNORE)
        extra = {"valid_tokens": tokens, "valid_masked": masked}
    return PackedBatch(
        input_ids=torch.from_numpy(input_ids.astype(np.int64)),
        segment_ids=torch.from_numpy(segment_ids.astype(np.int64)),
        position_ids=torch.from_numpy(position_ids.astype(np.int64)),
        cu_seqlens=torch.from_numpy(cu_seqlens.astype(np.int32)),
        max_seqlen=int(lengths.max()) if len(index) else 0,
        min_seqlen=int(lengths.min()) if len(index) else 0,
        masked_positions=torch.from_numpy(masked_positions.astype(np.int64)),
        masked_labels=torch.from_numpy(masked_labels.astype(np.int64)),
        next_sentence_labels=torch.from_numpy(samples.next_sentence_labels[index].astype(np.int64)),
        lengths=lengths.astype(np.int64) if len(index) else None,
        **extra,
    )
