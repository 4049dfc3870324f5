"""`batch.micro_batch_size: auto`: what the memory probes count, the line they fit, the choice, and that a run with
`auto` trains as one configured with the number it chose, also when it resumes. On a GPU the CUDA allocator's peaks
are checked by the gpu-marked test at the end and by `bench/micro_batch_fit.py` in scripts/gpu_checks.sh."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.trainer.conftest import make_model_config, make_samples, start_ranks
from tests.trainer.test_train import losses, run
from trainer.memory import OPTIMIZER_COPIES, SavedBytes, choose_micro_batch, largest_fitting_divisor, measure
from trainer.model import BertForPreTraining

CPU = torch.device("cpu")


def test_the_saved_bytes_are_the_tensors_backward_keeps_parameters_excepted():
    """A linear layer keeps its input (its weight is a parameter: not counted) and GELU keeps its input: 10 x 16
    and 10 x 32 float32 numbers, counted by hand."""
    layer = torch.nn.Linear(16, 32)
    x = torch.randn(10, 16)
    with SavedBytes(layer) as saved:
        F.gelu(layer(x)).sum().backward()
    assert saved.bytes == (10 * 16 + 10 * 32) * 4


def tiny_model() -> BertForPreTraining:
    torch.manual_seed(0)
    return BertForPreTraining(make_model_config(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1))


def test_the_measured_bytes_grow_along_the_line_the_two_probes_fit():
    """Fitted at 2 and 4 sequences of 64 tokens, the line predicts what 12 such sequences measure (dropout on: its
    masks are kept too), to 1 %. (Not fitted at 1: a single sequence's CPU attention keeps a view of the whole
    query-key-value grid where larger batches keep copies of its parts, 4.5 % above the line.)"""
    model, samples = tiny_model(), make_samples([64] * 16)
    fit = choose_micro_batch(model, samples, 16, CPU, None, budget_bytes=1e12)
    optimizer = OPTIMIZER_COPIES * sum(p.numel() * 4 for p in model.parameters())
    measured = measure(model, samples, np.arange(12), CPU, None)
    predicted = fit.bytes_for(12) - optimizer
    assert measured == pytest.approx(predicted, rel=0.01)
    assert fit.bytes_per_token > 0 and [p.sequences for p in fit.probes] == [2, 4]
    # Several ranks: DDP's buckets hold a float32 copy of the gradient (before_allreduce's flat copy another)
    parallel = choose_micro_batch(model, samples, 16, CPU, None, budget_bytes=1e12, gradient_copies=2)
    assert parallel.fixed_bytes - fit.fixed_bytes == 2 * sum(p.numel() * 4 for p in model.parameters())


@pytest.mark.parametrize(("budget_for", "delta", "chosen"), [(6, 0, 6), (6, -1, 4), (24, 0, 24), (1, -1, 1)])
def test_the_choice_is_the_largest_divisor_of_a_ranks_batch_whose_worst_case_fits(budget_for, delta, chosen):
    """Divisors of 24: ..., 4, 6, 8, ...; every sequence counted at the longest length (64, though most are
    shorter); with no divisor fitting, 1 (the step then fails as out of memory, recorded as such)."""
    model, samples = tiny_model(), make_samples([20, 64, 33, 12, 64, 40] * 4)
    line = choose_micro_batch(model, samples, 24, CPU, None, budget_bytes=1e12)
    assert line.longest == 64 and line.micro_batch_size == 24
    fit = choose_micro_batch(model, samples, 24, CPU, None, budget_bytes=line.bytes_for(budget_for) + delta)
    assert fit.micro_batch_size == chosen


def test_ranks_that_plan_on_one_hosts_memory_share_it_but_each_has_its_own_address_space(monkeypatch):
    """On the CPU the ranks of a host plan on the same memory: each gets its share of half of it (16 GB available:
    8 GB, 2 GB for each of 4 ranks). An address-space limit is each process's own: it is not divided."""
    import trainer.memory

    monkeypatch.setattr(trainer.memory, "available_host_memory", lambda: 16e9)
    monkeypatch.setattr(trainer.memory, "address_space_left", lambda: float("inf"))
    model, samples = tiny_model(), make_samples([64] * 8)
    assert choose_micro_batch(model, samples, 8, CPU, None).budget_bytes == 8e9
    assert choose_micro_batch(model, samples, 8, CPU, None, sharing=4).budget_bytes == 2e9
    monkeypatch.setattr(trainer.memory, "address_space_left", lambda: 3e9)  # less than the host's share: it binds
    assert choose_micro_batch(model, samples, 8, CPU, None, sharing=4).budget_bytes == 1.5e9
    assert choose_micro_batch(model, samples, 8, CPU, None, sharing=8).budget_bytes == 1e9  # the host's share binds


