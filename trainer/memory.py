"""How many sequences fit in one forward/backward on this device: `batch.micro_batch_size: auto`.

The micro-batch only sets how a step's sequences are split into forward/backward passes (accumulation makes the
step's gradient the same whatever the split: `trainer.train.train_step`), and on a GPU the fastest is usually the
largest that fits (on the CPU it is not: BENCHMARKS.md). Before the first step the trainer measures one forward +
backward on the training set's longest sequences at two small micro-batches, fits

    bytes = fixed + per_token x tokens

adds the optimizer's state (two float32 moments per parameter and the step's temporaries, made at the first step)
and, with several ranks, the gradient's copies in DDP's buckets (and before_allreduce's flat copy), and takes the
largest divisor of the per-rank batch whose worst case, every sequence as long as the longest one, fits in the
device's free memory less a margin (on the CPU, shared by the host's ranks). All ranks take the
smallest of their choices.

What is measured: on CUDA, the caching allocator's peak above what was allocated before (activations, gradients,
workspaces: everything the pass allocates), against the free memory the driver reports; on the CPU, which keeps no
allocator statistics, the bytes autograd saves for the backward pass plus the gradients, against half the memory
the kernel reports available (or half of what the process's address-space limit leaves, if that is less). The
probes leave no trace: gradients are dropped and the random number generators restored, so a run with `auto`
trains exactly as one configured with the micro-batch it chose.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from trainer.data.batch import pack_batch
from trainer.data.shards import PretrainingSamples
from trainer.model import pretraining_loss
from trainer.precision import autocast as autocast_region

GIB = 2**30
CUDA_MARGIN = 0.9  # of the free device memory: fragmentation, the eval pass, the NCCL buffers
CPU_SHARE = 0.5  # of the available host memory: the estimate misses the backward's transients (up to 28 % measured)
OPTIMIZER_COPIES = 3  # float32 copies of the parameters the optimizer adds: two moments, one of temporaries


@dataclass(frozen=True)
class Probe:
    sequences: int
    tokens: int
    bytes: int  # what the forward + backward needed beyond what was allocated before it


@dataclass(frozen=True)
class MemoryFit:
    """The measurement behind a chosen micro-batch, and the choice."""

    probes: tuple[Probe, ...]
    fixed_bytes: float  # what does not grow with the tokens, the optimizer's state included
    bytes_per_token: float
    longest: int  # tokens of the longest training sequence: every sequence is assumed this long
    budget_bytes: float
    per_rank_batch: int
    micro_batch_size: int

    def bytes_for(self, sequences: int) -> float:
        """The predicted peak of a micro-batch of `sequences` sequences of the longest length."""
        return self.fixed_bytes + self.bytes_per_token * sequences * self.longest

    def describe(self) -> str:
        need = self.bytes_for(self.micro_batch_size)
        probes = ", ".join(f"{p.sequences} x {p.tokens // p.sequences} tokens {size(p.bytes)}" for p in self.probes)
        return (
            f"batch.micro_batch_size auto: {self.micro_batch_size} of {self.per_rank_batch} sequences a rank "
            f"({self.micro_batch_size} x {self.longest} tokens need {size(need)} of {size(self.budget_bytes)}; "
            f"measured {probes}: {self.bytes_per_token / 2**10:.1f} KiB a token + {size(self.fixed_bytes)})"
        )


def size(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / 2**20:.1f} MiB"


def largest_fitting_divisor(per_rank: int, fits) -> int:
    """The largest divisor d of `per_rank` with fits(d); 1 when none fits (the step then fails as out of memory)."""
    return next((d for d in range(per_rank, 0, -1) if per_rank % d == 0 and fits(d)), 1)


def fit_line(probes: tuple[Probe, ...]) -> tuple[float, float]:
    """(fixed, per_token) of the line through the first and last probe."""
    first, last = probes[0], probes[-1]
    if last.tokens == first.tokens:
        return 0.0, first.bytes / max(first.tokens, 1)
    per_token = max((last.bytes - first.bytes) / (last.tokens - first.tokens), 0.0)
    return first.bytes - per_token * first.tokens, per_token


def choose_micro_batch(
    model: torch.nn.Module,
    samples: PretrainingSamples,
    per_rank: int,
    device: torch.device,
    autocast: torch.dtype | None,
    budget_bytes: float | None = None,
    sharing: int = 1,
    gradient_copies: int = 0,
) -> MemoryFit:
    """Measure and choose (see the module's doc). `budget_bytes`: the memory to fit in (None: the device's, divided
    among `sharing` processes that plan on the same memory: the ranks of one host on the CPU). `gradient_copies`:
    float32 copies of the gradient that data parallelism adds (DDP's buckets; before_allreduce's flat copy)."""
    lengths = samples.lengths
    longest_first = np.argsort(-lengths, kind="stable")
    if device.type == "cuda":  # a first pass allocates the libraries' workspaces: not a cost of the tokens
        measure(model, samples, longest_first[:1], device, autocast)
    # Not 1: a single sequence's attention can alias buffers that larger micro-batches copy (CPU attention)
    sizes = sorted({min(2, per_rank), min(4, per_rank)})
    # Layers compiled for fixed shapes (model.compile with model.static_shapes) compile again for each probe's shape,
    # and so does a compiled model (model.compile_model) on fixed shapes or where the number of sequences changes (a
    # shape of its graph, as the one-sequence pass above makes it), and compiling allocates on the device: each
    # probe's first pass compiles, its second is measured
    config = getattr(model, "config", None)  # the trainer's BertForPreTraining's ModelConfig
    compiles = config is not None and ((config.compile and config.static_shapes) or config.compile_model)
    if device.type == "cuda" and compiles:
        for m in sizes:
            measure(model, samples, longest_first[:m], device, autocast)
    probes = tuple(
        Probe(m, int(lengths[longest_first[:m]].sum()), measure(model, samples, longest_first[:m], device, autocast))
        for m in sizes
    )
    fixed, per_token = fit_line(probes)
    fixed += (OPTIMIZER_COPIES + gradient_copies) * sum(p.numel() * 4 for p in model.parameters() if p.requires_grad)
    budget = device_budget(device, sharing) if budget_bytes is None else budget_bytes
    line = MemoryFit(probes, fixed, per_token, int(lengths.max()), budget, per_rank, micro_batch_size=1)
    return replace(line, micro_batch_size=largest_fitting_divisor(per_rank, lambda m: line.bytes_for(m) <= budget))


def measure(model: torch.nn.Module, samples, index, device: torch.device, autocast: torch.dtype | None) -> int:
    """Bytes one forward + backward of the rows `index` needs beyond what is allocated now (see the module's doc);
    leaves no gradients and the random number generators as they were."""
    batch = pack_batch(samples, index).to(device)
    cuda = device.type == "cuda"
    rng = torch.get_rng_state(), torch.cuda.get_rng_state(device) if cuda else None
    was_training = model.training
    model.train()
    counter = SavedBytes(model) if not cuda else None
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    try:
        with counter or nullcontext():
            with autocast_region(device, autocast):
                loss = pretraining_loss(model(batch), batch).total
            loss.backward()
        if cuda:
            torch.cuda.synchronize(device)
            used = torch.cuda.max_memory_allocated(device) - before
        else:
            used = counter.bytes + sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
        torch.set_rng_state(rng[0])
        if cuda:
            torch.cuda.set_rng_state(rng[1], device)
            torch.cuda.empty_cache()
    return int(used)


class SavedBytes(torch.autograd.graph.saved_tensors_hooks):
    """Counts the bytes of the distinct tensors autograd saves for the backward pass, parameters excepted."""

    def __init__(self, model: torch.nn.Module):
        self.bytes = 0
        skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
        seen: set[int] = set()

        def pack(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key not in skip and key not in seen:
                seen.add(key)
                self.bytes += storage.nbytes()
            return t

        super().__init__(pack, lambda t: t)

    def __enter__(self) -> SavedBytes:
        super().__enter__()
        return self


def device_budget(device: torch.device, sharing: int = 1) -> float:
    """The memory a run on `device` may plan for: CUDA_MARGIN of the free device memory; on the CPU, CPU_SHARE of
    the host's available memory divided among the `sharing` processes that plan on it, or of what this process's
    address-space limit leaves (an HPO trial's `resources.memory_limit_mb`, a limit of each process), whichever is
    less."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        free, _total = torch.cuda.mem_get_info(device)
        return CUDA_MARGIN * free / sharing
    return CPU_SHARE * min(available_host_memory() / sharing, address_space_left())


def address_space_left() -> float:
    """Bytes the soft address-space limit (RLIMIT_AS) leaves above the process's present size; inf without one."""
    import resource

    limit, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if limit == resource.RLIM_INFINITY:
        return float("inf")
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return max(float(limit) - float(line.split()[1]) * 1024, 0.0)
    except OSError:
        pass
    return float(limit)


def available_host_memory() -> float:
    """MemAvailable of /proc/meminfo (bytes); elsewhere the physical memory."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def out_of_memory(error: BaseException) -> bool:
    """CUDA's out-of-memory error, Python's, or the CPU allocator's (a RuntimeError that says so)."""
    return isinstance(error, (torch.OutOfMemoryError, MemoryError)) or "can't allocate memory" in str(error)
