"""Config loading: defaults, YAML + dotted overrides, and errors that name the dotted key."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from trainer import config as trainer_config
from trainer.__main__ import main
from trainer.balance import assign_bins
from trainer.config import ModelConfig, TrainerConfig, dump_config, load_config
from trainer.distributed import DistEnv, pick_device
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


def test_an_override_given_twice_is_refused_naming_both(tmp_path):
    path = write(tmp_path, "optimizer:\n  name: adamw\n  lr: 0.001\n")
    with pytest.raises(ConfigError, match=r"override 'optimizer.lr=2e-3': optimizer.lr is given twice "
                                          r"\('optimizer.lr=1e-3' before it\); give it once"):  # fmt: skip
        load_config(path, ["optimizer.lr=1e-3", "model.hidden_size=64", "optimizer.lr=2e-3"])


def test_a_mapping_override_sets_the_keys_it_names_and_keeps_the_sections_others(tmp_path):
    """`optimizer={lr: 0.01}` is `optimizer.lr=0.01`: the file's optimizer name stays (the section was replaced
    whole, so every other key went back to its default: LAMB for the file's AdamW, BERT-large's layers)."""
    path = write(tmp_path, "optimizer:\n  name: adamw\n  lr: 0.001\nmodel:\n  hidden_size: 128\n"
                           "  num_hidden_layers: 2\n  num_attention_heads: 4\n  intermediate_size: 512\n")  # fmt: skip
    cfg = load_config(path, ["optimizer={lr: 0.01, weight_decay: 0.1}", "model={hidden_size: 64}", "model={}"])
    assert (cfg.optimizer.name, cfg.optimizer.lr, cfg.optimizer.weight_decay) == ("adamw", 0.01, 0.1)
    assert (cfg.model.hidden_size, cfg.model.num_hidden_layers, cfg.model.num_attention_heads) == (64, 2, 4)
    with pytest.raises(ConfigError, match=r"override 'optimizer=\{lr: 0.02\}': optimizer.lr is given twice "
                                          r"\('optimizer.lr=0.01' before it\); give it once"):  # fmt: skip
        load_config(path, ["optimizer.lr=0.01", "optimizer={lr: 0.02}"])


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


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("seed=true", "seed: takes a number, not true or false"),  # pydantic would read 1
        ("eval.every_samples=false", "eval.every_samples: takes a number, not true or false"),
        ("balance.bins=[true,128]", "balance.bins: takes a number, not true or false"),  # a list's items too
        ("optimizer.lr=.inf", "optimizer.lr: Input should be a finite number"),  # trained, then diverged
        ("budget.max_time_s=.inf", "budget.max_time_s: Input should be a finite number"),
        ("optimizer.beta1=.nan", "optimizer.beta1: Input should be a finite number"),
        ("data.shuffle=0", "data.shuffle: takes true or false (got 0)"),  # pydantic would read false
        ("data.shuffle=1.0", "data.shuffle: takes true or false (got 1.0)"),
        ('data.shuffle="true"', "data.shuffle: takes true or false (got 'true')"),  # a string, quoted
    ],
)
def test_a_bool_or_infinity_for_a_number_or_a_number_for_a_switch_is_refused_naming_the_key(override, says):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert says in str(err.value)
    assert load_config(None, ["model.compile=true"]).model.compile is True  # a boolean field takes them


def test_a_key_given_twice_in_a_config_file_is_refused_naming_its_lines(tmp_path):
    path = write(tmp_path, "model:\n  hidden_size: 128\n  hidden_size: 256\n")  # the last one would win
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == (f"config file {path}: line 3: model.hidden_size: given twice (first on line 2), and "
                              "only the last would count; keep one")  # fmt: skip


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


def cli(*args: str) -> subprocess.CompletedProcess:
    """`python -m trainer ARGS`; a config it refuses is refused before torch is imported (a fraction of a second)."""
    return subprocess.run([sys.executable, "-m", "trainer", *args], capture_output=True, text=True, timeout=60)


def assert_refused(proc: subprocess.CompletedProcess, *named: str) -> None:
    """Exit 2 (bad config), one `error:` message that names each of `named`, and no traceback."""
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr
    for text in named:
        assert text in proc.stderr, proc.stderr


def test_a_directory_as_the_config_file_is_refused_naming_it(tmp_path):
    directory = tmp_path / "configs"
    directory.mkdir()
    (directory / "demo.yaml").write_text("seed: 1\n")
    assert_refused(cli("--config", str(directory)), str(directory), "is a directory", "demo.yaml")
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(directory)


def test_a_config_file_that_is_not_utf8_is_refused_naming_the_file_and_the_byte(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"device: cpu\nseed: \x96\xff\n")
    proc = cli("--config", str(path))
    assert_refused(proc, str(path), "not UTF-8", "0x96", "offset 18", "line 2")
    with pytest.raises(ConfigError, match="latin1.yaml"):
        load_config(path)


def test_a_config_file_whose_top_level_is_not_a_mapping_is_refused_also_with_overrides(tmp_path):
    path = write(tmp_path, "- seed\n- device\n")
    assert_refused(cli("--config", str(path), "seed=1"), str(path), "top level must be a mapping")


@pytest.mark.parametrize("seed", [-1, 2**64])
def test_a_seed_that_numpy_or_torch_refuses_is_a_bad_config(seed):
    assert_refused(cli("--print-config", f"seed={seed}"), "seed", f"(got {seed})")


def test_every_seed_the_field_takes_seeds_numpy_and_torch():
    for seed in (0, 2**64 - 1):
        assert load_config(None, [f"seed={seed}"]).seed == seed
        np.random.default_rng([seed, 7])  # as trainer/balance.py seeds an epoch
        torch.Generator().manual_seed(seed)  # as torch.manual_seed in trainer/run.py


@pytest.mark.parametrize(
    "bins",
    ["[200,100]", "[64,64,128]", "[]", "[0,64]", "[-8,64]", "[64,1.5]", "7", "[64,null]"],
)
def test_balance_bins_the_balance_code_cannot_take_are_refused_naming_the_key(bins):
    with pytest.raises(ConfigError) as err:
        load_config(None, ["balance.method=stratified", f"balance.bins={bins}"])
    assert "balance.bins" in str(err.value)


def test_balance_bins_that_are_not_increasing_exit_2_before_any_trial():
    proc = cli("--print-config", "balance.method=stratified", "balance.bins=[200, 100]")
    assert_refused(proc, "balance.bins", "strictly increasing", "(got [200, 100])")


def test_every_balance_bins_the_config_takes_the_balance_code_takes():
    for bins in ([1], [64, 128], [32, 64, 96, 127, 128]):
        cfg = load_config(None, ["balance.method=stratified", f"balance.bins={bins}"])
        assert (
            assign_bins(np.array([1, 64, 500]), cfg.balance.bins).tolist()
            == np.minimum(np.searchsorted(bins, [1, 64, 500]), len(bins) - 1).tolist()
        )


def test_device_cuda_without_cuda_exits_2_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    jsonl = tmp_path / "out" / "run.jsonl"
    code = main(["--config", "trainer/configs/demo_cpu.yaml", "device=cuda", f"log.jsonl={jsonl}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: device: cuda, but this machine has no CUDA device"), err
    assert "torch.cuda.is_available() is False" in err and "use device: cpu or auto" in err
    assert not jsonl.parent.exists()  # refused before the reporter made its file


def test_pick_device_refuses_cuda_without_cuda_and_a_local_rank_without_its_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="device: cuda, but this machine has no CUDA device"):
        pick_device("cuda", DistEnv())
    assert pick_device("auto", DistEnv()) == pick_device("cpu", DistEnv()) == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for requested in ("cuda", "auto"):
        with pytest.raises(ConfigError, match="LOCAL_RANK 2, but this machine has 2 CUDA devices"):
            pick_device(requested, DistEnv(rank=2, world_size=4, local_rank=2, local_world_size=4))


def test_a_shipped_config_is_named_by_its_name_and_an_unknown_name_lists_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shipped = Path(trainer_config.__file__).parent / "configs" / "demo_cpu.yaml"
    assert load_config("demo_cpu") == load_config("demo_cpu.yaml") == load_config(shipped)
    with pytest.raises(ConfigError, match=r"config file nope does not exist \(a shipped config may be named instead: "
                                          r"bert_large, demo_cpu, gpu_check\)"):  # fmt: skip
        load_config("nope")
    (tmp_path / "demo_cpu.yaml").write_text("seed: 7\n")  # the user's own file wins
    assert load_config("demo_cpu.yaml").seed == 7


def test_a_config_file_that_is_not_yaml_is_named_with_its_line_in_one_line(tmp_path):
    path = write(tmp_path, "model:\n  hidden_size: [1, 2\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(f"config file {path}: line 3, column 1: not valid YAML (expected ',' or ']'")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("text", ["", "  \n\n", "# my settings, to come\n", "---\n", "null\n"],
                         ids=["empty", "blank", "comments", "bare-document", "null"])  # fmt: skip
def test_a_config_file_that_sets_nothing_is_refused_and_braces_are_every_default(tmp_path, text):
    """An empty file trained BERT-large with every default, without a word; `{}` says so on purpose."""
    path = write(tmp_path, text)
    assert_refused(cli("--config", str(path), "--print-config"), f"config file {path} sets nothing",
                   "write {} in it to train with every default")  # fmt: skip
    path.write_text("{}\n")
    assert load_config(path) == load_config(None) == TrainerConfig()


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["model.compile=true", "model.compile_model=true"], "model.compile_model compiles the whole forward pass"),
        (["model.compile_model=true", "model.attention=jagged"], "attention varlen, packed or padded (or auto), not"),
    ],
)
def test_a_compiled_model_with_compiled_layers_or_jagged_attention_is_refused_before_any_work(overrides, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        load_config(None, overrides)
    assert load_config(None, overrides[:1]).model.compile_model is (overrides[0] == "model.compile_model=true")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [({"attention": "packed"}, "model.varlen_kernel: cudnn is a kernel of the varlen attention, not of "
                               "model.attention: packed: set model.attention to varlen or auto"),
     ({"attention": "jagged"}, "not of model.attention: jagged"),
     ({"static_shapes": True}, "model.varlen_kernel: cudnn takes batches of their sequences' tokens alone, eager: not "
                               "with model.static_shapes"),
     ({"compile_model": True}, "eager: not with model.compile_model")],
)  # fmt: skip
def test_cudnn_varlen_attention_goes_with_the_varlen_attention_on_unpadded_eager_batches(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ModelConfig(varlen_kernel="cudnn", **overrides)
    assert ModelConfig(varlen_kernel="cudnn").attention == "auto"
    assert ModelConfig(varlen_kernel="cudnn", attention="varlen", half_residual=True, fused_norm=True)
    assert ModelConfig().varlen_kernel == "flash"


def test_a_sections_own_check_names_its_keys_without_the_whole_section():
    """A check across a section's keys said them, then `(got {...every key of the section...})`."""
    with pytest.raises(ConfigError) as refused:
        load_config(None, ["model.varlen_kernel=cudnn", "model.attention=packed"])
    assert str(refused.value).splitlines()[1] == ("  model: model.varlen_kernel: cudnn is a kernel of the varlen "
                                                  "attention, not of model.attention: packed: set model.attention to "
                                                  "varlen or auto")  # fmt: skip


