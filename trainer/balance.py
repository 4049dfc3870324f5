"""Load balancing: which samples each rank gets in each step (`balance.method`; this docstring is the specification).

With unpadded variable-length BERT the rank with the most tokens sets the step time. Every rank holds the same
data set index (the valid length of every sample), so the plan of an epoch is a pure function of
(lengths, method, bins, micro_batch_size, world_size, local_world_size, seed, epoch):

- `none`: a random permutation cut into micro-batches;
- `stratified`: every micro-batch takes a fixed count from each length bin (counts proportional to the global
  bin histogram), so all ranks see the same length histogram;
- `local_presort`: stratified micro-batches, then inside each node the node's sequences are sorted by length
  and dealt in snake order over the node's ranks (`presort_node`). Only intra-node exchange.

Contract of every plan (`plan_epoch`): every rank has the same number of steps; every step but the last gives
every rank exactly micro_batch_size samples; the remaining r = N mod (world_size * micro_batch_size) samples make a
last step in which batch sizes differ by at most one, when r >= world_size, so that no rank is ever without a
sequence (a rank with none could not join the step's gradient all-reduce); fewer than world_size are left out of
that epoch (shuffled, other epochs' permutations leave out others; with `data.shuffle: false` the same ones every
epoch). So each sample appears exactly once per epoch, but for those; one process leaves none out.
`RankBatchSampler` is what the trainer iterates; for `local_presort` it really all-gathers the local batches within
the node's process group.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainer.errors import ConfigError, DataWarning

METHODS = ("none", "stratified", "local_presort")

Plan = list[list[np.ndarray]]  # plan[step][rank] -> sample indices (int64) of that rank's micro-batch


# --------------------------------------------------------------------------- length bins and counts


def assign_bins(lengths: np.ndarray, bins: Sequence[int]) -> np.ndarray:
    """Bin index of every sample: bin k holds bins[k-1] < length <= bins[k]; lengths above the last bound go to
    the last bin. `bins` are strictly increasing upper bounds (config `balance.bins`)."""
    bounds = np.asarray(bins)
    if bounds.ndim != 1 or len(bounds) == 0 or np.any(np.diff(bounds) <= 0):
        raise ConfigError(f"balance.bins must be non-empty, strictly increasing upper bounds; got {list(bins)}")
    return np.minimum(np.searchsorted(bounds, lengths, side="left"), len(bounds) - 1)


def warn_one_bin(lengths: np.ndarray, method: str, bins: Sequence[int]) -> None:
    """A DataWarning where `stratified` finds sequences of several lengths all in one bin of `bins`: every
    micro-batch then draws from that bin alone, as `none` would, and the method balances nothing (it ran without
    a word). The warning names bounds inside the lengths (their quartiles)."""
    if method != "stratified" or len(lengths) == 0:
        return
    shortest, longest = int(lengths.min()), int(lengths.max())
    if shortest == longest or len(np.unique(assign_bins(lengths, bins))) > 1:
        return
    quartiles = {int(q) for q in np.quantile(lengths, [0.25, 0.5, 0.75])}
    bounds = sorted(q for q in quartiles if shortest <= q < longest) + [longest]
    warnings.warn(
        f"balance.method stratified: balance.bins {list(bins)} put all {len(lengths):,} training sequences (of "
        f"{shortest} to {longest} tokens) in one bin, so every micro-batch draws from it as method none would and "
        f"nothing is balanced; give bounds inside the lengths, e.g. balance.bins=[{','.join(map(str, bounds))}]",
        DataWarning,
        stacklevel=2,
    )


def batch_bin_counts(histogram: np.ndarray, micro_batch_size: int) -> np.ndarray:
    """How many samples of each bin one micro-batch takes: micro_batch_size * histogram / sum(histogram), rounded
    by largest remainder (ties to the lower bin) so the counts sum to micro_batch_size. Empty bins get 0, and no
    count exceeds its bin when sum(histogram) >= micro_batch_size."""
    histogram = np.asarray(histogram, dtype=np.int64)
    total = int(histogram.sum())
    quotas, remainders = np.divmod(micro_batch_size * histogram, total)  # exact integer arithmetic
    missing = micro_batch_size - int(quotas.sum())
    quotas[np.argsort(-remainders, kind="stable")[:missing]] += 1
    return quotas


def token_imbalance(tokens_per_rank: Sequence[float] | np.ndarray) -> float:
    """max / mean of the tokens per rank in one step: 1.0 is perfectly even; defined as 1.0 when no rank has
    any token (mean 0)."""
    tokens = np.asarray(tokens_per_rank, dtype=np.float64)
    mean = tokens.mean() if tokens.size else 0.0
    return float(tokens.max() / mean) if mean > 0 else 1.0


# --------------------------------------------------------------------------- epoch plans


def plan_epoch(
    lengths: np.ndarray,
    method: str,
    bins: Sequence[int],
    micro_batch_size: int,
    world_size: int,
    local_world_size: int,
    seed: int,
    epoch: int,
    shuffle: bool = True,
) -> Plan:
    """The whole epoch: plan[step][rank] are the sample indices of that rank's micro-batch (see module doc for
    the contract). Deterministic from (seed, epoch); with shuffle=False the plan does not depend on them and
    samples are taken in index order."""
    _check_layout(method, micro_batch_size, world_size, local_world_size)
    rng = np.random.default_rng([seed, epoch]) if shuffle else None
    if method == "none":
        return _random_plan(len(lengths), micro_batch_size, world_size, rng)
    plan = _stratified_plan(assign_bins(lengths, bins), len(bins), micro_batch_size, world_size, rng)
    if method == "local_presort":
        plan = [_presort_step(step, lengths, local_world_size) for step in plan]
    return plan


def presort_node(node_batches: list[np.ndarray], lengths: np.ndarray) -> list[np.ndarray]:
    """Re-deal the micro-batches of one node's ranks (in node-rank order): all their sequences sorted by length,
    longest first (ties keep gathered order), laid out in rows of len(node_batches), every odd row reversed
    ("snake"); node rank j gets column j. A short last row fills columns from its row's start side."""
    local_world_size = len(node_batches)
    samples = np.concatenate([np.asarray(b, dtype=np.int64) for b in node_batches])
    ordered = samples[np.argsort(-lengths[samples], kind="stable")]
    row, column = np.divmod(np.arange(len(ordered)), local_world_size)
    column = np.where(row % 2 == 1, local_world_size - 1 - column, column)
    return [ordered[column == j] for j in range(local_world_size)]


