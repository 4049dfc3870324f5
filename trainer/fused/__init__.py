"""Triton kernels for the encoder's per-token work, each used in place of several eager PyTorch kernels.

- `trainer.fused.norm` (`model.fused_norm`): bias, dropout, residual addition and LayerNorm, the end of each half of
  every encoder layer, in one kernel forward and one backward.
- `trainer.fused.gelu` (`model.fused_gelu`): bias and GELU after the feed-forward layer's first matrix product, in
  one kernel forward and one backward that also sums the bias's gradient.

The matrix products before them run without their bias, which the kernels add (and whose gradients they sum), so
the eager model's parameters, names and checkpoints are unchanged. Both compute in fp32 whatever their inputs'
dtype. CUDA only (Triton compiles for the GPU); on the CPU the kernels run in Triton's interpreter when the process
starts with TRITON_INTERPRET=1 (what the tests do). `kernels_run` says whether they may run and
`trainer.fused.trial.try_kernels` runs each once on a few values (Triton compiles its launcher with the machine's C
compiler on first use); the trainer refuses the switches where either fails, before any work
(`trainer.preflight.check_fused_kernels`).

Each kernel's launch (a tile's rows, the warps of a program, the backward's tiles a program) has a default for a GPU
and one for the interpreter; `set_launch` puts others in their place for the process (`bench.fused_kernels` times
alternatives on a GPU and writes the fastest in the form it takes).
"""

from __future__ import annotations

import os

import torch

try:
    import triton
except ImportError:  # the CPU set-up need not have it; the switches are refused there
    triton = None

KERNELS_NEED = "a CUDA GPU and the triton package (installed with PyTorch's CUDA wheels)"

# The launch parameters each kernel takes, by its name: a tile's rows (and GELU's columns), the backward's tiles a
# program, and Triton's warps a program; each a power of two.
LAUNCH_PARAMETERS = {
    "norm_forward": ("ROWS", "num_warps"),
    "norm_backward": ("ROWS", "TILES_PER_PROGRAM", "num_warps"),
    "gelu_forward": ("ROWS", "COLS", "num_warps"),
    "gelu_backward": ("ROWS", "COLS", "TILES_PER_PROGRAM", "num_warps"),
}
_launch_overrides: dict[str, dict[str, int]] = {}

# Compiler options every launch passes: multiply-adds fused (what Triton has done by default, and what the kernels
# were checked with on a GPU; Triton 3.9 warns once a process that its default will change, and 3.10 changes it).
COMPILE_OPTIONS = {"enable_fp_fusion": True}


def interpreting() -> bool:
    """Whether Triton runs its kernels in its interpreter on the CPU (TRITON_INTERPRET=1 when triton was imported)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def kernels_run(device: torch.device) -> bool:
    """Whether the kernels can run on `device`: triton imported, and a CUDA device (or the interpreter)."""
    return triton is not None and (device.type == "cuda" or interpreting())


def launch(kernel: str, defaults: dict) -> dict:
    """`kernel`'s launch parameters: its module's `defaults` with those `set_launch` put in their place."""
    return {**defaults, **_launch_overrides.get(kernel, {})}


def set_launch(overrides: dict[str, dict[str, int]]) -> None:
    """Launch parameters in place of the kernels' defaults for this process, by kernel name and parameter
    (`LAUNCH_PARAMETERS`; each a power of two, num_warps at most 32, the others at most 4,096); {} restores the
    defaults. Checked whole before
    any is set: a ValueError names the kernel, the parameter and what it may be."""
    checked = {}
    for kernel, parameters in overrides.items():
        if kernel not in LAUNCH_PARAMETERS:
            raise ValueError(f"launch: no kernel {kernel!r}; the kernels are {', '.join(LAUNCH_PARAMETERS)}")
        if not isinstance(parameters, dict):
            raise ValueError(f"launch: {kernel}: give its parameters as a mapping, not {parameters!r}")
        for name, value in parameters.items():
            if name not in LAUNCH_PARAMETERS[kernel]:
                raise ValueError(f"launch: {kernel} takes {', '.join(LAUNCH_PARAMETERS[kernel])}, not {name!r}")
            most = 32 if name == "num_warps" else 4096
            power = isinstance(value, int) and not isinstance(value, bool) and value > 0 and value & (value - 1) == 0
            if not power or value > most:
                raise ValueError(f"launch: {kernel}.{name} must be a power of two of at most {most}, not {value!r}")
        checked[kernel] = dict(parameters)
    _launch_overrides.clear()
    _launch_overrides.update(checked)
