"""`INERT_UNDER` says what the trainer does: under each value it names, two settings of the key train alike, to the
bit; under a value that reads the key, they do not (so the check can fail). Every entry has its case here."""

from __future__ import annotations

import typing

import pytest
import torch

from tests.trainer.test_train import losses, run
from trainer.config import INERT_UNDER, TrainerConfig, inert_under

# key -> (two values of it, a value of each governing key that reads it); runs of 4 steps on the tiny model
CASES = {
    "clipping.max_norm": ((1e-3, 10.0), {"clipping.strategy": "after_allreduce"}),
    "optimizer.max_grad_norm": ((1e-3, 10.0), {"optimizer.name": "lamb", "clipping.strategy": "none"}),
    "optimizer.use_nvlamb": ((True, False), {"optimizer.name": "lamb"}),
    "precision.initial_loss_scale": ((1.0, 2.0**40), {"precision.dtype": "fp16", "device": "cuda"}),  # 2**40 overflows
    "model.half_residual": ((True, False), {"precision.dtype": "bf16"}),
}
SETTINGS = {"budget.max_samples": 32, "optimizer.eps": 1e-3}  # an eps that makes the gradient's scale count


def inert_cases() -> list[tuple[str, str, str]]:
    return [(key, governing, value) for key, conditions in INERT_UNDER.items() for governing, values in conditions
            for value in values]  # fmt: skip


def trained(tmp_path, key: str, value, setting: dict[str, str]) -> list[float]:
    _, records = run(tmp_path / f"{key}-{value}-{'-'.join(setting.values())}", **SETTINGS, **setting, **{key: value})
    return losses(records)


def test_every_key_and_value_is_the_trainers_and_has_its_case():
    fields = TrainerConfig.model_fields
    for key, governing, value in inert_cases():
        section, leaf = governing.split(".")
        assert value in typing.get_args(fields[section].annotation.model_fields[leaf].annotation)
        assert key.split(".")[1] in fields[key.split(".")[0]].annotation.model_fields
    assert set(CASES) == set(INERT_UNDER)
    assert inert_under("clipping.max_norm", {"clipping.strategy": "none"}.__getitem__) == ("clipping.strategy", "none")
    assert inert_under("clipping.max_norm", {"clipping.strategy": "bucketwise"}.__getitem__) is None
    assert inert_under("optimizer.lr", {}.__getitem__) is None


@pytest.mark.parametrize(
    ("key", "governing", "value"), [pytest.param(*c, id=f"{c[0]}-{c[1]}={c[2]}") for c in inert_cases()]
)
def test_the_key_trains_alike_under_a_value_that_makes_it_inert(tmp_path, key, governing, value):
    values, reading = CASES[key]
    inert = {**{k: v for k, v in reading.items() if k != "device"}, governing: value}  # on the CPU
    assert trained(tmp_path, key, values[0], inert) == trained(tmp_path, key, values[1], inert)


@pytest.mark.parametrize("key", CASES)
def test_the_key_changes_the_training_under_a_value_that_reads_it(tmp_path, key):
    values, reading = CASES[key]
    if reading.get("device") == "cuda" and not torch.cuda.is_available():
        pytest.skip(f"{key} is read under {reading}, which needs a CUDA device")
    assert trained(tmp_path, key, values[0], reading) != trained(tmp_path, key, values[1], reading)