def _check_layout(method: str, micro_batch_size: int, world_size: int, local_world_size: int) -> None:
    if method not in METHODS:
        raise ConfigError(f"balance.method must be one of {METHODS}; got {method!r}")
    if micro_batch_size < 1 or world_size < 1 or local_world_size < 1 or world_size % local_world_size:
        raise ConfigError(
            f"need micro_batch_size >= 1 and world_size ({world_size}) a multiple of local_world_size "
            f"({local_world_size}); got micro_batch_size={micro_batch_size}"
        )


def _random_plan(n: int, micro_batch_size: int, world_size: int, rng: np.random.Generator | None) -> Plan:
    order = rng.permutation(n) if rng is not None else np.arange(n, dtype=np.int64)
    full_steps, global_batch = n // (world_size * micro_batch_size), world_size * micro_batch_size
    full = order[: full_steps * global_batch].reshape(full_steps, world_size, micro_batch_size)
    plan = [list(step) for step in full]
    return _with_last_step(plan, order[full_steps * global_batch :], world_size)


def _stratified_plan(
    sample_bins: np.ndarray, num_bins: int, micro_batch_size: int, world_size: int, rng: np.random.Generator | None
) -> Plan:
    """Full micro-batches drawn in rounds: the first round takes as many whole steps as the counts from the
    global histogram allow (all batches with the same histogram); when a bin runs out, the counts are recomputed
    from what is left, so the last few steps have a slightly different histogram. The final partial step deals
    the rest bin by bin over the ranks."""
    pools = [np.flatnonzero(sample_bins == k) for k in range(num_bins)]
    if rng is not None:
        pools = [rng.permutation(pool) for pool in pools]
    full_steps = len(sample_bins) // (world_size * micro_batch_size)
    needed, rounds = full_steps * world_size, []
    while needed > 0:
        batches, pools = _draw_round(pools, micro_batch_size, world_size, needed)
        rounds.append(batches)
        needed -= len(batches)
    full = np.concatenate(rounds) if rounds else np.empty((0, micro_batch_size), np.int64)
    plan = [list(step) for step in full.reshape(full_steps, world_size, micro_batch_size)]
    return _with_last_step(plan, np.concatenate(pools), world_size)


