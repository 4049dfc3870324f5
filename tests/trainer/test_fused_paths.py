"""Each fast path of the model against its eager reference on the CPU, float32: the jagged attention and the packed
grid against the padded grid, and the compiled per-token layers (`model.compile`) against the eager modules, losses
and gradients within 1e-5 relative over a few optimizer steps of a tiny model with BERT's dropout, seeded.

A few gradients cannot be known to 1e-5 in float32 at all: the next-sentence head's (pooler, classifier) sum six
sequences' terms that nearly cancel (every [CLS] starts from the same embedding), and the eager float32 model is
itself a few 1e-5 away from the exact gradient there. The exact gradient is the eager model run in float64 (the same
dropout masks: the draws do not depend on the dtype); a fast path's gradient must be within 1e-5 of the eager one,
or, where the eager float32 gradient is farther than that from the exact one, within that distance."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch._inductor.config as inductor_config

from tests.trainer.conftest import make_model_config, make_samples
from trainer.attention import (
    PaddingLayout,
    attention_kernel,
    attention_layout,
    flash_device,
    packed_attention,
    resolve_attention,
)
from trainer.config import OptimizerConfig, TrainerConfig
from trainer.data.batch import ShapeBudget, pack_batch
from trainer.errors import ConfigError
from trainer.layer_norm import LayerNorm
from trainer.model import (
    BertForPreTraining,
    PretrainingOutput,
    pretraining_logits,
    pretraining_loss,
)
from trainer.optim import build_optimizer

LENGTHS = [7, 33, 64, 12, 50, 5, 64, 21]
RTOL = 1e-5


def assert_close(ours: torch.Tensor, reference: torch.Tensor, what: str) -> None:
    scale = reference.abs().max().item()
    error = (ours - reference).abs().max().item()
    assert error <= RTOL * scale, f"{what}: largest difference {error:.3g} against a scale of {scale:.3g}"


def assert_gradients_close(grads: dict, reference: dict, exact: dict) -> None:
    """Every gradient within RTOL of the eager one, or within the eager float32 gradient's own distance from the
    exact (float64) one where that is larger; the key biases' gradients are zero in exact arithmetic (softmax does
    not see a constant added to every key of a query), so both must be rounding noise, far below the others."""
    assert grads.keys() == reference.keys() == exact.keys()
    largest = max(g.abs().max().item() for g in reference.values())
    for name, grad in grads.items():
        if name.endswith("attention.self.key.bias"):
            assert max(grad.abs().max().item(), reference[name].abs().max().item()) < 1e-6 * largest, name
            continue
        scale = reference[name].abs().max().item()
        float32_error = (reference[name].double() - exact[name]).abs().max().item()
        error = (grad - reference[name]).abs().max().item()
        assert error <= max(RTOL * scale, float32_error), (
            f"{name}: largest difference {error:.3g} against a scale of {scale:.3g} (float32's own error there: "
            f"{float32_error:.3g})"
        )


def exact_gradients(model: BertForPreTraining, samples, steps: int = 3) -> dict:
    """The gradients of `train_steps` on a float64 copy of `model` (taken before it trains)."""
    return train_steps(copy.deepcopy(model).double(), samples, steps)[1]


def train_steps(
    model: BertForPreTraining, samples, steps: int = 3, seed: int = 1, budget: ShapeBudget | None = None
) -> tuple[list[float], dict]:
    """`steps` AdamW steps over rotating micro-batches (padded to `budget` if given), dropout drawn from `seed`; the
    losses and last gradients."""
    optimizer = build_optimizer(model, OptimizerConfig(name="adamw", lr=1e-3))
    torch.manual_seed(seed)
    losses = []
    for step in range(steps):
        batch = pack_batch(samples, np.roll(np.arange(len(LENGTHS)), step)[:6], budget)
        loss = pretraining_loss(model(batch), batch)
        optimizer.zero_grad(set_to_none=True)
        loss.total.backward()
        losses.append(loss.total.item())
        if step < steps - 1:
            optimizer.step()
    return losses, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("attention", ["jagged", "packed"])
def test_attention_matches_the_padded_grid_forward_and_backward(attention):
    samples = make_samples(LENGTHS)
    torch.manual_seed(0)
    padded = BertForPreTraining(make_model_config(attention="padded"))
    fast = BertForPreTraining(make_model_config(attention=attention))
    fast.load_state_dict(padded.state_dict())
    exact = exact_gradients(padded, samples)
    reference_losses, reference_grads = train_steps(padded, samples)
    losses, grads = train_steps(fast, samples)
    assert np.allclose(losses, reference_losses, rtol=RTOL, atol=0)
    assert_gradients_close(grads, reference_grads, exact)


def test_jagged_attention_on_the_cpu_logs_nothing_of_pytorchs_internals():
    """Its backward asks PyTorch whether FX traces it, and PyTorch answers once per process with a warning for its
    own developers (`is_fx_tracing will return true ...`) on the trainer's stderr: the trainer drops that line."""
    import logging

    import torch.fx._symbolic_trace as symbolic_trace

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger(symbolic_trace.__name__)
    symbolic_trace.is_fx_tracing_warning.cache_clear()  # as in a fresh process
    logger.addHandler(handler)
    try:
        symbolic_trace.is_fx_tracing_warning()  # called where jagged attention calls it
        batch = pack_batch(make_samples(LENGTHS), np.arange(len(LENGTHS)))
        qkv = torch.randn(batch.num_tokens, 3, 4, 8, requires_grad=True)
        packed_attention(qkv, batch, attention_layout("jagged", batch), 0.1).sum().backward()
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in records] == [] and qkv.grad is not None


