"""MLPerf HDF5 shards (trainer/data/shards.py): exact keys, dtypes and shapes; errors that name file and key."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from tests.trainer.conftest import make_samples
from trainer.data.shards import (
    SHARD_LAYOUT,
    PretrainingSamples,
    count_samples,
    find_shards,
    load_samples,
    read_shard,
    write_shard,
)
from trainer.errors import DataError

MLPERF_DTYPES = {
    "input_ids": "int32",
    "input_mask": "int8",
    "segment_ids": "int8",
    "masked_lm_positions": "int32",
    "masked_lm_ids": "int32",
    "next_sentence_labels": "int8",
}


def assert_same_samples(a: PretrainingSamples, b: PretrainingSamples) -> None:
    for key, array in a.arrays().items():
        np.testing.assert_array_equal(getattr(b, key), array, err_msg=key)
        assert getattr(b, key).dtype == array.dtype, key


def rewrite_key(path, key, data) -> None:
    with h5py.File(path, "a") as f:
        del f[key]
        if data is not None:
            f.create_dataset(key, data=data)


@pytest.mark.parametrize("compress", [False, True])
def test_round_trip_keeps_exact_mlperf_keys_dtypes_and_shapes(tmp_path, compress):
    samples = make_samples([64, 10, 33, 2], seq_len=64, max_pred=8)
    path = tmp_path / "part-00000.h5"
    write_shard(path, samples, compress=compress)
    with h5py.File(path, "r") as f:
        assert sorted(f.keys()) == sorted(MLPERF_DTYPES)
        assert {key: str(f[key].dtype) for key in f} == MLPERF_DTYPES
        assert f["input_ids"].shape == (4, 64) and f["masked_lm_ids"].shape == (4, 8)
        assert f["next_sentence_labels"].shape == (4,)
    assert_same_samples(samples, read_shard(path))
    assert {key: str(dtype) for key, (dtype, _) in SHARD_LAYOUT.items()} == MLPERF_DTYPES


def test_lengths_subset_and_concatenate():
    a, b = make_samples([5, 64, 17], seq_len=64, seed=1), make_samples([40, 3], seq_len=64, seed=2)
    assert a.lengths.tolist() == [5, 64, 17] and a.lengths.dtype == np.int64
    both = PretrainingSamples.concatenate([a, b])
    assert len(both) == 5 and both.lengths.tolist() == [5, 64, 17, 40, 3]
    picked = both.subset(np.array([4, 0]))
    np.testing.assert_array_equal(picked.input_ids, both.input_ids[[4, 0]])
    assert both.subset(3).lengths.tolist() == [40]
    assert both.subset(both.lengths > 16).lengths.tolist() == [64, 17, 40]


def test_concatenate_rejects_different_sequence_lengths():
    with pytest.raises(DataError, match="max_seq_length"):
        PretrainingSamples.concatenate([make_samples([5], seq_len=64), make_samples([5], seq_len=32)])


def test_read_casts_other_integer_dtypes_when_values_fit(tmp_path):
    samples = make_samples([20, 30], seq_len=32, max_pred=4)
    path = tmp_path / "wide.h5"
    write_shard(path, samples)
    rewrite_key(path, "input_ids", samples.input_ids.astype(np.int64))
    rewrite_key(path, "next_sentence_labels", samples.next_sentence_labels.astype(np.int64)[:, None])  # [N, 1]
    assert_same_samples(samples, read_shard(path))


def test_missing_key_names_file_and_key(tmp_path):
    path = tmp_path / "broken.h5"
    write_shard(path, make_samples([10, 20], seq_len=32, max_pred=4))
    rewrite_key(path, "segment_ids", None)
    with pytest.raises(DataError, match=r"broken\.h5.*'segment_ids' is missing"):
        read_shard(path)


def test_wrong_shape_names_file_and_key(tmp_path):
    path = tmp_path / "short_mask.h5"
    samples = make_samples([10, 20], seq_len=32, max_pred=4)
    write_shard(path, samples)
    rewrite_key(path, "input_mask", samples.input_mask[:, :16])
    with pytest.raises(DataError, match=r"short_mask\.h5.*'input_mask' has shape \(2, 16\)"):
        read_shard(path)


@pytest.mark.parametrize(
    ("key", "bad", "message"),
    [
        ("input_ids", np.full((2, 32), 2**40, dtype=np.int64), "do not fit int32"),
        ("input_ids", np.zeros((2, 32), dtype=np.float32), "expected integers"),
        ("masked_lm_positions", np.full((2, 4), 32, dtype=np.int32), "outside"),
        ("next_sentence_labels", np.array([0, 2], dtype=np.int8), "only 0"),
    ],
)
def test_bad_values_name_the_key(tmp_path, key, bad, message):
    path = tmp_path / "bad.h5"
    write_shard(path, make_samples([10, 20], seq_len=32, max_pred=4))
    rewrite_key(path, key, bad)
    with pytest.raises(DataError, match=rf"bad\.h5.*'{key}'.*{message}"):
        read_shard(path)


def test_input_mask_must_be_a_prefix(tmp_path):
    samples = make_samples([10, 20], seq_len=32, max_pred=4)
    samples.input_mask[0, 3] = 0
    with pytest.raises(DataError, match="'input_mask' must mark a prefix"):
        write_shard(tmp_path / "gap.h5", samples)


def test_missing_or_non_hdf5_file(tmp_path):
    with pytest.raises(DataError, match=r"nothere\.h5: shard file not found"):
        read_shard(tmp_path / "nothere.h5")
    text = tmp_path / "text.h5"
    text.write_text("not hdf5")
    with pytest.raises(DataError, match=r"text\.h5: not a readable HDF5 file"):
        read_shard(text)


@pytest.mark.parametrize(("offset", "garbage"), [(800, bytes(1000)), (300, bytes(range(256)) * 4)])
def test_a_shard_with_a_damaged_header_is_a_data_error_naming_it(tmp_path, offset, garbage):
    """h5py raises RuntimeError (not OSError) for some damage inside the file's structures, as a bad copy gives."""
    path = tmp_path / "damaged.h5"
    write_shard(path, make_samples([10, 20, 30], seq_len=32, max_pred=4))
    data = bytearray(path.read_bytes())
    data[offset : offset + len(garbage)] = garbage
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"damaged\.h5: not a readable HDF5 file .*re-create the shard"):
        read_shard(path)


