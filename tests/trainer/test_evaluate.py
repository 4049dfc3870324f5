"""trainer.evaluate: the masked-LM accuracy (the number a run's target is judged by), the masked-LM loss and the NSP
accuracy over the whole evaluation set, the same in any batch size, padded to fixed shapes or not, on one rank or
split over two, against a sample-by-sample computation by hand."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist

from tests.trainer.conftest import make_model_config, make_samples, start_ranks
from trainer.data.batch import ShapeBudget, pack_batch
from trainer.distributed import DistEnv
from trainer.evaluate import evaluate
from trainer.model import BertForPreTraining

# A vocabulary of 8 (labels 5-7): an untrained model's guesses are right often enough that accuracy is not 0
VOCAB = 8
LENGTHS = [5, 9, 17, 33, 64, 12, 40, 23, 7, 51, 30, 64, 3, 18]  # 3: [CLS] x [SEP], one masked token


def tiny_model() -> BertForPreTraining:
    torch.manual_seed(0)
    return BertForPreTraining(make_model_config(vocab_size=VOCAB)).double()  # float64: no argmax flips on rounding


def by_hand(model: BertForPreTraining, samples) -> dict[str, float]:
    """Each sample alone; at each masked position its hit and its negative log-likelihood, summed in Python."""
    hits, nll, nsp_hits, masked = 0, 0.0, 0, 0
    with torch.no_grad():
        for i in range(len(samples)):
            batch = pack_batch(samples, np.array([i]))
            out = model(batch)
            log_p = torch.log_softmax(out.mlm_logits, dim=-1)
            for row, label in enumerate(batch.masked_labels.tolist()):
                hits += int(log_p[row].argmax()) == label
                nll -= float(log_p[row, label])
                masked += 1
            nsp_hits += int(out.nsp_logits[0].argmax()) == int(batch.next_sentence_labels[0])
    return {"mlm_accuracy": hits / masked, "mlm_loss": nll / masked, "nsp_accuracy": nsp_hits / len(samples),
            "masked_tokens": masked, "sequences": len(samples)}  # fmt: skip


def assert_matches(result, expected: dict[str, float]) -> None:
    got = {k: getattr(result, k) for k in expected}
    assert got["mlm_accuracy"] == expected["mlm_accuracy"] and got["nsp_accuracy"] == expected["nsp_accuracy"], got
    assert got["masked_tokens"] == expected["masked_tokens"] and got["sequences"] == expected["sequences"], got
    assert got["mlm_loss"] == pytest.approx(expected["mlm_loss"], rel=1e-6), got  # the loss is taken in float32


def test_the_hand_computation_is_not_trivial():
    expected = by_hand(tiny_model(), make_samples(LENGTHS, vocab_size=VOCAB))
    assert 0.1 < expected["mlm_accuracy"] < 0.9 and 0.1 < expected["nsp_accuracy"] < 0.9, expected
    assert expected["masked_tokens"] == sum(min(8, max(1, (n - 2) // 4)) for n in LENGTHS)


@pytest.mark.parametrize("batch_size", [1, 4, 5, 100])
def test_any_batch_size_gives_the_sample_by_sample_numbers(batch_size):
    model, samples = tiny_model(), make_samples(LENGTHS, vocab_size=VOCAB)
    model.train()
    result = evaluate(model, samples, batch_size, torch.device("cpu"), DistEnv())
    assert_matches(result, by_hand(model, samples))
    assert model.training  # evaluation leaves the model as it found it


def test_batches_padded_to_fixed_shapes_give_the_same_numbers():
    model, samples = tiny_model(), make_samples(LENGTHS, vocab_size=VOCAB)
    model.eval()
    batches = [np.arange(len(LENGTHS))[s : s + 4] for s in range(0, len(LENGTHS), 4)]
    packed = [pack_batch(samples, b) for b in batches]
    budget = ShapeBudget.fitting(max(b.num_tokens for b in packed), max(b.num_masked for b in packed))
    assert any(pack_batch(samples, b, budget).padded for b in batches)  # padding runs through the model
    result = evaluate(model, samples, 4, torch.device("cpu"), DistEnv(), budget=budget)
    assert_matches(result, by_hand(model, samples))
    assert not model.training


def rank_worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    result = evaluate(tiny_model(), make_samples(LENGTHS, vocab_size=VOCAB), 3, torch.device("cpu"),
                      DistEnv(rank=rank, world_size=2, local_rank=rank, local_world_size=2))  # fmt: skip
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result.__dict__, f)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


@pytest.mark.distributed
def test_two_ranks_each_evaluating_every_other_sample_give_every_rank_the_whole_sets_numbers(tmp_path):
    start_ranks(rank_worker, (str(tmp_path / "init"), str(tmp_path)), 2)
    expected = by_hand(tiny_model(), make_samples(LENGTHS, vocab_size=VOCAB))
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert_matches(type("Result", (), got), expected)
