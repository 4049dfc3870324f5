"""Text -> shards (trainer/data/prepare.py) and the generated demo corpus (trainer/data/demo_corpus.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from trainer.data.demo_corpus import DEMO_OPTIONS, generate_documents, make_demo_data, write_text
from trainer.data.prepare import PrepareOptions, load_tokenizer, main, prepare_corpus, truncate_seq_pair
from trainer.data.shards import PretrainingSamples, load_samples
from trainer.errors import DataError

PAD, CLS, SEP, MASK = 0, 2, 3, 4
OPTIONS = PrepareOptions(vocab_size=600, max_seq_length=64, max_predictions=10, eval_fraction=0.1, seed=3)


def quiet(_message: str) -> None:
    pass


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A small corpus prepared once: (output dir, meta, documents as text)."""
    out = tmp_path_factory.mktemp("prepared")
    documents = generate_documents(120, seed=5)
    write_text(documents, out / "corpus.txt")
    meta = prepare_corpus([out / "corpus.txt"], out, replace(OPTIONS, samples_per_shard=200), log=quiet)
    return out, meta, documents


def restore(samples: PretrainingSamples) -> np.ndarray:
    """input_ids with the original tokens put back at the masked positions."""
    ids = samples.input_ids.copy()
    rows, slots = np.nonzero(samples.masked_lm_positions > 0)
    ids[rows, samples.masked_lm_positions[rows, slots]] = samples.masked_lm_ids[rows, slots]
    return ids


def token_string(ids) -> str:
    return " " + " ".join(map(str, ids)) + " "


def test_sequences_are_cls_a_sep_b_sep_with_matching_segments(prepared):
    out, _, _ = prepared
    samples = load_samples(str(out / "train"))
    ids, lengths = restore(samples), samples.lengths
    for row in range(len(samples)):
        tokens = ids[row, : lengths[row]]
        seps = np.flatnonzero(tokens == SEP)
        assert tokens[0] == CLS and len(seps) == 2 and seps[1] == lengths[row] - 1 and seps[0] >= 2
        expected_segments = np.r_[np.zeros(seps[0] + 1), np.ones(lengths[row] - seps[0] - 1)]
        np.testing.assert_array_equal(samples.segment_ids[row, : lengths[row]], expected_segments)
        assert not ids[row, lengths[row] :].any() and not samples.segment_ids[row, lengths[row] :].any()
        assert not np.isin(tokens[1:-1], (PAD, CLS, MASK)).any()


def test_masked_ids_are_the_original_tokens_of_the_documents(prepared):
    """A and B, with the masked tokens put back, are runs of tokens of the tokenized documents; for IsNext pairs
    B is from A's document, later in it."""
    out, _, documents = prepared
    tokenizer = load_tokenizer(out / "vocab.txt", lowercase=True)
    doc_strings = [token_string(t for e in tokenizer.encode_batch(d, add_special_tokens=False) for t in e.ids)
                   for d in documents]  # fmt: skip
    samples = load_samples(str(out / "train"))
    ids = restore(samples)
    for row in range(0, len(samples), 3):
        tokens = ids[row, : samples.lengths[row]]
        sep = int(np.flatnonzero(tokens == SEP)[0])
        a, b = token_string(tokens[1:sep]), token_string(tokens[sep + 1 : -1])
        docs_a = [i for i, s in enumerate(doc_strings) if a in s]
        assert docs_a and any(b in s for s in doc_strings)
        if samples.next_sentence_labels[row] == 0:
            assert any(doc_strings[i].find(b) > doc_strings[i].find(a) for i in docs_a if b in doc_strings[i])


def test_masking_counts_and_replacements(prepared):
    out, _, _ = prepared
    samples = load_samples(str(out / "train"))
    counts = (samples.masked_lm_positions > 0).sum(axis=1)
    expected = np.minimum(10, np.maximum(1, np.round(0.15 * (samples.lengths - 3))))
    np.testing.assert_array_equal(counts, expected)
    rows, slots = np.nonzero(samples.masked_lm_positions > 0)
    at_masked = samples.input_ids[rows, samples.masked_lm_positions[rows, slots]]
    assert 0.7 < (at_masked == MASK).mean() < 0.9
    assert (
        (samples.masked_lm_positions[:, 1:] > samples.masked_lm_positions[:, :-1])
        | (counts[:, None] <= np.arange(1, 10))
    ).all()


