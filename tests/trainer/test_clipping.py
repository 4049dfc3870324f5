"""Clipping strategies under real DDP (2 and 4 gloo ranks) against an independent single-process computation.

Each rank records the gradients the optimizer would see after `GradientClipper.before_step`, and the
parameters DDP put in each bucket. The test recomputes every rank's local gradient in this process and applies
the formulas of DESIGN.md by hand: mean; clip(mean); mean(clip(local)); per bucket mean(clip_b(local_b)).
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from tests.trainer.conftest import make_model_config, make_samples
from trainer.clipping import GradientClipper, clip_coefficient, effective_optimizer_config
from trainer.config import ClippingConfig, OptimizerConfig
from trainer.data.batch import pack_batch
from trainer.distributed import DistEnv
from trainer.model import BertForPreTraining, pretraining_loss

WORLDS = [2, 4]  # 4 ranks oversubscribe a 2-core machine, which gloo tolerates
ITERATIONS = 3  # 1: DDP's initial single bucket, 2: rebuilt buckets (both deferred), 3: overlapped hook
MICRO_BATCHES = 2
MICRO_BATCH_SIZE = 3
MAX_NORM = 0.8
STRATEGIES = ["none", "after_allreduce", "before_allreduce", "bucketwise"]


def tiny_model() -> BertForPreTraining:
    torch.manual_seed(0)
    return BertForPreTraining(make_model_config(hidden_size=32, num_attention_heads=2, intermediate_size=64))


def shared_samples(world: int):
    lengths = np.random.default_rng(5).integers(8, 65, world * ITERATIONS * MICRO_BATCHES * MICRO_BATCH_SIZE)
    return make_samples(lengths, seed=7)


def micro_batch_index(iteration: int, rank: int, micro: int, world: int) -> np.ndarray:
    start = ((iteration * world + rank) * MICRO_BATCHES + micro) * MICRO_BATCH_SIZE
    return np.arange(start, start + MICRO_BATCH_SIZE)


def backward(module, samples, iteration, rank, world, clipper=None):
    for micro in range(MICRO_BATCHES):
        ctx = clipper.backward_context(micro == MICRO_BATCHES - 1) if clipper else torch.enable_grad()
        with ctx:
            batch = pack_batch(samples, micro_batch_index(iteration, rank, micro, world))
            (pretraining_loss(module(batch), batch).total / MICRO_BATCHES).backward()


def run_strategy(rank: int, world: int, strategy: str, samples, record_timeline: bool) -> dict:
    model = tiny_model()
    names = {id(p): n for n, p in model.named_parameters()}
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.02)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    clipper = GradientClipper(
        ClippingConfig(strategy=strategy, max_norm=MAX_NORM),
        "adamw",
        model,
        ddp,
        scaler,
        DistEnv(rank, world, rank, world),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    if clipper.hook_state is not None:
        clipper.hook_state.bucket_params = []
    timeline: list = []
    if record_timeline:
        for n, p in model.named_parameters():
            p.register_post_accumulate_grad_hook(lambda p, n=n: timeline.append(("grad", n, time.perf_counter_ns())))
        clipper.timeline = timeline
        if clipper.hook_state is not None:
            clipper.hook_state.timeline = timeline
    out = {"grads": [], "buckets": [], "timeline": []}
    for iteration in range(ITERATIONS):
        timeline.clear()
        backward(ddp, samples, iteration, rank, world, clipper)
        clipper.before_step(optimizer)
        out["grads"].append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
        if clipper.hook_state is not None:
            out["buckets"].append([[names[id(p)] for p in b] for b in clipper.hook_state.bucket_params])
        out["timeline"].append(list(timeline))
        optimizer.zero_grad(set_to_none=True)
    if clipper.hook_state is not None:
        out["num_buckets"] = clipper.hook_state.num_buckets
    return out


def worker(rank: int, world: int, init_file: str, out_file: str, record_timeline: bool) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    samples = shared_samples(world)
    results = {s: run_strategy(rank, world, s, samples, record_timeline) for s in STRATEGIES}
    torch.save(results, f"{out_file}.{rank}")
    dist.destroy_process_group()


def run_ranks(tmp_path, world: int = 2, record_timeline: bool = False) -> list[dict]:
    out = tmp_path / "grads"
    args = (world, str(tmp_path / "init"), str(out), record_timeline)
    mp.start_processes(worker, args=args, nprocs=world, start_method="spawn", join=True)
    return [torch.load(f"{out}.{r}", weights_only=False) for r in range(world)]


def local_gradients(samples, iteration: int, rank: int, world: int) -> dict[str, torch.Tensor]:
    model = tiny_model()
    backward(model, samples, iteration, rank, world)
    return {n: p.grad.detach().double() for n, p in model.named_parameters()}


def norm(grads: dict, keys) -> torch.Tensor:
    return torch.sqrt(sum((grads[k] ** 2).sum() for k in keys))


def scaled(grads: dict, keys, threshold: float) -> dict:
    coef = clip_coefficient(norm(grads, keys), threshold)
    return {k: grads[k] * coef for k in keys}


def reference(strategy: str, local: list[dict], buckets: list[list[str]] | None) -> dict:
    keys = list(local[0])
    if strategy == "before_allreduce":
        local = [scaled(g, keys, MAX_NORM) for g in local]
    if strategy == "bucketwise":
        clipped = [{} for _ in local]
        for bucket in buckets:
            for r, g in enumerate(local):
                clipped[r].update(scaled(g, bucket, MAX_NORM / math.sqrt(len(buckets))))
        local = clipped
    mean = {k: sum(g[k] for g in local) / len(local) for k in keys}
    return scaled(mean, keys, MAX_NORM) if strategy == "after_allreduce" else mean


@pytest.fixture(scope="module", params=WORLDS, ids=[f"{w}ranks" for w in WORLDS])
def rank_results(request, tmp_path_factory):
    return run_ranks(tmp_path_factory.mktemp("clip"), world=request.param)


@pytest.mark.distributed
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_optimizer_sees_the_reference_gradients(rank_results, strategy):
    world = len(rank_results)
    samples = shared_samples(world)
    for iteration in range(ITERATIONS):
        local = [local_gradients(samples, iteration, r, world) for r in range(world)]
        buckets = rank_results[0][strategy]["buckets"][iteration] if strategy == "bucketwise" else None
        expected = reference(strategy, local, buckets)
        plain_mean = reference("none", local, None)
        if strategy != "none":  # the threshold must actually bite, or this test could not fail
            assert max((expected[k] - plain_mean[k]).abs().max() for k in expected) > 1e-4
        for rank in range(world):
            got = rank_results[rank][strategy]["grads"][iteration]
            for name, value in expected.items():
                torch.testing.assert_close(got[name].double(), value, atol=1e-6, rtol=0, msg=f"{strategy} {name}")


@pytest.mark.distributed
def test_bucketwise_used_several_buckets_and_the_same_ones_on_every_rank(rank_results):
    per_rank = [r["bucketwise"]["buckets"] for r in rank_results]
    assert all(buckets == per_rank[0] for buckets in per_rank)
    assert len(per_rank[0][0]) == 1  # DDP starts with one bucket ...
    assert len(per_rank[0][2]) >= 3  # ... and rebuilds by bucket_cap_mb after the first iteration
    assert rank_results[0]["bucketwise"]["num_buckets"] == len(per_rank[0][2])
    all_names = sorted(n for bucket in per_rank[0][2] for n in bucket)
    assert all_names == sorted(local_gradients(shared_samples(2), 0, 0, 2))


@pytest.mark.distributed
def test_bucketwise_all_reduce_overlaps_backward_and_before_allreduce_cannot(tmp_path):
    results = run_ranks(tmp_path, world=2, record_timeline=True)
    for rank in range(2):
        events = results[rank]["bucketwise"]["timeline"][-1]  # the overlapped iteration
        kinds = [e[0] for e in events]
        last_grad = max(i for i, k in enumerate(kinds) if k == "grad")
        first_reduce = kinds.index("allreduce")
        assert first_reduce < last_grad, "bucket all-reduce should start while backward still produces gradients"
        grads_after = {e[1] for e in events[first_reduce:] if e[0] == "grad"}
        assert "bert.embeddings.position_embeddings.weight" in grads_after  # the first layer's grads came later

        events = results[rank]["before_allreduce"]["timeline"][-1]
        kinds = [e[0] for e in events]
        assert kinds.count("allreduce") == 1
        assert kinds.index("allreduce") > max(i for i, k in enumerate(kinds) if k == "grad")


def test_lamb_after_allreduce_clips_once_inside_lamb():
    opt = OptimizerConfig(name="lamb", max_grad_norm=1.0)
    clip = ClippingConfig(strategy="after_allreduce", max_norm=0.25)
    assert effective_optimizer_config(opt, clip).max_grad_norm == 0.25
    model = tiny_model()
    clipper = GradientClipper(clip, "lamb", model, None, torch.amp.GradScaler("cpu", enabled=False), DistEnv())
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    clipper.before_step(torch.optim.SGD(model.parameters(), lr=0.0))
    assert all(torch.equal(p.grad, torch.ones_like(p)) for p in model.parameters())  # left to LAMB
    assert effective_optimizer_config(OptimizerConfig(name="lamb"), ClippingConfig(strategy="bucketwise")) == (
        OptimizerConfig(name="lamb")
    )


def test_loss_scaled_gradients_are_clipped_in_unscaled_units():
    # The threshold is multiplied by the loss scale: clipping scaled grads = scaling clipped grads.
    grads = torch.tensor([3.0, 4.0])
    scale = 1024.0
    unscaled = grads * clip_coefficient(torch.linalg.vector_norm(grads), 1.0)
    scaled_grads = (grads * scale) * clip_coefficient(torch.linalg.vector_norm(grads * scale), 1.0 * scale)
    torch.testing.assert_close(scaled_grads / scale, unscaled)
    assert clip_coefficient(torch.tensor(float("inf")), 1.0).item() == 1.0  # overflow stays visible to the scaler
