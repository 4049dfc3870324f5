"""hpo.engine.local.check_trial_data: inputs every trial would fail on are refused before anything is written,
naming the experiment file, the key and the value: a starting checkpoint that is not there, an optimizer backend
that cannot be imported where the trials run."""

from __future__ import annotations

import glob
import importlib.util

import pytest

from hpo.engine.local import check_trial_data
from hpo.errors import HpoError
from tests.hpo.engine.test_study import make_spec


def test_a_missing_starting_checkpoint_is_refused_naming_it(tmp_path):
    missing = tmp_path / "bert_large.pt"
    spec = make_spec(tmp_path, **{"model.init_checkpoint": str(missing)})
    with pytest.raises(HpoError) as err:
        check_trial_data(spec)
    assert str(err.value).startswith(f"exp.yaml: overrides.model.init_checkpoint = {str(missing)!r}")
    assert "no such file; every trial would start from it" in str(err.value)
    missing.write_bytes(b"")  # there: the trials read it (and say so if it is not a checkpoint)
    check_trial_data(spec)


def test_apex_is_refused_where_it_cannot_be_imported(tmp_path):
    spec = make_spec(tmp_path, **{"optimizer.impl": "apex"})
    if importlib.util.find_spec("apex") is not None:  # an optional backend: where it is installed, it is taken
        check_trial_data(spec)
        return
    with pytest.raises(HpoError, match="overrides.optimizer.impl = apex, but NVIDIA apex cannot be imported here"):
        check_trial_data(spec)
    check_trial_data(make_spec(tmp_path, **{"optimizer.impl": "torch"}))


def test_the_data_is_checked_as_the_trials_read_it_cut_to_data_max_seq_length(tmp_path):
    """A position table shorter than the shards' rows fits once `data.max_seq_length` cuts them, as in the trainer."""
    spec = make_spec(tmp_path, **{"model.max_position_embeddings": 16})
    with pytest.raises(HpoError, match="model.max_position_embeddings = 16"):
        check_trial_data(spec)
    check_trial_data(make_spec(tmp_path, **{"model.max_position_embeddings": 16, "data.max_seq_length": 16}))


def test_a_global_batch_larger_than_the_training_set_is_refused_fixed_or_tuned(tmp_path):
    """Every trial at a batch its training set cannot fill would be refused by the trainer: the experiment is
    refused first, at the largest batch it can run (a choice's largest, a range's upper end)."""
    import h5py

    spec = make_spec(tmp_path)
    train = spec.resolved_base()["data"]["train"]
    sequences = sum(h5py.File(path, "r")["input_ids"].shape[0] for path in glob.glob(f"{train}/*.h5"))
    too_large = sequences + 1
    for space, where in (
        (None, "overrides.batch.global_batch_size"),
        ({"batch.global_batch_size": {"choice": [8, too_large]}}, "space.batch.global_batch_size"),
        ({"batch.global_batch_size": {"int": [8, too_large]}}, "space.batch.global_batch_size"),
    ):
        overrides = {"batch.global_batch_size": too_large, "batch.micro_batch_size": 1} if space is None else {
            "batch.micro_batch_size": 1}  # fmt: skip
        with pytest.raises(HpoError) as err:
            check_trial_data(make_spec(tmp_path, space=space, **overrides))
        assert str(err.value) == (f"exp.yaml: {where}: a global batch of {too_large:,}, but overrides.data.train = "
                                  f"{train!r} holds {sequences:,} sequences; every trial at that batch would be "
                                  f"refused: give data.train at least {too_large:,} sequences, or a batch of at most "
                                  f"{sequences:,}")  # fmt: skip
    check_trial_data(make_spec(tmp_path, **{"batch.global_batch_size": sequences, "batch.micro_batch_size": 1}))
