"""The fused kernels (`trainer.fused`: bias-dropout-residual-LayerNorm, bias-GELU) against their eager references,
run in Triton's interpreter on the CPU: `python -m tests.trainer.fused_kernels_checks` with TRITON_INTERPRET=1 (read
when triton is imported, so a process of its own: tests/trainer/test_fused_kernels.py starts it). Prints one JSON
object of measured differences and counts; the tests assert on them. With `--slow`, only the cases of the slow tests
(`SLOW_CASES`: the model with one kernel, and with the norm's hidden dropout) instead."""

from __future__ import annotations

import contextlib
import copy
import json
import sys

import numpy as np
import torch
import torch.nn.functional as F

from tests.trainer.conftest import make_model_config, make_samples
from tests.trainer.test_fused_paths import LENGTHS, exact_gradients, train_steps
from trainer.config import TrainerConfig
from trainer.data.batch import pack_batch
from trainer.fused import gelu, interpreting, norm, set_launch
from trainer.fused.gelu import bias_gelu
from trainer.fused.norm import bias_dropout_add_norm, dropout_keep
from trainer.model import BertForPreTraining, pretraining_loss
from trainer.preflight import check_fused_kernels


def relative(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """The largest difference over the reference's largest magnitude."""
    scale = reference.abs().max().item()
    return (ours.double() - reference.double()).abs().max().item() / scale if scale else ours.abs().max().item()


def ulps(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """The largest difference in units in the last place of `ours`' dtype at each reference value."""
    exponent = torch.floor(torch.log2(reference.abs().clamp_min(torch.finfo(ours.dtype).tiny)))
    ulp = torch.pow(2.0, exponent) * torch.finfo(ours.dtype).eps
    return ((ours.double() - reference) / ulp).abs().max().item() if ours.numel() else 0.0


def against_eager(rows: int, cols: int, p: float, training: bool, dtype=torch.float32) -> dict:
    """The fused op's output and five gradients against the eager composition in float64 with the mask the kernel
    drew (`dropout_keep` of the seed it drew: torch's generator is reset to draw it again); relative differences."""
    torch.manual_seed(3)
    mm, residual = torch.randn(rows, cols, dtype=dtype), torch.randn(rows, cols, dtype=dtype)
    bias, weight, norm_bias = torch.randn(cols), 1 + 0.1 * torch.randn(cols), torch.randn(cols)
    grad = torch.randn(rows, cols, dtype=dtype)
    leaves = [t.clone().requires_grad_() for t in (mm, bias, residual, weight, norm_bias)]
    torch.manual_seed(11)
    out = bias_dropout_add_norm(*leaves, p, 1e-12, training)
    out.backward(grad)
    torch.manual_seed(11)
    seed = torch.randint(0, 2**62, (1,), dtype=torch.int64)  # the draw `dropout_seed` made
    keep = dropout_keep(seed, (rows, cols), p) if training and p > 0 else torch.ones(rows, cols, dtype=torch.bool)
    exact = [t.detach().double().requires_grad_() for t in (mm, bias, residual, weight, norm_bias)]
    scale = 1 / (1 - p) if training else 1.0
    x = exact[2] + (exact[0] + exact[1]) * keep * scale
    reference = F.layer_norm(x, (cols,), exact[3], exact[4], 1e-12)
    reference.backward(grad.double())
    names = ("mm", "bias", "residual", "weight", "norm_bias")
    result = {"out": relative(out, reference), "out_dtype": str(out.dtype), "dropped": 1 - keep.float().mean().item()}
    result.update({f"d_{n}": relative(leaf.grad, ref.grad) for n, leaf, ref in zip(names, leaves, exact, strict=True)})
    if dtype != torch.float32:  # the activations' results in units of their dtype's last place
        result["ulps"] = {"out": ulps(out, reference.detach()), "d_mm": ulps(leaves[0].grad, exact[0].grad),
                          "d_residual": ulps(leaves[2].grad, exact[2].grad)}  # fmt: skip
    return result


def gelu_against_eager(rows: int, cols: int, dtype=torch.float32) -> dict:
    """The fused bias-GELU's output and both gradients against float64 eager `F.gelu(mm + bias)`; relative
    differences (and, in a half dtype, the output's and the product's gradient's in units in the last place)."""
    torch.manual_seed(5)
    mm, bias, grad = 2 * torch.randn(rows, cols, dtype=dtype), torch.randn(cols), torch.randn(rows, cols, dtype=dtype)
    leaves = [mm.clone().requires_grad_(), bias.clone().requires_grad_()]
    out = bias_gelu(*leaves)
    out.backward(grad)
    exact = [t.detach().double().requires_grad_() for t in (mm, bias)]
    reference = F.gelu(exact[0] + exact[1])
    reference.backward(grad.double())
    result = {"out": relative(out, reference), "out_dtype": str(out.dtype),
              "d_mm": relative(leaves[0].grad, exact[0].grad), "d_bias": relative(leaves[1].grad, exact[1].grad),
              "d_bias_dtype": str(leaves[1].grad.dtype)}  # fmt: skip
    if dtype != torch.float32:
        result["ulps"] = {"out": ulps(out, reference.detach()), "d_mm": ulps(leaves[0].grad, exact[0].grad)}
    return result


@contextlib.contextmanager
def tiles_of(rows: int):
    """Every kernel launched with tiles of `rows` rows (the backward's programs still 2 tiles each): in the
    interpreter a program costs milliseconds whatever its tile, so a few large ones compute the same rows sooner.
    Each row is computed alone (the mask's draws too: a row's counters do not depend on the tile), only the
    backward's partial sums of the weights' gradients add up over fewer programs."""
    set_launch({"norm_forward": {"ROWS": rows}, "norm_backward": {"ROWS": rows}, "gelu_forward": {"ROWS": rows},
                "gelu_backward": {"ROWS": rows}})  # fmt: skip
    try:
        yield
    finally:
        set_launch({})


def mask_statistics(rows: int = 400, cols: int = 250, p: float = 0.1) -> dict:
    """How many elements a mask drops, and how many positions two seeds' masks share (the masks drawn in one tile
    each: the same masks as in the default tiles of 16 rows)."""
    with tiles_of(512):
        first = dropout_keep(torch.tensor([12345]), (rows, cols), p)
        again = dropout_keep(torch.tensor([12345]), (rows, cols), p)
        other = dropout_keep(torch.tensor([12346]), (rows, cols), p)
    return {"n": rows * cols, "dropped": int((~first).sum()), "same_seed_equal": bool(torch.equal(first, again)),
            "other_seed_agree": int((first == other).sum()),
            "rows_equal": int((first[0] == first[1]).sum())}  # fmt: skip


def model_against_eager(switches: dict) -> dict:
    """The tiny model with the fused kernels `switches` turns on against the eager one, float32, over AdamW steps:
    BERT's attention dropout seeded (the fused kernels draw nothing at hidden dropout 0, so both draw the same
    attention masks); losses, and each gradient's difference from the eager one and both their distances from the
    exact (float64) gradient. The fused model runs tiles of 64 rows (`tiles_of`): a step's ~200 tokens in 3 or 4
    programs forward and 2 backward, whose partial sums add up."""
    samples = make_samples(LENGTHS)
    cfg = make_model_config(attention_probs_dropout_prob=0.1)
    torch.manual_seed(0)
    eager = BertForPreTraining(cfg)
    fused = BertForPreTraining(cfg.model_copy(update=switches))
    fused.load_state_dict(eager.state_dict())
    untrained = copy.deepcopy(eager)  # for another seed's run from the same weights
    exact = exact_gradients(eager, samples)
    reference_losses, reference_grads = train_steps(eager, samples)
    with tiles_of(64):
        losses, grads = train_steps(fused, samples)
    other_seed = train_steps(untrained, samples, seed=2)[0]
    gradients = {}
    for name, grad in grads.items():
        gradients[name] = {
            "difference": (grad - reference_grads[name]).abs().max().item(),
            "scale": reference_grads[name].abs().max().item(),
            "float32_error": (reference_grads[name].double() - exact[name]).abs().max().item(),
            "fused_error": (grad.double() - exact[name]).abs().max().item(),
        }
    return {"losses": losses, "reference_losses": reference_losses, "other_seed_losses": other_seed,
            "same_names": sorted(fused.state_dict()) == sorted(eager.state_dict()), "gradients": gradients,
            "missing": sorted(reference_grads.keys() - grads.keys())}  # fmt: skip


def model_with_dropout() -> dict:
    """The tiny model with `model.fused_norm` and BERT's hidden dropout: the losses of two seeds, of one seed twice,
    and eval mode's logits twice (no dropout there)."""
    samples = make_samples(LENGTHS)
    torch.manual_seed(0)
    model = BertForPreTraining(make_model_config(hidden_dropout_prob=0.1, fused_norm=True))
    batch = pack_batch(samples, np.arange(len(LENGTHS)))

    def loss(seed: int) -> float:
        torch.manual_seed(seed)
        return pretraining_loss(model(batch), batch).total.item()

    model.eval()
    with torch.no_grad():
        eval_equal = torch.equal(model(batch).mlm_logits, model(batch).mlm_logits)
    eval_loss = pretraining_loss(model(batch), batch).total.item()
    model.train()
    return {"seed1": loss(1), "seed1_again": loss(1), "seed2": loss(2), "eval_equal": eval_equal,
            "eval_loss": eval_loss}  # fmt: skip


@contextlib.contextmanager
def gpu_launch_shapes():
    """The kernels launched as on a GPU, in the interpreter: the norm one row a tile, 16 tiles a program in the
    backward; GELU tiles of 4 rows by 32 columns (rows of 80: three column blocks, the last one part), 4 tiles a
    program. The interpreter's own shapes (16 rows a tile, the whole row) leave those loops and bounds unrun."""
    set_launch({"norm_forward": {"ROWS": 1}, "norm_backward": {"ROWS": 1, "TILES_PER_PROGRAM": 16},
                "gelu_forward": {"ROWS": 4, "COLS": 32},
                "gelu_backward": {"ROWS": 4, "COLS": 32, "TILES_PER_PROGRAM": 4}})  # fmt: skip
    try:
        yield
    finally:
        set_launch({})


def empty_batch() -> dict:
    """Both ops on no rows: outputs of no rows, the weights' and biases' gradients zero."""
    mm, bias, residual = (torch.zeros(0, 8, requires_grad=True), torch.ones(8, requires_grad=True),
                          torch.zeros(0, 8, requires_grad=True))  # fmt: skip
    weight, norm_bias = torch.ones(8, requires_grad=True), torch.ones(8, requires_grad=True)
    out = bias_dropout_add_norm(mm, bias, residual, weight, norm_bias, 0.1, 1e-12, True)
    activated = bias_gelu(mm, bias)
    (out.sum() + activated.sum()).backward()
    grads = [t.grad for t in (mm, bias, residual, weight, norm_bias)]
    return {"shapes": [list(out.shape), list(activated.shape)],
            "grads_zero": all(g is not None and not g.any() for g in grads)}  # fmt: skip


# The tiny model with one kernel and with the norm's hidden dropout: seconds each in the interpreter, measured for the
# slow tests only. The default ones run both kernels in the model (`model_both`), and the dropout's seed and eval mode
# at the op (`dropout`, `eval`, `mask`).
SLOW_CASES = {
    "model": lambda: model_against_eager({"fused_norm": True}),
    "model_gelu": lambda: model_against_eager({"fused_gelu": True}),
    "model_dropout": model_with_dropout,
}


def main(argv: list[str]) -> None:
    assert interpreting(), "run with TRITON_INTERPRET=1"
    if argv == ["--slow"]:
        print(json.dumps({name: measure() for name, measure in SLOW_CASES.items()}))
        return
    assert not argv, f"unknown arguments {argv} (--slow or none)"
    results = {
        "dropout": against_eager(37, 48, 0.1, True),  # a row narrower than the kernel's block (64)
        "dropout_quarter": against_eager(29, 64, 0.25, True),
        "eval": against_eager(37, 48, 0.1, False),
        "bf16": against_eager(37, 48, 0.1, True, torch.bfloat16),
        "gelu": gelu_against_eager(37, 80),  # a row narrower than the kernel's block (128)
        "gelu_bf16": gelu_against_eager(37, 80, torch.bfloat16),
        "mask": mask_statistics(),
        "model_both": model_against_eager({"fused_norm": True, "fused_gelu": True}),
        "no_rows": empty_batch(),
    }
    with gpu_launch_shapes():
        results["gpu_shapes"] = {
            "dropout": against_eager(21, 48, 0.1, True),  # 2 programs backward, the second partly past the rows
            "gelu": gelu_against_eager(37, 80),
            "launches": [norm._launch("norm_backward", 48), gelu._launch("gelu_backward", 80)],
        }
    results["default_launches"] = [norm._launch("norm_backward", 48), gelu._launch("gelu_backward", 80)]
    cfg = TrainerConfig(model=make_model_config(fused_norm=True, fused_gelu=True).model_dump())
    half = TrainerConfig(model=make_model_config(fused_norm=True, fused_gelu=True, half_residual=True).model_dump())
    results["trial_launches"] = [
        trial_launches(cfg, None),  # kernels_run and the trial launch pass where the kernels run
        trial_launches(half, torch.bfloat16),  # bf16 products and residual stream
    ]
    print(json.dumps(results))


def trial_launches(cfg: TrainerConfig, autocast: torch.dtype | None) -> list[str]:
    """The kernels the trainer's check of `cfg` launched (each launch asks `_launch` for its shape), in order."""
    launched = []
    real = {module: module._launch for module in (norm, gelu)}

    def recording(module):
        def launch(kernel: str, cols: int) -> dict:
            launched.append(kernel)
            return real[module](kernel, cols)

        return launch

    try:
        for module in real:
            module._launch = recording(module)
        check_fused_kernels(cfg, torch.device("cpu"), autocast)
    finally:
        for module, launch in real.items():
            module._launch = launch
    return launched


if __name__ == "__main__":
    main(sys.argv[1:])