def test_find_shards_directory_glob_and_file(tmp_path):
    for name in ("part-00001.h5", "part-00000.h5", "extra.hdf5", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in find_shards(str(tmp_path))] == ["extra.hdf5", "part-00000.h5", "part-00001.h5"]
    assert [p.name for p in find_shards(str(tmp_path / "part-*.h5"))] == ["part-00000.h5", "part-00001.h5"]
    assert [p.name for p in find_shards(str(tmp_path / "extra.hdf5"))] == ["extra.hdf5"]
    with pytest.raises(DataError, match="no shard files found"):
        find_shards(str(tmp_path / "missing" / "*.h5"))


def test_find_shards_says_why_it_found_none_and_names_the_key(tmp_path):
    """It said "no shard files found" alike for a path that does not exist, an empty directory and a glob that
    matches nothing, without the config key."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("not a shard")
    cases = {
        str(tmp_path / "empty"): "(a directory without *.h5/*.hdf5 files)",
        str(tmp_path / "missing"): "(it does not exist)",
        str(tmp_path / "*.hdf5"): "(a pattern that matches no file)",
    }
    for spec, why in cases.items():
        with pytest.raises(DataError) as caught:
            find_shards(spec, "data.train")
        assert str(caught.value).startswith(f"data.train: no shard files found for {spec!r} {why}: "), caught.value


def test_load_samples_concatenates_in_file_order_and_limits(tmp_path):
    first, second = make_samples([10, 11, 12], seq_len=32, seed=1), make_samples([20, 21], seq_len=32, seed=2)
    write_shard(tmp_path / "part-00000.h5", first)
    write_shard(tmp_path / "part-00001.h5", second)
    assert load_samples(str(tmp_path)).lengths.tolist() == [10, 11, 12, 20, 21]
    limited = load_samples(str(tmp_path), limit=4)
    assert limited.lengths.tolist() == [10, 11, 12, 20]
    np.testing.assert_array_equal(limited.input_ids[3], second.input_ids[0])


def test_write_refuses_values_that_do_not_fit_the_mlperf_dtype(tmp_path):
    samples = make_samples([10, 20], seq_len=32, max_pred=4)
    samples.input_ids = samples.input_ids.astype(np.int64)
    samples.input_ids[0, 1] = 2**31
    with pytest.raises(DataError, match=r"too_big\.h5: HDF5 key 'input_ids'.*do not fit int32"):
        write_shard(tmp_path / "too_big.h5", samples)
    samples.input_ids[0, 1] = 7
    write_shard(tmp_path / "fits.h5", samples)
    assert read_shard(tmp_path / "fits.h5").input_ids.dtype == np.int32


def test_truncated_rows_keep_their_first_tokens_and_the_masks_inside_them(tmp_path):
    samples = make_samples([7, 33, 64, 12, 50, 20], seq_len=64, max_pred=8, seed=4)
    write_shard(tmp_path / "part-00000.h5", samples)
    cut = load_samples(str(tmp_path), max_seq_length=16)
    assert cut.max_seq_length == 16 and cut.max_predictions == 8
    for row in range(len(samples)):  # row by row: the first 16 columns, the masked (position, label) pairs below 16
        length = int(samples.input_mask[row].sum())
        assert cut.lengths[row] == min(length, 16)
        for key in ("input_ids", "input_mask", "segment_ids"):
            assert getattr(cut, key)[row].tolist() == getattr(samples, key)[row, :16].tolist()
        pairs = zip(samples.masked_lm_positions[row].tolist(), samples.masked_lm_ids[row].tolist(), strict=True)
        kept = [(p, i) for p, i in pairs if 0 < p < 16]
        got = list(zip(cut.masked_lm_positions[row].tolist(), cut.masked_lm_ids[row].tolist(), strict=True))
        assert [pair for pair in got if pair[0] > 0] == kept
        assert all(pair == (0, 0) for pair in got if pair[0] == 0)
    assert cut.next_sentence_labels.tolist() == samples.next_sentence_labels.tolist()
    same = load_samples(str(tmp_path), max_seq_length=64)  # as wide as the shard, or wider: the rows as they are
    assert_same_samples(same, samples)
    assert_same_samples(load_samples(str(tmp_path), max_seq_length=100), samples)


def test_count_samples_is_what_load_samples_loads_without_reading_rows(tmp_path):
    """Three shards (one empty) count as the rows load_samples returns; a shard that is no HDF5 file is named."""
    write_shard(tmp_path / "a.h5", make_samples([10, 20, 30]))
    write_shard(tmp_path / "b.h5", make_samples([]))
    write_shard(tmp_path / "c.hdf5", make_samples([12, 40]))
    assert count_samples(str(tmp_path)) == len(load_samples(str(tmp_path))) == 5
    (tmp_path / "d.h5").write_bytes(b"not hdf5")
    with pytest.raises(DataError, match="d.h5: not a readable HDF5 file"):
        count_samples(str(tmp_path))
