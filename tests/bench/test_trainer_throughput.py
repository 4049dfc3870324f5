"""bench.trainer_throughput's timing loop: every model steps on the same batches, the valid tokens counted are those
of the timed steps, and a model whose step runs out of device memory leaves the comparison without stopping the
others (at large batches Hugging Face's padded model needs several times our activations, and a GPU is lent for
minutes). The allocator failing is stood in for by a step that raises PyTorch's own `OutOfMemoryError`."""

from __future__ import annotations

import re
from functools import partial

import numpy as np
import pytest
import torch

from bench.trainer_throughput import (
    bf16_weights,
    build_models,
    fixed_shape,
    parse_variant,
    print_breakdowns,
    step_ours,
    time_steps,
)
from tests.trainer.conftest import make_model_config, make_samples
from trainer.config import OptimizerConfig
from trainer.data.batch import masked_counts
from trainer.model import BertForPreTraining
from trainer.optim import build_optimizer

LENGTHS = [7, 33, 64, 12, 50, 5, 64, 21]


def runner(model, samples):
    return partial(step_ours, model, samples=samples, device=torch.device("cpu"), autocast=None), model


def test_a_model_out_of_memory_leaves_the_comparison_and_the_others_are_timed(capsys):
    samples = make_samples(LENGTHS)
    torch.manual_seed(0)
    ours, other = BertForPreTraining(make_model_config()), BertForPreTraining(make_model_config())
    seen = []

    def runs_out_at_its_second_step(opt, index):
        seen.append(list(index))
        if len(seen) == 2:
            for p in other.parameters():  # a step that failed half-way leaves gradients behind: they must go
                p.grad = torch.ones_like(p)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        runner(other, samples)[0](opt=opt, index=index)

    runners = {"ours": runner(ours, samples), "big": (runs_out_at_its_second_step, other)}
    optimizers = {name: build_optimizer(model, OptimizerConfig(name="lamb", lr=1e-4)) for name, (_, model) in
                  runners.items()}  # fmt: skip
    before = {name: p.detach().clone() for name, p in ours.named_parameters()}
    seconds, tokens, _ = time_steps(runners, optimizers, samples, batch=2, warmup=1, steps=3,
                                    device=torch.device("cpu"))  # fmt: skip

    assert list(seconds) == list(runners) == ["ours"] and seconds["ours"] > 0
    assert "big" not in optimizers and all(p.grad is None for p in other.parameters())
    assert tokens == {"ours": sum(LENGTHS[2:8])}  # steps 1-3 (batches of 2) are timed, step 0 is the warm-up
    assert seen == [[0, 1], [2, 3]]  # the same batches as every other model, and no step after the failure
    assert any((p - before[name]).abs().max() > 0 for name, p in ours.named_parameters())  # ours kept training
    assert "big: out of device memory at batch 2; left out of the comparison" in capsys.readouterr().out


class CompilationError(Exception):
    """As Triton's compile errors are: an Exception, not a RuntimeError."""


@pytest.mark.parametrize("error", [RuntimeError, CompilationError])
def test_a_model_whose_step_fails_leaves_the_comparison_saying_why(capsys, error):
    samples = make_samples(LENGTHS)
    torch.manual_seed(0)
    ours, other = BertForPreTraining(make_model_config()), BertForPreTraining(make_model_config())

    def refused(opt, index):
        raise error("FlashAttention only supports Ampere GPUs or newer.\nmore detail")

    runners = {"ours": runner(ours, samples), "refused": (refused, other)}
    optimizers = {name: build_optimizer(model, OptimizerConfig(name="lamb", lr=1e-4)) for name, (_, model) in
                  runners.items()}  # fmt: skip
    seconds, _, _ = time_steps(runners, optimizers, samples, batch=2, warmup=1, steps=2, device=torch.device("cpu"))
    assert list(seconds) == ["ours"]
    assert (f"refused: failed ({error.__name__}: FlashAttention only supports Ampere GPUs or newer.) at batch 2; left "
            "out of the comparison") in capsys.readouterr().out  # fmt: skip


def test_every_model_out_of_memory_is_an_error_that_says_to_lower_the_batch():
    samples = make_samples(LENGTHS)
    model = BertForPreTraining(make_model_config())

    def out_of_memory(opt, index, **_):
        raise torch.OutOfMemoryError("CUDA out of memory")

    runners = {"only": (out_of_memory, model)}
    optimizers = {"only": build_optimizer(model, OptimizerConfig(name="lamb", lr=1e-4))}
    with pytest.raises(SystemExit, match="every model ran out of device memory or failed at batch 4: see above"):
        time_steps(runners, optimizers, samples, batch=4, warmup=0, steps=1, device=torch.device("cpu"))


