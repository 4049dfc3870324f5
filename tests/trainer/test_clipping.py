"""Clipping strategies under real DDP (2 and 4 gloo ranks) against an independent single-process computation.

The same ranks also run multi-million-element buckets with known gradients, whose clip coefficients must match
float64 (see "exact clip coefficients" below).

Each rank records the gradients the optimizer would see after `GradientClipper.before_step`, and the
parameters DDP put in each bucket. The test recomputes every rank's local gradient in this process and applies
the formulas of trainer/clipping.py by hand: mean; clip(mean); mean(clip(local)); per bucket mean(clip_b(local_b)).
"""

from __future__ import annotations

import functools
import math
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tests.trainer.conftest import buckets_by_hand, make_model_config, make_samples, start_ranks
from trainer.clipping import EPS, GradientClipper, clip_coefficient, ddp_bucket_count, effective_optimizer_config
from trainer.config import ClippingConfig, OptimizerConfig, TrainerConfig
from trainer.data.batch import pack_batch
from trainer.distributed import DistEnv
from trainer.model import BertForPreTraining, pretraining_loss
from trainer.run import clipping_summary

WORLDS = [2, 4]  # 4 ranks oversubscribe a 2-core machine, which gloo tolerates
ITERATIONS = 3  # 1: DDP's initial single bucket, 2: rebuilt buckets (both deferred), 3: overlapped hook
TINY_BUCKET_CAP_MB = 0.02  # several buckets of the tiny model
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


