"""Load balancing plans (trainer/balance.py): coverage, equal steps, stratified histograms, the snake presort,
and the distributed sampler against the pure plan."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import examples
from trainer.balance import (
    RankBatchSampler,
    assign_bins,
    batch_bin_counts,
    build_batch_sampler,
    make_node_groups,
    plan_epoch,
    presort_node,
    resume_batch,
    steps_per_epoch,
    token_imbalance,
)
from trainer.errors import ConfigError

BINS = [128, 256, 384, 512]
SHARD_SIZES = (1000, 733, 517)  # N = 2250, not a multiple of any world_size * micro_batch_size used below
LAYOUTS = [(2, 2), (4, 4), (8, 4)]  # (world_size, local_world_size): one node of 2, one of 4, 2 nodes of 4
METHODS = ["none", "stratified", "local_presort"]


def make_mlperf_like_lengths(n: int, seed: int = 0) -> np.ndarray:
    """~25 % exactly 512, the rest a gamma bump with its mode near 160, truncated to [16, 511]."""
    rng = np.random.default_rng(seed)
    body = rng.gamma(3.0, 80.0, 4 * n)
    body = body[(body >= 16) & (body < 512)][:n].astype(np.int64)
    return np.where(rng.random(n) < 0.25, 512, body)


def make_shard_lengths(seed: int = 0) -> np.ndarray:
    return np.concatenate([make_mlperf_like_lengths(n, seed + i) for i, n in enumerate(SHARD_SIZES)])


def make_plan(lengths, method, world_size, local_world_size, micro_batch_size=16, seed=0, epoch=0, **kw):
    return plan_epoch(lengths, method, BINS, micro_batch_size, world_size, local_world_size, seed, epoch, **kw)


def histogram(batch, lengths) -> list[int]:
    return np.bincount(assign_bins(lengths[batch], BINS), minlength=len(BINS)).tolist()


def mean_imbalance(plan, lengths) -> float:
    return float(np.mean([token_imbalance([lengths[b].sum() for b in step]) for step in plan[:-1]]))


# --------------------------------------------------------------------------- bins, counts, imbalance


def test_assign_bins_upper_bounds_inclusive_and_overflow_to_last_bin():
    lengths = np.array([1, 128, 129, 256, 257, 384, 385, 512, 600])
    assert assign_bins(lengths, BINS).tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 3]
    with pytest.raises(ConfigError, match="balance.bins"):
        assign_bins(lengths, [256, 128])


def largest_remainder_by_fractions(hist, size):
    """Independent largest-remainder rounding with exact fractions."""
    quotas = [Fraction(size * h, sum(hist)) for h in hist]
    counts = [int(q) for q in quotas]
    order = sorted(range(len(hist)), key=lambda k: (-(quotas[k] - counts[k]), k))
    for k in order[: size - sum(counts)]:
        counts[k] += 1
    return counts


@pytest.mark.parametrize("hist", [[300, 600, 400, 700], [1, 0, 0, 2249], [563, 562, 563, 562], [5, 5, 5, 1]])
@pytest.mark.parametrize("size", [1, 7, 16])
def test_batch_bin_counts_is_largest_remainder(hist, size):
    counts = batch_bin_counts(np.array(hist), size)
    assert counts.tolist() == largest_remainder_by_fractions(hist, size)
    assert counts.sum() == size and all(c <= h for c, h in zip(counts, hist, strict=True))


def test_token_imbalance():
    assert token_imbalance([100, 100, 100]) == 1.0
    assert token_imbalance([300, 100, 200]) == pytest.approx(1.5)
    assert token_imbalance([0, 0]) == 1.0


# --------------------------------------------------------------------------- the plan contract


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("world_size,local_world_size", LAYOUTS)
def test_every_sample_once_and_equal_steps(method, world_size, local_world_size):
    lengths = make_shard_lengths()
    plan = make_plan(lengths, method, world_size, local_world_size)
    assert len(plan) == -(-len(lengths) // (world_size * 16))
    assert all(len(step) == world_size for step in plan)  # every rank has every step
    everything = np.concatenate([batch for step in plan for batch in step])
    assert np.array_equal(np.sort(everything), np.arange(len(lengths)))
    assert all(len(batch) == 16 for step in plan[:-1] for batch in step)
    last_sizes = [len(batch) for batch in plan[-1]]
    assert max(last_sizes) - min(last_sizes) <= 1 and sum(last_sizes) == len(lengths) % (world_size * 16)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("left", [3, 8, 9])
def test_no_rank_is_ever_without_a_sequence_fewer_left_than_ranks_are_left_out(method, left):
    """A rank with no sequence in a step could not join its gradient all-reduce: a last step of fewer sequences
    than ranks is left out of the epoch (3 of 8 ranks here), one of at least as many is spread (8, 9)."""
    lengths = make_mlperf_like_lengths(2 * 8 * 4 + left)  # 2 full steps of 8 ranks x 4, then `left` samples
    plan = make_plan(lengths, method, world_size=8, local_world_size=4, micro_batch_size=4)
    everything = np.sort(np.concatenate([b for s in plan for b in s]))
    assert all(len(batch) >= 1 for step in plan for batch in step)
    if left < 8:
        assert len(plan) == 2 and len(everything) == 64 and len(np.unique(everything)) == 64
    else:
        assert len(plan) == 3 and np.array_equal(everything, np.arange(len(lengths)))
        assert sorted(len(batch) for batch in plan[-1]) == [1] * (16 - left) + [2] * (left - 8)
    sampler = RankBatchSampler(lengths, method, BINS, 4, seed=0, world_size=8, local_world_size=4)
    assert sampler.steps_per_epoch == len(plan)


@pytest.mark.parametrize("n", [64, 97, 100, 131])
@pytest.mark.parametrize("world_size,micro,accumulation", [(1, 4, 1), (1, 4, 3), (2, 4, 1), (2, 2, 3), (4, 3, 2)])
def test_optimizer_steps_are_the_steps_the_loop_takes_to_a_budget(n, world_size, micro, accumulation):
    """Counted against the plans themselves: steps of `accumulation` micro-batch rounds, epoch after epoch, until
    the sequences trained reach the budget."""
    lengths = make_mlperf_like_lengths(n)
    sampler = RankBatchSampler(lengths, "none", BINS, micro, seed=0, world_size=world_size, local_world_size=1)
    for budget in (1, 50, n, 3 * n + 7):
        steps = samples = epoch = 0
        while samples < budget:
            rounds = make_plan(lengths, "none", world_size, 1, micro_batch_size=micro, epoch=epoch)
            for start in range(0, len(rounds), accumulation):
                samples += sum(len(b) for step in rounds[start : start + accumulation] for b in step)
                steps += 1
                if samples >= budget:
                    break
            epoch += 1
        assert sampler.optimizer_steps(budget, accumulation) == steps, budget


def trained(plan, batches: int) -> list[int]:
    """The samples a plan's first `batches` micro-batches of every rank train, sorted."""
    return sorted(int(i) for step in plan[:batches] for batch in step for i in batch)


