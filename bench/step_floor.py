"""The floor under a training step: the arithmetic it must do and the bytes its optimizer must move, over the GPU's
rates. Counted, not timed (the model runs on PyTorch's meta device, where nothing is computed), so it runs anywhere.

- Matrix products: PyTorch's FLOP counter over one forward and backward of our model on a batch of the MLPerf-like
  length mix (the linear layers see only the batch's tokens; the MLM head only the masked ones).
- Attention: 12·L²·hidden per sequence of L tokens and layer (forward 4·L²·hidden, backward twice that), each
  sequence attending only to itself, as the varlen kernel computes it.
- Optimizer: LAMB's state in fp32 read and written once (weights, gradient, two moments read; weights and moments
  written): 7 x 4 bytes a parameter.

    python -m bench.step_floor                          # BERT-large, batch 128, H100/H200 dense bf16 peak
    python -m bench.step_floor --batch 256 --bandwidth-tbs 4.8
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from bench.trainer_throughput import SIZES, make_samples
from trainer.config import ModelConfig
from trainer.data.batch import pack_batch
from trainer.model import BertForPreTraining, pretraining_loss


def matmul_flops(cfg: ModelConfig, batch) -> int:
    """FLOPs of the matrix products of one forward and backward (attention's own left out: see `attention_flops`)."""
    with torch.device("meta"):
        model = BertForPreTraining(cfg.model_copy(update={"attention": "padded"})).train()
    meta = batch.to("meta")
    with FlopCounterMode(display=False) as counter:
        pretraining_loss(model(meta), meta).total.backward()
    counts = counter.get_flop_counts()["Global"]
    return sum(n for op, n in counts.items() if str(op) in ("aten.mm", "aten.addmm"))


def attention_flops(lengths: np.ndarray, hidden: int, layers: int) -> int:
    """Attention within each sequence, forward and backward: 12·L²·hidden a sequence and layer."""
    return int(12 * hidden * layers * np.square(lengths.astype(np.int64)).sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=SIZES, default="large")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak (H100 SXM and H200: 989)")
    ap.add_argument("--bandwidth-tbs", type=float, default=4.8, help="memory bandwidth (H200: 4.8, H100 SXM: 3.35)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cfg = ModelConfig(vocab_size=30522, max_position_embeddings=args.seq_len, **SIZES[args.size])
    samples = make_samples(args.batch, args.seq_len, 76, 30522, args.seed)
    batch = pack_batch(samples, np.arange(args.batch))
    with torch.device("meta"):
        parameters = sum(p.numel() for p in BertForPreTraining(cfg).parameters())
    matmul = matmul_flops(cfg, batch)
    attention = attention_flops(samples.lengths[: args.batch], cfg.hidden_size, cfg.num_hidden_layers)
    optimizer_bytes = 7 * 4 * parameters
    times = {
        "matrix products": matmul / (args.peak_tflops * 1e12),
        "attention": attention / (args.peak_tflops * 1e12),
        "optimizer (bytes)": optimizer_bytes / (args.bandwidth_tbs * 1e12),
    }
    floor = sum(times.values())
    print(f"size={args.size} ({parameters / 1e6:.0f} M parameters) batch={args.batch} tokens={batch.num_tokens} "
          f"masked={batch.masked_labels.numel()} peak={args.peak_tflops:g} TFLOP/s "
          f"bandwidth={args.bandwidth_tbs:g} TB/s")  # fmt: skip
    print(f"  matrix products   {matmul / 1e12:7.2f} TFLOP  {1e3 * times['matrix products']:7.1f} ms")
    print(f"  attention         {attention / 1e12:7.2f} TFLOP  {1e3 * times['attention']:7.1f} ms")
    print(f"  optimizer         {optimizer_bytes / 1e9:7.2f} GB     {1e3 * times['optimizer (bytes)']:7.1f} ms")
    print(f"  floor             {1e3 * floor:21.1f} ms  = {args.batch / floor:,.0f} sequences/s (element-wise work "
          f"not counted: its bytes depend on fusion)")  # fmt: skip
    six_n = 6 * parameters * batch.num_tokens
    print(f"  6·N·tokens        {six_n / 1e12:7.2f} TFLOP (the convention of the throughput benchmark's share of peak)")


if __name__ == "__main__":
    main()
