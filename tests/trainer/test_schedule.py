"""trainer.schedule: the MLPerf warmup + polynomial decay, checked against numbers worked out by hand."""

from __future__ import annotations

import pytest
import torch

from trainer.config import ScheduleConfig
from trainer.schedule import build_scheduler, idle_steps, mlperf_lr

BASE, END = 4e-3, 1e-4


def lr_at(step, warmup=10, start=0, total=100, power=1.0, end=END):
    return mlperf_lr(step, BASE, warmup, start, total, power, end)


@pytest.mark.parametrize(
    ("step", "start", "expected"),
    [
        (0, 0, 0.0),  # warmup starts from 0 at step 0
        (4, 0, BASE * 4 / 10),
        (0, -5, BASE * 5 / 10),  # a negative offset starts part of the way up
        (3, -5, BASE * 8 / 10),
        (4, -5, BASE * 9 / 10),
        (5, -5, (BASE - END) * (1 - 5 / 100) + END),  # s - S = 10: warmup is over, decay from the step count
    ],
)
def test_warmup_is_linear_from_the_offset(step, start, expected):
    assert lr_at(step, start=start) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("power", [1.0, 0.5])
def test_peak_decay_and_end(power):
    assert lr_at(10, power=power) == pytest.approx((BASE - END) * 0.9**power + END, rel=1e-12)  # first after warmup
    assert lr_at(55, power=power) == pytest.approx((BASE - END) * 0.45**power + END, rel=1e-12)
    assert lr_at(100, power=power) == END
    assert lr_at(250, power=power) == END  # past the horizon the rate stays at end_lr


def test_power_half_is_above_linear_during_decay():
    assert lr_at(55, power=0.5) > lr_at(55, power=1.0)


def test_no_warmup_goes_straight_to_decay():
    assert lr_at(0, warmup=0) == pytest.approx(BASE, rel=1e-12)
    assert lr_at(0, warmup=0, start=3) == pytest.approx(BASE, rel=1e-12)
    assert lr_at(20, warmup=0) == pytest.approx((BASE - END) * 0.8 + END, rel=1e-12)


def test_positive_offset_never_gives_a_negative_rate():
    assert lr_at(2, start=5) == 0.0
    assert lr_at(7, start=5) == pytest.approx(BASE * 2 / 10, rel=1e-12)


def test_lambda_lr_follows_mlperf_lr_when_driven_by_an_optimizer():
    cfg = ScheduleConfig(warmup_steps=4, start_warmup_step=-2, power=0.5, end_lr=END)
    param = torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.SGD([param], lr=BASE)
    scheduler = build_scheduler(optimizer, cfg, base_lr=BASE, total_steps=12)  # cfg.total_steps is None: use 12
    seen = []
    for _ in range(15):
        param.grad = torch.ones(3)
        seen.append(optimizer.param_groups[0]["lr"])  # the rate this optimizer step runs with
        optimizer.step()
        scheduler.step()
    expected = [mlperf_lr(s, BASE, 4, -2, 12, 0.5, END) for s in range(15)]
    assert seen == pytest.approx(expected, rel=1e-12)
    assert seen[0] == pytest.approx(BASE * 2 / 4) and seen[-1] == pytest.approx(END)


def test_config_total_steps_wins_over_the_argument():
    cfg = ScheduleConfig(warmup_steps=0, total_steps=10, power=1.0, end_lr=0.0)
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=BASE)
    scheduler = build_scheduler(optimizer, cfg, base_lr=BASE, total_steps=1000)
    for _ in range(5):
        param.grad = torch.ones(1)
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(BASE * 0.5, rel=1e-12)


def mlperf_reference_lr(step, init_lr, warmup, start, total, power, end):
    """mlcommons/training language_model/tensorflow/bert/optimization.py `create_optimizer`, transcribed: TF's
    polynomial_decay (cycle=False) of the global step read before the update, blended with the linear warmup of
    `global_step - start_warmup_step` while that is below `num_warmup_steps` (the reference's end_lr is 0)."""
    decayed = (init_lr - end) * (1 - min(step, total) / total) ** power + end
    if not warmup:
        return decayed
    is_warmup = 1.0 if step - start < warmup else 0.0
    return (1.0 - is_warmup) * decayed + is_warmup * init_lr * ((step - start) / warmup)


@pytest.mark.parametrize("power", [1.0, 0.5, 2.0])
@pytest.mark.parametrize("end", [0.0, END])
def test_matches_the_mlperf_reference_on_every_step(power, end):
    checked = 0
    for warmup in (0, 1, 7, 30):
        for start in (-9, -1, 0, 4):
            for total in (1, 12, 40):
                for step in range(60):
                    expected = mlperf_reference_lr(step, BASE, warmup, start, total, power, end)
                    got = mlperf_lr(step, BASE, warmup, start, total, power, end)
                    if expected < 0:  # before a positive start offset the reference's rate is negative: ours 0
                        assert got == 0.0 and start > 0 and step < start
                        continue
                    assert got == pytest.approx(expected, rel=1e-12, abs=1e-18), (warmup, start, total, step)
                    checked += 1
    assert checked > 2800  # all but the 36 steps before the positive offset


@pytest.mark.parametrize(
    ("warmup", "start", "power", "end", "idle"),
    [
        (0, 0, 1.0, 0.0, 8),  # 0 from step index 12 (the horizon) on: indices 12..19
        (4, 0, 1.0, 0.0, 8),  # a warmup inside the horizon changes nothing
        (15, 0, 1.0, 0.0, 5),  # a warmup past the horizon: it rises to index 14, then drops to 0 at 15
        (15, -5, 2.0, 0.0, 8),  # started part of the way up: over at 10, inside the horizon
        (0, 0, 0.0, 0.0, 0),  # power 0: (1 - 1) ** 0 = 1, the base rate for ever
        (0, 0, 1.0, 1e-5, 0),  # an end rate above 0 trains on
    ],
    ids=["decay", "warmup", "long-warmup", "offset-warmup", "power-0", "end-lr"],
)
def test_idle_steps_are_the_steps_past_the_horizon_whose_rate_is_0(warmup, start, power, end, idle):
    """20 steps over a horizon of 12: the steps from index 12 on whose rate, evaluated one by one, is 0 (a warmup's
    first step at 0 before the horizon does not count: the rate rises after it)."""
    cfg = ScheduleConfig(warmup_steps=warmup, start_warmup_step=start, power=power, end_lr=end)
    zero = [s for s in range(12, 20) if mlperf_lr(s, BASE, warmup, start, 12, power, end) == 0]
    assert zero == list(range(20 - len(zero), 20)) and len(zero) == idle  # the last ones, all of them
    assert idle_steps(cfg, total_steps=12, run_steps=20) == idle
    assert idle_steps(cfg, total_steps=12, run_steps=12) == 0  # the run ends at the horizon