def test_largest_fitting_divisor():
    assert largest_fitting_divisor(48, lambda d: d <= 20) == 16
    assert largest_fitting_divisor(7, lambda d: d <= 6) == 1
    assert largest_fitting_divisor(1, lambda d: False) == 1


def test_the_probes_leave_no_gradients_the_weights_and_the_random_numbers_as_they_were():
    model, samples = tiny_model(), make_samples([64, 30, 50, 64])
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    choose_micro_batch(model, samples, 4, CPU, None)
    assert torch.equal(torch.rand(3), expected)
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())


def test_a_run_with_auto_trains_as_one_configured_with_the_micro_batch_it_chose(tmp_path):
    """On this machine a rank's batch of 8 tiny sequences fits: auto chooses 8 and trains step for step as
    micro_batch_size 8 does (BERT's dropout on: the probes restore the random numbers it draws)."""
    auto, auto_records = run(tmp_path / "auto", **{"batch.micro_batch_size": "auto"})
    fixed, fixed_records = run(tmp_path / "fixed", **{"batch.micro_batch_size": 8})
    assert auto.micro_batch_size == 8 and fixed.micro_batch_size == 8
    assert losses(auto_records) == losses(fixed_records) and len(losses(auto_records)) == 12


def test_a_run_that_resumes_with_auto_keeps_its_checkpoints_micro_batch_and_continues_the_same_losses(tmp_path):
    """Trained 40 samples with micro-batch 4 (accumulation 2), resumed with auto: auto would take 8 here, but the
    loop's position counts micro-batches, so the resumed run keeps 4 and continues the uninterrupted losses."""
    common = {"batch.micro_batch_size": 4, "checkpoint.every_samples": 40, "schedule.total_steps": 12}
    _, uninterrupted = run(tmp_path / "full", **common, **{"checkpoint.dir": str(tmp_path / "full" / "ck")})
    ck = str(tmp_path / "part" / "ck")
    _, part1 = run(tmp_path / "part", **common, **{"budget.max_samples": 40, "checkpoint.dir": ck})
    second, records = run(tmp_path / "part", **{**common, "batch.micro_batch_size": "auto", "checkpoint.dir": ck})
    assert second.micro_batch_size == 4 and second.samples == 96
    assert losses(part1) + losses(records)[len(losses(part1)) :] == pytest.approx(losses(uninterrupted), abs=1e-6)


def test_resuming_with_another_micro_batch_is_refused_naming_both(tmp_path):
    from trainer.errors import ConfigError

    ck = str(tmp_path / "ck")
    run(tmp_path, **{"batch.micro_batch_size": 4, "budget.max_samples": 40, "checkpoint.dir": ck})
    with pytest.raises(ConfigError, match=r"batch.micro_batch_size: .* trained with 4, this run has 8: .* set 4"):
        run(tmp_path, **{"batch.micro_batch_size": 8, "checkpoint.dir": ck})