def test_the_breakdown_names_the_kernels_that_took_the_time():
    """`--breakdown --top N`: the step's operators summed by name, the most time first; their launches add up to the
    step's kernel count and their time to the split's (attention + matmul + optimizer + other)."""
    from bench.trainer_throughput import breakdown, format_top

    samples = make_samples(LENGTHS)
    torch.manual_seed(0)
    model = BertForPreTraining(make_model_config())
    run, _ = runner(model, samples)
    opt = build_optimizer(model, OptimizerConfig(name="lamb", lr=1e-4))
    parts = breakdown(partial(run, opt=opt, index=[0, 1, 2]), torch.device("cpu"))
    rows = parts["by name"]
    assert [t for _, t, _ in rows] == sorted((t for _, t, _ in rows), reverse=True)
    assert sum(c for _, _, c in rows) == parts["kernels"] > 0
    split = parts["attention"] + parts["matmul"] + parts["optimizer"] + parts["other device"]
    assert sum(t for _, t, _ in rows) == pytest.approx(split, rel=1e-9)
    assert any(name == "aten::addmm" for name, _, _ in rows)
    # The optimizer's share: what ran from its start on, its fused Adam pass among it, none of the step's matrix
    # products (they all count as such), and the profiler's range itself is no operator
    by_name = {name: t for name, t, _ in rows}
    assert parts["optimizer"] >= by_name["aten::_fused_adam_"] > 0 and "optimizer step" not in by_name
    matmuls = sum(t for name, t in by_name.items() if name in ("aten::mm", "aten::addmm", "aten::bmm"))
    assert parts["matmul"] == pytest.approx(matmuls, rel=1e-9)
    top = format_top(parts, 3).splitlines()
    assert len(top) == 3 and rows[0][0] in top[0]


def test_the_loss_log_softmax_is_no_attention_and_a_profiler_range_is_no_work():
    """On a GPU the loss's log-softmax kernel is `cunn_SoftMaxForward<..., LogSoftMaxForwardEpilogue>`; a
    `record_function` range appears there as a device event spanning the kernels it launched."""
    from bench.trainer_throughput import breakdown, category

    assert category("void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, c10::BFloat16, float, float, "
                    "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>") is None  # fmt: skip
    assert category("aten::_log_softmax") is None and category("aten::_log_softmax_backward_data") is None
    assert category("void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, float, float, float, "
                    "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>") == "attention"  # fmt: skip
    assert category("aten::_safe_softmax") == "attention" and category("sm90_xmma_gemm_bf16bf16") == "matmul"

    def step(profiled):  # two operators inside a range of their own
        with torch.profiler.record_function("a range"):
            torch.ones(64, 64).mm(torch.ones(64, 64)).sum()

    parts = breakdown(step, torch.device("cpu"))
    names = [name for name, _, _ in parts["by name"]]
    assert "aten::mm" in names and "a range" not in names


def test_without_hf_the_share_of_peak_counts_hf_models_parameters():
    """`--no-hf` builds no Hugging Face model; 6·N still counts N as Hugging Face's model of that size has it (ours
    pads the vocabulary to a multiple of 8)."""
    import transformers

    from bench.trainer_throughput import build_models, hf_parameters

    cfg = make_model_config()
    ours, hf = build_models(cfg, torch.device("cpu"), 0, ["padded", "padded+compile"], hf_too=False)
    assert hf is None and list(ours) == ["padded", "padded+compile"]
    first, second = ours.values()
    assert all(
        torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values(), strict=True)
    )
    assert cfg.padded_vocab_size > cfg.vocab_size
    reference = transformers.BertForPreTraining(transformers.BertConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads, intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings))  # fmt: skip
    assert hf_parameters(first) == sum(p.numel() for p in reference.parameters())


def test_hf_padded_to_the_batch_max_runs_only_where_some_batch_is_shorter_than_the_full_length():
    from types import SimpleNamespace

    from bench.trainer_throughput import batch_max_is_full_length

    samples = SimpleNamespace(lengths=np.array([512, 30, 40, 512, 512, 7, 90, 100]))
    assert batch_max_is_full_length(samples, batch=2, batches=2, seq_len=512)  # [512, 30], [40, 512]
    assert not batch_max_is_full_length(samples, batch=2, batches=4, seq_len=512)  # ..., [90, 100]
    assert not batch_max_is_full_length(samples, batch=4, batches=2, seq_len=1024)


