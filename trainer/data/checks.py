"""Checks that a data set can be trained and evaluated on, run once before the first step.

`read_shard` already checks each shard's layout (keys, shapes, dtypes, the input_mask prefix, positions inside
the row width). What it cannot know is the model, or whether a data set is usable as a whole. Without these
checks bad data fails late and under another name: an empty training set loops forever, an empty eval set
reports accuracy 0.0, a masked position past the row's real length trains on the next row's token, an id
outside the vocabulary crashes mid-training, a data set without masked tokens ends as `diverged`, and a row
without valid tokens packs to nothing, so the next-sentence head reads the next row's [CLS] (or an index past
the batch). An empty shard beside good ones is no error, but is said once, as a `DataWarning` naming the file.

Every check is vectorized over the rows (MLPerf shards hold hundreds of thousands) and raises `DataError`
naming the file, the HDF5 key, the first bad row (numbered inside its file) and what to do.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trainer.config import ModelConfig
from trainer.data.shards import PretrainingSamples, load_samples
from trainer.errors import DataError, DataWarning

RECREATE = "re-create the shard with `python -m trainer.data.prepare` (or `python -m trainer.data.demo_corpus`)"
FIX_VOCAB = f"set model.vocab_size to the size of the vocabulary the shards were prepared with, or {RECREATE}"


def load_checked_samples(
    spec: str, key: str, model: ModelConfig, limit: int | None = None, max_seq_length: int | None = None
) -> PretrainingSamples:
    """The samples of `spec` (the config key `key`, e.g. data.train), every shard cut to `max_seq_length` tokens
    when given (data.max_seq_length) and checked against `model`."""
    summary = _Summary()

    def check(part: PretrainingSamples, path: Path) -> None:
        check_rows(part, path, model)
        summary.add(path, part)

    samples = load_samples(spec, limit, check, max_seq_length, key)
    summary.require_rows_and_masks(spec, key)
    summary.warn_empty_shards(key)
    return samples


def warn_rows_narrower_than(max_seq_length: int | None, samples_of: dict[str, tuple[str, PretrainingSamples]]) -> None:
    """A DataWarning for each data set (config key -> (spec, samples)) whose rows are narrower than
    data.max_seq_length: the setting cuts nothing there, and the run trains on shorter sequences than it asks for
    (it ran without a word)."""
    if max_seq_length is None:
        return
    for key, (spec, samples) in samples_of.items():
        if samples.max_seq_length < max_seq_length:
            width = samples.max_seq_length
            warnings.warn(
                f"data.max_seq_length = {max_seq_length} is wider than the rows of {key} = {spec!r} ({width} "
                f"tokens): it cuts nothing, and the run {'trains' if key == 'data.train' else 'evaluates'} on "
                f"sequences of at most {width} tokens; prepare shards of {max_seq_length} tokens (`python -m "
                f"trainer.data.prepare --max-seq-length {max_seq_length}`) or set data.max_seq_length to {width} "
                "or less",
                DataWarning,
                stacklevel=2,
            )


def check_rows(samples: PretrainingSamples, path: Path, model: ModelConfig) -> None:
    """Every row fits `model` and its masked positions point into the row's own tokens."""
    lengths = samples.lengths
    positions = samples.masked_lm_positions
    masked = positions > 0  # position 0 ([CLS]) is the padding of the list
    vocab = f"model.vocab_size = {model.vocab_size}"
    first_column = np.arange(samples.max_seq_length) == 0
    _refuse_rows(
        samples,
        "input_mask",
        (lengths == 0)[:, None] & first_column,
        path,
        "no valid token (the row's input_mask is all 0), so the row has no [CLS] for the next-sentence head",
        f"drop the row or {RECREATE}",
    )
    beyond_table = np.arange(samples.max_seq_length) >= model.max_position_embeddings
    _refuse_rows(
        samples,
        "input_mask",
        (samples.input_mask > 0) & beyond_table,
        path,
        f"a valid token at or past model.max_position_embeddings = {model.max_position_embeddings}",
        f"raise model.max_position_embeddings, cut the rows to it (data.max_seq_length="
        f"{model.max_position_embeddings}), or prepare shorter sequences",
    )
    _refuse_rows(
        samples,
        "input_ids",
        _outside(samples.input_ids, model.vocab_size),
        path,
        f"token id outside {vocab}",
        FIX_VOCAB,
    )
    types = f"model.type_vocab_size = {model.type_vocab_size}"
    _refuse_rows(
        samples,
        "segment_ids",
        _outside(samples.segment_ids, model.type_vocab_size),
        path,
        f"id outside {types}",
        RECREATE,
    )
    past_length = masked & (positions >= lengths[:, None])
    what = "masked position past the row's valid tokens (input_mask); it would train on another row's token"
    _refuse_rows(samples, "masked_lm_positions", past_length, path, what, RECREATE)
    labels = masked & _outside(samples.masked_lm_ids, model.vocab_size)
    _refuse_rows(samples, "masked_lm_ids", labels, path, f"label outside {vocab}", FIX_VOCAB)


def _outside(values: np.ndarray, size: int) -> np.ndarray:
    return (values < 0) | (values >= size)


def _refuse_rows(samples: PretrainingSamples, key: str, bad: np.ndarray, path: Path, what: str, remedy: str) -> None:
    """Raise naming the first row of `key` where `bad` ([N, width] booleans) marks a value, if there is one."""
    rows = np.flatnonzero(bad.any(axis=1))
    if not rows.size:
        return
    row = int(rows[0])
    column = int(np.flatnonzero(bad[row])[0])
    value = getattr(samples, key)[row, column]
    raise DataError(
        f"{path}: HDF5 key '{key}', row {row}, column {column} (value {value}): {what} "
        f"({rows.size} of {len(bad)} rows affected); {remedy}"
    )


@dataclass
class _Summary:
    """Rows and masked tokens per shard, to refuse an empty data set by name."""

    shards: list[tuple[Path, int, int]] = field(default_factory=list)

    def add(self, path: Path, part: PretrainingSamples) -> None:
        self.shards.append((path, len(part), int((part.masked_lm_positions > 0).sum())))

    def warn_empty_shards(self, key: str) -> None:
        """Warn once per shard without rows (only called when others have rows): it adds nothing to `key`."""
        for path, rows, _ in self.shards:
            if rows == 0:
                warnings.warn(
                    f"{path}: {key} shard has no rows (HDF5 key 'input_ids' has 0 rows) and is skipped; "
                    "remove it or re-create it with samples",
                    DataWarning,
                    stacklevel=2,
                )

    def require_rows_and_masks(self, spec: str, key: str) -> None:
        files = ", ".join(f"{path} ({rows} rows, {masks} masked tokens)" for path, rows, masks in self.shards)
        if sum(rows for _, rows, _ in self.shards) == 0:
            raise DataError(
                f"{key} = {spec!r}: no rows to {'train' if key == 'data.train' else 'evaluate'} on in {files} "
                f"(HDF5 key 'input_ids' has 0 rows); point {key} at shards with samples or re-create them"
            )
        if sum(masks for _, _, masks in self.shards) == 0:
            raise DataError(
                f"{key} = {spec!r}: no masked tokens in {files} (HDF5 key 'masked_lm_positions' is all 0, "
                "which marks padding); without masked tokens there is no masked-LM loss or accuracy: "
                "re-create the shards with masking (`--masked-lm-prob` > 0)"
            )