def test_resuming_with_auto_on_ranks_the_checkpoints_micro_batch_does_not_divide_the_batch_over_says_so(
    tmp_path, capsys, monkeypatch
):
    """A global batch of 12 trained in micro-batches of 4 on one process, resumed with auto on 2 ranks (rank 0's view:
    refused before any work, so before the process group): 4 x 2 does not divide 12."""
    from tests.trainer.conftest import make_train_overrides
    from trainer.__main__ import main

    ck = str(tmp_path / "ck")
    settings = {"batch.global_batch_size": 12, "checkpoint.dir": ck}
    run(tmp_path, **{"batch.micro_batch_size": 4, "budget.max_samples": 48, **settings})
    capsys.readouterr()
    for key, value in {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(key, value)
    assert main(make_train_overrides(tmp_path, **{"batch.micro_batch_size": "auto", **settings})) == 2
    err = capsys.readouterr().err
    assert "auto resumes with checkpoint" in err and "'s micro-batch, 4, which does not divide this run's batch " in err
    assert "(batch.global_batch_size 12 over 2 rank(s)): resume on a number of ranks" in err, err


def test_an_auto_micro_batch_with_a_batch_that_does_not_split_over_the_ranks_is_refused_before_any_work():
    from trainer.config import load_config
    from trainer.distributed import DistEnv
    from trainer.errors import ConfigError
    from trainer.preflight import accumulation_steps

    cfg = load_config(None, ["batch.global_batch_size=10", "batch.micro_batch_size=auto"])
    with pytest.raises(ConfigError, match=r"global_batch_size \(10\) must be a multiple of the world size \(4\)"):
        accumulation_steps(cfg, DistEnv(world_size=4, local_world_size=4))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_the_gpu_the_line_through_the_allocators_peaks_predicts_a_larger_micro_batch():
    """bf16, BERT's dropout: fitted at 2 and 4 sequences of 64 tokens, the line predicts the allocator's peak at
    32 such sequences within 10 % (the allocator rounds blocks up; bench/micro_batch_fit.py checks BERT-large)."""
    cuda = torch.device("cuda")
    model, samples = tiny_model().to(cuda), make_samples([64] * 32)
    fit = choose_micro_batch(model, samples, 32, cuda, torch.bfloat16, budget_bytes=1e12)
    optimizer = OPTIMIZER_COPIES * sum(p.numel() * 4 for p in model.parameters())
    measured = measure(model, samples, np.arange(32), cuda, torch.bfloat16)
    assert measured == pytest.approx(fit.bytes_for(32) - optimizer, rel=0.1)


def budgets_under_a_limit(rank: int, out_file: str) -> None:
    """In a process of its own: the CPU budget without a limit, then under an address-space limit 1 GiB above the
    process's size (the limit stays with the process: never set in the test's own)."""
    import resource

    from trainer.memory import device_budget

    size = next(int(line.split()[1]) * 1024 for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith("VmSize:"))  # fmt: skip
    free = device_budget(CPU)
    resource.setrlimit(resource.RLIMIT_AS, (size + 2**30, resource.RLIM_INFINITY))
    Path(out_file).write_text(f"{free} {device_budget(CPU)}")


def test_on_the_cpu_auto_plans_within_the_address_space_limit_of_the_process(tmp_path):
    """An HPO trial with `resources.memory_limit_mb` runs under an address-space limit: auto plans for half of what
    that limit leaves above the process's size (here 1 GiB left: 0.5 GiB), not for half of the host's memory. The
    process is forked from the gloo tests' fork server (torch already imported there: no second import of seconds)."""
    start_ranks(budgets_under_a_limit, (str(tmp_path / "budgets"),), 1)
    unlimited, limited = map(float, (tmp_path / "budgets").read_text().split())
    assert unlimited > 2**30  # the host's half is more than the limit leaves: the limit is what binds
    assert 0.45 * 2**30 < limited <= 0.5 * 2**30


class RunsOutAtFourSequences(BertForPreTraining):
    """The tiny model on a device that holds fewer than 4 of the longest sequences: its forward raises PyTorch's
    own out-of-memory error there, as CUDA's allocator does."""

    def forward(self, batch):
        if batch.num_sequences >= 4:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return super().forward(batch)


def test_a_probe_that_runs_out_of_memory_leaves_auto_at_one_sequence_and_the_run_goes_on(capfd):
    """The rank still joins the ranks' choice (none waits for a rank that left), at 1; a step there trains or fails
    as out of memory like any other. Another error of the probe is not taken for one."""
    from trainer.config import load_config
    from trainer.distributed import DistEnv
    from trainer.run import resolve_micro_batch

    cfg = load_config(None, ["batch.global_batch_size=8", "batch.micro_batch_size=auto"])
    samples = make_samples([7, 33, 64, 12, 50, 5, 64, 21])
    torch.manual_seed(0)
    model = RunsOutAtFourSequences(make_model_config())
    resolved = resolve_micro_batch(cfg, DistEnv(), torch.device("cpu"), None, model, samples)
    assert resolved.batch.micro_batch_size == 1
    assert "auto: 1 (measuring the longest sequences ran out of memory: CUDA out of memory" in capfd.readouterr().err
    assert all(p.grad is None for p in model.parameters())

    class Broken(BertForPreTraining):
        def forward(self, batch):
            raise RuntimeError("a bug, not the memory")

    with pytest.raises(RuntimeError, match="a bug"):
        resolve_micro_batch(cfg, DistEnv(), torch.device("cpu"), None, Broken(make_model_config()), samples)