def test_the_packed_grid_has_fewer_rows_than_sequences_on_mixed_lengths():
    """What makes `packed` worth having: the batches above share rows (8 sequences, 5 rows), so its grid is smaller."""
    batch = pack_batch(make_samples(LENGTHS), np.arange(len(LENGTHS)))
    layout = attention_layout("packed", batch)
    assert (layout.batch, layout.length) == (5, max(LENGTHS))
    assert attention_layout("padded", batch).batch == len(LENGTHS)


@pytest.mark.parametrize("attention", ["jagged", "packed"])
def test_attention_dropout_keeps_the_expectation_and_is_off_in_eval(attention):
    """Inverted dropout on the attention weights: every draw differs from the output without dropout, their mean
    over 400 seeded draws is that output within 4 standard errors everywhere; p = 0 is the padded grid's output."""
    batch = pack_batch(make_samples(LENGTHS), np.arange(len(LENGTHS)))
    generator = torch.Generator().manual_seed(0)
    qkv = torch.randn(batch.num_tokens, 3, 4, 8, generator=generator)
    layout = attention_layout(attention, batch)
    grid = PaddingLayout.from_cu_seqlens(batch.cu_seqlens, batch.position_ids, batch.max_seqlen)
    exact = packed_attention(qkv, batch, grid, 0.0)
    assert_close(packed_attention(qkv, batch, layout, 0.0), exact, f"{attention} output without dropout")
    draws = []
    for seed in range(400):
        torch.manual_seed(seed)
        draws.append(packed_attention(qkv, batch, layout, 0.1))
    draws = torch.stack(draws)
    assert all((d - exact).abs().max() > 1e-3 for d in draws[:20])
    standard_error = draws.std(0) / 400**0.5
    assert ((draws.mean(0) - exact).abs() <= 4 * standard_error + 1e-6).float().mean() > 0.999
    assert (draws.mean(0) - exact).abs().max() < 0.05 * exact.abs().max()


def test_auto_attention_is_the_packed_grid_on_the_cpu_and_varlen_is_refused_there():
    cfg = make_model_config(attention="varlen", attention_probs_dropout_prob=0.1)
    batch = pack_batch(make_samples(LENGTHS), np.arange(4))
    with pytest.raises(ConfigError, match="model.attention: varlen needs a CUDA GPU of compute capability 8.0"):
        BertForPreTraining(cfg)(batch)
    for x in (torch.zeros(1), torch.zeros(1, device="meta")):  # what the model asks with its embeddings' output
        assert attention_kernel("auto", x, 16) == attention_kernel("auto", x, 64) == "packed"
    auto, packed = BertForPreTraining(make_model_config()), BertForPreTraining(make_model_config(attention="packed"))
    packed.load_state_dict(auto.state_dict())
    assert torch.equal(auto(batch).mlm_logits, packed(batch).mlm_logits)


def test_auto_attention_is_varlen_where_it_runs_else_the_padded_grid_on_a_gpu_and_the_packed_one_elsewhere():
    """In half precision where the flash kernel runs (a GPU of compute capability 8.0 or newer), auto takes varlen,
    with BERT's attention dropout too: on an H200 at batch 128 it trained BERT-large 1.56x as fast as the padded grid
    (BENCHMARKS.md). Elsewhere on a GPU (a V100 or T4, fp32, heads the kernel does not take) the padded grid; on the
    CPU, the packed grid (faster than the padded one there: BENCHMARKS.md)."""
    assert resolve_attention("auto", flash=True, half=True) == "varlen"
    assert resolve_attention("auto", flash=True, half=False) == "padded"
    assert resolve_attention("auto", flash=False, half=True, gpu=True) == "padded"  # a V100
    assert resolve_attention("auto", flash=False, half=False, gpu=False) == "packed"  # the CPU
    assert resolve_attention("auto", flash=False, half=True) == "packed"  # no GPU said: not one
    assert resolve_attention("jagged", flash=True, half=True) == "jagged"  # asked for, it is taken
    assert resolve_attention("padded", flash=True, half=True) == "padded"
    with pytest.raises(ConfigError, match="compute capability 8.0 or newer"):
        resolve_attention("varlen", flash=False, half=True)
    # Heads the flash kernel does not take (a multiple of 8, at most 256): auto takes the grid, varlen is refused
    assert resolve_attention("auto", flash=True, half=True, head_dim=12) == "padded"
    assert resolve_attention("auto", flash=True, half=True, head_dim=512) == "padded"
    with pytest.raises(ConfigError, match="heads of a multiple of 8 up to 256"):
        resolve_attention("varlen", flash=True, half=True, head_dim=12)


