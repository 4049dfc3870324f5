"""Time the fused kernels (`trainer.fused`) under alternative launch parameters, against the device's copy bandwidth
and the eager PyTorch they replace, at BERT-large's widths on one batch's tokens; keep the fastest launch of each and
write them in the form `trainer.fused.set_launch` takes.

Four kernels: the bias-dropout-residual-LayerNorm forward and backward (`model.fused_norm`) and the bias-GELU forward
and backward (`model.fused_gelu`), each launched as the model launches it (the kernel and what its launch function
does around it), in training's dtypes (the products in bf16 under autocast; the residual stream in bf16, as with
`model.half_residual`, or fp32). Each kernel runs first with its defaults, then with each candidate of `CANDIDATES`.
A launch's outputs are checked before it is timed, with the memory it makes filled with NaN first: the defaults'
all written, a candidate's the defaults' (the dropout mask equal, each other value within its dtype's rounding). One
that computes something else, or fails to compile or launch, is named and left out. A candidate is kept where it is
faster than the defaults by more than `--margin` (3 %). Times are medians of repeated launches
(`triton.testing.do_bench`) on a GPU; in Triton's interpreter on the CPU (TRITON_INTERPRET=1) they are host times,
which check this script, not the kernels' speed. Bytes are what a kernel must read and write at least (each input
once, each output once); their rate is compared with a device-to-device copy timed in the same run (bytes read plus
bytes written). Last, each pair (forward, forward and backward) beside what the eager model runs for the same work
(its dropout, residual addition and LayerNorm under autocast, its GELU; the backward with the bias's gradient),
with the milliseconds a step of `--layers` layers saves; without dropout, also how far eager's output is from the
kernels' (the same function: within the dtype's rounding).

    python -m bench.fused_kernels --device cuda [--tokens 30286] [--residual bf16|fp32] [--write launch.json]

30,286 tokens: a batch of 128 sequences of the MLPerf-like length mix (`python -m bench.step_floor`). `--write`
saves the kept launches (those other than the defaults) as JSON, after each kernel, which
`python -m bench.trainer_throughput --fused-launch FILE` launches the model's kernels with; `--max-seconds` begins
no launch past its time (a kernel not begun keeps its defaults).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from bench.machine import cpu_model
from trainer.errors import error_line
from trainer.fused import LAUNCH_PARAMETERS, interpreting, kernels_run, set_launch

# Launch parameters tried beside each kernel's defaults, the likeliest first (a limit of seconds stops the list).
CANDIDATES = {
    "norm_forward": [{"ROWS": 1, "num_warps": 4}, {"ROWS": 2, "num_warps": 8}, {"ROWS": 4, "num_warps": 8}],
    "norm_backward": [
        {"ROWS": 1, "TILES_PER_PROGRAM": 16, "num_warps": 8},
        {"ROWS": 1, "TILES_PER_PROGRAM": 32, "num_warps": 8},
        {"ROWS": 1, "TILES_PER_PROGRAM": 128, "num_warps": 8},
        {"ROWS": 1, "TILES_PER_PROGRAM": 32, "num_warps": 4},
        {"ROWS": 2, "TILES_PER_PROGRAM": 16, "num_warps": 8},
    ],
    "gelu_forward": [{"ROWS": 2, "num_warps": 8}, {"ROWS": 8, "num_warps": 8}, {"ROWS": 4, "num_warps": 4}],
    "gelu_backward": [
        {"ROWS": 4, "TILES_PER_PROGRAM": 16, "num_warps": 8},
        {"ROWS": 4, "TILES_PER_PROGRAM": 32, "num_warps": 8},
        {"ROWS": 2, "TILES_PER_PROGRAM": 64, "num_warps": 8},
        {"ROWS": 8, "TILES_PER_PROGRAM": 16, "num_warps": 8},
        {"ROWS": 4, "TILES_PER_PROGRAM": 32, "num_warps": 4},
    ],
}
# Element-wise tolerances by output dtype: |a - b| <= RTOL * |b| + ATOL * max |b|. Half-precision outputs may round
# one unit in the last place apart (the fp32 values before rounding differ in their last bits: reductions run in
# another order); fp32 ones differ by reduction order alone (the weights' gradients sum 30,000 rows).
RTOL = {torch.float32: 1e-5, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}
ATOL = 1e-6
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def agree(reference: list[torch.Tensor], candidate: list[torch.Tensor]) -> str | None:
    """None where a candidate's outputs are the reference's: integer ones (the dropout mask) equal, floating ones
    finite and each element within its dtype's rounding of the reference's (`RTOL`, `ATOL`); else what differs."""
    for i, (ref, got) in enumerate(zip(reference, candidate, strict=True)):
        if ref.shape != got.shape or ref.dtype != got.dtype:
            return f"output {i}: {tuple(got.shape)} {got.dtype}, not {tuple(ref.shape)} {ref.dtype}"
        if not ref.is_floating_point():
            if not torch.equal(ref, got):
                return f"output {i}: {int((ref != got).sum())} of {ref.numel()} values differ"
            continue
        if not torch.isfinite(got).all():
            return f"output {i}: {int((~torch.isfinite(got)).sum())} values not finite (unwritten?)"
        ref64, got64 = ref.double(), got.double()
        scale = ref64.abs().max().item() if ref.numel() else 0.0
        off = (got64 - ref64).abs() > RTOL[ref.dtype] * ref64.abs() + ATOL * scale
        if off.any():
            return f"output {i}: {int(off.sum())} of {ref.numel()} values beyond {RTOL[ref.dtype]:.0e} relative"
    return None


def relative_difference(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """‖ours - reference‖ / ‖reference‖, in float64 (inf where they differ in shape)."""
    if ours.shape != reference.shape:
        return math.inf
    scale = reference.double().norm().item()
    return (ours.double() - reference.double()).norm().item() / max(scale, 1e-300)


@contextlib.contextmanager
def fresh_memory_filled():
    """Every tensor made in the block without values (torch.empty: the kernels' outputs, the backward's partial
    sums) filled first with NaN, or the largest integer (PyTorch's deterministic mode), so that a value a launch does
    not write shows instead of what the allocator's block held before (often the same launch's last result)."""
    deterministic, warn_only = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = fill
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)


def checked_outputs(launch: Callable[[], list[torch.Tensor]]) -> list[torch.Tensor]:
    """What `launch` returns, with its fresh memory filled first (`fresh_memory_filled`)."""
    with fresh_memory_filled():
        return launch()


def pick(times: dict[str, tuple[float, dict | None]], margin: float) -> tuple[str, float, dict | None]:
    """(name, seconds, parameters) of the launch to keep among `times` (name -> seconds and parameters, None for the
    defaults): the fastest candidate where it beats the defaults by more than `margin` (a share of their time), else
    the defaults (where they were timed)."""
    name, (seconds, parameters) = min(times.items(), key=lambda item: item[1][0])
    default = times.get("(default)")
    if default is not None and parameters is not None and seconds > default[0] * (1 - margin):
        return "(default)", default[0], None
    return name, seconds, parameters


def timer(device: torch.device) -> Callable[[Callable[[], object]], float]:
    """Seconds one call of a function takes: the median of repeated launches on a GPU (device events), one timed
    call after one untimed on the CPU (the interpreter)."""
    if device.type == "cuda":
        import triton.testing

        return lambda fn: triton.testing.do_bench(fn, warmup=5, rep=40, return_mode="median") / 1e3

    def host(fn):
        fn()
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    return host


def copy_rate(device: torch.device, nbytes: int, seconds: Callable) -> float:
    """Bytes a second of a device-to-device copy of `nbytes`, counting bytes read and written."""
    source = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    return 2 * nbytes / seconds(lambda: target.copy_(source))


def problems(tokens: int, hidden: int, intermediate: int, product: torch.dtype, stream: torch.dtype,
             dropout: float, device: torch.device) -> dict:  # fmt: skip
    """For each kernel: (a function that launches it as the model does and returns its outputs, the bytes it must
    move at least); for "eager_norm" and "eager_gelu", a function of `backward` that runs the eager model's layers
    for the same work (`trainer.layer_norm`'s LayerNorm and dropout under autocast, and GELU; the bias already added, as
    the matrix product adds it there; with `backward`, their backward and the bias's gradient) and returns the
    forward's output. Inputs drawn once from a fixed seed; the backward ones take the forward's outputs."""
    from trainer.fused.gelu import gelu_backward, gelu_forward
    from trainer.fused.norm import dropout_seed, norm_backward, norm_forward
    from trainer.layer_norm import LayerNorm

    generator = torch.Generator(device="cpu").manual_seed(0)

    def draw(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)

    mm, residual, grad = draw(tokens, hidden, dtype=product), draw(tokens, hidden, dtype=stream), draw(
        tokens, hidden, dtype=stream)  # fmt: skip
    bias, weight, norm_bias = draw(hidden), 1.0 + 0.1 * draw(hidden), 0.1 * draw(hidden)
    torch.manual_seed(0)
    seed = dropout_seed(device) if dropout > 0 else None
    eps = 1e-12
    out, mean, rstd, keep = norm_forward(mm, bias, residual, weight, norm_bias, dropout, eps, seed)
    wide, wide_bias, wide_grad = draw(tokens, intermediate, dtype=product), draw(intermediate), draw(
        tokens, intermediate, dtype=product)  # fmt: skip
    p, s, mask = product.itemsize, stream.itemsize, 1 if seed is not None else 0
    rows = 8 * tokens  # each row's mean and 1/std, fp32
    half = product != torch.float32
    norm = LayerNorm(hidden, eps, half_io=half and stream == product).to(device)
    with torch.no_grad():
        norm.weight.copy_(weight), norm.bias.copy_(norm_bias)
    drop = torch.nn.Dropout(dropout)
    autocast = torch.autocast(device.type, dtype=product, enabled=half)

    biased, wide_biased = mm + bias.to(product), wide + wide_bias.to(product)  # as nn.Linear gives them

    def eager_norm(backward: bool):
        x, r = biased.detach().requires_grad_(), residual.detach().requires_grad_()  # (views: no copy timed)
        with autocast:
            y = norm(drop(x) + r)
        if backward:
            torch.autograd.grad(y, (x, r, norm.weight, norm.bias), grad)[0].sum(0)  # (and the bias's gradient)
        return [y.detach()]

    def eager_gelu(backward: bool):
        x = wide_biased.detach().requires_grad_()
        with autocast:
            y = torch.nn.functional.gelu(x)
        if backward:
            torch.autograd.grad(y, x, wide_grad)[0].sum(0)
        return [y.detach()]

    return {
        "norm_forward": (lambda: list(norm_forward(mm, bias, residual, weight, norm_bias, dropout, eps, seed)),
                         tokens * hidden * (p + s + s + mask) + rows),
        "norm_backward": (lambda: list(norm_backward(grad, mm, bias, residual, weight, mean, rstd, keep, dropout,
                                                     seed is not None)),
                          tokens * hidden * (s + p + s + mask + p + s) + rows),
        "gelu_forward": (lambda: [gelu_forward(wide, wide_bias)], tokens * intermediate * 2 * p),
        "gelu_backward": (lambda: list(gelu_backward(wide_grad, wide, wide_bias)), tokens * intermediate * 3 * p),
        "eager_norm": eager_norm,
        "eager_gelu": eager_gelu,
    }  # fmt: skip


def use_launch(path: Path) -> dict:
    """Launch the model's kernels as `path` says (a file `--write` saved; `trainer.fused.set_launch`) and return what
    it holds; a SystemExit naming the file and what is wrong with it, before anything is set."""
    try:
        chosen = json.loads(path.read_text())
        set_launch(chosen)
    except OSError as error:
        raise SystemExit(f"--fused-launch {path}: cannot read it ({error.strerror or error})") from None
    except (json.JSONDecodeError, ValueError, AttributeError) as error:
        raise SystemExit(f"--fused-launch {path}: not the launches `python -m bench.fused_kernels --write` saves "
                         f"({error})") from None  # fmt: skip
    return chosen


def failure(error: Exception) -> str:
    """An error's type and the line of its text that says what went wrong (`trainer.errors.error_line`: Triton's
    compile errors carry it apart from their source position), for one line of the table."""
    return f"{type(error).__name__}: {error_line(error)[:160]}"


def write_launches(path: Path, best: dict[str, dict | None]) -> dict:
    """Write the kept launches other than the defaults to `path` as JSON (`use_launch` reads it); return them."""
    chosen = {kernel: parameters for kernel, parameters in best.items() if parameters is not None}
    path.write_text(json.dumps(chosen, indent=1) + "\n")
    return chosen


def describe(parameters: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in parameters.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda, or cpu with TRITON_INTERPRET=1 (checks the script)")
    parser.add_argument("--tokens", type=int, default=30286, help="rows: a batch's tokens (default: 128 sequences)")
    parser.add_argument("--hidden", type=int, default=1024, help="the norm's row (BERT-large: 1,024)")
    parser.add_argument("--intermediate", type=int, default=4096, help="GELU's row (BERT-large: 4,096)")
    parser.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16", help="the products' dtype")
    parser.add_argument("--residual", choices=("bf16", "fp16", "fp32"), default="bf16",
                        help="the residual stream's dtype (bf16: model.half_residual)")  # fmt: skip
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--layers", type=int, default=24, help="encoder layers, for a step's saving (BERT-large: 24)")
    parser.add_argument("--kernels", default=",".join(LAUNCH_PARAMETERS), help="comma-separated, of those named")
    parser.add_argument("--limit", type=int, default=None, help="candidates a kernel at most (default: all)")
    parser.add_argument("--max-seconds", type=float, default=None,
                        help="start no launch after this many seconds of its work (a kernel not begun keeps its "
                        "defaults)")  # fmt: skip
    parser.add_argument("--margin", type=float, default=0.03,
                        help="a candidate is kept where it beats the defaults by more than this share of their "
                        "time")  # fmt: skip
    parser.add_argument("--copy-bytes", type=int, default=1 << 30, help="the copy timed for the bandwidth")
    parser.add_argument("--write", type=Path, default=None, help="the kept launch of each kernel, as JSON")
    args = parser.parse_args(argv)
    kernels = [k for k in args.kernels.split(",") if k]
    unknown = [k for k in kernels if k not in LAUNCH_PARAMETERS]
    if unknown or not kernels:
        parser.error(f"--kernels: {', '.join(unknown) or 'none given'}; the kernels are {', '.join(LAUNCH_PARAMETERS)}")
    if args.tokens < 1 or args.hidden < 1 or args.intermediate < 1 or not 0 <= args.dropout < 1:
        parser.error("--tokens, --hidden and --intermediate must be at least 1 and --dropout in [0, 1)")
    device = torch.device(args.device)
    if not kernels_run(device):
        print(f"bench.fused_kernels: the kernels do not run on {device} here: they need a CUDA GPU and triton, or "
              "on the CPU Triton's interpreter (TRITON_INTERPRET=1 in the environment)", file=sys.stderr)  # fmt: skip
        return 2
    started = time.monotonic()
    seconds = timer(device)
    product, stream = DTYPES[args.dtype], DTYPES[args.residual]
    label = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {cpu_model()}, interpreter"
    print(f"fused kernels at {args.tokens:,} tokens, hidden {args.hidden:,}, intermediate {args.intermediate:,}, "
          f"{args.dtype} products, {args.residual} residual stream, dropout {args.dropout}")  # fmt: skip
    rate = copy_rate(device, args.copy_bytes, seconds)
    print(
        f"device: {label}; a {args.copy_bytes / 2**30:g} GiB device-to-device copy: {rate / 1e9:,.0f} GB/s "
        "(read + written)" + (" (interpreter: host times, not the kernels' speed)" if interpreting() else "")
    )
    print(f"  {'kernel':<14} {'launch':<44} {'time':>10} {'rate':>12} {'of copy':>8}")
    work = problems(args.tokens, args.hidden, args.intermediate, product, stream, args.dropout, device)
    best, fastest, untimed = {}, {}, 0
    deadline = math.inf if args.max_seconds is None else started + args.max_seconds
    for kernel in kernels:
        launch, nbytes = work[kernel]
        candidates = CANDIDATES[kernel][: args.limit]
        if time.monotonic() > deadline:  # its defaults not run either: the kernel keeps them
            untimed += 1 + len(candidates)
            print(f"  {kernel:<14} not run: time is up")
            continue
        set_launch({})
        try:
            reference = checked_outputs(launch)
            problem = agree(reference, reference) if reference else None
        except Exception as error:  # the defaults do not compile or run here: nothing to check the others against
            print(f"  {kernel:<14} {'(default)':<44} left out, and its candidates: {failure(error)}")
            continue
        if problem is not None:
            print(f"  {kernel:<14} {'(default)':<44} left out, and its candidates: {problem}")
            continue
        times = {}
        for parameters in [None, *candidates]:
            if parameters is not None and time.monotonic() > deadline:
                untimed += 1
                continue
            name = "(default)" if parameters is None else describe(parameters)
            try:
                set_launch({} if parameters is None else {kernel: parameters})
                problem = None if parameters is None else agree(reference, checked_outputs(launch))
                if problem is not None:
                    print(f"  {kernel:<14} {name:<44} left out: not the defaults' outputs ({problem})")
                    continue
                times[name] = (seconds(launch), parameters)
            except Exception as error:  # a launch Triton cannot compile or run: named, the others go on
                print(f"  {kernel:<14} {name:<44} left out: {failure(error)}")
                continue
            finally:
                set_launch({})
            t = times[name][0]
            print(f"  {kernel:<14} {name:<44} {t * 1e6:8.1f} us {nbytes / t / 1e9:8,.0f} GB/s {nbytes / t / rate:7.0%}")
        if times:
            name, t, parameters = pick(times, args.margin)
            default = times.get("(default)", (math.nan,))[0]
            best[kernel], fastest[kernel] = parameters, t
            print(f"  kept {kernel}: {name}, {t * 1e6:.1f} us ({default / t:.2f}x the defaults)")
            if args.write is not None:  # after each kernel: a run cut short keeps what it found
                write_launches(args.write, best)
    if untimed:
        print(f"time is up: {untimed} launch(es) not run (--max-seconds {args.max_seconds:g})")
    if args.write is not None:
        chosen = write_launches(args.write, best)
        print(f"wrote {args.write}: {json.dumps(chosen) if chosen else 'the defaults were kept ({})'}")
    for op, calls, what in (("norm", 2 * args.layers, "dropout, addition, LayerNorm"), ("gelu", args.layers, "GELU")):
        if f"{op}_forward" not in fastest or f"{op}_backward" not in fastest:
            continue
        try:  # against what the eager model runs for the same work (a second or two: past the deadline too)
            eager = [seconds(partial(work[f"eager_{op}"], backward)) for backward in (False, True)]
            eager_out, fused_out = work[f"eager_{op}"](False)[0], work[f"{op}_forward"][0]()[0]
        except Exception as error:  # (the launches are written already)
            print(f"  {op}: eager PyTorch not timed: {failure(error)}")
            continue
        fused = [fastest[f"{op}_forward"], fastest[f"{op}_forward"] + fastest[f"{op}_backward"]]
        saved = (eager[1] - fused[1]) * calls
        print(f"  {op}: eager PyTorch ({what}; the backward with the bias's gradient) forward "
              f"{eager[0] * 1e6:.1f} us, forward + backward {eager[1] * 1e6:.1f} us; fused {fused[0] * 1e6:.1f} "
              f"and {fused[1] * 1e6:.1f} us ({eager[1] / fused[1]:.2f}x): {saved * 1e3:.2f} ms less a step of "
              f"{calls} calls ({args.layers} layers)")  # fmt: skip
        if args.dropout == 0:  # the same function: without dropout, eager's output is the kernels' within rounding
            difference = relative_difference(eager_out, fused_out)
            same = difference <= RTOL[fused_out.dtype]  # (each rounds its sums to the output's dtype at its own step)
            verdict = "the same function, within" if same else "NOT the same function: over"
            print(f"  {op}: without dropout, |eager - fused| / |fused| = {difference:.1e}: {verdict} "
                  f"{RTOL[fused_out.dtype]:.0e}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
