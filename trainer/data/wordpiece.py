"""A WordPiece vocabulary trained deterministically: the same text gives the same vocabulary in every process.

The algorithm is that of the `tokenizers` WordPiece trainer (BERT's normalization and pre-tokenization, an
alphabet of the most frequent characters, "##" for characters inside a word, then merges of the most frequent
adjacent pair until the vocabulary is full or no pair occurs twice). The one difference is the tie-break:
`tokenizers` prefers the pair whose token ids are lowest, and ids follow the iteration order of a hash map
that changes from process to process, so equally frequent merges came out in a different order and the
vocabulary differed between runs. Here ties go to the pair whose two strings sort first.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import pairwise
from pathlib import Path

PREFIX = "##"  # marks a piece that continues a word
LINES_PER_CHUNK = 10000  # lines split into pieces in one call

Pair = tuple[str, str]


def count_words(paths: Sequence[str | Path], lowercase: bool) -> Counter[str]:
    """How often each word occurs, after the normalization and pre-tokenization of a BERT WordPiece tokenizer.

    Both act on each space-separated piece of text alone, so each distinct piece is normalized only once.
    """
    from tokenizers import BertWordPieceTokenizer

    bert = BertWordPieceTokenizer(lowercase=lowercase)
    pieces: Counter[str] = Counter()
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for chunk in _chunks(f, LINES_PER_CHUNK):
                pieces.update("".join(chunk).replace("\n", " ").split(" "))
    counts: Counter[str] = Counter()
    for piece, count in pieces.items():
        for word, _ in bert.pre_tokenizer.pre_tokenize_str(bert.normalizer.normalize_str(piece)):
            counts[word] += count
    return counts


def _chunks(lines: Iterable[str], size: int) -> Iterable[list[str]]:
    chunk: list[str] = []
    for line in lines:
        chunk.append(line)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def alphabet(word_counts: Counter[str], limit: int) -> list[str]:
    """The `limit` most frequent characters (ties: the lower code point), in code point order."""
    chars: Counter[str] = Counter()
    for word, count in word_counts.items():
        for char in word:
            chars[char] += count
    kept = sorted(chars, key=lambda c: (-chars[c], c))[:limit]
    return sorted(kept)


def train_wordpiece(
    word_counts: Counter[str],
    vocab_size: int,
    special_tokens: Sequence[str],
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
) -> list[str]:
    """The vocabulary, in the order tokens were added: special tokens, characters, then merged pieces."""
    vocab = dict.fromkeys([*special_tokens, *alphabet(word_counts, limit_alphabet)])
    words, counts = [], []
    for word, count in sorted(word_counts.items()):
        symbols = [char if i == 0 else PREFIX + char for i, char in enumerate(word) if char in vocab]
        vocab.update(dict.fromkeys(symbols))
        words.append(symbols)
        counts.append(count)
    merges = _Merges(words, counts)
    while len(vocab) < vocab_size:
        pair = merges.most_frequent(min_frequency)
        if pair is None:
            break
        token = pair[0] + pair[1].removeprefix(PREFIX)
        vocab[token] = None
        merges.merge(pair, token)
    return list(vocab)


class _Merges:
    """Pair counts over all words, kept up to date as pairs are merged; a heap finds the most frequent."""

    def __init__(self, words: list[list[str]], counts: list[int]):
        self.words, self.counts = words, counts
        self.pair_counts: Counter[Pair] = Counter()
        self.where: dict[Pair, set[int]] = {}
        for index, symbols in enumerate(words):
            for pair in pairwise(symbols):
                self.pair_counts[pair] += counts[index]
                self.where.setdefault(pair, set()).add(index)
        # Entries (-count, left, right): the highest count first, then the pair whose strings sort first.
        self.heap = [(-count, *pair) for pair, count in self.pair_counts.items()]
        heapq.heapify(self.heap)

    def most_frequent(self, min_frequency: int) -> Pair | None:
        """The most frequent pair, or None when none occurs at least `min_frequency` times (or at all)."""
        while self.heap:
            negative_count, left, right = self.heap[0]
            if self.pair_counts.get((left, right), 0) != -negative_count:
                heapq.heappop(self.heap)  # an outdated entry: the pair's current count has its own
                continue
            return (left, right) if -negative_count >= max(min_frequency, 1) else None
        return None

    def merge(self, pair: Pair, token: str) -> None:
        """Replace every occurrence of `pair` (left to right, without overlap) by `token`, updating the counts."""
        changed: Counter[Pair] = Counter()
        for index in sorted(self.where.pop(pair, ())):
            symbols, count = self.words[index], self.counts[index]
            merged = _merge_symbols(symbols, pair, token)
            if len(merged) == len(symbols):
                continue
            for old in pairwise(symbols):
                changed[old] -= count
            for new in pairwise(merged):
                changed[new] += count
                self.where.setdefault(new, set()).add(index)
            self.words[index] = merged
        for changed_pair, delta in changed.items():
            if delta:
                self.pair_counts[changed_pair] += delta
                heapq.heappush(self.heap, (-self.pair_counts[changed_pair], *changed_pair))


def _merge_symbols(symbols: list[str], pair: Pair, token: str) -> list[str]:
    merged, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
            merged.append(token)
            i += 2
        else:
            merged.append(symbols[i])
            i += 1
    return merged