def test_lengths_vary_and_both_nsp_labels_occur(prepared):
    out, meta, _ = prepared
    samples = load_samples(str(out / "train"))
    lengths = samples.lengths
    assert len(np.unique(lengths)) > 20
    assert (lengths == 64).mean() > 0.1 and (lengths <= 48).mean() > 0.2
    # NotNext is drawn with probability 1/2, and always when a document has one sentence left (as Google's script)
    assert 0.4 < samples.next_sentence_labels.mean() < 0.8
    assert meta["train_samples"] == len(samples) and meta["train_mean_length"] == pytest.approx(lengths.mean())
    assert len(list((out / "train").glob("part-*.h5"))) == -(-len(samples) // 200)


def test_meta_baseline_is_the_most_frequent_train_label_on_eval(prepared):
    out, meta, _ = prepared
    train, eval_ = load_samples(str(out / "train")), load_samples(str(out / "eval"))
    train_labels = train.masked_lm_ids[train.masked_lm_positions > 0]
    eval_labels = eval_.masked_lm_ids[eval_.masked_lm_positions > 0]
    values, counts = np.unique(train_labels, return_counts=True)
    top = values[counts.argmax()]
    assert meta["most_frequent_masked_token_id"] == top
    assert meta["baseline_mlm_accuracy"] == pytest.approx(np.mean(eval_labels == top))
    assert meta["eval_samples"] == len(eval_) > 0 and meta["eval_masked_tokens"] == len(eval_labels)
    assert json.loads((out / "meta.json").read_text()) == meta


def test_vocab_has_the_special_tokens_first_and_can_be_reused(prepared, tmp_path):
    out, meta, _ = prepared
    vocab = (out / "vocab.txt").read_text().splitlines()
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and vocab[5:] == sorted(vocab[5:])
    assert len(vocab) == meta["vocab_size"] <= 600
    again = prepare_corpus([out / "corpus.txt"], tmp_path, replace(OPTIONS, vocab=str(out / "vocab.txt")), log=quiet)
    assert again["vocab_size"] == meta["vocab_size"]
    np.testing.assert_array_equal(
        load_samples(str(tmp_path / "train")).input_ids, load_samples(str(out / "train")).input_ids
    )


def test_truncate_seq_pair_shortens_the_longer_side():
    rng = np.random.default_rng(0)
    a, b = list(range(10)), list(range(100, 103))
    truncate_seq_pair(a, b, 8, rng)
    assert len(a) == 5 and b == [100, 101, 102]
    assert " ".join(map(str, a)) in " ".join(map(str, range(10)))


def test_bad_inputs_raise_data_errors(tmp_path):
    with pytest.raises(DataError, match=r"missing\.txt: input text file not found"):
        prepare_corpus([tmp_path / "missing.txt"], tmp_path / "out", OPTIONS, log=quiet)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(DataError, match="no text found"):
        prepare_corpus([empty], tmp_path / "out", OPTIONS, log=quiet)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\nthe\n")
    with pytest.raises(DataError, match=r"vocab\.txt: vocabulary lacks the special tokens \['\[CLS\]'"):
        load_tokenizer(vocab, lowercase=True)


def test_cli_writes_shards_and_meta_and_replaces_old_shards(tmp_path, capsys):
    text, out = tmp_path / "in.txt", tmp_path / "out"
    write_text(generate_documents(30, seed=1), text)
    args = ["--input", str(text), "--out", str(out), "--max-seq-length", "32", "--max-predictions", "5",
            "--eval-fraction", "0.2", "--seed", "1"]  # fmt: skip
    main([*args, "--samples-per-shard", "5", "--vocab-size", "300"])
    main([*args, "--samples-per-shard", "1000", "--vocab", str(out / "vocab.txt")])
    meta = json.loads((out / "meta.json").read_text())
    assert meta["max_seq_length"] == 32 and meta["options"]["seed"] == 1
    assert [p.name for p in (out / "train").iterdir()] == ["part-00000.h5"]
    assert len(load_samples(str(out / "train"))) == meta["train_samples"] > 5
    assert load_samples(str(out / "eval")).input_ids.shape[1:] == (32,)
    assert "baseline (always" in capsys.readouterr().out


def test_tiny_demo_corpus_end_to_end(tmp_path):
    meta = make_demo_data(tmp_path, documents=400, seed=2, options=replace(DEMO_OPTIONS, eval_fraction=0.1), log=quiet)
    train = load_samples(str(tmp_path / "train"))
    assert meta["train_samples"] == len(train) > 500 and meta["max_seq_length"] == 128
    assert train.masked_lm_positions.shape[1] == 20
    assert 0.03 < (train.lengths == 128).mean() < 0.3 and np.median(train.lengths) < 80  # many short, some full
    assert 0.02 < meta["baseline_mlm_accuracy"] < 0.15
    assert (tmp_path / "corpus.txt").read_text().count("\n\n") == 399


def test_cli_reports_data_errors_without_a_traceback_and_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--input", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "out")])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'nope.txt'}: input text file not found") and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def reference_truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng):
    """Google's `truncate_seq_pair`, one token deleted at a time (quadratic in a long sentence)."""
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