@pytest.mark.parametrize(("override", "suggested"), [
    ("optimizer.lrr=0.1", "optimizer.lr"), ("budget.max_sample=5", "budget.max_samples"),
    ("optimizer.learning_rate=0.1", "optimizer.lr"), ("batch.batch_size=64", "batch.global_batch_size"),
    ("clipping.max_grad_norm=1", "clipping.max_norm"), ("nonsense.x=1", None), ("eval.colour=1", None),
])  # fmt: skip
def test_an_unknown_key_names_the_key_it_is_close_to(override, suggested):
    """A typo named the source file to check the spelling against (not there for an installed trainer); the key's
    section names its closest key, as an experiment file's typo does, and --print-config shows them all."""
    with pytest.raises(ConfigError) as raised:
        load_config(None, [override])
    message = str(raised.value)
    assert "trainer/config.py" not in message and "`python -m trainer --print-config` shows every key" in message
    if suggested is None:
        assert "did you mean" not in message
    else:
        assert f"unknown key; did you mean {suggested}?" in message


def test_a_key_set_to_null_that_needs_a_value_says_what_the_value_is():
    """`data.eval=null` (or `data.train=`, read as null) said only "Input should be a valid string"."""
    with pytest.raises(ConfigError) as refused:
        load_config("demo_cpu", ["data.eval=null", "data.train=", "optimizer.lr=null"])
    lines = str(refused.value).splitlines()[1:]
    assert lines == [
        "  data.train: needs a value, not null: directory or glob of training HDF5 shards (got None)",
        "  data.eval: needs a value, not null: directory or glob of evaluation HDF5 shards (got None)",
        "  optimizer.lr: needs a value, not null: peak learning rate (got None)",
    ]
    with pytest.raises(ConfigError, match=r"optimizer.lr: Input should be a valid number, unable to parse string"):
        load_config("demo_cpu", ["optimizer.lr=fast"])  # a value of another type: pydantic's own words