@pytest.mark.parametrize("budget", [None, ShapeBudget((320,), 48)], ids=["unpadded", "padded-to-a-budget"])
def test_the_varlen_kernel_is_called_as_pytorchs_flash_operators_take_it_checked_on_the_meta_device(budget):
    """The varlen path runs only on a GPU, but PyTorch's flash operators have meta kernels: a call on the meta device
    is checked against the operators' schemas (the number of arguments, tensors where tensors go) and gives the
    outputs' shapes. A self-attention layer of BERT's head size, bf16, on the meta device: the forward returns one
    row per token, and the backward, fed what the forward saved, gives every weight a gradient of its own shape,
    through the strided query/key/value views of one projection; on a batch padded to a budget (model.static_shapes)
    the kernel gets the sequences' tokens and the layer returns a row for every token, padding included."""
    from trainer.model import BertSelfAttention

    cfg = make_model_config(hidden_size=256, num_attention_heads=4, attention_probs_dropout_prob=0.1)
    attention = BertSelfAttention(cfg).to(device="meta", dtype=torch.bfloat16)
    host = pack_batch(make_samples(LENGTHS), np.arange(len(LENGTHS)), budget)
    batch = host.to("meta")
    rows = host.input_ids.numel()  # sum(LENGTHS), or the budget's length
    x = torch.empty(rows, 256, device="meta", dtype=torch.bfloat16, requires_grad=True)
    out = attention(x, batch, None)  # layout None: the varlen kernel
    assert (out.shape, out.dtype, out.device.type) == ((rows, 256), torch.bfloat16, "meta")
    assert rows == (sum(LENGTHS) if budget is None else 320)
    out.sum().backward()
    assert x.grad.shape == x.shape
    for name, parameter in attention.named_parameters():
        assert parameter.grad is not None and parameter.grad.shape == parameter.shape, name


@pytest.fixture
def inductor_uses_eager_random():
    """Compiled dropout draws its masks from the eager generator, so a seeded compiled step is the eager step."""
    with inductor_config.patch(fallback_random=True):
        torch._dynamo.reset()
        yield
    torch._dynamo.reset()