@pytest.mark.parametrize("seed", range(20))
def test_truncate_seq_pair_gives_googles_pairs_and_draws(seed):
    sizes = np.random.default_rng(seed)
    a, b = list(range(int(sizes.integers(0, 300)))), list(range(1000, 1000 + int(sizes.integers(0, 300))))
    limit = int(sizes.integers(1, 200))
    expected_a, expected_b, expected_rng = list(a), list(b), np.random.default_rng(seed + 100)
    reference_truncate_seq_pair(expected_a, expected_b, limit, expected_rng)
    rng = np.random.default_rng(seed + 100)
    truncate_seq_pair(a, b, limit, rng)
    assert (a, b) == (expected_a, expected_b)
    assert rng.random() == expected_rng.random()  # the same number of draws


def test_a_very_long_sentence_is_truncated_to_the_same_tokens_as_googles():
    a, b = list(range(20_000)), list(range(10**6, 10**6 + 40))
    expected_a, expected_b = list(a), list(b)
    reference_truncate_seq_pair(expected_a, expected_b, 125, np.random.default_rng(9))
    truncate_seq_pair(a, b, 125, np.random.default_rng(9))
    assert (a, b) == (expected_a, expected_b) and len(a) + len(b) == 125


def test_input_that_is_not_utf8_is_refused_naming_the_file_line_and_byte(tmp_path):
    text = tmp_path / "latin1.txt"
    text.write_bytes("first line.\n\ncaf\u00e9 au lait.\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1\.txt: line 3 is not UTF-8 text: byte 0xe9 at column 4 "):
        prepare_corpus([text], tmp_path / "out", OPTIONS, log=quiet)
    vocab = tmp_path / "vocab.txt"
    vocab.write_bytes(b"[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\ncaf\xe9\n")
    with pytest.raises(DataError, match=r"vocab\.txt: line 6 is not UTF-8 text: byte 0xe9 at column 4 "):
        load_tokenizer(vocab, lowercase=True)


def test_a_directory_as_input_is_refused_saying_to_pass_its_files(tmp_path):
    with pytest.raises(DataError, match=r"is a directory: pass the text files in it, e\.g\. --input .*/\*\.txt"):
        prepare_corpus([tmp_path], tmp_path / "out", OPTIONS, log=quiet)