def run_strategy(rank: int, world: int, strategy: str, samples) -> dict:
    model = tiny_model()
    names = {id(p): n for n, p in model.named_parameters()}
    ddp = DistributedDataParallel(model, bucket_cap_mb=TINY_BUCKET_CAP_MB)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    clipper = GradientClipper(
        ClippingConfig(strategy=strategy, max_norm=MAX_NORM, bucket_cap_mb=TINY_BUCKET_CAP_MB),
        "adamw",
        model,
        ddp,
        scaler,
        DistEnv(rank, world, rank, world),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    if clipper.hook_state is not None:
        clipper.hook_state.bucket_params = []
    # The timeline only appends (event, name, time) to a list: the gradients are those of an unrecorded run.
    timeline: list = []
    for n, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(lambda p, n=n: timeline.append(("grad", n, time.perf_counter_ns())))
    clipper.timeline = timeline
    if clipper.hook_state is not None:
        clipper.hook_state.timeline = timeline
    out = {"grads": [], "buckets": [], "timeline": [], "ddp_buckets": clipper.ddp_buckets}
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


# (strategy, clipping.bucket_cap_mb) of the start lines the ranks write: several buckets, and one (the whole model)
START_LINES = [*((s, TINY_BUCKET_CAP_MB) for s in STRATEGIES), ("bucketwise", 25.0)]


def start_line_clipping(rank: int, world: int, strategy: str, cap_mb: float) -> str:
    """What the trainer's start line says of clipping for the tiny model wrapped in DDP with buckets of `cap_mb`."""
    model = tiny_model()
    cfg = TrainerConfig(clipping=ClippingConfig(strategy=strategy, bucket_cap_mb=cap_mb))
    ddp = DistributedDataParallel(model, bucket_cap_mb=cap_mb)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    clipper = GradientClipper(cfg.clipping, "adamw", model, ddp, scaler, DistEnv(rank, world, rank, world))
    return clipping_summary(cfg, clipper)


def worker(rank: int, world: int, init_file: str, out_file: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    samples = shared_samples(world)
    results = {s: run_strategy(rank, world, s, samples) for s in STRATEGIES}
    xs_by_rank = [rank_gradient(r) for r in range(world)]
    results["large_buckets"] = {s: run_large_buckets(rank, world, s, xs_by_rank) for s in CLIPPED}
    results["start_lines"] = {(s, cap): start_line_clipping(rank, world, s, cap) for s, cap in START_LINES}
    torch.save(results, f"{out_file}.{rank}")
    dist.barrier()  # no rank tears gloo down while another still talks to it (that aborts the process)
    dist.destroy_process_group()


def run_ranks(tmp_path, world: int = 2) -> list[dict]:
    out = tmp_path / "grads"
    args = (world, str(tmp_path / "init"), str(out))
    start_ranks(worker, args, world)
    return [torch.load(f"{out}.{r}", weights_only=False) for r in range(world)]


def local_gradients(samples, iteration: int, rank: int, world: int) -> dict[str, torch.Tensor]:
    model = tiny_model()
    backward(model, samples, iteration, rank, world)
    return {n: p.grad.detach().double() for n, p in model.named_parameters()}


@functools.cache
def reference_local_gradients(world: int, iteration: int, rank: int) -> dict[str, torch.Tensor]:
    """`local_gradients` on the ranks' shared samples, computed once for all strategies (never modified)."""
    return local_gradients(shared_samples(world), iteration, rank, world)


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


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """`runs(world)`: the ranks' results, run once per world size for every test of this module."""
    done: dict[int, list[dict]] = {}

    def get(world: int) -> list[dict]:
        if world not in done:
            done[world] = run_ranks(tmp_path_factory.mktemp("clip"), world=world)
        return done[world]

    return get


# 4 ranks (13 s, a launch of their own) are slow; 2 ranks check every strategy in the default suite
@pytest.fixture(
    scope="module",
    params=[pytest.param(w, marks=pytest.mark.slow) if w == 4 else w for w in WORLDS],
    ids=[f"{w}ranks" for w in WORLDS],
)
def rank_results(request, runs):
    return runs(request.param)


@pytest.mark.distributed
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_optimizer_sees_the_reference_gradients(rank_results, strategy):
    world = len(rank_results)
    for iteration in range(ITERATIONS):
        local = [reference_local_gradients(world, iteration, r) for r in range(world)]
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
    assert all_names == sorted(reference_local_gradients(2, 0, 0))


@pytest.mark.distributed
def test_the_clippers_bucket_count_is_the_one_ddp_built(rank_results):
    """The count the trainer's start line names (`GradientClipper.ddp_buckets`, for bucketwise and before_allreduce
    under DDP) is the number of buckets DDP rebuilt and the bucket-wise hook clipped, on every rank."""
    built = len(rank_results[0]["bucketwise"]["buckets"][-1])
    assert built >= 3
    for result in rank_results:
        counts = [result[strategy]["ddp_buckets"] for strategy in STRATEGIES]
        assert counts == [None, None, built, built]  # none, after_allreduce: buckets change nothing
    large = rank_results[0]["large_buckets"]["bucketwise"]
    assert large[-1]["ddp_buckets"] == len(large[-1]["buckets"]) == 2


@pytest.mark.distributed
def test_the_start_line_names_the_ddp_buckets_under_bucketwise_and_before_allreduce(rank_results):
    """With one bucket (the tiny model's 0.1 MB of gradients under the default cap of 25 MB) bucketwise clips the
    whole local gradient, as before_allreduce does: the line says so."""
    built = len(rank_results[0]["bucketwise"]["buckets"][-1])
    cap = f"clipping.bucket_cap_mb {TINY_BUCKET_CAP_MB:g}"
    assert [r["start_lines"] for r in rank_results] == [{
        ("none", TINY_BUCKET_CAP_MB): "clipping none",
        ("after_allreduce", TINY_BUCKET_CAP_MB): "clipping after_allreduce",
        ("before_allreduce", TINY_BUCKET_CAP_MB): f"clipping before_allreduce ({built} DDP buckets at {cap})",
        ("bucketwise", TINY_BUCKET_CAP_MB): f"clipping bucketwise ({built} DDP buckets at {cap})",
        ("bucketwise", 25.0): "clipping bucketwise (1 DDP bucket at clipping.bucket_cap_mb 25: clips like "
                              "before_allreduce)",
    }] * len(rank_results)  # fmt: skip


@pytest.mark.parametrize("cap_mb", [1e-5, 0.005, TINY_BUCKET_CAP_MB, 0.05, 25.0])
def test_the_bucket_count_follows_ddps_rule(cap_mb):
    """`ddp_bucket_count` against DDP's rule written out by hand (`buckets_by_hand`), at caps from about one bucket
    per parameter to one for the whole model."""
    params = list(tiny_model().parameters())
    cap = int(cap_mb * 1024 * 1024)
    expected = buckets_by_hand([p.numel() * p.element_size() for p in params], cap)
    assert ddp_bucket_count(params, cap) == expected
    assert (expected == 1) == (cap_mb == 25.0)  # one bucket only for the whole model's cap
    for p in params[:3]:  # DDP buckets the trainable parameters only
        p.requires_grad_(False)
    assert ddp_bucket_count(params, cap) == buckets_by_hand([p.numel() * p.element_size() for p in params[3:]], cap)


@pytest.mark.distributed
def test_bucketwise_all_reduce_overlaps_backward_and_before_allreduce_cannot(runs):
    results = runs(2)
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


# --------------------------------------------------------------------------- exact clip coefficients on large buckets
# Every rank gets a known gradient: the loss Σ_i <p_i, x_i> has gradient exactly x_i. The averaged gradient the
# optimizer sees is then Σ_r c_r x_r / world (one coefficient c per rank and bucket), so c is recovered from it by
# least squares in float64 and compared with c computed in float64 from x.

SIZES = (2_000_000, 500_000, 3_000)  # torch's own float32 norm of 2 M elements is ~2e-5 off
BUCKET_CAP_MB = 1.0  # DDP closes a bucket once it holds this much: [2 M] and [0.5 M + 3 k]
LARGE_MAX_NORM = 1.0
# bucketwise goes through DDP's initial buckets, the rebuilt ones (deferred hook) and the overlapped hook
LARGE_ITERATIONS = {"after_allreduce": 1, "before_allreduce": 1, "bucketwise": 3}
CLIPPED = ["after_allreduce", "before_allreduce", "bucketwise"]


@functools.cache
def rank_gradient(rank: int) -> list[torch.Tensor]:
    """Rank `rank`'s gradient, one tensor per parameter; ranks differ in direction and scale."""
    gen = torch.Generator().manual_seed(100 + rank)
    return [torch.randn(n, generator=gen) * (1 + rank) for n in SIZES]


class GivenGradients(nn.Module):
    """loss = Σ_i <p_i, x_i>, so the gradient of p_i is exactly x_i (parameters of `sizes` elements)."""

    def __init__(self, sizes: tuple[int, ...]):
        super().__init__()
        self.weights = nn.ParameterList(nn.Parameter(torch.zeros(n)) for n in sizes)

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return sum((p * x).sum() for p, x in zip(self.weights, xs, strict=True))


def recover_coefficients(grads, xs_by_rank, params: list[int]) -> list[float]:
    """c_r with grads ≈ Σ_r c_r x_r / world on the parameters `params`, by float64 least squares."""
    world = len(xs_by_rank)
    gram = torch.zeros(world, world, dtype=torch.float64)
    rhs = torch.zeros(world, dtype=torch.float64)
    for i in params:
        columns = torch.stack([xs[i] for xs in xs_by_rank]).double()
        gram += columns @ columns.T
        rhs += columns @ grads[i].double()
    return (torch.linalg.solve(gram, rhs) * world).tolist()


def run_large_buckets(rank: int, world: int, strategy: str, xs_by_rank) -> list[dict]:
    model = GivenGradients(SIZES)
    index = {id(p): i for i, p in enumerate(model.parameters())}
    ddp = DistributedDataParallel(model, bucket_cap_mb=BUCKET_CAP_MB)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    env = DistEnv(rank, world, rank, world)
    clipper = GradientClipper(
        ClippingConfig(strategy=strategy, max_norm=LARGE_MAX_NORM), "adamw", model, ddp, scaler, env
    )
    if clipper.hook_state is not None:
        clipper.hook_state.bucket_params = []
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    out = []
    for _ in range(LARGE_ITERATIONS[strategy]):
        with clipper.backward_context(last_micro_batch=True):
            ddp(xs_by_rank[rank]).backward()
        clipper.before_step(optimizer)
        if clipper.hook_state is not None:
            buckets = [[index[id(p)] for p in b] for b in clipper.hook_state.bucket_params]
        else:
            buckets = [list(range(len(SIZES)))]
        grads = [p.grad for p in model.parameters()]
        if rank == 0:
            out.append({"buckets": buckets, "coefs": [recover_coefficients(grads, xs_by_rank, b) for b in buckets],
                        "ddp_buckets": clipper.ddp_buckets})  # fmt: skip
        optimizer.zero_grad(set_to_none=True)
    return out


def reference_coefficients(strategy: str, world: int, buckets: list[list[int]]) -> list[list[float]]:
    """Float64 clip coefficients per bucket and rank, from the formulas of trainer.clipping."""
    xs = [[x.double() for x in rank_gradient(r)] for r in range(world)]

    def coef(norm: float, threshold: float) -> float:
        return min(1.0, threshold / (norm + EPS))

    def norm(tensors) -> float:
        return math.sqrt(sum(float(t.square().sum()) for t in tensors))

    if strategy == "after_allreduce":
        mean = [sum(x[i] for x in xs) / world for i in range(len(SIZES))]
        return [[coef(norm(mean), LARGE_MAX_NORM)] * world]
    if strategy == "before_allreduce":
        return [[coef(norm(x), LARGE_MAX_NORM) for x in xs]]
    threshold = LARGE_MAX_NORM / math.sqrt(len(buckets))
    return [[coef(norm([x[i] for i in bucket]), threshold) for x in xs] for bucket in buckets]


@pytest.mark.distributed
@pytest.mark.parametrize("strategy", CLIPPED)
def test_clip_coefficients_on_large_buckets_match_float64(rank_results, strategy):
    world, results = len(rank_results), rank_results[0]["large_buckets"]
    for iteration in results[strategy]:
        expected = reference_coefficients(strategy, world, iteration["buckets"])
        assert all(c < 0.01 for bucket in expected for c in bucket)  # every rank and bucket is clipped
        for got_bucket, expected_bucket in zip(iteration["coefs"], expected, strict=True):
            for got, want in zip(got_bucket, expected_bucket, strict=True):
                assert abs(got - want) / want < 1e-6, (strategy, iteration["buckets"], got, want)
    if strategy == "bucketwise":
        last = results[strategy][-1]["buckets"]
        assert len(last) >= 2 and [0] in last  # the 2 M-element parameter is a bucket of its own


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


def test_with_lamb_strategy_none_still_clips_at_lambs_max_grad_norm():
    """`none` adds no clip, but LAMB's pre-normalization stays (apex semantics): the docs and the clipping presets
    said that `none` clips nothing. Three LAMB steps on gradients of norm ~1,000 under `none` match
    `after_allreduce` at max_norm = optimizer.max_grad_norm exactly, and differ from a threshold that never bites."""
    from trainer.optim import build_optimizer

    def weights_after_steps(strategy: str, max_norm: float) -> torch.Tensor:
        model = tiny_model()
        clip = ClippingConfig(strategy=strategy, max_norm=max_norm)
        optimizer = build_optimizer(model, effective_optimizer_config(OptimizerConfig(name="lamb", lr=0.01), clip))
        clipper = GradientClipper(clip, "lamb", model, None, torch.amp.GradScaler("cpu", enabled=False), DistEnv())
        generator = torch.Generator().manual_seed(1)
        for _ in range(3):
            for p in model.parameters():
                p.grad = torch.randn(p.shape, generator=generator) * 10.0
            clipper.before_step(optimizer)
            optimizer.step()
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    unclipped = weights_after_steps("after_allreduce", 1e6)
    assert torch.equal(weights_after_steps("none", 1e6), weights_after_steps("after_allreduce", 1.0))
    assert not torch.equal(weights_after_steps("none", 1e6), unclipped)


def test_loss_scaled_gradients_are_clipped_in_unscaled_units():
    # The threshold is multiplied by the loss scale: clipping scaled grads = scaling clipped grads.
    grads = torch.tensor([3.0, 4.0])
    scale = 1024.0
    unscaled = grads * clip_coefficient(torch.linalg.vector_norm(grads), 1.0)
    scaled_grads = (grads * scale) * clip_coefficient(torch.linalg.vector_norm(grads * scale), 1.0 * scale)
    torch.testing.assert_close(scaled_grads / scale, unscaled)
    for threshold in (1.0, 1e-7, 1e-3 * 2.0**-14, torch.tensor(1e-9)):  # also below eps (a shrunk loss scale)
        for bad in (float("inf"), float("nan"), float("-inf")):  # an overflow stays visible to the scaler
            assert clip_coefficient(torch.tensor(bad), threshold).item() == 1.0, (bad, threshold)
    norms = torch.tensor([0.0, 0.5, 1.0, 3.0, 1e30])
    expected = [min(1.0, 2.0 / (n + EPS)) for n in norms.tolist()]
    assert clip_coefficient(norms, 2.0).tolist() == pytest.approx(expected, rel=1e-7)


# --------------------------------------------------------------------------- on a GPU (pytest -m gpu)


def sync_free_step_worker(rank: int, init_file: str, strategy: str) -> None:
    """One NCCL rank: a bf16 DDP step of the tiny BERT with the strategy's hook and the noise-scale probe measuring
    per bucket, under CUDA's sync debug mode (it raises where the host would wait for the GPU)."""
    from trainer.noise_probe import NormProbe
    from trainer.optim import build_optimizer

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=0, world_size=1)
    torch.manual_seed(0)
    model = BertForPreTraining(make_model_config(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)).cuda()
    ddp = DistributedDataParallel(model, device_ids=[0], bucket_cap_mb=0.05)  # several buckets
    probe = NormProbe(1, device=torch.device("cuda"))
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    clipper = GradientClipper(ClippingConfig(strategy=strategy, max_norm=1.0), "adamw", model, ddp, scaler,
                              DistEnv(0, 1), probe)  # fmt: skip
    optimizer = build_optimizer(model, OptimizerConfig(name="adamw", lr=1e-4))
    batch = pack_batch(make_samples([7, 33, 64, 12, 50, 5, 64, 21]), np.arange(8)).to("cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = pretraining_loss(ddp(batch), batch).total
        loss.backward()
        clipper.before_step(optimizer)
        pending = probe.take()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return pending

    for _ in range(3):  # DDP rebuilds its buckets; bucketwise learns their count
        step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        pending = step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert clipper.hook_state is not None  # the hook ran
    # recorded on the device; one rank without accumulation measures no noise scale (no smaller batch to compare)
    assert pending is not None and torch.isfinite(pending.values).all() and pending.read() is None
    dist.destroy_process_group()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("strategy", ["none", "bucketwise"])
def test_on_the_gpu_a_ddp_step_with_the_noise_scale_probe_never_waits_for_the_device(tmp_path, strategy):
    """The communication hooks record each bucket's norms on the device: a clip coefficient of 1 (no clip) made a
    device tensor from a host number, a copy the host waited for, in every bucket of every measured step."""
    start_ranks(sync_free_step_worker, (str(tmp_path / "init"), strategy), 1)
