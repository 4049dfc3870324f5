"""The deterministic WordPiece trainer (trainer/data/wordpiece.py) on corpora small enough to work by hand."""

from __future__ import annotations

from collections import Counter

from trainer.data.masking import SPECIAL_TOKENS
from trainer.data.wordpiece import count_words, train_wordpiece

SPECIALS = list(SPECIAL_TOKENS)


def test_words_are_normalized_and_split_as_bert_does(tmp_path):
    text = tmp_path / "a.txt"
    text.write_text("Hello, Café world!\n\nhello  cafe\tWORLD\n", encoding="utf-8")
    assert count_words([text], lowercase=True) == {"hello": 2, ",": 1, "cafe": 2, "world": 2, "!": 1}
    assert count_words([text], lowercase=False)["Café"] == 1


def test_equally_frequent_pairs_merge_in_the_order_of_their_strings():
    # (a, ##b) and (b, ##a) both occur 3 times; one merge fits: the pair whose strings sort first wins.
    words = Counter({"ba": 3, "ab": 3})
    assert train_wordpiece(words, len(SPECIALS) + 5, SPECIALS) == [*SPECIALS, "a", "b", "##b", "##a", "ab"]
    assert train_wordpiece(words, 100, SPECIALS)[-2:] == ["ab", "ba"]


def test_merges_go_left_to_right_until_no_pair_occurs_twice():
    # a ##a ##a ##a (x2): (##a, ##a) occurs 4 times -> a ##aa ##a; then (##aa, ##a) and (a, ##aa) twice each,
    # and "##aa" < "a" -> a ##aaa; then aaaa.
    assert train_wordpiece(Counter({"aaaa": 2}), 100, SPECIALS) == [*SPECIALS, "a", "##a", "##aa", "##aaa", "aaaa"]
    # Once: (##a, ##a) still occurs twice inside the word, the next pairs once: no more merges.
    assert train_wordpiece(Counter({"aaaa": 1}), 100, SPECIALS) == [*SPECIALS, "a", "##a", "##aa"]


def test_the_alphabet_keeps_the_most_frequent_characters():
    # With room for two characters, "z" (1 occurrence) is left out of the alphabet and out of the words.
    vocab = train_wordpiece(Counter({"xy": 2, "yz": 1}), 100, SPECIALS, limit_alphabet=2)
    assert vocab == [*SPECIALS, "x", "y", "##y", "xy"]