@pytest.mark.parametrize(
    ("option", "value", "flag"),
    [
        ("samples_per_shard", 0, "--samples-per-shard"),
        ("dupe_factor", 0, "--dupe-factor"),
        ("masked_lm_prob", 0.0, "--masked-lm-prob"),
        ("masked_lm_prob", 1.5, "--masked-lm-prob"),
        ("short_seq_prob", 1.5, "--short-seq-prob"),
        ("short_seq_prob", -0.1, "--short-seq-prob"),
        ("vocab_size", 4, "--vocab-size"),
        ("max_seq_length", 7, "--max-seq-length"),
        ("eval_fraction", 1.0, "--eval-fraction"),
        ("seed", -1, "--seed"),
    ],
)
def test_bad_options_are_refused_naming_the_flag_before_any_output(tmp_path, option, value, flag):
    text = tmp_path / "in.txt"
    write_text(generate_documents(5, seed=1), text)
    with pytest.raises(DataError, match=f"^{flag} {value}: "):
        prepare_corpus([text], tmp_path / "out", replace(OPTIONS, **{option: value}), log=quiet)
    assert not (tmp_path / "out").exists()


def test_a_vocabulary_size_beside_a_vocabulary_file_is_refused_as_it_would_be_ignored(tmp_path, capsys):
    text, vocab = tmp_path / "in.txt", tmp_path / "vocab.txt"
    write_text(generate_documents(5, seed=1), text)
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\n")
    argv = ["--input", str(text), "--out", str(tmp_path / "out"), "--vocab", str(vocab), "--vocab-size", "50"]
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    assert capsys.readouterr().err == (
        f"error: --vocab-size 50: sets the size of a vocabulary trained on the input; with --vocab the tokens of "
        f"{vocab} are the vocabulary: leave --vocab-size out\n"
    )
    assert not (tmp_path / "out").exists()


def test_an_empty_file_among_several_inputs_is_refused_naming_it(tmp_path):
    text, empty = tmp_path / "in.txt", tmp_path / "empty.txt"
    write_text(generate_documents(5, seed=1), text)
    empty.write_text("\n \n")
    with pytest.raises(DataError, match=rf"^{empty}: no text in it \(empty, or blank lines only\); remove it"):
        prepare_corpus([text, empty], tmp_path / "out", OPTIONS, log=quiet)
    assert not (tmp_path / "out").exists()


def test_every_input_that_cannot_be_read_is_named_in_one_error(tmp_path):
    """Several bad inputs: the error named the first, and each fix met the next."""
    text, empty, latin, missing = (tmp_path / name for name in ("in.txt", "empty.txt", "latin.txt", "gone.txt"))
    write_text(generate_documents(5, seed=1), text)
    empty.write_text("\n")
    latin.write_bytes("caf\u00e9\n".encode("latin-1"))
    with pytest.raises(DataError) as refused:
        prepare_corpus([text, empty, latin, missing, tmp_path], tmp_path / "out", OPTIONS, log=quiet)
    lines = str(refused.value).splitlines()
    assert lines[0] == "4 of the 5 inputs cannot be read:"
    assert [line.split(":")[0].strip() for line in lines[1:]] == [str(empty), str(latin), str(missing), str(tmp_path)]
    assert "no text in it" in lines[1] and "UTF-8" in lines[2] and "not found" in lines[3] and "directory" in lines[4]
    assert not (tmp_path / "out").exists()


def test_one_document_cannot_make_an_eval_set(tmp_path):
    text = tmp_path / "in.txt"
    write_text(generate_documents(1, seed=1), text)
    with pytest.raises(DataError, match=r"^1 document in .*an eval set needs at least 2 .*--eval-fraction 0"):
        prepare_corpus([text], tmp_path / "out", OPTIONS, log=quiet)
    assert not (tmp_path / "out").exists()


def test_no_eval_fraction_writes_no_evaluation_set_and_no_baseline(tmp_path):
    """--eval-fraction 0 wrote an empty evaluation shard, and a baseline accuracy of 0.0 over no samples."""
    text, said = tmp_path / "in.txt", []
    write_text(generate_documents(20, seed=1), text)
    meta = prepare_corpus([text], tmp_path / "out", replace(OPTIONS, eval_fraction=0.0), log=said.append)
    assert not (tmp_path / "out" / "eval").exists() and len(load_samples(str(tmp_path / "out" / "train"))) > 0
    assert meta["eval_samples"] == 0 and meta["baseline_mlm_accuracy"] is None
    assert json.loads((tmp_path / "out" / "meta.json").read_text())["baseline_mlm_accuracy"] is None
    assert "eval: none (--eval-fraction 0): give a run another preparation's evaluation set as data.eval" in said
    assert not any("baseline" in line for line in said)


