"""The curve table and the surrogate over it, against the formulas the synthetic table was written from."""

from __future__ import annotations

import math

import pytest

from hpo.errors import HpoError
from hpo.simulation.surrogate import Config, Surrogate
from hpo.simulation.table import load_table
from tests.hpo.simulation.conftest import EVERY, MAX_SAMPLES, accuracy, write_table


@pytest.fixture
def surrogate(tmp_path):
    return Surrogate(load_table(write_table(tmp_path / "curves.jsonl")))


def test_a_grid_point_gives_its_recorded_curve_exactly(surrogate):
    curve = surrogate.curve(Config("lamb", 1e-2, 40, 128, seed=1))
    assert curve.evals == tuple(
        (s, accuracy("lamb", 1e-2, 40, 128, 1, s)) for s in range(EVERY, MAX_SAMPLES + 1, EVERY)
    )
    assert not curve.diverged and curve.end == MAX_SAMPLES


def test_between_grid_points_the_curve_is_the_log_lr_blend_of_its_neighbours(surrogate):
    lr = 10**-2.25  # a quarter of the way from 1e-3 to 1e-2 in log(lr)... from 1e-2 towards 1e-3: w = 0.75
    curve = surrogate.curve(Config("adamw", lr, 0, 32, seed=2))
    w = (math.log(lr) - math.log(1e-3)) / (math.log(1e-2) - math.log(1e-3))
    assert w == pytest.approx(0.75)
    for samples, value in curve.evals:
        left, right = accuracy("adamw", 1e-3, 0, 32, 2, samples), accuracy("adamw", 1e-2, 0, 32, 2, samples)
        assert value == pytest.approx((1 - w) * left + w * right, abs=1e-12)
        assert min(left, right) < value < max(left, right)


def test_another_seed_gives_another_recorded_curve_and_seeds_wrap(surrogate):
    config = Config("adamw", 1e-3, 0, 32, seed=1234)
    other = Config("adamw", 1e-3, 0, 32, seed=1235)
    assert surrogate.recorded_seed(1234) == 1234 % 3 and surrogate.recorded_seed(1235) == 1235 % 3
    assert surrogate.curve(config).evals != surrogate.curve(other).evals
    assert surrogate.curve(config).evals[-1][1] == accuracy("adamw", 1e-3, 0, 32, 1234 % 3, MAX_SAMPLES)
    assert surrogate.curve(Config("adamw", 1e-3, 0, 32, seed=1237)) == surrogate.curve(config)  # 1237 = 1234 + 3


def test_accuracy_between_evaluations_is_linear_in_samples(surrogate):
    curve = surrogate.curve(Config("lamb", 1e-2, 0, 32, seed=0))
    a, b = curve.accuracy_at(2048), curve.accuracy_at(3072)
    assert curve.accuracy_at(2560) == pytest.approx((a + b) / 2)
    assert curve.evaluations(2048, 6000) == (
        (2048, a),
        (4096, curve.accuracy_at(4096)),
        (6000, curve.accuracy_at(6000)),
    )


def test_divergence_follows_the_nearer_neighbour(surrogate):
    near_diverged = surrogate.curve(Config("lamb", 10**-1.25, 0, 32, seed=0))  # w = 0.75 towards 1e-1
    assert near_diverged.diverged and near_diverged.end == 3072
    assert [s for s, _ in near_diverged.evals] == [1024, 2048]
    far_diverged = surrogate.curve(Config("lamb", 10**-1.75, 0, 32, seed=0))  # w = 0.25
    assert not far_diverged.diverged and far_diverged.end == MAX_SAMPLES
    held = accuracy("lamb", 1e-1, 0, 32, 0, 2048)  # the diverged run's last accuracy, held after its end
    assert far_diverged.accuracy_at(MAX_SAMPLES) == pytest.approx(
        0.75 * accuracy("lamb", 1e-2, 0, 32, 0, MAX_SAMPLES) + 0.25 * held
    )


def test_points_outside_the_table_are_refused_by_name(surrogate):
    with pytest.raises(HpoError, match=r"optimizer.lr 0.5 is outside the curve table's range \[0.0001, 0.1\]"):
        surrogate.curve(Config("adamw", 0.5, 0, 32))
    with pytest.raises(HpoError, match=r"schedule.warmup_steps=20.*schedule.warmup_steps in \[0, 40\]"):
        surrogate.curve(Config("adamw", 1e-3, 20, 32))


def test_a_bad_table_line_is_named(tmp_path):
    path = write_table(tmp_path / "curves.jsonl")
    lines = path.read_text().splitlines()
    lines[3] = lines[3][:-5]
    path.write_text("\n".join(lines))
    with pytest.raises(HpoError, match=r"curves.jsonl line 4: not JSON"):
        load_table(path)
    with pytest.raises(HpoError, match=r"cannot read the curve table .*missing.jsonl.*bench.curves.generate"):
        load_table(tmp_path / "missing.jsonl")
    (tmp_path / "binary.jsonl").write_bytes(b"\xff\xfe{}")
    with pytest.raises(HpoError, match=r"binary.jsonl: not a curve table: not UTF-8 text \(byte 0xff at offset 0\)"):
        load_table(tmp_path / "binary.jsonl")


def test_a_handicapped_optimizer_reads_another_ones_curves_delayed(tmp_path):
    table = load_table(write_table(tmp_path / "curves.jsonl"))
    plain = Surrogate(table)
    handicapped = Surrogate(table, {"lamb": ("adamw", 2 * EVERY)})
    for lr in (1e-3, 10**-2.5):
        original = plain.curve(Config("adamw", lr, 0, 32, seed=1))
        delayed = handicapped.curve(Config("lamb", lr, 0, 32, seed=1))
        assert [s for s, _ in delayed.evals] == list(range(EVERY, MAX_SAMPLES + 1, EVERY))
        assert [a for _, a in delayed.evals[:2]] == [original.evals[0][1]] * 2  # nothing learned while delayed
        assert [a for _, a in delayed.evals[2:]] == [a for _, a in original.evals[: len(original.evals) - 2]]
        target = original.evals[3][1]  # reached at 4,096 samples by the original: 6,144 by the delayed one
        first = next(s for s, a in delayed.evals if a >= target)
        assert first == next(s for s, a in original.evals if a >= target) + 2 * EVERY
    tie = Surrogate(table, {"lamb": ("adamw", 0)})
    assert tie.curve(Config("lamb", 1e-3, 40, 128, 2)) == plain.curve(Config("adamw", 1e-3, 40, 128, 2))
    diverging = handicapped.curve(Config("lamb", 1e-1, 0, 32, seed=0))
    assert diverging.diverged and diverging.end == 3072 + 2 * EVERY


def test_a_learning_rate_a_rounding_error_above_a_grid_point_reads_that_point(surrogate):
    """Within the table's tolerance (1e-9 relative) a learning rate is its grid point, from above as from below."""
    exact = surrogate.curve(Config("adamw", 1e-3, 0, 32, seed=1))
    for lr in (1e-3 * (1 + 1e-12), 1e-3 * (1 - 1e-12)):
        assert surrogate.curve(Config("adamw", lr, 0, 32, seed=1)) == exact
