"""MLM masking (trainer/data/masking.py): 15 % chosen, 80/10/10 replacement, never on special tokens."""

from __future__ import annotations

import numpy as np
import pytest

from trainer.data.masking import MaskingRule, SpecialTokenIds, mask_tokens

VOCAB_SIZE = 1000
SPECIAL = SpecialTokenIds()  # [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4


def make_rule(**options) -> MaskingRule:
    return MaskingRule(SPECIAL, np.arange(5, VOCAB_SIZE, dtype=np.int32), **options)


def make_sequence(rng: np.random.Generator, len_a: int, len_b: int) -> np.ndarray:
    """[CLS] A [SEP] B [SEP] with random normal tokens (and some [UNK]); no [PAD]."""
    a, b = rng.integers(1, VOCAB_SIZE, len_a), rng.integers(1, VOCAB_SIZE, len_b)
    a[np.isin(a, (2, 3, 4))] = 1
    b[np.isin(b, (2, 3, 4))] = 1
    return np.concatenate([[2], a, [3], b, [3]]).astype(np.int32)


def test_masked_positions_and_labels_are_consistent():
    rng = np.random.default_rng(0)
    tokens = make_sequence(rng, 40, 57)
    masked, positions, labels = mask_tokens(tokens, make_rule(), rng)
    assert len(positions) == round(97 * 0.15)  # 15 % of the 97 maskable tokens
    assert np.all(np.diff(positions) > 0)
    np.testing.assert_array_equal(labels, tokens[positions])
    unchosen = np.setdiff1d(np.arange(len(tokens)), positions)
    np.testing.assert_array_equal(masked[unchosen], tokens[unchosen])


def test_deterministic_given_the_generator():
    tokens = make_sequence(np.random.default_rng(1), 30, 30)
    first = mask_tokens(tokens, make_rule(), np.random.default_rng(7))
    second = mask_tokens(tokens, make_rule(), np.random.default_rng(7))
    for x, y in zip(first, second, strict=True):
        np.testing.assert_array_equal(x, y)


def test_statistics_of_choice_and_replacement():
    """Over many sequences: 15 % chosen; of those 80 % [MASK], 10 % random, 10 % kept (random may equal the
    original by chance with probability 1/995, so kept is compared to 0.1 + 0.1/995)."""
    rng, rule = np.random.default_rng(2), make_rule()
    maskable = chosen = to_mask = changed = kept = 0
    for _ in range(3000):
        tokens = make_sequence(rng, int(rng.integers(20, 200)), int(rng.integers(20, 200)))
        masked, positions, _ = mask_tokens(tokens, rule, rng)
        maskable += len(tokens) - 3
        chosen += len(positions)
        to_mask += int((masked[positions] == SPECIAL.mask).sum())
        changed += int(((masked[positions] != SPECIAL.mask) & (masked[positions] != tokens[positions])).sum())
        kept += int((masked[positions] == tokens[positions]).sum())
    assert chosen / maskable == pytest.approx(0.15, abs=0.002)
    assert to_mask / chosen == pytest.approx(0.8, abs=0.01)
    assert changed / chosen == pytest.approx(0.1 * (1 - 1 / 995), abs=0.006)
    assert kept / chosen == pytest.approx(0.1 + 0.1 / 995, abs=0.006)


def test_random_replacements_come_from_the_normal_vocabulary():
    rng, rule = np.random.default_rng(3), make_rule(mask_prob=0.0, random_prob=1.0)
    replaced = []
    for _ in range(500):
        masked, positions, _ = mask_tokens(make_sequence(rng, 200, 200), rule, rng)
        replaced.append(masked[positions])
    counts = np.bincount(np.concatenate(replaced), minlength=VOCAB_SIZE)  # 30,000 draws, ~30 per normal id
    assert counts[:5].sum() == 0
    assert counts[5:].min() >= 5 and counts[5:].max() <= 70  # uniform over the normal vocabulary


def test_never_masks_special_tokens_and_respects_the_limits():
    rng, rule = np.random.default_rng(4), make_rule(max_predictions=20)
    for length in (1, 3, 10, 300):
        tokens = np.concatenate([make_sequence(rng, length, 5), np.zeros(20, dtype=np.int32)])  # [PAD] tail
        tokens[3] = SPECIAL.mask
        _, positions, labels = mask_tokens(tokens, rule, rng)
        assert not np.isin(labels, SPECIAL.never_masked()).any()
        maskable = int((~np.isin(tokens, SPECIAL.never_masked())).sum())
        assert len(positions) == min(20, max(1, round(0.15 * maskable)))
    masked, positions, labels = mask_tokens(np.array([2, 3, 3, 0], dtype=np.int32), rule, rng)
    assert len(positions) == 0 and len(labels) == 0 and masked.tolist() == [2, 3, 3, 0]


def test_rule_for_a_vocabulary_with_other_special_ids():
    vocab = {"[PAD]": 0, "[unused0]": 1, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103, "the": 104, "a": 5}
    rule = MaskingRule.for_vocab(vocab, max_predictions=5)
    assert rule.special == SpecialTokenIds(pad=0, unk=100, cls=101, sep=102, mask=103)
    assert rule.random_token_ids.tolist() == [5, 104]
