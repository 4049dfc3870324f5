"""Fixtures of the NNI engine tests: tiny experiments (the tiny BERT on random shards, a few steps) under NNI."""

from __future__ import annotations

from pathlib import Path

from hpo.experiment import experiment_from_dict
from tests.trainer.conftest import make_shards

# clipping.max_norm exists only when clipping is on: a conditional space.
CONDITIONAL_SPACE = {
    "optimizer.lr": {"float": [1e-4, 1e-2], "log": True},
    "clipping.strategy": {"choice": ["none", "after_allreduce"]},
    "clipping.max_norm": {"float": [0.5, 5.0], "when": {"clipping.strategy": {"not": "none"}}},
}


def nni_experiment_data(tmp_path: Path, tuner: str, trials: int, parallel: int, space=None, compare=(),
                        options=None, name="nniexp") -> dict:  # fmt: skip
    """An experiment file's contents (engine: nni) over the tiny BERT on random shards in tmp_path/data."""
    train_dir, eval_dir = make_shards(tmp_path / "data")
    overrides = {
        "device": "cpu", "model.vocab_size": 99, "model.hidden_size": 32, "model.num_hidden_layers": 1,
        "model.num_attention_heads": 2, "model.intermediate_size": 64, "model.max_position_embeddings": 64,
        "data.train": str(train_dir), "data.eval": str(eval_dir), "batch.global_batch_size": 8,
        "batch.micro_batch_size": 8, "eval.every_samples": 16, "eval.target_mlm_accuracy": 0.02,
        "eval.batch_size": 32, "budget.max_samples": 48, "log.every_steps": 2,
    }  # fmt: skip
    return {
        "name": name,
        "base_config": {},
        "overrides": overrides,
        "space": space or CONDITIONAL_SPACE,
        "compare": list(compare),
        "tuner": {"name": tuner, "seed": 0, "options": {"assessor": "none"} if options is None else options},
        "budget": {"trials": trials, "max_parallel": parallel, "trial_timeout_s": 120},
        "resources": {"gpus": "none", "cpu_slots": parallel},
        "engine": "nni",
    }


def make_nni_spec(tmp_path: Path, tuner: str, trials: int, parallel: int, **kwargs):
    """A validated engine: nni experiment (see `nni_experiment_data`)."""
    data = nni_experiment_data(tmp_path, tuner, trials, parallel, **kwargs)
    return experiment_from_dict(data, f"{data['name']}.yaml", base_dir=tmp_path)
