"""Bad data is refused before the first step: exit code 1, a message naming file, key and row, no step taken.

Each case corrupts one shard written by `make_shards` the way a user's data could be wrong, then runs the CLI
entry point (`trainer.__main__.main`) in this process. An empty shard beside a good one is no error: it is
named once in a `DataWarning` and the run trains on the others.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.trainer.conftest import make_model_config, make_train_overrides
from trainer.__main__ import main
from trainer.balance import assign_bins
from trainer.data.checks import check_rows
from trainer.data.shards import SHARD_LAYOUT, PretrainingSamples, read_shard, write_shard
from trainer.errors import DataError, DataWarning
from trainer.report import read_jsonl
from trainer.result import TrainStatus

VOCAB = 99  # make_train_overrides' model.vocab_size


def empty(samples: PretrainingSamples) -> tuple[PretrainingSamples, None]:
    return samples.subset(slice(0, 0)), None


def position_past_length(samples: PretrainingSamples) -> tuple[PretrainingSamples, int]:
    row = int(np.flatnonzero(samples.lengths < samples.max_seq_length - 1)[3])
    samples.masked_lm_positions[row, 0] = samples.lengths[row] + 1  # inside the row width, past its tokens
    return samples, row


def token_id_outside_vocab(samples: PretrainingSamples) -> tuple[PretrainingSamples, int]:
    samples.input_ids[7, 1] = VOCAB
    return samples, 7


def label_outside_vocab(samples: PretrainingSamples) -> tuple[PretrainingSamples, int]:
    row = int(np.flatnonzero(samples.masked_lm_positions[:, 0] > 0)[4])
    samples.masked_lm_ids[row, 0] = VOCAB + 50
    return samples, row


def zero_length_row(samples: PretrainingSamples) -> tuple[PretrainingSamples, int]:
    """Row 9 without a valid token: all its arrays 0, as a converter that pads missing rows would write it."""
    for key in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids"):
        getattr(samples, key)[9] = 0
    return samples, 9


def no_masked_tokens(samples: PretrainingSamples) -> tuple[PretrainingSamples, None]:
    samples.masked_lm_positions[:] = 0
    samples.masked_lm_ids[:] = 0
    return samples, None


# (which shard, corruption, the key the message must name, words it must contain)
CASES = {
    "empty_train_shard": ("train", empty, "input_ids", "no rows to train on"),
    "empty_eval_set": ("eval", empty, "input_ids", "no rows to evaluate on"),
    "masked_position_past_row_length": ("train", position_past_length, "masked_lm_positions", "past the row"),
    "token_id_outside_vocab": ("train", token_id_outside_vocab, "input_ids", "model.vocab_size = 99"),
    "eval_label_outside_vocab": ("eval", label_outside_vocab, "masked_lm_ids", "model.vocab_size = 99"),
    "no_masked_tokens": ("train", no_masked_tokens, "masked_lm_positions", "no masked tokens"),
    "zero_length_train_row": ("train", zero_length_row, "input_mask", "no valid token"),
    "zero_length_eval_row": ("eval", zero_length_row, "input_mask", "no valid token"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_data_fails_before_the_first_step_naming_file_key_and_row(tmp_path, capsys, case):
    which, corrupt, key, words = CASES[case]
    overrides = make_train_overrides(tmp_path)
    shard = tmp_path / which / "part-00000.h5"
    samples, row = corrupt(read_shard(shard))
    write_shard(shard, samples)

    message = run_failing(overrides, capsys)

    assert str(shard) in message and f"'{key}'" in message and words in message
    if row is not None:
        assert f"row {row}," in message
    assert_nothing_trained(tmp_path, message)


def run_failing(overrides: list[str], capsys) -> str:
    """Run the trainer, which must fail; its error message."""
    assert main(overrides) == TrainStatus.FAILED.exit_code == 1
    stderr = capsys.readouterr().err
    return stderr.split("error: ", 1)[1].splitlines()[0]


def assert_nothing_trained(tmp_path: Path, message: str) -> None:
    records = read_jsonl(tmp_path / "report.jsonl")
    assert [r["kind"] for r in records] == ["final"]  # no progress or eval record: nothing was trained
    final = records[0]
    assert final["status"] == "failed" and final["error"] == "data" and final["steps"] == 0
    assert final["samples"] == 0 and final["reason"] == message


def test_an_hdf5_group_in_place_of_a_dataset_is_refused_naming_file_and_key(tmp_path, capsys):
    overrides = make_train_overrides(tmp_path)
    shard = tmp_path / "train" / "part-00000.h5"
    arrays = read_shard(shard).arrays()
    with h5py.File(shard, "w") as f:  # segment_ids written as a group holding the array, as some exporters nest
        for key in SHARD_LAYOUT:
            if key == "segment_ids":
                f.create_group(key).create_dataset("values", data=arrays[key])
            else:
                f.create_dataset(key, data=arrays[key])

    message = run_failing(overrides, capsys)

    assert message.startswith(f"{shard}: HDF5 key 'segment_ids' is a group, not a dataset")
    assert_nothing_trained(tmp_path, message)


def test_an_empty_shard_beside_a_good_one_is_named_once_in_a_warning_and_skipped(tmp_path, capsys):
    overrides = make_train_overrides(tmp_path)
    good = tmp_path / "train" / "part-00000.h5"
    empty_shard = tmp_path / "train" / "part-00001.h5"
    write_shard(empty_shard, read_shard(good).subset(slice(0, 0)))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # every call shows, so a repeated warning would be counted
        assert main(overrides) == TrainStatus.BUDGET_EXHAUSTED.exit_code

    about_data = [str(w.message) for w in caught if issubclass(w.category, DataWarning)]
    assert len(about_data) == 1
    assert about_data[0].startswith(f"{empty_shard}: data.train shard has no rows")
    assert str(good) not in about_data[0]
    final = read_jsonl(tmp_path / "report.jsonl")[-1]
    assert final["status"] == "budget_exhausted" and final["samples"] == 96  # the good shard's 96 rows


def test_a_masked_position_on_the_last_valid_token_is_accepted(mixed_samples):
    row = 1
    mixed_samples.masked_lm_positions[row, 0] = mixed_samples.lengths[row] - 1  # the final [SEP]: inside the row
    check_rows(mixed_samples, Path("x.h5"), make_model_config())
    mixed_samples.masked_lm_positions[row, 0] = mixed_samples.lengths[row]
    with pytest.raises(DataError, match=r"x.h5: HDF5 key 'masked_lm_positions', row 1, column 0"):
        check_rows(mixed_samples, Path("x.h5"), make_model_config())


def test_a_zero_length_row_is_refused_before_any_other_check(mixed_samples):
    mixed_samples.input_mask[4] = 0  # masked positions stay: the row has no [CLS] before its masks are checked
    with pytest.raises(DataError, match=r"x.h5: HDF5 key 'input_mask', row 4, column 0 \(value 0\): no valid token"):
        check_rows(mixed_samples, Path("x.h5"), make_model_config())


def test_rows_longer_than_the_position_table_are_refused(mixed_samples):
    first_too_long = int(np.flatnonzero(mixed_samples.lengths > 40)[0])
    with pytest.raises(DataError, match=rf"'input_mask', row {first_too_long}, column 40 .*embeddings = 40") as err:
        check_rows(mixed_samples, Path("x.h5"), make_model_config(max_position_embeddings=40))
    assert "cut the rows to it (data.max_seq_length=40)" in str(err.value)  # the option made for it


def test_an_evaluation_set_that_names_training_shards_is_warned_of(tmp_path):
    """data.eval pointing at the training shards ran without a word: accuracy measured on sequences it trains on."""
    overrides = make_train_overrides(tmp_path, **{"data.eval": str(tmp_path / "train"), "budget.max_samples": 16})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(overrides) == TrainStatus.BUDGET_EXHAUSTED.exit_code
    about_data = [str(w.message) for w in caught if issubclass(w.category, DataWarning)]
    assert len(about_data) == 1 and about_data[0].startswith("data.eval names 1 of data.train's shards ("), about_data
    assert "the evaluation measures accuracy on sequences the run trains on" in about_data[0]
    with warnings.catch_warnings(record=True) as caught:  # a held-out set: no word
        warnings.simplefilter("always")
        assert main(make_train_overrides(tmp_path, **{"budget.max_samples": 16})) == 0
    assert not [w for w in caught if issubclass(w.category, DataWarning)]


def data_warnings(overrides: list[str]) -> list[str]:
    """The DataWarnings of a run of `overrides` (which must end budget_exhausted)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(overrides) == TrainStatus.BUDGET_EXHAUSTED.exit_code
    return [str(w.message) for w in caught if issubclass(w.category, DataWarning)]


