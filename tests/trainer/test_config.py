"""Config loading: defaults, YAML + dotted overrides, and errors that name the dotted key."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trainer.config import dump_config, load_config
from trainer.errors import ConfigError


def write(tmp_path, text: str):
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


def test_overrides_apply_to_nested_keys_with_yaml_types(tmp_path):
    path = write(tmp_path, "optimizer:\n  name: adamw\n  lr: 0.001\n")
    cfg = load_config(path, ["optimizer.lr=2e-3", "schedule.start_warmup_step=-5", "balance.bins=[64,128]"])
    assert cfg.optimizer.name == "adamw"
    assert cfg.optimizer.lr == pytest.approx(2e-3)
    assert cfg.schedule.start_warmup_step == -5
    assert cfg.balance.bins == [64, 128]


def test_dump_round_trips(tmp_path):
    cfg = load_config(None, ["model.hidden_size=128", "model.num_attention_heads=4", "clipping.strategy=bucketwise"])
    again = load_config(write(tmp_path, dump_config(cfg)))
    assert again == cfg


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("optimizer.lrr=1e-3", "optimizer.lrr"),
        ("optimiser.lr=1e-3", "optimiser"),
        ("optimizer.lr=-1", "optimizer.lr"),
        ("optimizer.lr=fast", "optimizer.lr"),
        ("optimizer.name=sgd", "optimizer.name"),
        ("optimizer.beta2=1.0", "optimizer.beta2"),
        ("clipping.strategy=sometimes", "clipping.strategy"),
        ("eval.target_mlm_accuracy=1.5", "eval.target_mlm_accuracy"),
        ("batch.micro_batch_size=0", "batch.micro_batch_size"),
        ("batch.micro_batch_size=automatic", "batch.micro_batch_size"),
        ("batch.micro_batch_size=1.5", "batch.micro_batch_size"),
        ("model.num_attention_heads=5", "model.num_attention_heads"),
    ],
)
def test_bad_values_name_the_dotted_key(override, key):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert key in str(err.value)


def test_bad_files_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="cfg.yaml"):
        load_config(write(tmp_path, "optimizer: [unclosed\n"))
    with pytest.raises(ConfigError, match="optimizer.lr"):
        load_config(write(tmp_path, "optimizer:\n  lr: [1, 2]\n"))
    with pytest.raises(ConfigError, match="not of the form"):
        load_config(None, ["optimizer.lr"])


def test_cli_exits_2_and_trains_nothing_on_a_bad_key(tmp_path):
    ckpt = tmp_path / "ckpt"
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", f"checkpoint.dir={ckpt}", "optimizer.wd=0.1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "optimizer.wd" in proc.stderr and "unknown key" in proc.stderr
    assert not ckpt.exists()


def test_the_micro_batch_is_a_whole_number_or_auto_in_one_message():
    import numpy as np

    assert load_config(None, ["batch.micro_batch_size=auto"]).batch.micro_batch_size == "auto"
    from trainer.config import BatchConfig

    assert BatchConfig(micro_batch_size=np.int64(8)).micro_batch_size == 8  # a tuner's sampled integer
    for written in (8.0, "8"):  # as the other integer fields take them (global_batch_size: 8.0 and "8" are 8)
        assert BatchConfig(micro_batch_size=written).micro_batch_size == 8
        assert BatchConfig(global_batch_size=written).global_batch_size == 8
    for wrong in (8.5, "8.5", 0, "0", "x"):
        with pytest.raises(ValueError, match="must be a whole number >= 1, or auto"):
            BatchConfig(micro_batch_size=wrong)
    with pytest.raises(ConfigError) as err:
        load_config(None, ["batch.micro_batch_size=true"])
    assert str(err.value).splitlines()[1:] == [
        "  batch.micro_batch_size: must be a whole number >= 1, or auto (the largest that fits the device's memory) "
        "(got True)"
    ]