def test_models_can_step_at_batches_of_their_own_and_count_their_own_tokens():
    """`--hf-batch`: each runner takes its own batch size; runners of one size see the same batches."""
    samples = make_samples(LENGTHS)
    torch.manual_seed(0)
    models = {name: BertForPreTraining(make_model_config()) for name in ("small", "big", "big too")}
    seen: dict[str, list] = {name: [] for name in models}

    def stepping(name):
        def run(opt, index):
            seen[name].append(list(index))
            runner(models[name], samples)[0](opt=opt, index=index)

        return run, models[name]

    runners = {name: stepping(name) for name in models}
    optimizers = {name: build_optimizer(m, OptimizerConfig(name="lamb", lr=1e-4)) for name, m in models.items()}
    sizes = {"small": 1, "big": 3, "big too": 3}
    seconds, tokens, _ = time_steps(runners, optimizers, samples, sizes, warmup=1, steps=1, device=torch.device("cpu"))
    assert seen == {"small": [[0], [1]], "big": [[0, 1, 2], [3, 4, 5]], "big too": [[0, 1, 2], [3, 4, 5]]}
    assert tokens == {"small": LENGTHS[1], "big": sum(LENGTHS[3:6]), "big too": sum(LENGTHS[3:6])}
    assert set(seconds) == set(models) and all(s > 0 for s in seconds.values())


def test_past_the_deadline_the_timing_stops_after_the_round_under_way(capsys):
    """`--max-seconds`: a deadline already passed still times one step of every model (and warms up first), then
    stops; the figures are of the steps timed."""
    samples = make_samples(LENGTHS)
    torch.manual_seed(0)
    models = {name: BertForPreTraining(make_model_config()) for name in ("a", "b")}
    runners = {name: runner(model, samples) for name, model in models.items()}
    optimizers = {name: build_optimizer(m, OptimizerConfig(name="lamb", lr=1e-4)) for name, m in models.items()}
    timing = time_steps(runners, optimizers, samples, batch=2, warmup=1, steps=3, device=torch.device("cpu"),
                        deadline=0.0)  # fmt: skip
    assert timing.steps == 1 and timing.tokens == {"a": sum(LENGTHS[2:4]), "b": sum(LENGTHS[2:4])}
    out = capsys.readouterr().out
    assert "time is up (--max-seconds): 1 of 3 steps timed" in out
    # each model's first step (its compiling, where compiled) is said, from the seconds it took
    (line,) = [x for x in out.splitlines() if x.startswith("  first step (with any compiling): ")]
    said = [part.rsplit(" ", 2) for part in line.split(": ", 1)[1].split(", ")]
    assert [name for name, _, _ in said] == list(runners) and all(unit == "s" for _, _, unit in said)
    assert all(float(seconds) >= 0 for _, seconds, _ in said)


def test_a_breakdown_that_fails_is_said_and_the_others_still_come_until_the_deadline(capsys):
    """The profiled steps run a batch never timed (it may not fit) and cost seconds each: one that runs out of memory
    is named and the next still comes; past the deadline the rest are left out, where the check's limit would
    otherwise cut them (and the lines after them) off."""
    samples = make_samples(LENGTHS)
    torch.manual_seed(0)
    ours = BertForPreTraining(make_model_config())

    def out_of_memory(opt, index, **_):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    runners = {"big": (out_of_memory, ours), "ours": runner(ours, samples)}
    optimizers = {name: build_optimizer(ours, OptimizerConfig(name="lamb", lr=1e-4)) for name in runners}
    sizes = {"big": 2, "ours": 2}
    print_breakdowns(runners, optimizers, sizes, at_step=1, device=torch.device("cpu"), top=0, deadline=None)
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["big", "breakdown", "failed", "(OutOfMemoryError:", "CUDA", "out", "of", "memory.",
                                "Tried", "to", "allocate", "2.00", "GiB)"]  # fmt: skip
    assert lines[2].split()[0] == "ours" and len(lines) == 3  # profiled: the row of its parts
    print_breakdowns(runners, optimizers, sizes, at_step=1, device=torch.device("cpu"), top=0, deadline=0.0)
    assert capsys.readouterr().out == "  breakdown left out: --max-seconds has passed\n"


