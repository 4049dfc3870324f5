"""Bad data is refused before the first step: exit code 1, a message naming file, key and row, no step taken.

Each case corrupts one shard written by `make_shards` the way a user's data could be wrong, then runs the CLI
entry point (`trainer.__main__.main`) in this process.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.trainer.conftest import make_model_config, make_train_overrides
from trainer.__main__ import main
from trainer.data.checks import check_rows
from trainer.data.shards import PretrainingSamples, read_shard, write_shard
from trainer.errors import DataError
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
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_data_fails_before_the_first_step_naming_file_key_and_row(tmp_path, capsys, case):
    which, corrupt, key, words = CASES[case]
    overrides = make_train_overrides(tmp_path)
    shard = tmp_path / which / "part-00000.h5"
    samples, row = corrupt(read_shard(shard))
    write_shard(shard, samples)

    assert main(overrides) == TrainStatus.FAILED.exit_code == 1

    stderr = capsys.readouterr().err
    message = stderr.split("error: ", 1)[1].splitlines()[0]
    assert str(shard) in message and f"'{key}'" in message and words in message
    if row is not None:
        assert f"row {row}," in message
    records = read_jsonl(tmp_path / "report.jsonl")
    assert [r["kind"] for r in records] == ["final"]  # no progress or eval record: nothing was trained
    final = records[0]
    assert final["status"] == "failed" and final["error"] == "data" and final["steps"] == 0
    assert final["samples"] == 0 and final["reason"] == message


def test_a_masked_position_on_the_last_valid_token_is_accepted(mixed_samples):
    row = 1
    mixed_samples.masked_lm_positions[row, 0] = mixed_samples.lengths[row] - 1  # the final [SEP]: inside the row
    check_rows(mixed_samples, Path("x.h5"), make_model_config())
    mixed_samples.masked_lm_positions[row, 0] = mixed_samples.lengths[row]
    with pytest.raises(DataError, match=r"x.h5: HDF5 key 'masked_lm_positions', row 1, column 0"):
        check_rows(mixed_samples, Path("x.h5"), make_model_config())


def test_rows_longer_than_the_position_table_are_refused(mixed_samples):
    first_too_long = int(np.flatnonzero(mixed_samples.lengths > 40)[0])
    with pytest.raises(DataError, match=rf"'input_mask', row {first_too_long}, column 40 .*embeddings = 40"):
        check_rows(mixed_samples, Path("x.h5"), make_model_config(max_position_embeddings=40))
