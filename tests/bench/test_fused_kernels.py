"""bench/fused_kernels.py: the fused kernels timed under alternative launches, each checked against the defaults'
outputs first, the fastest written in the form `trainer.fused.set_launch` takes, and read back by the throughput
benchmark's --fused-launch. On the CPU the kernels run in Triton's interpreter (a process of its own), which checks
the script, not the kernels' speed: no test here reads a time."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.fused_kernels import CANDIDATES, agree, checked_outputs, pick, use_launch, write_launches
from bench.fused_kernels import main as bench_main
from trainer.fused import LAUNCH_PARAMETERS, _launch_overrides, set_launch

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--device", "cpu", "--tokens", "37", "--hidden", "48", "--intermediate", "80", "--copy-bytes", "100000"]


def run_bench(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"}
    return subprocess.run([sys.executable, "-m", "bench.fused_kernels", *SMALL, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


@pytest.fixture
def restored_launch():
    yield
    set_launch({})


def test_outputs_agree_only_when_equal_masks_and_each_value_within_its_dtypes_rounding():
    values = torch.linspace(-3, 3, 1000)
    mask = (torch.arange(1000) % 7 != 0).to(torch.uint8)
    reference = [values, values.bfloat16(), mask]
    assert agree(reference, [values.clone(), values.bfloat16().clone(), mask.clone()]) is None
    nudged = values.bfloat16().clone()
    nudged[::10] = torch.nextafter(nudged[::10].float(), torch.tensor(math.inf)).bfloat16()  # a tenth off by an ulp
    assert agree(reference, [values, nudged, mask]) is None
    unwritten = values.clone()
    unwritten[500:] = math.nan
    assert "output 0: 500 values not finite" in agree(reference, [unwritten, values.bfloat16(), mask])
    flipped = mask.clone()
    flipped[3] = 1 - flipped[3]
    assert "output 2: 1 of 1000 values differ" in agree(reference, [values, values.bfloat16(), flipped])
    off = agree(reference, [values * 1.001, *reference[1:]])  # all but the two nearest 0 (within ATOL of 3)
    assert "output 0: 998 of 1000 values beyond 1e-05 relative" in off
    assert "not (1000,)" in agree(reference, [values[:999], values.bfloat16(), mask])
    rows = torch.randn(30000, 64).bfloat16()  # one row of many left as zeros: each value is checked, not the norm
    zeroed = rows.clone()
    zeroed[12345] = 0
    assert "output 0: 64 of 1920000 values beyond" in agree([rows], [zeroed])


def test_a_launch_is_checked_with_its_fresh_memory_filled_so_that_an_unwritten_value_shows():
    """What a launch makes with torch.empty (its outputs, the backward's partial sums) is NaN, or 255 for bytes,
    until the kernel writes it: memory the allocator hands back would hold the last launch's (right) values."""
    keep = torch.ones(8, dtype=torch.uint8)
    made = checked_outputs(lambda: [torch.empty(8), torch.empty(8, dtype=torch.uint8), torch.ones(8)])
    assert torch.isnan(made[0]).all() and (made[1] == 255).all()
    assert "output 0: 8 values not finite" in agree([torch.ones(8), keep, torch.ones(8)], made)
    assert (
        agree([torch.ones(8), torch.ones(8)], checked_outputs(lambda: [torch.empty(8).fill_(1), torch.ones(8)])) is None
    )
    assert not torch.are_deterministic_algorithms_enabled()  # restored after the check


def test_a_candidate_is_kept_only_where_it_beats_the_defaults_by_more_than_the_margin():
    fast, slow = {"ROWS": 2}, {"ROWS": 4}
    times = {"(default)": (1.00, None), "ROWS=2": (0.90, fast), "ROWS=4": (1.20, slow)}
    assert pick(times, 0.03) == ("ROWS=2", 0.90, fast)
    assert pick(times, 0.15) == ("(default)", 1.00, None)  # 10 % faster: within the margin
    assert pick({"(default)": (1.00, None), "ROWS=4": (1.20, slow)}, 0.03) == ("(default)", 1.00, None)
    assert pick({"ROWS=4": (1.20, slow)}, 0.03) == ("ROWS=4", 1.20, slow)  # the defaults left out: the one timed


def test_the_kept_launches_are_written_as_the_throughput_benchmark_reads_them(tmp_path, restored_launch):
    path = tmp_path / "launch.json"
    best = {"norm_forward": None, "norm_backward": CANDIDATES["norm_backward"][1], "gelu_backward": None}
    assert write_launches(path, best) == {"norm_backward": CANDIDATES["norm_backward"][1]}
    assert use_launch(path) == {"norm_backward": CANDIDATES["norm_backward"][1]}
    assert _launch_overrides == {"norm_backward": CANDIDATES["norm_backward"][1]}
    assert write_launches(path, {"gelu_forward": None}) == {} and use_launch(path) == {}


def test_set_launch_takes_each_kernels_own_parameters_as_powers_of_two_and_refuses_the_rest_whole(restored_launch):
    set_launch({"norm_backward": {"TILES_PER_PROGRAM": 16}})
    bad = [
        ({"norm_middle": {"ROWS": 1}}, "no kernel 'norm_middle'; the kernels are norm_forward, norm_backward"),
        ({"norm_forward": {"TILES_PER_PROGRAM": 8}}, "norm_forward takes ROWS, num_warps, not 'TILES_PER_PROGRAM'"),
        ({"gelu_forward": {"ROWS": 3}}, "gelu_forward.ROWS must be a power of two of at most 4096, not 3"),
        ({"gelu_forward": {"ROWS": 0}}, "gelu_forward.ROWS must be a power of two of at most 4096, not 0"),
        ({"gelu_forward": {"ROWS": True}}, "gelu_forward.ROWS must be a power of two of at most 4096, not True"),
        (
            {"gelu_backward": {"TILES_PER_PROGRAM": 8192}},
            "gelu_backward.TILES_PER_PROGRAM must be a power of two of at most 4096",
        ),
        ({"gelu_backward": {"num_warps": 64}}, "gelu_backward.num_warps must be a power of two of at most 32, not 64"),
        ({"gelu_forward": {"COLS": "8"}}, "gelu_forward.COLS must be a power of two of at most 4096, not '8'"),
        ({"norm_forward": [1, 2]}, "norm_forward: give its parameters as a mapping"),
    ]
    for overrides, message in bad:
        with pytest.raises(ValueError, match="launch: " + message.replace("(", r"\(").replace(")", r"\)")):
            set_launch({"gelu_forward": {"ROWS": 8}, **overrides})  # a good entry beside the bad one: none is set
        assert _launch_overrides == {"norm_backward": {"TILES_PER_PROGRAM": 16}}
    set_launch({})
    assert _launch_overrides == {}


def test_every_candidate_is_a_launch_set_launch_takes(restored_launch):
    assert set(CANDIDATES) == set(LAUNCH_PARAMETERS)
    for kernel, candidates in CANDIDATES.items():
        assert len({json.dumps(c, sort_keys=True) for c in candidates}) == len(candidates), kernel  # no repeats
        for candidate in candidates:
            set_launch({kernel: candidate})


@pytest.mark.slow  # the bench's runs in the interpreter (make test-all); the kernels' checks are in tests/trainer
def test_the_bench_checks_and_times_each_kernels_defaults_and_candidates_and_writes_what_it_kept(
    tmp_path, restored_launch
):
    pytest.importorskip("triton", reason="the fused kernels are Triton's (installed by make setup)")
    written = tmp_path / "launch.json"
    done = run_bench("--limit", "1", "--write", str(written))
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "fused kernels at 37 tokens, hidden 48, intermediate 80, bf16 products, bf16 residual stream" in lines[0]
    assert "interpreter" in lines[1]
    for kernel in LAUNCH_PARAMETERS:  # the defaults and the first candidate, each timed: no output differed
        timed = [line for line in lines if line.split()[:1] == [kernel] and line.rstrip().endswith("%")]
        first = " ".join(f"{k}={v}" for k, v in CANDIDATES[kernel][0].items())
        assert len(timed) == 2 and "(default)" in timed[0] and first in timed[1], (kernel, done.stdout)
        assert sum(line.startswith(f"  kept {kernel}: ") for line in lines) == 1
    assert "left out" not in done.stdout
    for op, calls in (("norm", 48), ("gelu", 24)):  # beside what eager PyTorch runs for the same work
        said = [line for line in lines if line.startswith(f"  {op}: eager PyTorch (")]
        assert len(said) == 1 and f"a step of {calls} calls (24 layers)" in said[0], done.stdout
    chosen = json.loads(written.read_text())  # which one is kept is a matter of time: either is a launch it ran
    assert all(parameters == CANDIDATES[kernel][0] for kernel, parameters in chosen.items()), chosen
    assert use_launch(written) == chosen


@pytest.mark.slow  # the bench's reference in the interpreter (make test-all); tests/trainer checks the kernels
def test_without_dropout_the_eager_reference_computes_what_the_kernels_do():
    """The eager rows time the same work: without dropout, the eager model's LayerNorm (its residual stream in bf16,
    as `model.half_residual` runs it) and GELU give the kernels' outputs within bf16 rounding; in fp32 within 1e-5."""
    pytest.importorskip("triton", reason="the fused kernels are Triton's (installed by make setup)")
    for dtype, within in (("bf16", "8e-03"), ("fp32", "1e-05")):
        done = run_bench("--limit", "0", "--dropout", "0", "--dtype", dtype, "--residual", dtype)
        assert done.returncode == 0, done.stderr[-3000:]
        for op in ("norm", "gelu"):
            assert f"  {op}: without dropout, |eager - fused| / |fused| = " in done.stdout, done.stdout
            said = done.stdout.split(f"  {op}: without dropout, ")[1].splitlines()[0]
            assert said.endswith(f"the same function, within {within}"), said


@pytest.mark.slow  # the bench's runs in the interpreter (make test-all); the kernels' checks are in tests/trainer
def test_past_its_seconds_the_bench_begins_no_kernel_and_writes_that_the_defaults_stay(tmp_path):
    pytest.importorskip("triton", reason="the fused kernels are Triton's (installed by make setup)")
    written = tmp_path / "launch.json"
    done = run_bench("--kernels", "norm_forward,gelu_forward", "--max-seconds", "0", "--write", str(written))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "norm_forward   not run: time is up" in done.stdout and "gelu_forward   not run: time is up" in done.stdout
    left = 2 + len(CANDIDATES["norm_forward"]) + len(CANDIDATES["gelu_forward"])
    assert f"time is up: {left} launch(es) not run (--max-seconds 0)" in done.stdout
    assert "(default)" not in done.stdout and "eager PyTorch" not in done.stdout
    assert json.loads(written.read_text()) == {}


def test_without_a_gpu_or_the_interpreter_the_bench_says_where_the_kernels_run_and_writes_nothing(
    tmp_path, monkeypatch, capsys
):
    """In this process, without TRITON_INTERPRET (read where the bench asks whether the kernels run): its `main`
    returns the exit code `python -m bench.fused_kernels` exits with."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    written = tmp_path / "launch.json"
    assert bench_main([*SMALL, "--write", str(written)]) == 2
    assert "the kernels do not run on cpu here: they need a CUDA GPU and triton" in capsys.readouterr().err
    assert not written.exists()


def test_bad_arguments_are_named_before_any_kernel_runs(capsys):
    """In this process (argparse's error is a SystemExit)."""
    with pytest.raises(SystemExit) as exited:
        bench_main([*SMALL, "--kernels", "norm_forward,gelu_middle"])
    assert exited.value.code == 2 and "--kernels: gelu_middle; the kernels are norm_forward" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        bench_main([*SMALL, "--dropout", "1"])
    assert exited.value.code == 2 and "--dropout in [0, 1)" in capsys.readouterr().err


def test_a_launch_file_that_cannot_be_used_is_named_with_what_is_wrong_and_nothing_is_set(tmp_path, restored_launch):
    set_launch({"gelu_forward": {"ROWS": 8}})
    missing = tmp_path / "none.json"
    with pytest.raises(SystemExit, match=f"--fused-launch {missing}: cannot read it"):
        use_launch(missing)
    for text, why in [("{not json", "Expecting property name"), ('{"norm_forward": {"ROWS": 3}}', "power of two"),
                      ("[1, 2]", "'list' object has no attribute 'items'")]:  # fmt: skip
        path = tmp_path / "launch.json"
        path.write_text(text)
        with pytest.raises(SystemExit, match=f"--fused-launch {path}: not the launches .* saves .*{why}"):
            use_launch(path)
    assert _launch_overrides == {"gelu_forward": {"ROWS": 8}}