def test_the_bf16_weights_variant_holds_bf16_weights_and_its_steps_update_them():
    """`+bf16w` (the benchmark's own: bf16 weights, no fp32 master copies) is the model of its other switches with
    every weight in bf16, and a timed step (LAMB, fp32 moments) moves them."""
    assert parse_variant("packed+half+bf16w") == parse_variant("packed+half")
    assert bf16_weights("packed+half+bf16w") and not bf16_weights("packed+half")
    with pytest.raises(SystemExit, match=re.escape("KERNEL[+compile|+whole|+fused|+gelu][+half][+static][+bf16w]")):
        parse_variant("packed+bf16")
    samples = make_samples(LENGTHS)
    cfg = make_model_config()
    ours, _ = build_models(cfg, torch.device("cpu"), 0, ["packed", "packed+bf16w"], hf_too=False)
    assert {p.dtype for p in ours["packed+bf16w"].parameters()} == {torch.bfloat16}
    assert {p.dtype for p in ours["packed"].parameters()} == {torch.float32}
    model = ours["packed+bf16w"]
    before = [p.detach().clone() for p in model.parameters()]
    opt = build_optimizer(model, OptimizerConfig(name="lamb", lr=1e-2))
    step_ours(model, opt, samples, np.arange(4), torch.device("cpu"), None)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))


