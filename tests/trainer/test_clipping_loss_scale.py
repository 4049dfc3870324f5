"""Clipping and the noise-scale probe under fp16-style loss scaling and gradient accumulation, against float64.

Every micro-batch has a known gradient: the loss Σ_i <p_i, x_i> has gradient exactly x_i, so a rank's accumulated
gradient is g_r = Σ_k x_{r,k} / accumulation. A real `torch.amp.GradScaler` (enabled on the CPU: the scaling
arithmetic is the same as on a GPU) multiplies every gradient by S = 2^10. What the optimizer sees after
`GradientClipper.before_step` and the scaler's unscale must be, whatever S (module docstring of trainer.clipping):
none: mean_r g_r; after_allreduce: clip(mean_r g_r, t); before_allreduce: mean_r clip(g_r, t); bucketwise: per DDP
bucket b, mean_r clip(g_r[b], t / sqrt(#buckets)); with one process the last two clip g by t. The probe's norms
are in unscaled units: (mean_r mean_k |x_{r,k}|², mean_r |g_r|²) when accumulating, else (mean_r |g_r|², |mean_r
g_r|²). An overflow (inf) in one rank's gradient must reach every rank's scaler, and the probe must drop the step.
"""

from __future__ import annotations

import math
import os
from contextlib import nullcontext

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from tests.trainer.conftest import start_ranks
from tests.trainer.test_clipping import GivenGradients
from trainer.clipping import EPS, GradientClipper
from trainer.config import ClippingConfig
from trainer.distributed import DistEnv
from trainer.noise_probe import NormProbe

SIZES = (3000, 2000, 700)  # with BUCKET_CAP_MB DDP rebuilds its buckets as [p2, p1] and [p0]
BUCKET_CAP_MB = 0.01
SCALE = 2.0**10
MAX_NORM = 50.0  # local norms are 44 to 150, their means 49 to 84: the clips bite on most ranks and buckets
ITERATIONS = 4  # 1: DDP's initial buckets, 2: rebuilt (both deferred by bucketwise), 3: overlapped, 4: an overflow
OVERFLOW = ITERATIONS - 1
STRATEGIES = ["none", "after_allreduce", "before_allreduce", "bucketwise"]
ACCUMULATIONS = [1, 2]


def micro_gradient(iteration: int, rank: int, micro: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * iteration + 10 * rank + micro)
    xs = [torch.randn(n, generator=gen) * (1 + rank) for n in SIZES]
    if iteration == OVERFLOW and rank == 1:
        xs[2][7] = float("inf")
    return xs


def data_ranks(world: int) -> list[int]:
    """Whose micro-batch gradients each rank gets: one process gets rank 1's (large enough to be clipped)."""
    return list(range(world)) if world > 1 else [1]


def run_steps(rank: int, world: int, strategy: str, accumulation: int) -> list[dict]:
    """The trainer's step, written out as in trainer.train.train_step: what the optimizer saw, per iteration."""
    model = GivenGradients(SIZES)
    index = {id(p): i for i, p in enumerate(model.parameters())}
    ddp = DistributedDataParallel(model, bucket_cap_mb=BUCKET_CAP_MB) if world > 1 else None
    scaler = torch.amp.GradScaler("cpu", init_scale=SCALE, growth_interval=10**6)
    probe = NormProbe(world)
    if accumulation > 1:
        probe.watch_micro_batches(list(model.parameters()))
    env = DistEnv(rank, world, rank, world) if world > 1 else DistEnv()
    clipper = GradientClipper(
        ClippingConfig(strategy=strategy, max_norm=MAX_NORM), "adamw", model, ddp, scaler, env, probe
    )
    if clipper.hook_state is not None:
        clipper.hook_state.bucket_params = []
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    out = []
    for iteration in range(ITERATIONS):
        for micro in range(accumulation):
            weight = 1.0 / accumulation
            # as train.micro_batch_probe: the scale is read before the micro-batch's forward (on the first step,
            # before the scaler has scaled anything)
            measure = probe.micro_batch(weight, clipper.loss_scale()) if accumulation > 1 else nullcontext()
            with clipper.backward_context(micro == accumulation - 1), measure:
                loss = (ddp or model)(micro_gradient(iteration, data_ranks(world)[rank], micro)) * weight
                scaler.scale(loss).backward()
        clipper.before_step(optimizer)
        pending = probe.take()
        scaler.step(optimizer)  # unscales the gradients in place (after_allreduce did already), skips on inf
        found_inf = scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
        buckets = [list(range(len(SIZES)))]
        if clipper.hook_state is not None:
            buckets = [[index[id(p)] for p in b] for b in clipper.hook_state.bucket_params]
        out.append(
            {
                "grads": [p.grad.detach().clone() for p in model.parameters()],
                "buckets": buckets,
                "norms": pending.read() if pending is not None else None,
                "found_inf": sum(v.item() for v in found_inf.values()),
            }
        )
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    return out