def test_a_max_seq_length_wider_than_the_shards_is_warned_of_and_a_cutting_one_is_not(tmp_path):
    """data.max_seq_length above the shards' 64-token rows cut nothing and trained on 64 tokens without a word."""
    said = data_warnings(make_train_overrides(tmp_path, **{"data.max_seq_length": 128, "budget.max_samples": 16}))
    assert len(said) == 2, said  # the training and the evaluation rows
    train = str(tmp_path / "train")
    assert said[0].startswith(f"data.max_seq_length = 128 is wider than the rows of data.train = '{train}' (64 tokens)")
    assert "the run trains on sequences of at most 64 tokens" in said[0]
    assert "`python -m trainer.data.prepare --max-seq-length 128`) or set data.max_seq_length to 64 or less" in said[0]
    assert said[1].startswith("data.max_seq_length = 128 is wider than the rows of data.eval")
    assert "the run evaluates on sequences of at most 64 tokens" in said[1]
    assert not data_warnings(make_train_overrides(tmp_path, **{"data.max_seq_length": 64, "budget.max_samples": 16}))
    assert not data_warnings(make_train_overrides(tmp_path, **{"data.max_seq_length": 32, "budget.max_samples": 16}))


def test_stratified_bins_that_hold_every_sequence_in_one_are_warned_of_with_bounds_inside_the_lengths(tmp_path):
    """balance.bins above every length made `stratified` draw as `none` does, without a word; the bounds it names
    split the sequences (checked here by binning them)."""
    overrides = make_train_overrides(tmp_path, **{"balance.method": "stratified", "budget.max_samples": 16})
    said = data_warnings(overrides)  # the default bins [64, 128, ...] hold the 8- to 64-token rows in their first
    lengths = read_shard(tmp_path / "train" / "part-00000.h5").lengths
    assert len(said) == 1, said
    assert said[0].startswith(
        f"balance.method stratified: balance.bins [64, 128, 192, 256, 320, 384, 448, 511, 512] put all 96 training "
        f"sequences (of {lengths.min()} to {lengths.max()} tokens) in one bin"
    )
    bounds = [int(b) for b in said[0].split("balance.bins=[")[1].rstrip("]").split(",")]
    assert bounds == sorted(set(bounds)) and bounds[-1] == lengths.max() and len(bounds) == 4
    assert len(np.unique(assign_bins(lengths, bounds))) == 4  # the named bounds put sequences in each of 4 bins
    split = {"balance.method": "stratified", "balance.bins": str(bounds), "budget.max_samples": 16}
    assert not data_warnings(make_train_overrides(tmp_path, **split))
    assert not data_warnings(make_train_overrides(tmp_path, **{"budget.max_samples": 16}))  # method none: no word
