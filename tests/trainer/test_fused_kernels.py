"""`model.fused_norm` and `model.fused_gelu`: the bias-dropout-residual-LayerNorm and bias-GELU kernels
(`trainer.fused`) against eager PyTorch.

The kernels are Triton's, compiled for a GPU; on the CPU they run in Triton's interpreter, which a process must ask
for before it imports triton: the checks run once in a process of their own (`tests.trainer.fused_kernels_checks`;
the slow tests' cases in a second one) and the tests below read what it measured. In float32 every output and
gradient is within 1e-5 of the exact (float64) eager composition (with the mask the kernel drew); the tiny model with
the kernels trains the eager model's losses (within 1e-5) and gradients over AdamW steps: each within 1e-5 of the
eager one, or, where the two differ by more (the near-cancelling sums of the next-sentence head: see
tests/trainer/test_fused_paths.py), no farther from the exact (float64) gradient than the eager float32 one is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from scipy import stats

from tests.trainer.conftest import make_model_config
from tests.trainer.test_fused_paths import RTOL, cuda_only
from trainer.config import TrainerConfig
from trainer.errors import ConfigError

triton = pytest.importorskip("triton", reason="the fused kernels are Triton's (installed by make setup)")

ROOT = Path(__file__).resolve().parents[2]
OPERANDS = ("out", "d_mm", "d_bias", "d_residual", "d_weight", "d_norm_bias")


def run_checks(*args: str) -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "tests.trainer.fused_kernels_checks", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def measured() -> dict:
    return run_checks()


@pytest.fixture(scope="module")
def measured_slow() -> dict:
    """The cases only slow tests read (`fused_kernels_checks.SLOW_CASES`), in a process of their own."""
    return run_checks("--slow")


@pytest.mark.parametrize("case", ["dropout", "dropout_quarter", "eval"])
def test_the_kernels_give_the_eager_layer_norm_of_the_residual_plus_the_dropped_out_biased_product(measured, case):
    """Output and the gradients of all five inputs, float32, within 1e-5 of float64 eager PyTorch: dropout 0.1 on
    rows of 48 (narrower than the kernel's block), 0.25 on rows of 64, and eval mode (no dropout)."""
    result = measured[case]
    for name in OPERANDS:
        assert result[name] <= RTOL, (case, name, result[name])
    assert result["out_dtype"] == "torch.float32"
    assert result["dropped"] == (0.0 if case == "eval" else pytest.approx(0.25 if "quarter" in case else 0.1, abs=0.03))


def test_in_bf16_activations_are_within_one_unit_of_the_last_place_and_the_weights_gradients_in_fp32(measured):
    """bf16 product and residual (the bf16 residual stream): the output and the activations' gradients within one
    bf16 unit in the last place of the exact values (Triton's interpreter truncates where a GPU rounds to nearest:
    one unit, not half), the fp32 weights' and biases' gradients within 1e-5."""
    result = measured["bf16"]
    assert result["out_dtype"] == "torch.bfloat16"
    assert all(units <= 1.0 for units in result["ulps"].values()), result["ulps"]
    for name in ("d_bias", "d_weight", "d_norm_bias"):
        assert result[name] <= RTOL, (name, result[name])


def test_the_bias_gelu_kernels_give_eager_gelu_of_the_biased_product(measured):
    """float32: output and both gradients within 1e-5 of float64 eager `F.gelu(mm + bias)` on rows of 80 (narrower
    than the kernel's block); bf16: the output and the product's gradient within 2^-7 of the largest value (one unit
    in the last place of the largest: the interpreter truncates; where GELU is tiny, 1 + erf cancels in fp32 as in
    eager PyTorch's kernel, so units at each value would not bound it), the bias's gradient fp32 within 1e-5."""
    fp32, bf16 = measured["gelu"], measured["gelu_bf16"]
    assert all(fp32[name] <= RTOL for name in ("out", "d_mm", "d_bias")), fp32
    assert fp32["out_dtype"] == "torch.float32" and bf16["out_dtype"] == "torch.bfloat16"
    assert bf16["out"] <= 2**-7 and bf16["d_mm"] <= 2**-7, bf16
    assert bf16["d_bias"] <= RTOL and bf16["d_bias_dtype"] == "torch.float32", bf16


def test_the_dropout_mask_drops_its_share_depends_on_the_seed_alone_and_differs_between_seeds(measured):
    """100,000 draws at p = 0.1: the dropped count within the binomial's central 1 - 1e-6; the same seed draws the
    same mask; another seed's mask agrees with it as independent draws
    would ((1-p)^2 + p^2 of the positions), and so do two rows of one mask."""
    mask = measured["mask"]
    n, p = mask["n"], 0.1
    low, high = stats.binom.interval(1 - 1e-6, n, p)
    assert low <= mask["dropped"] <= high
    assert mask["same_seed_equal"]
    agree = (1 - p) ** 2 + p**2
    low, high = stats.binom.interval(1 - 1e-6, n, agree)
    assert low <= mask["other_seed_agree"] <= high
    low, high = stats.binom.interval(1 - 1e-6, 250, agree)
    assert low <= mask["rows_equal"] <= high


@pytest.mark.parametrize(
    "case",
    [pytest.param("model", marks=pytest.mark.slow), pytest.param("model_gelu", marks=pytest.mark.slow), "model_both"],
)  # each kernel alone in the model: slow; both kernels run in the same model path by default
def test_the_model_with_the_kernels_trains_the_eager_models_losses_and_gradients(request, case):
    """model.fused_norm, model.fused_gelu, and both."""
    model = request.getfixturevalue("measured" if case == "model_both" else "measured_slow")[case]
    assert model["same_names"]  # checkpoints keep their names
    assert model["missing"] == []
    assert model["losses"] == pytest.approx(model["reference_losses"], rel=RTOL, abs=0)
    # the attention dropout's draws move the losses far more than the kernels' rounding does: the same seed matters
    ours = max(abs(a - b) for a, b in zip(model["losses"], model["reference_losses"], strict=True))
    other = max(abs(a - b) for a, b in zip(model["other_seed_losses"], model["reference_losses"], strict=True))
    assert other > max(10 * ours, 1e-6), (other, ours)
    largest = max(g["scale"] for g in model["gradients"].values())
    for name, g in model["gradients"].items():
        if name.endswith("attention.self.key.bias"):  # zero in exact arithmetic: rounding noise in both
            assert max(g["difference"], g["scale"]) < 1e-6 * largest, name
            continue
        assert g["difference"] <= RTOL * g["scale"] or g["fused_error"] <= g["float32_error"], (name, g)


@pytest.mark.slow  # by default the op's seeded mask and eval mode: the [dropout] and [eval] cases and the mask test
def test_the_kernels_dropout_is_drawn_from_torchs_seed_and_off_in_eval(measured_slow):
    result = measured_slow["model_dropout"]
    assert result["seed1"] == result["seed1_again"]
    assert result["seed1"] != result["seed2"]
    assert result["eval_equal"]
    assert result["eval_loss"] not in (result["seed1"], result["seed2"])


def test_an_empty_micro_batch_passes_through_with_zero_gradients(measured):
    assert measured["no_rows"] == {"shapes": [[0, 8], [0, 8]], "grads_zero": True}


@pytest.mark.parametrize("case", ["dropout", "gelu"])
def test_launched_as_on_a_gpu_the_kernels_give_the_same_results(measured, case):
    """One row a tile and 16 tiles a program (the norm), 4 x 32 tiles over three column blocks (GELU): the loops
    and bounds a GPU runs, within 1e-5 of float64 eager as above."""
    result = measured["gpu_shapes"][case]
    names = OPERANDS if case == "dropout" else ("out", "d_mm", "d_bias")
    assert all(result[name] <= RTOL for name in names), result
    norm_launch, gelu_launch = measured["gpu_shapes"]["launches"]  # set_launch's parameters, the rest defaults
    assert norm_launch == {"BLOCK": 64, "ROWS": 1, "num_warps": 1, "TILES_PER_PROGRAM": 16}
    assert gelu_launch == {"ROWS": 4, "COLS": 32, "num_warps": 1, "TILES_PER_PROGRAM": 4}
    assert measured["default_launches"] == [  # and set_launch({}) restored the interpreter's defaults
        {"BLOCK": 64, "ROWS": 16, "num_warps": 1, "TILES_PER_PROGRAM": 2},
        {"ROWS": 16, "COLS": 128, "num_warps": 1, "TILES_PER_PROGRAM": 2},
    ]


def test_the_trainer_accepts_the_switches_where_the_kernels_run(measured):
    """In the interpreter the trial launch runs both kernels, forward and backward, and nothing is refused (a refusal
    would have ended the checks with an error): in fp32 and with bf16 products and residual stream."""
    both = ["norm_forward", "norm_backward", "gelu_forward", "gelu_backward"]
    assert measured["trial_launches"] == [both, both]


def test_a_trial_launch_that_fails_refuses_the_switch_naming_the_error(monkeypatch):
    """Where Triton cannot build its launcher (a machine without a C compiler, as its error says) the switch is
    refused before any work, with Triton's error; a compile error, whose text starts with the source position, by its
    message. Triton's failures are stood in for by a trial launch that raises them; the device by the interpreter's
    rule."""
    import trainer.fused as fused
    import trainer.fused.trial as trial
    from trainer.preflight import check_fused_kernels

    class CompilationError(Exception):  # as triton.compiler.errors.CompilationError carries its message
        error_message = "unsupported tensor index: constexpr[0]"

        def __str__(self):
            return "at 12:8:\n    x = tl.load(MM + at)\n        ^"

    failures = [RuntimeError("Failed to find C compiler. Please specify via CC environment variable.\n"),
                CompilationError()]  # fmt: skip

    def fails(device, cfg, autocast):
        raise failures.pop(0)

    monkeypatch.setattr(fused, "kernels_run", lambda device: True)
    monkeypatch.setattr(trial, "try_kernels", fails)
    cfg = TrainerConfig(model=make_model_config(fused_gelu=True).model_dump())
    message = (r"^model.fused_gelu: the Triton kernels do not run here \(RuntimeError: Failed to find C compiler\. "
               r"Please specify via CC environment variable\.\); set it false$")  # fmt: skip
    with pytest.raises(ConfigError, match=message):
        check_fused_kernels(cfg, torch.device("cpu"), None)
    message = r"\(CompilationError: unsupported tensor index: constexpr\[0\]\); set it false$"
    with pytest.raises(ConfigError, match=message):
        check_fused_kernels(cfg, torch.device("cpu"), None)


def test_the_switches_are_refused_with_compiled_layers_or_model_and_where_the_kernels_cannot_run(monkeypatch):
    from trainer.preflight import check_fused_kernels
    from trainer.run import execution

    for key in ("fused_norm", "fused_gelu"):
        for other in ("compile", "compile_model"):
            with pytest.raises(ValueError, match=f"model.{key} runs its own kernels"):
                make_model_config(**{key: True, other: True})
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cpu = torch.device("cpu")
    norm = TrainerConfig(model=make_model_config(fused_norm=True).model_dump())
    with pytest.raises(ConfigError, match=r"^model.fused_norm needs a CUDA GPU .*\(this run: cpu\); set it false$"):
        check_fused_kernels(norm, cpu, None)
    both = TrainerConfig(model=make_model_config(fused_norm=True, fused_gelu=True).model_dump())
    with pytest.raises(ConfigError, match=r"^model.fused_norm and model.fused_gelu need a CUDA GPU .*set them false$"):
        check_fused_kernels(both, cpu, None)
    check_fused_kernels(TrainerConfig(model=make_model_config().model_dump()), cpu, None)  # neither: nothing to do
    assert execution(norm, cpu, None) == "fp32, attention packed, fused bias-dropout-residual-LayerNorm kernels"
    assert execution(both, cpu, None) == (
        "fp32, attention packed, fused bias-dropout-residual-LayerNorm and bias-GELU kernels"
    )


@pytest.mark.gpu
@cuda_only
def test_on_the_gpu_the_kernels_match_eager_pytorch():
    """Compiled for the GPU, at BERT-large's widths (rows of 1,024; 4,096 for GELU) and 3,000 rows: float32 against
    float64 eager (the norm with the mask the kernel drew) within 1e-4 (other summation orders); bf16 within one unit
    in the last place (the norm) and 2^-7 of the largest value (GELU)."""
    from tests.trainer import fused_kernels_checks as checks

    with torch.device("cuda"):
        fp32 = checks.against_eager(3000, 1024, 0.1, True)
        bf16 = checks.against_eager(3000, 1024, 0.1, True, torch.bfloat16)
        gelu = checks.gelu_against_eager(3000, 4096)
        gelu_bf16 = checks.gelu_against_eager(3000, 4096, torch.bfloat16)
    assert all(fp32[name] <= 1e-4 for name in OPERANDS), fp32
    assert all(units <= 1.0 for units in bf16["ulps"].values()), bf16["ulps"]
    assert all(gelu[name] <= 1e-4 for name in ("out", "d_mm", "d_bias")), gelu
    assert gelu_bf16["out"] <= 2**-7 and gelu_bf16["d_mm"] <= 2**-7, gelu_bf16


def compiled_for_hopper(kernel, signature: dict, constants: dict) -> tuple[str, str]:
    """`kernel` compiled ahead of time for sm_90 with 8 warps, with the divisibility Triton finds at launch
    (pointers and a row of 1,024 or 4,096: multiples of 16): cuobjdump's resource usage and SASS."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from trainer.fused import COMPILE_OPTIONS  # the options the model's launches pass

    assert list(signature) == kernel.arg_names  # the launch's arguments, in order
    aligned = {(i,): [["tt.divisibility", 16]] for i, (name, kind) in enumerate(signature.items())
               if kind.startswith("*") or name == "cols"}  # fmt: skip
    source = ASTSource(fn=kernel, signature=signature, constexprs=constants, attrs=aligned)
    options = {"num_warps": 8, **COMPILE_OPTIONS}
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    cubin = Path(os.environ.get("TMPDIR", "/tmp")) / f"fused_{os.getpid()}_{kernel.__name__}.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    try:
        return tuple(subprocess.run([tools / "cuobjdump", flag, cubin], capture_output=True, text=True,
                                    check=True).stdout for flag in ("-res-usage", "-sass"))  # fmt: skip
    finally:
        cubin.unlink()


def test_the_kernels_compile_for_hopper_in_registers_with_vector_loads():
    """The kernels as a GPU lease would first compile them, ahead of time here (Triton compiles for a named target
    without a GPU): for sm_90 (H100/H200) at BERT-large's widths in bf16, as the model launches them. No register
    spills to local memory, no 16-bit global access (bf16 moved one value at a time, as an unaligned row would be,
    would cost the bandwidth these kernels are for), and at least as many 64- or 128-bit accesses as the kernel has
    activation tensors to read or write."""
    import re

    from trainer.fused import gelu, norm

    activations = {"MM": "*bf16", "BIAS": "*fp32", "RES": "*bf16", "W": "*fp32"}
    forward = {**activations, "B": "*fp32", "OUT": "*bf16", "MEAN": "*fp32", "RSTD": "*fp32", "SEED": "*i64",
               "KEEP": "*u8", "rows": "i32", "cols": "i32", "p": "fp32", "scale": "fp32", "eps": "fp32",
               "ROWS": "constexpr", "BLOCK": "constexpr", "DROPOUT": "constexpr"}  # fmt: skip
    backward = {"GRAD": "*bf16", **activations, "MEAN": "*fp32", "RSTD": "*fp32", "KEEP": "*u8", "D_MM": "*bf16",
                "D_RES": "*bf16", "PARTIAL": "*fp32", "rows": "i32", "cols": "i32", "p": "fp32", "scale": "fp32",
                "ROWS": "constexpr", "TILES_PER_PROGRAM": "constexpr", "BLOCK": "constexpr",
                "DROPOUT": "constexpr"}  # fmt: skip
    gelu_forward = {"MM": "*bf16", "BIAS": "*fp32", "OUT": "*bf16", "rows": "i32", "cols": "i32",
                    "ROWS": "constexpr", "COLS": "constexpr"}  # fmt: skip
    gelu_backward = {"GRAD": "*bf16", "MM": "*bf16", "BIAS": "*fp32", "D_MM": "*bf16", "PARTIAL": "*fp32",
                     "rows": "i32", "cols": "i32", "ROWS": "constexpr", "COLS": "constexpr",
                     "TILES_PER_PROGRAM": "constexpr"}  # fmt: skip
    tile = {"ROWS": 4, "COLS": 1024}
    # and the norm with the fp32 residual stream (model.half_residual off: autocast's fp32 LayerNorm output)
    fp32_stream = {"RES": "*fp32", "OUT": "*fp32", "D_RES": "*fp32"}
    norm_constants = {"ROWS": 1, "BLOCK": 1024, "DROPOUT": True}
    # each with the number of activation tensors it reads or writes ([rows, cols]: product, residual, output, ...)
    kernels = [(norm._forward_kernel, forward, norm_constants, 3),
               (norm._backward_kernel, backward, {**norm_constants, "TILES_PER_PROGRAM": 64}, 5),
               (norm._forward_kernel, {k: fp32_stream.get(k, v) for k, v in forward.items()}, norm_constants, 3),
               (norm._backward_kernel, {k: fp32_stream.get(k, v) for k, v in backward.items()},
                {**norm_constants, "TILES_PER_PROGRAM": 64}, 5),
               (gelu._forward_kernel, gelu_forward, tile, 2),
               (gelu._backward_kernel, gelu_backward, {**tile, "TILES_PER_PROGRAM": 64}, 3)]  # fmt: skip
    for kernel, signature, constants, activations_moved in kernels:
        usage, sass = compiled_for_hopper(kernel, signature, constants)
        assert re.search(r"\bLOCAL:0\b", usage) and re.search(r"\bSTACK:0\b", usage), (kernel.__name__, usage)
        accesses = re.findall(r"\b(?:LDG|STG)\.E(?:\.(\w+))?", sass)
        assert "U16" not in accesses, (kernel.__name__, accesses)  # no bf16 moved one at a time
        wide = sum(width in ("64", "128") for width in accesses)
        assert wide >= activations_moved, (kernel.__name__, accesses)  # each activation tensor in wide accesses
        assert re.search(r"\bFFMA\b", sass), kernel.__name__  # multiply-adds fused, as COMPILE_OPTIONS asks


def test_on_a_gpu_the_kernels_launch_with_their_documented_defaults_unless_set_launch_says_otherwise(monkeypatch):
    """The GPU's launches at BERT-large's widths (the interpreter's are checked above): the norm one row a tile with
    8 warps, its backward 64 tiles a program; GELU 4 x 1,024 tiles with 8 warps, its backward 64 tiles a program.
    `set_launch` replaces only what it names."""
    from trainer.fused import gelu, norm, set_launch

    monkeypatch.setattr(norm, "interpreting", lambda: False)
    monkeypatch.setattr(gelu, "interpreting", lambda: False)
    assert norm._launch("norm_forward", 1024) == {"BLOCK": 1024, "ROWS": 1, "num_warps": 8}
    assert norm._launch("norm_backward", 1024) == {"BLOCK": 1024, "ROWS": 1, "num_warps": 8, "TILES_PER_PROGRAM": 64}
    assert norm._launch("norm_forward", 768)["BLOCK"] == 1024  # BERT-base: the row rounded up to a power of two
    assert gelu._launch("gelu_forward", 4096) == {"ROWS": 4, "COLS": 1024, "num_warps": 8}
    assert gelu._launch("gelu_backward", 4096) == {"ROWS": 4, "COLS": 1024, "num_warps": 8, "TILES_PER_PROGRAM": 64}
    try:
        set_launch({"norm_backward": {"TILES_PER_PROGRAM": 16, "num_warps": 4}, "gelu_forward": {"ROWS": 8}})
        assert norm._launch("norm_backward", 1024) == {"BLOCK": 1024, "ROWS": 1, "num_warps": 4,
                                                       "TILES_PER_PROGRAM": 16}  # fmt: skip
        assert norm._launch("norm_forward", 1024) == {"BLOCK": 1024, "ROWS": 1, "num_warps": 8}
        assert gelu._launch("gelu_forward", 4096) == {"ROWS": 8, "COLS": 1024, "num_warps": 8}
    finally:
        set_launch({})
