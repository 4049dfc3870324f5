"""What a run refuses before any work (trainer/preflight.py), checked on its own: the kernels' trial launches.

The whole refusal is exercised through the command line in test_bad_input.py and test_train.py."""

from __future__ import annotations

import pytest
import torch

from trainer import preflight
from trainer.config import load_config
from trainer.errors import ConfigError


def test_cudnn_varlen_attention_that_fails_its_trial_launch_is_refused_with_the_error(monkeypatch):
    """Where the varlen attention runs but PyTorch's cuDNN attention takes no packed stream (an older cuDNN, a build
    without it), the trial launch's error is said before any work. The GPU is stood in for by the kernel choice and
    the failing launch by one that raises cuDNN's own error."""

    cfg = load_config(None, ["model.varlen_kernel=cudnn"])
    launched = []
    monkeypatch.setattr(preflight, "flash_device", lambda device: True)
    monkeypatch.setattr(preflight, "resolve_attention", lambda *args, **kwargs: "varlen")

    def fails(*args):
        launched.append(args)
        raise RuntimeError("cuDNN Frontend error: [cudnn_frontend] Error: No execution plans support the graph.")

    monkeypatch.setattr(preflight, "try_cudnn_attention", fails)
    with pytest.raises(ConfigError, match=r"model.varlen_kernel: cudnn: cuDNN's attention failed its trial on a "
                       r"packed stream here \(RuntimeError: cuDNN Frontend error: \[cudnn_frontend\] Error: No "
                       r"execution plans support the graph.\); set model.varlen_kernel: flash"):  # fmt: skip
        preflight.check_varlen_kernel(cfg, torch.device("cuda"), torch.bfloat16)
    assert launched == [(torch.device("cuda"), 16, 64, torch.bfloat16, 0.1)]  # BERT-large's, training's dtype
    launched.clear()
    preflight.check_varlen_kernel(load_config(None, []), torch.device("cuda"), torch.bfloat16)  # flash: nothing to try
    assert launched == []


class SequenceAttention:
    """The varlen call computed per sequence with PyTorch's SDPA (the CPU's math): a stand-in for a kernel that
    computes it right; `assumed_stride`: one that reads q, k and v as if their tokens were heads x head_dim apart
    (contiguous), as a cuDNN that ignored the strides of the model's strided views would."""

    def __init__(self, assumed_stride: bool = False):
        self.assumed_stride, self.calls = assumed_stride, []

    def apply(self, q, k, v, cu_seqlens, max_seqlen, dropout_p, padded=False):
        self.calls.append((torch.is_grad_enabled(), dropout_p))
        if self.assumed_stride:
            q, k, v = (torch.as_strided(t, t.shape, (t.shape[1] * t.shape[2], t.shape[2], 1)) for t in (q, k, v))
        bounds = cu_seqlens.tolist()
        outs = [torch.nn.functional.scaled_dot_product_attention(*(t[a:b].transpose(0, 1) for t in (q, k, v)))
                for a, b in zip(bounds[:-1], bounds[1:], strict=True)]  # fmt: skip
        return torch.cat([o.transpose(0, 1) for o in outs])


def test_the_cudnn_trial_compares_with_the_flash_kernel_on_strided_views_and_runs_evaluations_call(monkeypatch):
    """The trial launch refuses a cuDNN that computes something else than the flash kernel on the model's strided
    q, k, v (one that reads them as contiguous gets the second sequence wrong), and calls it as training (with
    gradients, without and with the run's dropout) and evaluation (no_grad) do. Both kernels need a GPU: they are
    stood in for by per-sequence attention on the CPU."""

    flash, right, wrong = SequenceAttention(), SequenceAttention(), SequenceAttention(assumed_stride=True)
    monkeypatch.setattr(preflight, "FlashVarlenAttention", flash)
    monkeypatch.setattr(preflight, "CudnnVarlenAttention", right)
    preflight.try_cudnn_attention(torch.device("cpu"), 2, 8, torch.float32, 0.1)
    assert right.calls == [(True, 0.0), (False, 0.0), (True, 0.1)]  # training, evaluation, training with dropout
    monkeypatch.setattr(preflight, "CudnnVarlenAttention", wrong)
    with pytest.raises(ValueError, match="its output differs from the flash kernel's by .* of the largest value"):
        preflight.try_cudnn_attention(torch.device("cpu"), 2, 8, torch.float32, 0.1)