def test_compiled_layers_match_the_eager_model_over_optimizer_steps(inductor_uses_eager_random):
    samples = make_samples(LENGTHS)
    cfg = make_model_config(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    torch.manual_seed(0)
    eager = BertForPreTraining(cfg)
    compiled = BertForPreTraining(cfg.model_copy(update={"compile": True}))
    compiled.load_state_dict(eager.state_dict())
    untrained = copy.deepcopy(eager)  # for another seed's run from the same weights
    assert sorted(compiled.state_dict()) == sorted(eager.state_dict())  # checkpoints keep their names
    exact = exact_gradients(eager, samples)
    reference_losses, reference_grads = train_steps(eager, samples)
    losses, grads = train_steps(compiled, samples)
    assert np.allclose(losses, reference_losses, rtol=RTOL, atol=0)
    assert losses != train_steps(untrained, samples, seed=2)[0]  # the dropout draws matter
    assert_gradients_close(grads, reference_grads, exact)
    assert compiled.bert.encoder.layer[0].intermediate._compiled_call_impl is not None
    # Batches of other token and masked-token counts run on the kernels already compiled: a recompilation per
    # batch size would cost every new micro-batch seconds on a GPU.
    graphs = dict(torch._dynamo.utils.counters["stats"])
    assert graphs["unique_graphs"] > 0
    for index in ([0, 1], [1, 2, 3, 4, 5, 6, 7]):
        batch = pack_batch(samples, np.array(index))
        pretraining_loss(compiled(batch), batch).total.backward()
    assert dict(torch._dynamo.utils.counters["stats"]) == graphs


@pytest.mark.parametrize("attention", ["padded", "jagged", "packed"])
def test_batches_padded_to_a_budget_train_as_the_unpadded_ones(attention):
    """Fixed shapes (`model.static_shapes`): micro-batches of 171 to 201 tokens padded to lengths of 192 and 256
    (and their masked positions to 48) give the unpadded model's losses and gradients over optimizer steps, on
    every CPU kernel: the padding tokens never reach attention and the padding masked positions no loss (without
    dropout, whose draws the padding would shift)."""
    samples = make_samples(LENGTHS)
    torch.manual_seed(0)
    plain = BertForPreTraining(make_model_config(attention=attention))
    static = BertForPreTraining(make_model_config(attention=attention, static_shapes=True))
    static.load_state_dict(plain.state_dict())
    exact = exact_gradients(plain, samples)
    reference_losses, reference_grads = train_steps(plain, samples)
    budget = ShapeBudget((192, 256, 320), 48)  # the steps' 171, 187 and 201 tokens padded to 192, 192 and 256
    batch = pack_batch(samples, np.roll(np.arange(len(LENGTHS)), 2)[:6], budget)
    assert (batch.num_tokens, batch.input_ids.numel()) == (201, 256) and batch.masked_labels.numel() > batch.num_masked
    losses, grads = train_steps(static, samples, budget=budget)
    assert np.allclose(losses, reference_losses, rtol=RTOL, atol=0)
    assert_gradients_close(grads, reference_grads, exact)


def test_compiled_layers_on_fixed_shapes_match_the_eager_model_and_compile_once(inductor_uses_eager_random):
    """With `model.static_shapes` the layers are compiled for one shape: the compiled model on batches padded to a
    budget, with BERT's dropout, gives the eager model's losses and gradients on the same batches, and batches of
    other token counts padded to the same budget run without compiling again."""
    samples = make_samples(LENGTHS)
    cfg = make_model_config(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, static_shapes=True)
    torch.manual_seed(0)
    eager = BertForPreTraining(cfg)
    compiled = BertForPreTraining(cfg.model_copy(update={"compile": True}))
    compiled.load_state_dict(eager.state_dict())
    untrained = copy.deepcopy(eager)  # for another seed's run from the same weights
    budget = ShapeBudget((320,), 48)
    exact = train_steps(copy.deepcopy(eager).double(), samples, budget=budget)[1]
    reference_losses, reference_grads = train_steps(eager, samples, budget=budget)
    losses, grads = train_steps(compiled, samples, budget=budget)
    assert np.allclose(losses, reference_losses, rtol=RTOL, atol=0)
    assert losses != train_steps(untrained, samples, seed=2, budget=budget)[0]  # the dropout draws matter
    assert_gradients_close(grads, reference_grads, exact)
    graphs = dict(torch._dynamo.utils.counters["stats"])
    assert graphs["unique_graphs"] > 0
    for index in ([0, 1], [1, 2, 3, 4, 5, 6, 7]):
        batch = pack_batch(samples, np.array(index), budget)
        assert batch.input_ids.numel() == 320
        pretraining_loss(compiled(batch), batch).total.backward()
    assert dict(torch._dynamo.utils.counters["stats"]) == graphs


def test_the_compiled_model_matches_the_eager_model_over_optimizer_steps(inductor_uses_eager_random):
    """`model.compile_model`: the whole forward pass compiled as one graph (no graph break: fullgraph), LayerNorm
    through its opaque operators, gives the eager model's losses and gradients with BERT's dropout over optimizer
    steps, on the padded grid (built on the host, outside the graph) and batches of other token counts run on the
    graph already compiled."""
    samples = make_samples(LENGTHS)
    cfg = make_model_config(
        hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, attention="padded", num_hidden_layers=1
    )
    torch.manual_seed(0)
    eager = BertForPreTraining(cfg)
    compiled = BertForPreTraining(cfg.model_copy(update={"compile_model": True}))
    compiled.load_state_dict(eager.state_dict())
    untrained = copy.deepcopy(eager)  # for another seed's run from the same weights
    assert sorted(compiled.state_dict()) == sorted(eager.state_dict())  # checkpoints keep their names
    assert all(m.opaque for m in compiled.modules() if isinstance(m, LayerNorm))
    exact = exact_gradients(eager, samples)
    reference_losses, reference_grads = train_steps(eager, samples)
    before = dict(torch._dynamo.utils.counters["stats"])
    losses, grads = train_steps(compiled, samples)
    graphs = dict(torch._dynamo.utils.counters["stats"])
    assert graphs["unique_graphs"] == before.get("unique_graphs", 0) + 1  # one graph, for any number of tokens
    assert np.allclose(losses, reference_losses, rtol=RTOL, atol=0)
    assert losses != train_steps(untrained, samples, seed=2)[0]  # the dropout draws matter
    assert_gradients_close(grads, reference_grads, exact)
    with torch.profiler.profile() as profile:  # LayerNorm on PyTorch's kernels, forward and backward, in the graph
        for index in ([0, 1], [1, 2, 3, 4, 5, 6, 7]):
            batch = pack_batch(samples, np.array(index))
            pretraining_loss(compiled(batch), batch).total.backward()
    assert dict(torch._dynamo.utils.counters["stats"]) == graphs
    layer_norms = 2 + 2 * cfg.num_hidden_layers  # the embeddings', the MLM transform's, two in each layer
    calls = [event.name for event in profile.events()]
    assert calls.count("trainer::layer_norm") == calls.count("trainer::layer_norm_backward") == 2 * layer_norms


def test_the_compiled_model_on_fixed_shapes_with_the_varlen_kernel_is_one_graph_for_every_batch_of_a_shape():
    """The varlen path runs only on a GPU, but its operators have meta kernels: on the meta device, bf16, the compiled
    model on fixed shapes (`model.compile_model` with `model.static_shapes`, what runs as CUDA graphs on a GPU) traces
    as one graph through the flash operators, forward and backward (AOT autograd), every parameter gets a gradient,
    and batches of other token counts (171, 187, 201 tokens of six sequences, padded to 320) reuse the graph: the
    graph reads no int of the batch's, only its tensors."""
    samples = make_samples(LENGTHS)
    cfg = make_model_config(hidden_size=256, num_attention_heads=4, hidden_dropout_prob=0.1,
                            attention_probs_dropout_prob=0.1, attention="varlen", compile_model=True,
                            static_shapes=True)  # fmt: skip
    model = BertForPreTraining(cfg).to(device="meta", dtype=torch.bfloat16)
    traced = torch.compile(pretraining_logits, fullgraph=True, dynamic=False, backend="aot_eager")
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    tokens = set()
    for step in range(3):
        host = pack_batch(samples, np.roll(np.arange(len(LENGTHS)), step)[:6], ShapeBudget((320,), 48))
        tokens.add(host.num_tokens)
        batch = host.to("meta")
        mlm_logits, nsp_logits = traced(model, batch, None)
        assert (mlm_logits.shape, nsp_logits.shape) == ((48, cfg.vocab_size), (6, 2))
        pretraining_loss(PretrainingOutput(mlm_logits, nsp_logits), batch).total.backward()
    assert tokens == {171, 187, 201}
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == before + 1
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None and parameter.grad.shape == parameter.shape, name


@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float32), (torch.float64, torch.float64),
                                    (torch.bfloat16, torch.float32), (torch.bfloat16, torch.bfloat16)],
                         ids=["fp32", "fp64", "bf16-fp32-weights", "bf16"])  # fmt: skip