@pytest.mark.parametrize("where", ["file", "under_a_file"])
def test_an_out_dir_that_is_a_file_is_refused_before_any_output(tmp_path, capsys, where):
    text, taken = tmp_path / "in.txt", tmp_path / "taken"
    write_text(generate_documents(5, seed=1), text)
    taken.write_text("mine")
    out = taken if where == "file" else taken / "out"
    with pytest.raises(SystemExit) as stop:
        main(["--input", str(text), "--out", str(out)])
    assert stop.value.code == 2 and taken.read_text() == "mine"
    err = capsys.readouterr().err
    assert err.startswith(f"error: --out {out} is ") and "give a directory" in err and "Traceback" not in err


def test_a_vocabulary_with_a_token_twice_is_refused_naming_both_lines(tmp_path):
    """The tokenizer would give the token the later line's id: ids up to the line count, past the vocab size."""
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "the"]) + "\n")
    with pytest.raises(DataError, match=r"vocab\.txt: line 8: token 'the' again \(first on line 6\)"):
        load_tokenizer(vocab, lowercase=True)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--documents", "0"], "--documents 0: must be at least 2 (one goes to the eval set)"),
        (["--documents", "1"], "--documents 1: must be at least 2 (one goes to the eval set)"),
        (["--seed", "-1"], "--seed -1: must be >= 0"),
    ],
)
def test_the_demo_corpus_refuses_bad_options_before_it_writes_over_a_corpus(tmp_path, capsys, argv, message):
    from trainer.data.demo_corpus import main as demo_main

    (tmp_path / "corpus.txt").write_text("an earlier corpus\n")
    with pytest.raises(SystemExit) as stop:
        demo_main(["--out", str(tmp_path), *argv])
    assert stop.value.code == 2
    assert capsys.readouterr().err == f"error: {message}\n"
    assert (tmp_path / "corpus.txt").read_text() == "an earlier corpus\n"


def test_the_vocabulary_is_read_as_the_tokenizer_reads_it_one_token_a_line(tmp_path):
    """Split on newlines only, trailing spaces dropped: 'cat ' is 'cat' again; a form feed inside a line is not a
    line break; a blank line is the empty token, so a second one is a token given twice: the tokenizer would number
    the tokens after it past the vocabulary's size."""
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\x0cb\ncat\ncat \n")
    with pytest.raises(DataError, match=r"line 8: token 'cat' again \(first on line 7\)"):
        load_tokenizer(vocab, lowercase=True)
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\x0cb\n\n\ncat\n")
    with pytest.raises(DataError, match=r"line 8: a blank line \(the empty token\) again \(first on line 7\)"):
        load_tokenizer(vocab, lowercase=True)
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\x0cb\na\nb\n\n")  # one blank line, at the end
    tokenizer = load_tokenizer(vocab, lowercase=True)
    ids = tokenizer.get_vocab()
    assert ids["a\x0cb"] == 5 and ids["a"] == 6 and ids["b"] == 7  # 'a\x0cb' is one token, not 'a' and 'b' twice
    assert sorted(ids.values()) == list(range(tokenizer.get_vocab_size()))  # every id below the size


def test_a_vocabulary_with_two_blank_lines_would_number_tokens_past_its_size(tmp_path):
    """Why two blank lines are refused: the tokenizer itself (the `tokenizers` package, read here without our check)
    gives the token after them an id equal to the vocabulary's size, one past the model's last embedding row."""
    from tokenizers import BertWordPieceTokenizer

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\n\n\nb\n")
    tokenizer = BertWordPieceTokenizer(str(vocab), lowercase=True)
    assert tokenizer.encode("a b", add_special_tokens=False).ids == [5, 8] and tokenizer.get_vocab_size() == 8
    with pytest.raises(DataError, match=r"line 8: a blank line"):
        load_tokenizer(vocab, lowercase=True)
