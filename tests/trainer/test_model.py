"""Our unpadded BERT against Hugging Face `BertForPreTraining` with the same weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.trainer.conftest import make_model_config, make_samples
from trainer.data.batch import pack_batch
from trainer.errors import CheckpointError
from trainer.hf_weights import load_hf_state_dict, read_state_dict
from trainer.model import BertForPreTraining, pretraining_loss

transformers = pytest.importorskip("transformers")


def make_hf_model(cfg, seed=0):
    torch.manual_seed(seed)
    hf_cfg = transformers.BertConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = transformers.BertForPreTraining(hf_cfg).eval()
    with torch.no_grad():  # HF inits biases and LayerNorms to constants; randomize them so the test can fail
        for name, p in model.named_parameters():
            if "bias" in name or "LayerNorm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def hf_outputs_at_masks(hf, samples, index):
    """Padded HF forward; MLM logits gathered at the masked positions in the same order as pack_batch."""
    ids = torch.from_numpy(samples.input_ids[index].astype(np.int64))
    mask = torch.from_numpy(samples.input_mask[index].astype(np.int64))
    seg = torch.from_numpy(samples.segment_ids[index].astype(np.int64))
    with torch.no_grad():
        out = hf(input_ids=ids, attention_mask=mask, token_type_ids=seg)
    pos = samples.masked_lm_positions[index]
    rows, cols = np.nonzero(pos > 0)
    return out.prediction_logits[rows, pos[rows, cols]], out.seq_relationship_logits


def test_matches_hugging_face_on_mixed_lengths(mixed_samples):
    cfg = make_model_config()
    hf = make_hf_model(cfg)
    ours = BertForPreTraining(cfg).eval()
    load_hf_state_dict(ours, hf.state_dict())
    index = np.arange(len(mixed_samples))
    batch = pack_batch(mixed_samples, index)
    assert batch.num_tokens == int(mixed_samples.input_mask.sum())  # no padding went in
    with torch.no_grad():
        out = ours(batch)
    hf_mlm, hf_nsp = hf_outputs_at_masks(hf, mixed_samples, index)
    assert out.mlm_logits.shape == hf_mlm.shape
    torch.testing.assert_close(out.mlm_logits, hf_mlm, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.nsp_logits, hf_nsp, atol=1e-5, rtol=0)


def test_loss_matches_hugging_face_loss(mixed_samples):
    cfg = make_model_config()
    hf = make_hf_model(cfg, seed=1)
    ours = BertForPreTraining(cfg).eval()
    load_hf_state_dict(ours, hf.state_dict())
    index = np.arange(len(mixed_samples))
    s = mixed_samples
    labels = np.full(s.input_ids.shape, -100, np.int64)
    rows, cols = np.nonzero(s.masked_lm_positions > 0)
    labels[rows, s.masked_lm_positions[rows, cols]] = s.masked_lm_ids[rows, cols]
    with torch.no_grad():
        hf_loss = hf(
            input_ids=torch.from_numpy(s.input_ids.astype(np.int64)),
            attention_mask=torch.from_numpy(s.input_mask.astype(np.int64)),
            token_type_ids=torch.from_numpy(s.segment_ids.astype(np.int64)),
            labels=torch.from_numpy(labels),
            next_sentence_label=torch.from_numpy(s.next_sentence_labels.astype(np.int64)),
        ).loss
        loss = pretraining_loss(ours(pack_batch(s, index)), pack_batch(s, index))
    torch.testing.assert_close(loss.total, hf_loss, atol=1e-5, rtol=0)


def test_gradients_match_hugging_face():
    cfg = make_model_config()
    samples = make_samples([9, 40, 17], seed=3)
    hf = make_hf_model(cfg, seed=2)
    ours = BertForPreTraining(cfg)
    load_hf_state_dict(ours, hf.state_dict())
    index = np.arange(3)
    batch = pack_batch(samples, index)
    out = ours(batch)
    (out.mlm_logits.sum() + out.nsp_logits.sum()).backward()
    ids = torch.from_numpy(samples.input_ids.astype(np.int64))
    mask = torch.from_numpy(samples.input_mask.astype(np.int64))
    seg = torch.from_numpy(samples.segment_ids.astype(np.int64))
    hf_out = hf(input_ids=ids, attention_mask=mask, token_type_ids=seg)
    pos = samples.masked_lm_positions
    rows, cols = np.nonzero(pos > 0)
    hf_mlm, hf_nsp = hf_out.prediction_logits[rows, pos[rows, cols]], hf_out.seq_relationship_logits
    (hf_mlm.sum() + hf_nsp.sum()).backward()
    hf_params = dict(hf.named_parameters())
    for name, p in ours.named_parameters():
        g_ref = hf_params[name].grad
        g = p.grad[: g_ref.shape[0]] if p.grad.shape != g_ref.shape else p.grad
        torch.testing.assert_close(g, g_ref, atol=1e-5, rtol=1e-4, msg=name)


def test_padded_vocab_loads_unpadded_safetensors(tmp_path):
    from safetensors.torch import save_file

    cfg = make_model_config()
    hf = make_hf_model(cfg)
    tied = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")  # HF's save_pretrained drops them too
    state = {k: v.clone() for k, v in hf.state_dict().items() if k not in tied}
    path = tmp_path / "model.safetensors"
    save_file(state, str(path))
    ours = BertForPreTraining(cfg)
    load_hf_state_dict(ours, read_state_dict(path))
    emb = ours.bert.embeddings.word_embeddings.weight
    assert emb.shape[0] == 104 and cfg.vocab_size == 99
    torch.testing.assert_close(emb[:99], hf.bert.embeddings.word_embeddings.weight)
    assert torch.count_nonzero(emb[99:]) == 0
    assert ours.cls.predictions.decoder.weight is emb  # still tied after loading


def test_checkpoint_errors_name_the_problem(tmp_path):
    cfg = make_model_config()
    ours = BertForPreTraining(cfg)
    with pytest.raises(CheckpointError, match="does not exist"):
        read_state_dict(tmp_path / "nope.bin")
    bad = dict(ours.state_dict())
    bad["bert.pooler.dense.weight"] = torch.zeros(3, 3)
    with pytest.raises(CheckpointError, match="bert.pooler.dense.weight"):
        load_hf_state_dict(ours, bad)


def test_bert_large_shapes_and_names():
    cfg = make_model_config(
        vocab_size=30522,
        hidden_size=1024,
        num_hidden_layers=24,
        num_attention_heads=16,
        intermediate_size=4096,
        max_position_embeddings=512,
    )
    with torch.device("meta"):
        ours = BertForPreTraining(cfg)
        hf = transformers.BertForPreTraining(
            transformers.BertConfig(
                hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096
            )
        )
    assert cfg.padded_vocab_size == 30528
    assert set(ours.state_dict()) == set(hf.state_dict()) - {"cls.predictions.decoder.bias"}
    n_ours = sum(p.numel() for p in ours.parameters())
    n_hf = sum(p.numel() for p in hf.parameters())
    assert n_ours - n_hf == 6 * 1024 + 6  # the six padding rows of the tied embedding and of the MLM bias


def test_a_batch_without_masked_tokens_has_zero_mlm_loss_not_nan():
    # Rows too short to mask have no masked positions; a micro-batch of only such rows must not end a run as
    # diverged. The NSP loss still trains.
    samples = make_samples([2, 2, 2])  # [CLS] [SEP]: nothing to mask
    assert (samples.masked_lm_positions == 0).all()
    torch.manual_seed(0)
    model = BertForPreTraining(make_model_config())
    batch = pack_batch(samples, np.arange(3))
    loss = pretraining_loss(model(batch), batch)
    assert loss.mlm.item() == 0.0 and loss.mlm_count == 0
    assert torch.isfinite(loss.total) and loss.total.item() == pytest.approx(loss.nsp.item())