def test_the_opaque_layer_norm_operators_pass_pytorchs_operator_checks(dtypes):
    """torch.library.opcheck on both operators: the schema, the fake (meta) implementation against the real outputs'
    shapes and dtypes (the statistics are fp32 for a bf16 input with fp32 weights on the CPU, bf16 with bf16 ones),
    the autograd registration, and AOT autograd's tracing of them."""
    from trainer.layer_norm import _layer_norm, _layer_norm_backward

    x_dtype, weight_dtype = dtypes
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(6, 16, generator=generator).to(x_dtype).requires_grad_()
    weight = torch.randn(16, generator=generator).to(weight_dtype).requires_grad_()
    bias = torch.randn(16, generator=generator).to(weight_dtype).requires_grad_()
    torch.library.opcheck(_layer_norm, (x, weight, bias, 1e-12))
    transposed = torch.randn(16, 6, generator=generator).to(x_dtype).t()  # outputs contiguous all the same
    torch.library.opcheck(_layer_norm, (transposed, weight, bias, 1e-12))
    _, mean, rstd = _layer_norm(x, weight, bias, 1e-12)
    grad = torch.randn(6, 16, generator=generator).to(x_dtype)
    inputs = (grad, x, mean, rstd, weight, bias)
    torch.library.opcheck(_layer_norm_backward, tuple(t.detach() for t in inputs))  # (no double backward)


def test_the_opaque_layer_norm_is_layer_norm_forward_and_backward_in_each_dtype_autocast_gives_it():
    """The operators the compiled model runs LayerNorm through give F.layer_norm's output and gradients: float32,
    float64, and under the CPU's bf16 autocast (bf16 input, fp32 weights, as the eager call takes them), with and
    without the bf16 residual stream."""
    for dtype, autocast, half_io in [(torch.float32, False, False), (torch.float64, False, False),
                                     (torch.float32, True, False), (torch.float32, True, True)]:  # fmt: skip
        plain, opaque = LayerNorm(16, 1e-12, half_io), LayerNorm(16, 1e-12, half_io, opaque=True)
        with torch.no_grad():
            plain.weight.normal_(), plain.bias.normal_()
        opaque.load_state_dict(plain.state_dict())
        plain, opaque = plain.to(dtype), opaque.to(dtype)
        x = torch.randn(10, 16, dtype=dtype, generator=torch.Generator().manual_seed(0))
        outputs = []
        for module in (plain, opaque):
            source = x.clone().requires_grad_()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = module(source.bfloat16() if autocast else source)
            (out.float() * torch.arange(16.0)).sum().backward()
            outputs.append((out, source.grad, module.weight.grad, module.bias.grad))
        for ours, reference in zip(outputs[1], outputs[0], strict=True):
            assert ours.dtype == reference.dtype
            assert torch.equal(ours, reference)


# --------------------------------------------------------------------------- the same on a GPU (pytest -m gpu)

cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
flash_only = pytest.mark.skipif(
    not (torch.cuda.is_available() and flash_device(torch.device("cuda"))),
    reason="needs a GPU the flash kernel runs on (compute capability 8.0 or newer)",
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.usefixtures("inductor_uses_eager_random")
@pytest.mark.gpu
@cuda_only
def test_on_the_gpu_jagged_and_compiled_paths_match_the_padded_eager_model(dtype):
    """On CUDA, without dropout: jagged attention (the flash kernel in bf16), the packed grid, the compiled layers,
    the fused bias-dropout-residual-LayerNorm kernels and, in bf16, the varlen kernel, also with compiled layers, as
    the compiled model or with the fused kernels, and the bf16 residual stream give the padded eager model's
    losses, also on a batch padded to a budget (model.static_shapes); bf16 within 2 %, float32 within 1e-4 (the
    GPU's kernels sum in other orders)."""
    samples = make_samples(LENGTHS)
    torch.manual_seed(0)
    reference = BertForPreTraining(make_model_config(attention="padded")).cuda()
    results = {}
    variants = [{"attention": "jagged"}, {"attention": "packed"}, {"attention": "jagged", "compile": True}]
    if dtype is torch.bfloat16:  # the residual stream in bf16 (under CUDA's autocast LayerNorm is otherwise fp32)
        variants += [{"attention": "packed", "half_residual": True}]
    if dtype is torch.bfloat16 and flash_device(torch.device("cuda")):  # a half-precision flash kernel
        variants += [
            {"attention": "varlen"},
            {"attention": "varlen", "compile": True},
            {"attention": "varlen", "half_residual": True},
            {"attention": "varlen", "compile": True, "static_shapes": True},
            {"attention": "varlen", "compile_model": True},
            {"attention": "varlen", "half_residual": True, "fused_norm": True, "fused_gelu": True},
        ]  # (on fixed shapes: the CUDA graphs' test)
    variants += [{"attention": "packed", "static_shapes": True},
                 {"attention": "packed", "fused_norm": True, "fused_gelu": True}]  # fmt: skip
    for variant in variants:
        model = BertForPreTraining(make_model_config(**variant)).cuda()
        model.load_state_dict(reference.state_dict())
        results[tuple(variant.items())] = model
    batch = pack_batch(samples, np.arange(len(LENGTHS))).to("cuda")
    padded = pack_batch(samples, np.arange(len(LENGTHS)), ShapeBudget((384,), 72)).to("cuda")  # model.static_shapes'
    with torch.autocast("cuda", dtype=dtype, enabled=dtype is not torch.float32):
        expected = pretraining_loss(reference(batch), batch).total.item()
        for variant, model in results.items():
            given = padded if dict(variant).get("static_shapes") else batch
            out = []
            hook = model.bert.encoder.layer[0].register_forward_hook(lambda m, i, o, seen=out: seen.append(o.dtype))
            loss = pretraining_loss(model(given), given).total.item()
            hook.remove()
            assert loss == pytest.approx(expected, rel=2e-2 if dtype is torch.bfloat16 else 1e-4), variant
            half = dict(variant).get("half_residual", False)
            if not dict(variant).get("compile_model"):  # its layers ran no Python hook on the GPU (2026-11-30)
                assert out == [torch.bfloat16 if half else torch.float32], variant  # the residual stream's dtype


@pytest.mark.parametrize("attention", ["jagged", pytest.param("varlen", marks=flash_only)])
@pytest.mark.gpu
@cuda_only
def test_on_the_gpu_flash_attention_trains_with_dropout_in_bf16(attention):
    """BERT's attention dropout on the flash kernel: a few bf16 steps of the tiny model lower its loss on one
    repeated batch, and eval mode is deterministic."""
    samples = make_samples(LENGTHS)
    torch.manual_seed(0)
    model = BertForPreTraining(make_model_config(attention=attention, hidden_dropout_prob=0.1,
                                                 attention_probs_dropout_prob=0.1)).cuda()  # fmt: skip
    assert_trains_on_one_batch_and_evaluates_alike(model, pack_batch(samples, np.arange(len(LENGTHS))).to("cuda"))


@pytest.mark.gpu
@flash_only
def test_on_the_gpu_the_fused_kernels_train_with_dropout_in_bf16():
    """`model.fused_norm` and `model.fused_gelu` with the varlen kernel and the bf16 residual stream, BERT's
    dropout: a few bf16 steps lower the loss on one repeated batch, and eval mode is deterministic."""
    samples = make_samples(LENGTHS)
    torch.manual_seed(0)
    cfg = make_model_config(attention="varlen", half_residual=True, fused_norm=True, fused_gelu=True,
                            hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)  # fmt: skip
    model = BertForPreTraining(cfg).cuda()
    assert_trains_on_one_batch_and_evaluates_alike(model, pack_batch(samples, np.arange(len(LENGTHS))).to("cuda"))


def assert_trains_on_one_batch_and_evaluates_alike(model: BertForPreTraining, batch) -> None:
    """20 bf16 AdamW steps on one repeated batch lower its loss by more than 0.5; eval mode gives the same logits
    twice (copied before the second call: a CUDA graph's replay writes its outputs over the last one's)."""
    optimizer = build_optimizer(model, OptimizerConfig(name="adamw", lr=3e-3))
    losses = []
    for _ in range(20):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = pretraining_loss(model(batch), batch).total
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert np.isfinite(losses).all() and losses[-1] < losses[0] - 0.5, losses
    model.eval()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        assert torch.equal(model(batch).mlm_logits.clone(), model(batch).mlm_logits)


@pytest.mark.usefixtures("inductor_uses_eager_random")
@pytest.mark.gpu
@flash_only
def test_on_the_gpu_the_compiled_model_on_cuda_graphs_trains_as_the_eager_model():
    """`model.compile_model` with `model.static_shapes` and the varlen kernel: the forward and backward replayed as
    CUDA graphs (recorded, none skipped), over bf16 optimizer steps on batches of other token counts padded to one
    budget, give the eager model's losses (within bf16's 2 %); eval mode runs on graphs of its own and gives eval's
    loss. With BERT's dropout (the flash kernel's random state and the eager generator's inside the graphs), 20 steps
    on one batch lower its loss, and eval mode is deterministic."""
    samples = make_samples(LENGTHS)
    torch.manual_seed(0)
    cfg = make_model_config(attention="varlen", static_shapes=True)
    eager = BertForPreTraining(cfg).cuda()
    compiled = BertForPreTraining(cfg.model_copy(update={"compile_model": True})).cuda()
    compiled.load_state_dict(eager.state_dict())
    budget = ShapeBudget((384,), 72)
    results = []
    for model in (eager, compiled):
        optimizer = build_optimizer(model, OptimizerConfig(name="adamw", lr=1e-3))
        losses = []
        for step in range(6):
            batch = pack_batch(samples, np.roll(np.arange(len(LENGTHS)), step)[:6], budget).to("cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = pretraining_loss(model(batch), batch)
            optimizer.zero_grad(set_to_none=True)
            loss.total.backward()
            optimizer.step()
            losses.append(loss.total.item())
        model.eval()
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            losses.append(pretraining_loss(model(batch), batch).total.item())
        results.append(losses)
    assert np.allclose(results[1], results[0], rtol=2e-2, atol=0), results
    assert torch._dynamo.utils.counters["inductor"]["cudagraph_skips"] == 0
    assert torch._dynamo.utils.counters["inductor"]["cudagraph_recorded_non_static_inputs"] > 0  # graphs recorded
    dropout = cfg.model_copy(update={"compile_model": True, "hidden_dropout_prob": 0.1,
                                     "attention_probs_dropout_prob": 0.1})  # fmt: skip
    model = BertForPreTraining(dropout).cuda()
    assert_trains_on_one_batch_and_evaluates_alike(model, pack_batch(samples, np.arange(6), budget).to("cuda"))


@pytest.mark.parametrize("kernel", ["flash", "cudnn"])
@pytest.mark.gpu
@flash_only
def test_on_the_gpu_varlen_dropout_backward_uses_the_forward_mask(kernel):
    """The varlen kernel with dropout against an explicit computation from its own dropout mask, on flash's kernel
    and on cuDNN's (`model.varlen_kernel`), q, k and v strided views of one tensor as in the model. With the values
    set to the identity (each sequence no longer than head_dim), the output *is* the dropped, rescaled attention
    matrix P_d = P * M / (1 - p); the mask M is read from it. Then the forward must be softmax(q k^T / sqrt(d))
    where kept, about a fraction p dropped, and the backward must be the gradients of that very P_d (float32, from
    q, k and M): a backward that drew another mask would miss dv by whole entries."""
    from trainer.attention import VARLEN_KERNELS

    FlashVarlenAttention = VARLEN_KERNELS[kernel]  # noqa: N806 (the kernel under test)

    p, heads, head_dim = 0.25, 2, 64
    lengths = [7, 33, 64, 12, 50, 64]
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32, device="cuda")
    T = int(cu[-1])
    generator = torch.Generator("cuda").manual_seed(0)
    qkv = torch.zeros(T, 3, heads, head_dim, device="cuda", dtype=torch.half)  # q, k, v: strided views, as the
    for i in range(2):  # model gives them (a token's q, k and v side by side)
        qkv[:, i] = torch.randn(T, heads, head_dim, device="cuda", generator=generator).half()
    position = torch.as_tensor(np.arange(T) - np.repeat(np.cumsum([0] + lengths[:-1]), lengths), device="cuda")
    qkv[torch.arange(T, device="cuda"), 2, :, position] = 1.0
    g = torch.randn(T, heads, head_dim, device="cuda", generator=generator).half()
    qkv.requires_grad_()
    q, k, v = qkv.unbind(1)
    torch.manual_seed(3)
    out = FlashVarlenAttention.apply(q, k, v, cu, max(lengths), p)
    out.backward(g)
    grads = dict(zip(("dq", "dk", "dv"), qkv.grad.unbind(1), strict=True))
    kept, dropped = 0, 0
    for start, length in zip(np.cumsum([0] + lengths[:-1]), lengths, strict=True):
        rows = slice(int(start), int(start) + length)
        qs, ks, gs = (t[rows].float().transpose(0, 1) for t in (q.detach(), k.detach(), g))  # [heads, L, d]
        scale = head_dim**-0.5
        probs = torch.softmax(qs @ ks.transpose(1, 2) * scale, dim=-1)  # [heads, L, L]
        p_d = out.detach()[rows].float().transpose(0, 1)[:, :, :length]  # the kernel's own dropped matrix
        mask = p_d != 0
        kept, dropped = kept + int(mask.sum()), dropped + int((~mask).sum())
        assert torch.allclose(p_d[mask], (probs / (1 - p))[mask], rtol=2e-3, atol=1e-4)
        assert (out.detach()[rows].float()[:, :, length:] == 0).all()
        d_p_d = gs @ v.detach()[rows].float().transpose(0, 1).transpose(1, 2)  # dL/dP_d = g V^T
        d_probs = d_p_d * mask / (1 - p)
        d_scores = probs * (d_probs - (d_probs * probs).sum(-1, keepdim=True))
        expected = {
            "dq": (d_scores @ ks) * scale,
            "dk": (d_scores.transpose(1, 2) @ qs) * scale,
            "dv": p_d.transpose(1, 2) @ gs,
        }
        for name, grad in grads.items():
            ours = grad[rows].float().transpose(0, 1)
            reference = expected[name]
            error = (ours - reference).abs().max().item()
            assert error <= 2e-2 * reference.abs().max().item(), f"{name}, sequence at {start}: {error:.3g}"
    assert abs(dropped / (kept + dropped) - p) < 0.03


@pytest.mark.gpu
@flash_only
def test_on_the_gpu_cudnns_varlen_attention_attends_as_the_flash_kernel_and_trains_the_same_model():
    """cuDNN's kernel (`model.varlen_kernel: cudnn`) on a packed bf16 stream of four sequences (strided q, k, v out of
    one [T, 3, heads, 64] tensor, as the model gives them): without dropout the flash kernel's output and gradients
    (within 2 % of their largest, bf16). The tiny model on either kernel, without dropout, in bf16: the same loss and
    gradients within bf16 rounding; the trial launch the trainer makes passes."""
    from trainer.attention import CudnnVarlenAttention, FlashVarlenAttention
    from trainer.preflight import check_varlen_kernel

    torch.manual_seed(0)
    lengths = [7, 33, 64, 12]
    cu_seqlens = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32, device="cuda")
    qkv = torch.randn(sum(lengths), 3, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def run(kernel):
        q, k, v = qkv.unbind(1)
        out = kernel.apply(q, k, v, cu_seqlens, max(lengths), 0.0)
        (grad,) = torch.autograd.grad(out.float().square().sum(), qkv)
        return out.float(), grad.float()

    (flash, flash_grad), (cudnn, cudnn_grad) = run(FlashVarlenAttention), run(CudnnVarlenAttention)
    assert (cudnn - flash).abs().max() <= 2e-2 * flash.abs().max()
    assert (cudnn_grad - flash_grad).abs().max() <= 2e-2 * flash_grad.abs().max()
    samples = make_samples(LENGTHS)
    batch = pack_batch(samples, np.arange(len(LENGTHS))).to("cuda")
    losses, grads = {}, {}
    for kernel in ("flash", "cudnn"):
        torch.manual_seed(0)
        cfg = make_model_config(attention="varlen", varlen_kernel=kernel, hidden_dropout_prob=0.0,
                                attention_probs_dropout_prob=0.0)  # fmt: skip
        model = BertForPreTraining(cfg).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = pretraining_loss(model(batch), batch).total
        loss.backward()
        losses[kernel] = loss.item()
        grads[kernel] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    assert losses["cudnn"] == pytest.approx(losses["flash"], rel=1e-2)
    assert (grads["cudnn"] - grads["flash"]).norm() <= 2e-2 * grads["flash"].norm()
    check_varlen_kernel(TrainerConfig(model=make_model_config(varlen_kernel="cudnn").model_dump()),
                        torch.device("cuda"), torch.bfloat16)  # fmt: skip


class Seen:
    """`real` as another version of torch has it: the names in `hidden` are no attribute of it, those in `replaced`
    are other objects; everything else is the real one's."""

    def __init__(self, real, hidden: tuple[str, ...] = (), **replaced) -> None:
        object.__setattr__(self, "_parts", (real, hidden, replaced))

    def __getattr__(self, name: str):
        real, hidden, replaced = self._parts
        if name in hidden:
            raise AttributeError(name)
        return replaced[name] if name in replaced else getattr(real, name)

    def __setattr__(self, name: str, value) -> None:
        real, hidden, _ = self._parts
        if name in hidden:
            raise AttributeError(name)
        setattr(real, name, value)


@pytest.mark.parametrize("before", [8, 64])
def test_compiled_layers_on_fixed_shapes_are_built_on_a_torch_whose_limit_has_its_old_name(monkeypatch, before):
    """`model.compile` with `model.static_shapes` set torch._dynamo.config.recompile_limit, a name PyTorch took in
    2.7: on the torch 2.4-2.6 the project takes, whose limit is cache_size_limit, building the model ended in an
    AttributeError. The limit is raised to 32 under the name the config has (a higher one is kept)."""
    import trainer.model

    config = torch._dynamo.config
    kept = config.cache_size_limit  # from 2.7 on, another name for recompile_limit
    before_27 = Seen(config, hidden=("recompile_limit",))
    monkeypatch.setattr(trainer.model, "torch", Seen(torch, _dynamo=Seen(torch._dynamo, config=before_27)))
    try:
        config.cache_size_limit = before
        BertForPreTraining(make_model_config(static_shapes=True, compile=True))
        assert config.cache_size_limit == max(before, 32)
    finally:
        config.cache_size_limit = kept
