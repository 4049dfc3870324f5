"""trainer.run: the components a run builds once."""

from __future__ import annotations

import pytest
import torch

from trainer.config import load_config
from trainer.distributed import DistEnv
from trainer.run import build_probe

APPROXIMATE = "noise scale: approximate while"


def probe_of(capsys, ranks: int, accumulation: int, *overrides: str):
    cfg = load_config(None, ["log.noise_scale=true", *overrides])
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    model[1].bias.requires_grad_(False)
    probe = build_probe(cfg, DistEnv(rank=0, world_size=ranks), torch.device("cpu"), model, accumulation)
    return probe, model, capsys.readouterr().err


def test_no_probe_without_the_noise_scale_or_without_small_batches(capsys):
    cfg = load_config(None, ["log.noise_scale=false"])
    model = torch.nn.Linear(3, 2)
    assert build_probe(cfg, DistEnv(world_size=4), torch.device("cpu"), model, 2) is None
    assert probe_of(capsys, 1, 1)[0] is None  # one rank, one micro-batch: the step has no smaller batch


def test_accumulated_micro_batches_are_the_small_batches_on_any_number_of_ranks(capsys):
    for ranks in (1, 4):
        probe, model, said = probe_of(capsys, ranks, 2, "clipping.strategy=bucketwise")
        trained = [p for p in model.parameters() if p.requires_grad]
        assert probe.world_size == ranks and probe.watching
        assert [id(p) for p in probe._watched] == [id(p) for p in trained] and len(trained) == 3
        assert APPROXIMATE not in said  # exact under any clip


@pytest.mark.parametrize(
    ("ranks", "strategy", "approximate"),
    [(2, "bucketwise", False), (3, "bucketwise", True), (3, "before_allreduce", True), (3, "after_allreduce", False)],
)
def test_ranks_are_the_small_batches_and_a_clip_before_the_allreduce_on_3_or_more_makes_it_approximate(
    capsys, ranks, strategy, approximate
):
    probe, _, said = probe_of(capsys, ranks, 1, f"clipping.strategy={strategy}")
    assert probe.world_size == ranks and not probe.watching
    assert (APPROXIMATE in said) is approximate
    if approximate:
        assert f"{strategy} clipping bites on {ranks} ranks" in said