def test_the_static_variant_pads_every_timed_batch_to_one_budget_above_the_largest():
    """`+static` (model.static_shapes): one budget for all the benchmark's batches, the next multiple of 64 above the
    most tokens any of them holds, and masked positions for the most any holds."""
    off = {"fused_norm": False, "fused_gelu": False, "varlen_kernel": "flash"}
    assert parse_variant("varlen+compile+half+static") == {"attention": "varlen", "compile": True,
                                                           "compile_model": False, "half_residual": True,
                                                           "static_shapes": True, **off}  # fmt: skip
    with pytest.raises(SystemExit, match="'varlen\\+compile\\+whole': Value error, model.compile_model compiles"):
        parse_variant("varlen+compile+whole")
    assert parse_variant("varlen+whole+half+static") == {"attention": "varlen", "compile": False,
                                                         "compile_model": True, "half_residual": True,
                                                         "static_shapes": True, **off}  # fmt: skip
    assert parse_variant("varlen+fused+half")["fused_norm"] and parse_variant("varlen+gelu")["fused_gelu"]
    with pytest.raises(SystemExit, match="'varlen\\+whole\\+fused': Value error, model.fused_norm runs its own"):
        parse_variant("varlen+whole+fused")
    samples = make_samples(LENGTHS)
    budget = fixed_shape(samples, 3, 2)  # batches [7, 33, 64] (104 tokens) and [12, 50, 5] (67)
    assert budget.tokens == 128
    masked = masked_counts(samples)
    assert budget.masked == 8 * -(-max(masked[:3].sum(), masked[3:6].sum()) // 8)


def test_chained_steps_run_in_a_row_per_model_and_count_the_timed_batches(capsys):
    """`--chain 2`: after the warm-up, each model takes two steps in a row before the other's (the last round has
    the one step left); the tokens are of the timed batches; a deadline already passed stops after the first
    round, with its two steps timed."""
    samples = make_samples(LENGTHS)
    torch.manual_seed(0)
    models = {name: BertForPreTraining(make_model_config()) for name in ("a", "b")}
    calls = []

    def recorded(name, run, index, **kwargs):
        calls.append((name, int(index[0]) // 2))
        return run(index=index, **kwargs)

    runners = {}
    for name, model in models.items():
        run, _ = runner(model, samples)
        runners[name] = (partial(recorded, name, run), model)
    optimizers = {name: build_optimizer(m, OptimizerConfig(name="lamb", lr=1e-4)) for name, m in models.items()}
    cpu = torch.device("cpu")
    timing = time_steps(dict(runners), optimizers, samples, batch=2, warmup=1, steps=3, device=cpu, chain=2)
    assert calls == [("a", 0), ("b", 0), ("a", 1), ("a", 2), ("b", 1), ("b", 2), ("a", 3), ("b", 3)]
    assert timing.steps == 3 and timing.tokens == {"a": sum(LENGTHS[2:8]), "b": sum(LENGTHS[2:8])}
    calls.clear()
    timing = time_steps(dict(runners), optimizers, samples, batch=2, warmup=1, steps=3, device=cpu, chain=2,
                        deadline=0.0)  # fmt: skip
    assert calls == [("a", 0), ("b", 0), ("a", 1), ("a", 2), ("b", 1), ("b", 2)]
    assert timing.steps == 2 and timing.tokens == {"a": sum(LENGTHS[2:6]), "b": sum(LENGTHS[2:6])}
    assert "time is up (--max-seconds): 2 of 3 steps timed" in capsys.readouterr().out


def test_the_cudnn_variant_is_the_varlen_model_on_cudnns_kernel(monkeypatch):
    """`+cudnn` is `model.varlen_kernel: cudnn`: the model's varlen attention calls cuDNN's kernel
    (`CudnnVarlenAttention`, stood in for by a recorder of its call: the kernel itself needs a GPU), on unpadded
    batches, eager; what the config refuses the variant refuses, naming it."""
    from trainer.attention import CudnnVarlenAttention, FlashVarlenAttention
    from trainer.data.batch import pack_batch

    assert parse_variant("varlen+half+cudnn") == {**parse_variant("varlen+half"), "varlen_kernel": "cudnn"}
    assert parse_variant("varlen+half")["varlen_kernel"] == "flash"
    for refused, why in [("packed+cudnn", "not of model.attention: packed"),
                         ("varlen+static+cudnn", "not with model.static_shapes"),
                         ("varlen+whole+cudnn", "not with model.compile_model")]:  # fmt: skip
        with pytest.raises(SystemExit, match=f"--variants: '{re.escape(refused)}': .*{why}"):
            parse_variant(refused)
    cfg = make_model_config(attention_probs_dropout_prob=0.1)
    ours, _ = build_models(cfg, torch.device("cpu"), 0, ["varlen+cudnn", "varlen"], hf_too=False)
    attention = {v: [layer.attention.self for layer in model.bert.encoder.layer] for v, model in ours.items()}
    assert all(a.varlen is CudnnVarlenAttention for a in attention["varlen+cudnn"])
    assert all(a.varlen is FlashVarlenAttention for a in attention["varlen"])
    calls = []

    def record(q, k, v, cu_seqlens, max_seqlen, dropout_p, padded=False):
        calls.append((cu_seqlens.tolist(), max_seqlen, dropout_p, padded))
        return q

    monkeypatch.setattr(CudnnVarlenAttention, "apply", staticmethod(record))
    samples = make_samples(LENGTHS)
    batch = pack_batch(samples, np.arange(3))
    x = torch.zeros(batch.num_tokens, ours["varlen+cudnn"].config.hidden_size)
    attention["varlen+cudnn"][0](x, batch, None)  # the varlen call (no layout), as a layer makes it
    assert calls == [([0, *np.cumsum(LENGTHS[:3]).tolist()], max(LENGTHS[:3]), 0.1, False)]
    monkeypatch.undo()  # the real call: a padded batch is refused before cuDNN is called
    with pytest.raises(ValueError, match="cuDNN's varlen attention takes batches of their sequences' tokens alone"):
        CudnnVarlenAttention.apply(x, x, x, batch.cu_seqlens, 64, 0.0, padded=True)


def test_fused_launch_launches_the_kernels_as_its_file_says_and_a_bad_file_stops_before_any_model(
    tmp_path, monkeypatch, capsys
):
    """`--fused-launch FILE` (what `bench.fused_kernels --write` saves) is set for the run and said; a file it cannot
    use is named, with what is wrong, before any model is built."""
    from bench import trainer_throughput
    from trainer import fused

    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text('{"norm_backward": {"TILES_PER_PROGRAM": 16}}')
    bad.write_text('{"norm_backward": {"TILES_PER_PROGRAM": 3}}')
    args = ["--variants", "padded", "--no-hf", "--steps", "1", "--warmup", "0", "--batch", "2", "--device", "cpu"]
    try:
        monkeypatch.setattr("sys.argv", ["trainer_throughput", "--fused-launch", str(good), *args])
        trainer_throughput.main()
        out = capsys.readouterr().out
        assert f'fused kernels launched as {good} says: {{"norm_backward": {{"TILES_PER_PROGRAM": 16}}}}' in out
        assert fused._launch_overrides == {"norm_backward": {"TILES_PER_PROGRAM": 16}}
        monkeypatch.setattr("sys.argv", ["trainer_throughput", "--fused-launch", str(bad), *args])
        monkeypatch.setattr(trainer_throughput, "build_models", lambda *a, **k: pytest.fail("a model was built"))
        with pytest.raises(SystemExit, match=f"--fused-launch {bad}: .*TILES_PER_PROGRAM must be a power of two"):
            trainer_throughput.main()
    finally:
        fused.set_launch({})