def worker(rank: int, world: int, init_file: str, out_file: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    results = {(s, a): run_steps(rank, world, s, a) for s in STRATEGIES for a in ACCUMULATIONS}
    torch.save(results, f"{out_file}.{rank}")
    dist.barrier()  # no rank tears gloo down while another still talks to it
    dist.destroy_process_group()
    os._exit(0)  # as in test_noise_scale: skip the interpreter's teardown of gloo's threads


@pytest.fixture(scope="module")
def rank_results(tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("scaled")
    start_ranks(worker, (2, str(tmp / "init"), str(tmp / "out")), 2)
    return [torch.load(f"{tmp / 'out'}.{r}", weights_only=False) for r in range(2)]


# --------------------------------------------------------------------------- the float64 reference


def local_gradient(iteration: int, rank: int, accumulation: int) -> list[torch.Tensor]:
    micros = [[x.double() for x in micro_gradient(iteration, rank, k)] for k in range(accumulation)]
    return [sum(m[i] for m in micros) / accumulation for i in range(len(SIZES))]


def norm(tensors) -> float:
    return math.sqrt(sum(float(t.square().sum()) for t in tensors))


def clipped(g: list[torch.Tensor], keys, threshold: float) -> dict[int, torch.Tensor]:
    coef = min(1.0, threshold / (norm([g[i] for i in keys]) + EPS))
    return {i: g[i] * coef for i in keys}


def expected_gradient(strategy, iteration, world, accumulation, buckets) -> list[torch.Tensor]:
    local = [local_gradient(iteration, r, accumulation) for r in data_ranks(world)]
    everything = list(range(len(SIZES)))
    if strategy == "before_allreduce" or (strategy == "bucketwise" and world == 1):
        local = [clipped(g, everything, MAX_NORM) for g in local]
    elif strategy == "bucketwise":
        local = [{i: x for b in buckets for i, x in clipped(g, b, MAX_NORM / math.sqrt(len(buckets))).items()}
                 for g in local]  # fmt: skip
    mean = [sum(g[i] for g in local) / world for i in everything]
    if strategy == "after_allreduce":
        mean = list(clipped(mean, everything, MAX_NORM).values())
    return mean


def expected_norms(iteration, world, accumulation) -> tuple[float, float]:
    local = [local_gradient(iteration, r, accumulation) for r in data_ranks(world)]
    if accumulation > 1:
        micro = [norm(micro_gradient(iteration, r, k)) ** 2 for r in data_ranks(world) for k in range(accumulation)]
        return sum(micro) / len(micro), sum(norm(g) ** 2 for g in local) / world
    mean = [sum(g[i] for g in local) / world for i in range(len(SIZES))]
    return sum(norm(g) ** 2 for g in local) / world, norm(mean) ** 2


def check(results: list[list[dict]], strategy: str, accumulation: int) -> None:
    world = len(results)
    for iteration in range(OVERFLOW):
        buckets = results[0][iteration]["buckets"]
        expected = expected_gradient(strategy, iteration, world, accumulation, buckets)
        if strategy != "none":  # the clip bites, or this could not fail
            plain = expected_gradient("none", iteration, world, accumulation, buckets)
            assert norm([a - b for a, b in zip(expected, plain, strict=True)]) > 1.0
        small, big = expected_norms(iteration, world, accumulation)
        for rank, steps in enumerate(results):
            step = steps[iteration]
            assert step["found_inf"] == 0
            for i, (got, want) in enumerate(zip(step["grads"], expected, strict=True)):
                msg = f"{strategy} accumulation {accumulation} iteration {iteration} rank {rank} param {i}"
                torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6, msg=msg)
            assert step["norms"] == pytest.approx((small, big), rel=1e-5), (strategy, accumulation, iteration)
    for steps in results:  # the overflow reached every rank's scaler, and the probe dropped the step
        assert steps[OVERFLOW]["found_inf"] == 1 and steps[OVERFLOW]["norms"] is None


@pytest.mark.parametrize("accumulation", [2, 3])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_one_process_with_loss_scaling_and_accumulation(strategy, accumulation):
    check([run_steps(0, 1, strategy, accumulation)], strategy, accumulation)


@pytest.mark.distributed
@pytest.mark.parametrize("accumulation", ACCUMULATIONS)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_two_ranks_with_loss_scaling(rank_results, strategy, accumulation):
    results = [r[(strategy, accumulation)] for r in rank_results]
    if strategy == "bucketwise":
        assert len(results[0][OVERFLOW - 1]["buckets"]) == 2  # the overlapped hook, on DDP's rebuilt buckets
    check(results, strategy, accumulation)