def _draw_round(
    pools: list[np.ndarray], micro_batch_size: int, world_size: int, needed: int
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Up to `needed` micro-batches [n, micro_batch_size] with the same per-bin counts, and what is left of the
    pools. Whole steps (multiples of world_size batches) when the pools allow, so all ranks of a step share the
    histogram; at least one batch when the pools hold >= micro_batch_size samples (see `batch_bin_counts`)."""
    counts = batch_bin_counts(np.array([len(p) for p in pools]), micro_batch_size)
    pairs = list(zip(pools, counts, strict=True))
    available = min(len(p) // c for p, c in pairs if c > 0)
    taken = min(needed, available if available < world_size else available - available % world_size)
    batches = np.concatenate([p[: taken * c].reshape(taken, c) for p, c in pairs], axis=1)
    return batches, [p[taken * c :] for p, c in pairs]


def _with_last_step(plan: Plan, rest: np.ndarray, world_size: int) -> Plan:
    """Append the partial last step: rank j gets rest[j::world_size] (sizes differ by at most one); fewer than
    world_size samples are left out, so that every rank has at least one."""
    plan = [[np.asarray(batch, dtype=np.int64) for batch in step] for step in plan]
    if len(rest) >= world_size:
        plan.append([rest[j::world_size].astype(np.int64) for j in range(world_size)])
    return plan


def _presort_step(step: list[np.ndarray], lengths: np.ndarray, local_world_size: int) -> list[np.ndarray]:
    nodes = [step[i : i + local_world_size] for i in range(0, len(step), local_world_size)]
    return [batch for node in nodes for batch in presort_node(node, lengths)]


def epoch_samples(n: int, micro_batch_size: int, world_size: int) -> int:
    """The samples an epoch of `n` trains: all, but for fewer than world_size left over (`_with_last_step`)."""
    rest = n % (world_size * micro_batch_size)
    return n - (rest if rest < world_size else 0)


def steps_per_epoch(n: int, micro_batch_size: int, world_size: int) -> int:
    """The micro-batches each rank trains in an epoch of `n` samples (a plan's steps)."""
    return -(-epoch_samples(n, micro_batch_size, world_size) // (world_size * micro_batch_size))


def resume_batch(method: str, n: int, micro_batch_size: int, saved_world_size: int, batches: int,
                 world_size: int) -> int | None:  # fmt: skip
    """Where an epoch's plan on `world_size` ranks goes on from a run on `saved_world_size` ranks that trained the
    first `batches` micro-batches of every rank's plan of the same epoch (the same `n` samples, method, bins, seed,
    shuffle and micro-batch): the micro-batch of this plan after which the same samples are trained. None where no
    position of this plan has trained the same samples.

    Under `none` both plans take the epoch's permutation in order, world_size x micro_batch_size samples a step
    (`_random_plan`), so the first k samples are the same whatever the number of ranks: the position is the saved
    run's samples of the epoch over this run's per step, where that is a whole number (under the same global batch
    it always is). `stratified` and `local_presort` draw their micro-batches in rounds whose size depends on the
    number of ranks (`_draw_round`), so the plans part after the first round: only an epoch's start and its end
    carry over. An epoch ended carries over as ended, the samples the one plan left out (fewer than its ranks) left
    out of it."""
    if batches >= steps_per_epoch(n, micro_batch_size, saved_world_size):
        return steps_per_epoch(n, micro_batch_size, world_size)
    if batches == 0 or saved_world_size == world_size:
        return batches
    if method != "none":
        return None
    samples, per_step = batches * saved_world_size * micro_batch_size, world_size * micro_batch_size
    return samples // per_step if samples % per_step == 0 else None


# --------------------------------------------------------------------------- the trainer's sampler


def make_node_groups(world_size: int, local_world_size: int) -> Any:
    """Create one process group per node (ranks n*local_world_size ... (n+1)*local_world_size - 1) and return
    this rank's. Collective: every rank must call it at the same point (dist.new_group is called for every node
    in the same order on all ranks)."""
    import torch.distributed as dist

    own = None
    for start in range(0, world_size, local_world_size):
        group = dist.new_group(ranks=list(range(start, start + local_world_size)))
        if start <= dist.get_rank() < start + local_world_size:
            own = group
    return own


@dataclass
class RankBatchSampler:
    """Yields this rank's micro-batch indices for an epoch; every rank yields `steps_per_epoch` batches and
    the batches equal `plan_epoch(...)[step][rank]`.

    For `local_presort` with world_size > 1 the node's ranks really exchange their local batches: at the start
    of `batches(epoch)` the rank computes its own stratified local batches of the whole epoch and all-gathers
    them (one `all_gather_object` per epoch) in `node_group`, then applies `presort_node` step by step and keeps
    its column. Indices are exchanged, not token ids: every rank can read any sample of the shared index.
    The all-gather runs when the first batch of the epoch is requested, so every rank of the node must start
    iterating the epoch (with NCCL, after `torch.cuda.set_device`).
    """

    lengths: np.ndarray
    method: str
    bins: Sequence[int]
    micro_batch_size: int
    seed: int
    shuffle: bool = True
    rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_group: Any = None  # this rank's node process group (`make_node_groups`); local_presort only
    _last_plan: tuple | None = field(default=None, init=False, repr=False, compare=False)  # ((method, epoch), plan)

    def __post_init__(self) -> None:
        _check_layout(self.method, self.micro_batch_size, self.world_size, self.local_world_size)
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank {self.rank} is outside world_size {self.world_size}")
        self.lengths = np.asarray(self.lengths)
        if len(self.lengths) < self.world_size:
            raise ConfigError(f"the training set has {len(self.lengths)} sequence(s), fewer than the {self.world_size} "
                              "ranks: every rank needs at least one a step; use fewer ranks or more data")  # fmt: skip

    @property
    def epoch_samples(self) -> int:
        """The samples an epoch trains: all, but for fewer than world_size left over (`_with_last_step`)."""
        return epoch_samples(len(self.lengths), self.micro_batch_size, self.world_size)

    @property
    def steps_per_epoch(self) -> int:
        return steps_per_epoch(len(self.lengths), self.micro_batch_size, self.world_size)

    def __len__(self) -> int:
        return self.steps_per_epoch

    def optimizer_steps(self, samples: int, accumulation: int) -> int:
        """Optimizer steps of `accumulation` micro-batches a rank until at least `samples` sequences are trained
        (the loop's stop): an epoch's steps are full global batches but its last, which may be short."""
        epochs, left = divmod(samples, self.epoch_samples)
        epoch_steps = -(-self.steps_per_epoch // accumulation)
        return epochs * epoch_steps + -(-left // (self.world_size * self.micro_batch_size * accumulation))

    def batches(self, epoch: int) -> Iterator[np.ndarray]:
        """This rank's micro-batches of `epoch`, in step order."""
        if self.method == "local_presort" and self.world_size > 1:
            yield from self._exchanged_batches(epoch)
            return
        for step in self._plan(self.method, epoch):
            yield step[self.rank]

    def loads(self, epoch: int) -> np.ndarray:
        """[micro-batch, rank, (tokens, sequences)] of every rank's micro-batches of `epoch`, in step order: what
        each rank's `batches(epoch)` holds, computed here from the epoch's plan without asking the other ranks."""
        plan = self._plan(self.method, epoch)
        return np.array([[(int(self.lengths[b].sum()), len(b)) for b in step] for step in plan],
                        dtype=np.int64).reshape(len(plan), self.world_size, 2)  # fmt: skip

    def largest(self, epoch: int, per_sample: np.ndarray) -> int:
        """The most of `per_sample` (a number per sample: its tokens, its masked positions) that any micro-batch of
        `epoch` holds, over every rank's, from the epoch's plan: the same on every rank, without asking the others."""
        return max(int(per_sample[b].sum()) for step in self._plan(self.method, epoch) for b in step)

    def _plan(self, method: str, epoch: int) -> Plan:
        """The epoch's plan, made once: the trainer asks for an epoch's batches and then for its loads."""
        if self._last_plan is None or self._last_plan[0] != (method, epoch):
            layout = (self.micro_batch_size, self.world_size, self.local_world_size)
            plan = plan_epoch(self.lengths, method, self.bins, *layout, self.seed, epoch, self.shuffle)
            self._last_plan = ((method, epoch), plan)
        return self._last_plan[1]

    def _exchanged_batches(self, epoch: int) -> Iterator[np.ndarray]:
        import torch.distributed as dist

        own = [step[self.rank] for step in self._plan("stratified", epoch)]
        gathered: list[Any] = [None] * self.local_world_size
        dist.all_gather_object(gathered, own, group=self.node_group)
        node_rank = self.rank % self.local_world_size
        for step in range(len(own)):
            yield presort_node([node[step] for node in gathered], self.lengths)[node_rank]


def build_batch_sampler(
    lengths: np.ndarray,
    method: str,
    bins: Sequence[int],
    micro_batch_size: int,
    seed: int,
    shuffle: bool = True,
    rank: int = 0,
    world_size: int = 1,
    local_world_size: int = 1,
    node_group: Any = None,
) -> RankBatchSampler:
    """The trainer's sampler for this rank. For `local_presort` with world_size > 1 and no `node_group`, the
    node groups are created here (`make_node_groups`), so then every rank must call this at the same point."""
    if method == "local_presort" and world_size > 1 and node_group is None:
        node_group = make_node_groups(world_size, local_world_size)
    return RankBatchSampler(
        lengths, method, bins, micro_batch_size, seed, shuffle, rank, world_size, local_world_size, node_group
    )
