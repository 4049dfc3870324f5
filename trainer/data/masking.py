"""Masked-LM masking as in Google BERT's `create_pretraining_data.py`.

Of the maskable tokens of a sequence (everything except [PAD], [CLS], [SEP] and [MASK]), choose 15 %
(at least one, at most `max_predictions`) at random; replace 80 % of the chosen ones by [MASK], 10 % by a
random token of the normal vocabulary and keep 10 % unchanged. The model must predict the original token at
every chosen position.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# The special tokens in the order in which the `tokenizers` BERT WordPiece trainer puts them first.
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


@dataclass(frozen=True)
class SpecialTokenIds:
    """Ids of BERT's special tokens in one vocabulary."""

    pad: int = 0
    unk: int = 1
    cls: int = 2
    sep: int = 3
    mask: int = 4

    @classmethod
    def from_vocab(cls, vocab: dict[str, int]) -> SpecialTokenIds:
        """Look the special tokens up in a token -> id mapping (KeyError names the missing token)."""
        return cls(*(vocab[token] for token in SPECIAL_TOKENS))

    def never_masked(self) -> tuple[int, ...]:
        return (self.pad, self.cls, self.sep, self.mask)


@dataclass(frozen=True, eq=False)
class MaskingRule:
    """What to mask and what to put in its place."""

    special: SpecialTokenIds
    random_token_ids: np.ndarray  # the normal vocabulary: where the 10 % random replacements come from
    max_predictions: int = 76
    masked_lm_prob: float = 0.15
    mask_prob: float = 0.8  # of the chosen tokens, replaced by [MASK]
    random_prob: float = 0.1  # of the chosen tokens, replaced by a random token; the rest stay unchanged

    @classmethod
    def for_vocab(cls, vocab: dict[str, int], max_predictions: int = 76, **options) -> MaskingRule:
        """The rule for a vocabulary; random replacements are drawn from all tokens not written like `[XYZ]`."""
        special = SpecialTokenIds.from_vocab(vocab)
        normal = [i for token, i in vocab.items() if not (token.startswith("[") and token.endswith("]"))]
        return cls(special, np.array(sorted(normal), dtype=np.int32), max_predictions, **options)

    def num_to_predict(self, num_candidates: int) -> int:
        """How many of `num_candidates` maskable tokens are chosen (0 only if there is none)."""
        wanted = max(1, int(round(num_candidates * self.masked_lm_prob)))
        return min(self.max_predictions, wanted, num_candidates)


def mask_tokens(
    tokens: np.ndarray, rule: MaskingRule, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mask one sequence of token ids.

    Returns `(masked_tokens, positions, labels)`: a masked copy of `tokens`, the chosen positions in increasing
    order and the original ids at those positions.
    """
    tokens = np.asarray(tokens)
    candidates = np.flatnonzero(~np.isin(tokens, rule.special.never_masked()))
    count = rule.num_to_predict(len(candidates))
    positions = np.sort(rng.choice(candidates, size=count, replace=False))
    labels = tokens[positions].copy()
    masked = tokens.copy()
    draw = rng.random(count)
    to_mask = draw < rule.mask_prob
    to_random = (draw >= rule.mask_prob) & (draw < rule.mask_prob + rule.random_prob)
    masked[positions[to_mask]] = rule.special.mask
    masked[positions[to_random]] = rng.choice(rule.random_token_ids, size=int(to_random.sum()))
    return masked, positions, labels
