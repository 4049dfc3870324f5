"""Full training step (forward, backward, optimizer) of our unpadded BERT vs Hugging Face `BertForPreTraining`.

Both models have the same size and weights, get the same batches (MLPerf-like lengths: many short sequences,
a bump at the maximum) and the same optimizer. HF runs padded with SDPA attention, twice: padded to the shard
width (how MLPerf shards are stored) and padded to the longest sequence of each batch (dynamic padding). Steps
are interleaved so both see the same machine state. Prints tokens/s (valid tokens) of each and the ratios.

    python bench/trainer_throughput.py                 # CPU default size
    python bench/trainer_throughput.py --device cuda --size large --dtype bf16 --batch 32 --steps 20
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from trainer.config import ModelConfig, OptimizerConfig
from trainer.data.batch import pack_batch
from trainer.data.shards import PretrainingSamples
from trainer.model import BertForPreTraining, load_hf_state_dict, pretraining_loss
from trainer.optim import build_optimizer

SIZES = {
    "cpu": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024),
    "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
}


def mlperf_like_lengths(n: int, max_len: int, rng: np.random.Generator) -> np.ndarray:
    """About 1/4 of sequences at the maximum, the rest a broad hump of short-to-medium lengths."""
    at_max = rng.random(n) < 0.25
    body = np.clip(rng.gamma(2.2, max_len / 7.0, n), 12, max_len).astype(np.int64)
    return np.where(at_max, max_len, body)


def make_samples(n: int, seq_len: int, max_pred: int, vocab: int, seed: int) -> PretrainingSamples:
    rng = np.random.default_rng(seed)
    lengths = mlperf_like_lengths(n, seq_len, rng)
    ids = rng.integers(5, vocab, (n, seq_len)).astype(np.int32)
    mask = (np.arange(seq_len)[None, :] < lengths[:, None]).astype(np.int8)
    ids *= mask
    segments = (np.arange(seq_len)[None, :] >= (lengths // 2)[:, None]).astype(np.int8) * mask
    positions = np.zeros((n, max_pred), np.int32)
    labels = np.zeros((n, max_pred), np.int32)
    for i, length in enumerate(lengths):
        k = min(max_pred, max(1, int(0.15 * length)))
        pos = np.sort(rng.choice(np.arange(1, length - 1), k, replace=False))
        positions[i, :k], labels[i, :k] = pos, ids[i, pos]
        ids[i, pos] = 4
    nsp = rng.integers(0, 2, n).astype(np.int8)
    return PretrainingSamples(ids, mask, segments, positions, labels, nsp)


def hf_inputs(samples: PretrainingSamples, index: np.ndarray, pad_to: int | None, device) -> dict:
    s = samples.subset(index)
    width = pad_to or int(s.lengths.max())
    labels = np.full((len(index), s.max_seq_length), -100, np.int64)
    rows, cols = np.nonzero(s.masked_lm_positions > 0)
    labels[rows, s.masked_lm_positions[rows, cols]] = s.masked_lm_ids[rows, cols]

    def t(a):
        return torch.from_numpy(np.ascontiguousarray(a[:, :width]).astype(np.int64)).to(device)

    return dict(
        input_ids=t(s.input_ids),
        attention_mask=t(s.input_mask),
        token_type_ids=t(s.segment_ids),
        labels=t(labels),
        next_sentence_label=torch.from_numpy(s.next_sentence_labels.astype(np.int64)).to(device),
    )


def build_models(cfg: ModelConfig, device, seed: int):
    import transformers

    torch.manual_seed(seed)
    hf_cfg = transformers.BertConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        attn_implementation="sdpa",
    )
    hf = transformers.BertForPreTraining(hf_cfg).to(device).train()
    ours = BertForPreTraining(cfg)
    load_hf_state_dict(ours, {k: v.cpu() for k, v in hf.state_dict().items()})
    return ours.to(device).train(), hf


def step_ours(model, opt, samples, index, device, autocast):
    batch = pack_batch(samples, index).to(device)
    with torch.autocast(device.type, dtype=autocast or torch.float32, enabled=autocast is not None):
        loss = pretraining_loss(model(batch), batch).total
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def step_hf(model, opt, samples, index, device, autocast, pad_to):
    inputs = hf_inputs(samples, index, pad_to, device)
    with torch.autocast(device.type, dtype=autocast or torch.float32, enabled=autocast is not None):
        loss = model(**inputs).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=SIZES, default="cpu")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--max-pred", type=int, default=76)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    device = torch.device(args.device)
    autocast = torch.bfloat16 if args.dtype == "bf16" else None
    cfg = ModelConfig(vocab_size=30522, max_position_embeddings=args.seq_len, **SIZES[args.size])
    samples = make_samples(args.batch * (args.steps + args.warmup), args.seq_len, args.max_pred, 30522, args.seed)
    ours, hf = build_models(cfg, device, args.seed)
    opt_cfg = OptimizerConfig(name="lamb", lr=1e-4)
    runners = {
        "ours (unpadded)": (lambda o, idx: step_ours(ours, o, samples, idx, device, autocast), ours),
        "HF padded to seq-len": (lambda o, idx: step_hf(hf, o, samples, idx, device, autocast, args.seq_len), hf),
        "HF padded to batch max": (lambda o, idx: step_hf(hf, o, samples, idx, device, autocast, None), hf),
    }
    optimizers = {name: build_optimizer(model, opt_cfg) for name, (_, model) in runners.items()}
    seconds = dict.fromkeys(runners, 0.0)
    tokens = 0
    for step in range(args.warmup + args.steps):
        index = np.arange(step * args.batch, (step + 1) * args.batch)
        for name, (run, _) in runners.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            run(optimizers[name], index)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if step >= args.warmup:
                seconds[name] += time.perf_counter() - t0
        if step >= args.warmup:
            tokens += int(samples.lengths[index].sum())
    padding = 1 - tokens / (args.batch * args.steps * args.seq_len)
    print(
        f"size={args.size} seq_len={args.seq_len} batch={args.batch} steps={args.steps} device={device} "
        f"dtype={args.dtype} threads={torch.get_num_threads()} padding_fraction={padding:.2f}"
    )
    base = tokens / seconds["ours (unpadded)"]
    for name, secs in seconds.items():
        tps = tokens / secs
        seq_s = args.batch * args.steps / secs
        print(f"  {name:<24} {tps:12,.0f} tokens/s  {seq_s:8.2f} seq/s  ours/this = {base / tps:5.2f}x")


if __name__ == "__main__":
    main()
