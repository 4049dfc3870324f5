"""Activation memory a training step keeps for its backward, per token and encoder layer, with and without
`model.half_residual`: the bytes of the tensors autograd saves in the forward (weights left out), for a model of one
layer and of two, the difference being one layer's. Counted, not timed: on the CPU as on a GPU, except that the
CPU's attention keeps its probabilities ([rows, heads, width, width]), which a GPU's fused kernels do not.

    python -m bench.saved_activations                 # BERT-large's width, 16 sequences of the MLPerf-like mix, bf16
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from bench.trainer_throughput import SIZES, make_samples
from trainer.config import ModelConfig
from trainer.data.batch import pack_batch
from trainer.memory import SavedBytes
from trainer.model import BertForPreTraining, pretraining_loss
from trainer.precision import autocast as autocast_region


def saved_bytes(model: BertForPreTraining, batch, device: torch.device, dtype: torch.dtype | None) -> int:
    """Bytes of the distinct storages autograd saves in one forward of `model` on `batch`, weights left out."""
    with SavedBytes(model) as counter, autocast_region(device, dtype):
        pretraining_loss(model(batch), batch)
    return counter.bytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=SIZES, default="large", help="the width of the layers (their number: 1 and 2)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--attention", default="packed", choices=["packed", "padded", "jagged", "varlen"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.dtype == "bf16" else None
    samples = make_samples(args.batch, args.seq_len, 76, 30522, args.seed)
    batch = pack_batch(samples, np.arange(args.batch)).to(device)
    print(f"size={args.size} batch={args.batch} tokens={batch.num_tokens} attention={args.attention} "
          f"dtype={args.dtype} device={device}")  # fmt: skip
    for half in (False, True):
        per_layers = {}
        for layers in (1, 2):
            cfg = ModelConfig(vocab_size=30522, max_position_embeddings=args.seq_len, attention=args.attention,
                              half_residual=half, **{**SIZES[args.size], "num_hidden_layers": layers})  # fmt: skip
            torch.manual_seed(args.seed)
            with device:
                model = BertForPreTraining(cfg).train()
            per_layers[layers] = saved_bytes(model, batch, device, dtype)
        layer = (per_layers[2] - per_layers[1]) / batch.num_tokens / 1024
        print(f"  half_residual={str(half).lower():<5}  {layer:7.1f} KiB a token and layer")


if __name__ == "__main__":
    main()
