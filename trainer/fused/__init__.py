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
(`trainer.train.check_fused_kernels`).
"""

from __future__ import annotations

import os

import torch

try:
    import triton
except ImportError:  # the CPU set-up need not have it; the switches are refused there
    triton = None

KERNELS_NEED = "a CUDA GPU and the triton package (installed with PyTorch's CUDA wheels)"


def interpreting() -> bool:
    """Whether Triton runs its kernels in its interpreter on the CPU (TRITON_INTERPRET=1 when triton was imported)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def kernels_run(device: torch.device) -> bool:
    """Whether the kernels can run on `device`: triton imported, and a CUDA device (or the interpreter)."""
    return triton is not None and (device.type == "cuda" or interpreting())