@st.composite
def resumes(draw):
    """A run on `saved` ranks stopped after `batches` micro-batches of an epoch, resumed on `ranks`: any lengths,
    micro-batch, method, seed, epoch and shuffling; half the time at an optimizer step of a global batch both
    numbers of ranks share (what a resume of the same config stops at)."""
    lengths = np.array(draw(st.lists(st.integers(1, 512), min_size=4, max_size=200)), dtype=np.int64)
    saved, ranks, micro = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 6))
    steps = steps_per_epoch(len(lengths), micro, saved)
    if draw(st.booleans()):
        accumulation = np.lcm(saved, ranks) // saved * draw(st.integers(1, 3))  # same global batch on both
        batches = accumulation * draw(st.integers(0, steps // accumulation)) if steps >= accumulation else steps
    else:
        batches = draw(st.integers(0, steps))
    method, seed, epoch, shuffle = (
        draw(st.sampled_from(METHODS)),
        draw(st.integers(0, 2**32 - 1)),
        draw(st.integers(0, 3)),
        draw(st.booleans()),
    )
    return lengths, seed, epoch, shuffle, method, micro, saved, ranks, batches


@pytest.mark.hypothesis
@given(resume=resumes())
@settings(max_examples=examples(ci=300, fuzz=5000))
def test_a_resume_on_another_number_of_ranks_goes_on_after_the_same_samples(resume):
    """`resume_batch` against the plans themselves: where it gives a position, the resumed plan's micro-batches
    before it train exactly the samples the saved run's did (nothing again, nothing skipped), or the epoch was done
    on both; under `none` at an optimizer step of a global batch both share it always gives one; `stratified` and
    `local_presort` (whose plans part with the number of ranks) only at an epoch's start or end, or on as many ranks."""
    lengths, seed, epoch, shuffle, method, micro, saved, ranks, batches = resume
    before = plan_epoch(lengths, method, [64, 128, 256, 512], micro, saved, saved, seed, epoch, shuffle)
    after = plan_epoch(lengths, method, [64, 128, 256, 512], micro, ranks, ranks, seed, epoch, shuffle)
    at = resume_batch(method, len(lengths), micro, saved, batches, ranks)
    if batches == len(before):
        assert at == len(after)  # the epoch is done: the next starts (the few either plan leaves out stay out)
    elif at is not None:
        assert trained(after, at) == trained(before, batches)
    if method == "none" and (batches * saved) % ranks == 0:
        assert at is not None
    if method != "none" and saved != ranks and 0 < batches < len(before):
        assert at is None


def test_stratified_plans_on_other_numbers_of_ranks_part_after_their_first_round():
    """Why `stratified` (and `local_presort`, which re-deals its steps) resume only on as many ranks: the rounds a
    plan draws its micro-batches in depend on the number of ranks, so after the first round the same number of
    micro-batches trains other samples on 1 rank than on 2 (and under `none` the same)."""
    lengths = make_mlperf_like_lengths(96, seed=1)
    for method, parts in (("stratified", True), ("none", False)):
        one, two = (plan_epoch(lengths, method, BINS, 4, ranks, ranks, 1234, 0) for ranks in (1, 2))
        differ = [k for k in range(len(two) + 1) if trained(one, 2 * k) != trained(two, k)]
        assert bool(differ) == parts, differ
        assert all(resume_batch(method, 96, 4, 2, k, 1) == (None if parts and 0 < k < len(two) else 2 * k)
                   for k in range(len(two) + 1))  # fmt: skip


def test_a_training_set_smaller_than_the_ranks_is_refused():
    with pytest.raises(ConfigError, match="3 sequence\\(s\\), fewer than the 4 ranks"):
        RankBatchSampler(np.array([10, 20, 30]), "none", BINS, 1, seed=0, world_size=4, local_world_size=4)


@pytest.mark.parametrize("method", METHODS)
def test_deterministic_per_seed_and_epoch(method):
    lengths = make_shard_lengths()

    def flat(**kw):
        return np.concatenate([b for s in make_plan(lengths, method, 4, 2, **kw) for b in s])

    assert np.array_equal(flat(seed=3, epoch=1), flat(seed=3, epoch=1))
    assert not np.array_equal(flat(seed=3, epoch=1), flat(seed=3, epoch=2))
    assert not np.array_equal(flat(seed=3, epoch=1), flat(seed=4, epoch=1))
    assert np.array_equal(flat(epoch=1, shuffle=False), flat(epoch=2, shuffle=False))


def test_unknown_method_and_bad_layout_raise():
    lengths = make_mlperf_like_lengths(100)
    with pytest.raises(ConfigError, match="balance.method"):
        make_plan(lengths, "sorted", 2, 2)
    with pytest.raises(ConfigError, match="local_world_size"):
        make_plan(lengths, "none", 6, 4)


# --------------------------------------------------------------------------- stratified


@pytest.mark.parametrize("world_size,local_world_size", LAYOUTS)
def test_stratified_full_batches_share_one_histogram_when_bins_are_proportional(world_size, local_world_size):
    rng = np.random.default_rng(1)
    lengths = rng.permutation(np.repeat([100, 200, 300, 500], [563, 562, 563, 562]))  # N = 2250
    plan = make_plan(lengths, "stratified", world_size, local_world_size, micro_batch_size=8)
    histograms = {tuple(histogram(batch, lengths)) for step in plan[:-1] for batch in step}
    assert histograms == {(2, 2, 2, 2)}


@pytest.mark.parametrize("world_size,local_world_size", LAYOUTS)
def test_stratified_batches_follow_global_histogram_until_a_bin_runs_out(world_size, local_world_size):
    lengths = make_shard_lengths()
    global_hist = histogram(np.arange(len(lengths)), lengths)
    counts = largest_remainder_by_fractions(global_hist, 16)
    available = min(h // c for h, c in zip(global_hist, counts, strict=True) if c)  # batches before a bin runs out
    first_round_steps = available // world_size
    plan = make_plan(lengths, "stratified", world_size, local_world_size)
    assert first_round_steps >= 0.9 * (len(plan) - 1)
    assert all(histogram(b, lengths) == counts for step in plan[:first_round_steps] for b in step)
    # the few later steps re-proportion what is left, still one histogram for all ranks of a step
    for step in plan[first_round_steps:-1]:
        assert len({tuple(histogram(b, lengths)) for b in step}) == 1


# --------------------------------------------------------------------------- local presort


def test_presort_node_snake_two_ranks_by_hand():
    lengths = np.array([10, 50, 30, 60, 20, 40])
    # sorted: 3(60) 1(50) | 5(40) 2(30) | 4(20) 0(10); the middle row is reversed
    columns = presort_node([np.array([0, 1, 2]), np.array([3, 4, 5])], lengths)
    assert [c.tolist() for c in columns] == [[3, 2, 4], [1, 5, 0]]


def test_presort_node_snake_three_ranks_with_partial_rows_by_hand():
    lengths = np.array([70, 60, 50, 40, 30, 20, 10, 5])
    batches = [np.array([7, 0, 3]), np.array([1, 4]), np.array([6, 2, 5])]
    # rows: [0 1 2] -> cols 0 1 2; [3 4 5] reversed -> cols 2 1 0; [6 7] -> cols 0 1
    assert [c.tolist() for c in presort_node(batches, lengths)] == [[0, 5, 6], [1, 4, 7], [2, 3]]
    # a partial odd row fills from the right: [3 4] -> cols 2 1
    five = [np.array([0, 1, 2]), np.array([3]), np.array([4])]
    assert [c.tolist() for c in presort_node(five, lengths)] == [[0], [1, 4], [2, 3]]


def test_presort_node_ties_keep_gathered_order_and_empty_node():
    lengths = np.full(4, 128)
    assert [c.tolist() for c in presort_node([np.array([2, 0]), np.array([3, 1])], lengths)] == [[2, 1], [0, 3]]
    empty = np.array([], dtype=np.int64)
    assert [len(c) for c in presort_node([empty, empty], lengths)] == [0, 0]


@pytest.mark.parametrize("world_size,local_world_size", LAYOUTS)
def test_local_presort_only_reshuffles_within_each_node(world_size, local_world_size):
    lengths = make_shard_lengths()
    stratified = make_plan(lengths, "stratified", world_size, local_world_size)
    presorted = make_plan(lengths, "local_presort", world_size, local_world_size)
    for strat_step, pre_step in zip(stratified, presorted, strict=True):
        for start in range(0, world_size, local_world_size):
            node = slice(start, start + local_world_size)
            assert Counter(np.concatenate(pre_step[node]).tolist()) == Counter(
                np.concatenate(strat_step[node]).tolist()
            )
            expected = presort_node(strat_step[node], lengths)
            assert all(np.array_equal(a, b) for a, b in zip(pre_step[node], expected, strict=True))


@pytest.mark.parametrize("world_size,local_world_size", [(8, 8), (8, 4)])
def test_local_presort_evens_tokens_on_mlperf_like_lengths(world_size, local_world_size):
    lengths = make_mlperf_like_lengths(20_000, seed=5)
    imbalance = {m: mean_imbalance(make_plan(lengths, m, world_size, local_world_size), lengths) for m in METHODS}
    assert imbalance["local_presort"] < imbalance["stratified"] < imbalance["none"]
    if local_world_size == world_size:
        assert imbalance["local_presort"] <= 1.02


# --------------------------------------------------------------------------- the sampler


@pytest.mark.parametrize(
    "method,world_size,local_world_size", [("none", 4, 2), ("stratified", 4, 2), ("local_presort", 1, 1)]
)
def test_sampler_without_exchange_equals_plan(method, world_size, local_world_size):
    lengths = make_shard_lengths()
    plan = make_plan(lengths, method, world_size, local_world_size, seed=7, epoch=2)
    for rank in range(world_size):
        layout = dict(rank=rank, world_size=world_size, local_world_size=local_world_size)
        sampler = build_batch_sampler(lengths, method, BINS, 16, seed=7, **layout)
        got = list(sampler.batches(2))
        assert len(got) == len(sampler) == len(plan)
        assert all(np.array_equal(g, step[rank]) for g, step in zip(got, plan, strict=True))


@pytest.mark.parametrize("method", ["none", "stratified", "local_presort"])
def test_the_loads_are_every_ranks_tokens_and_sequences_of_each_micro_batch(method):
    """231 samples over 4 ranks of micro-batch 16 (2 nodes of 2): the last step's batches differ in size. What
    ranks receive in local_presort's exchange is checked over gloo below."""
    lengths = make_shard_lengths()[:231]
    plan = make_plan(lengths, method, 4, 2, seed=3, epoch=1)
    sampler = RankBatchSampler(lengths, method, BINS, 16, seed=3, rank=1, world_size=4, local_world_size=2)
    loads = sampler.loads(1)
    assert loads.shape == (len(plan), 4, 2)
    assert loads.tolist() == [[[int(lengths[b].sum()), len(b)] for b in step] for step in plan]
    assert len(set(loads[-1, :, 1].tolist())) > 1 and loads[:, :, 1].sum() == len(lengths)
    # The most any micro-batch holds (model.static_shapes' budget), of every rank's: the tokens from the loads above,
    # another count per sample (here each sample's index) from the plan's batches
    assert sampler.largest(1, lengths) == loads[:, :, 0].max()
    index = np.arange(len(lengths))
    assert sampler.largest(1, index) == max(int(b.sum()) for step in plan for b in step)


def _sampler_worker(rank: int, world_size: int, init_method: str, out_dir: str, lengths: np.ndarray) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
    try:
        for local_world_size in (2, 1):  # one node of two ranks; two nodes of one rank
            group = make_node_groups(world_size, local_world_size)
            layout = dict(rank=rank, world_size=world_size, local_world_size=local_world_size, node_group=group)
            sampler = build_batch_sampler(lengths, "local_presort", BINS, 16, seed=11, **layout)
            for epoch in (0, 1):
                batches = list(sampler.batches(epoch))
                np.savez(f"{out_dir}/r{rank}_l{local_world_size}_e{epoch}.npz", *batches)
                np.save(f"{out_dir}/loads_r{rank}_l{local_world_size}_e{epoch}.npy", sampler.loads(epoch))
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_sampler_all_gather_over_gloo_equals_plan(tmp_path):
    from tests.trainer.conftest import start_ranks

    lengths = make_shard_lengths()
    world_size = 2
    init_method = f"file://{tmp_path}/rendezvous"
    start_ranks(_sampler_worker, (world_size, init_method, str(tmp_path), lengths), world_size)
    for local_world_size in (2, 1):
        for epoch in (0, 1):
            plan = make_plan(lengths, "local_presort", world_size, local_world_size, seed=11, epoch=epoch)
            for rank in range(world_size):
                with np.load(tmp_path / f"r{rank}_l{local_world_size}_e{epoch}.npz") as saved:
                    got = [saved[f"arr_{i}"] for i in range(len(saved.files))]
                assert len(got) == len(plan)
                assert all(np.array_equal(g, step[rank]) for g, step in zip(got, plan, strict=True))
                # every rank's own count of the loads (no exchange) is what each rank received in the exchange
                counts = [(int(lengths[g].sum()), len(g)) for g in got]
                for counter in range(world_size):
                    loads = np.load(tmp_path / f"loads_r{counter}_l{local_world_size}_e{epoch}.npy")
                    assert loads[:, rank].tolist() == [list(c) for c in counts]


# --------------------------------------------------------------------------- the contract on any input


@st.composite
def epoch_inputs(draw):
    """Any lengths (including none, and fewer than one step), bins, micro-batch size and node layout."""
    lengths = np.array(draw(st.lists(st.integers(1, 512), max_size=300)), dtype=np.int64)
    bins = sorted(draw(st.sets(st.integers(1, 600), min_size=1, max_size=6)))
    local_world_size = draw(st.integers(1, 4))
    world_size = local_world_size * draw(st.integers(1, 3))
    return lengths, bins, draw(st.integers(1, 9)), world_size, local_world_size


@pytest.mark.hypothesis
@given(inputs=epoch_inputs(), method=st.sampled_from(METHODS), seed=st.integers(0, 2**32 - 1),
       epoch=st.integers(0, 5), shuffle=st.booleans())  # fmt: skip
@settings(max_examples=examples(ci=150, fuzz=3000))
def test_every_plan_keeps_the_module_contract(inputs, method, seed, epoch, shuffle):
    """The contract of trainer/balance.py's docstring, on inputs drawn by Hypothesis: every sample once but for
    fewer than world_size left over, the same number of steps for every rank, full micro-batches but in the last
    step, a last step of at least one sample a rank; and local_presort only re-deals each node's samples, its ranks'
    tokens in a full step within the node's range of lengths of each other."""
    lengths, bins, micro_batch_size, world_size, local_world_size = inputs
    plan = plan_epoch(lengths, method, bins, micro_batch_size, world_size, local_world_size, seed, epoch, shuffle)
    global_batch = world_size * micro_batch_size
    full, rest = divmod(len(lengths), global_batch)
    left_out = rest if rest < world_size else 0
    assert len(plan) == full + (rest >= world_size)
    assert all(len(step) == world_size for step in plan)
    everything = [int(i) for step in plan for batch in step for i in batch]
    assert len(everything) == len(set(everything)) == len(lengths) - left_out
    assert set(everything) <= set(range(len(lengths)))
    assert all(len(batch) == micro_batch_size for step in plan[:-1] for batch in step)
    assert all(len(batch) >= 1 for step in plan for batch in step)
    if plan:
        last = [len(batch) for batch in plan[-1]]
        assert sum(last) == len(lengths) - left_out - (len(plan) - 1) * global_batch
        assert max(last) - min(last) <= 1
    again = plan_epoch(lengths, method, bins, micro_batch_size, world_size, local_world_size, seed, epoch, shuffle)
    assert all(np.array_equal(a, b) for s, t in zip(plan, again, strict=True) for a, b in zip(s, t, strict=True))
    if method != "local_presort":
        return
    stratified = plan_epoch(lengths, "stratified", bins, micro_batch_size, world_size, local_world_size, seed,
                            epoch, shuffle)  # fmt: skip
    for presorted_step, stratified_step in zip(plan, stratified, strict=True):
        for start in range(0, world_size, local_world_size):
            node = [lengths[b] for b in presorted_step[start : start + local_world_size]]
            before = np.concatenate(stratified_step[start : start + local_world_size])
            assert sorted(np.concatenate(presorted_step[start : start + local_world_size]).tolist()) == sorted(
                before.tolist()
            )
            if all(len(b) == micro_batch_size for b in node):
                tokens = [int(b.sum()) for b in node]
                assert max(tokens) - min(tokens) <= int(lengths[before].max() - lengths[before].min())
