"""Raw text -> MLPerf-style pretraining shards, following Google BERT's `create_pretraining_data.py`.

Input: text files with one sentence per line and a blank line between documents. Steps: WordPiece
tokenization (a vocabulary is trained on the input when none is given), documents split into train and eval,
sentence-pair instances ([CLS] A [SEP] B [SEP], B a random segment of another document half of the time,
shorter target lengths with probability `short_seq_prob`), 15 % masking, shuffled shards and `meta.json`.
The output is fully determined by the input text and the seed, the trained vocabulary included.

    python -m trainer.data.prepare --input corpus.txt --out data/ --vocab-size 8000 --max-seq-length 128
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from trainer.config import file_in_the_way
from trainer.data.masking import SPECIAL_TOKENS, MaskingRule, mask_tokens
from trainer.data.shards import PretrainingSamples, write_shard
from trainer.data.wordpiece import count_words, train_wordpiece
from trainer.errors import DataError

Document = list[list[int]]  # sentences of token ids
Log = Callable[[str], None]


@dataclass(frozen=True)
class PrepareOptions:
    """Settings of the preparation; the defaults are MLPerf's (BERT-large phase 2)."""

    vocab: str | None = None  # existing vocab.txt; None trains one on the input and writes DIR/vocab.txt
    vocab_size: int = 30522  # size of the trained vocabulary (ignored with `vocab`)
    lowercase: bool = True  # uncased model, as MLPerf
    max_seq_length: int = 512
    max_predictions: int = 76
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1  # probability that a document uses a random shorter target length
    dupe_factor: int = 1  # how many times each document is turned into instances (with different masks)
    eval_fraction: float = 0.05  # fraction of the documents that go to the eval set
    samples_per_shard: int = 65536
    compress: bool = False  # gzip the HDF5 datasets
    seed: int = 12345


class PairInstance(NamedTuple):
    tokens_a: list[int]
    tokens_b: list[int]
    is_random_next: bool


# ---------------------------------------------------------------------------------------------------- text


def not_utf8(path: Path) -> DataError:
    """The error for a text file that is not UTF-8, naming its first undecodable line, column and byte."""
    with path.open("rb") as f:
        for number, raw in enumerate(f, 1):  # a newline byte is never inside a UTF-8 character
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                return DataError(
                    f"{path}: line {number} is not UTF-8 text: byte 0x{raw[e.start]:02x} at column {e.start + 1} "
                    "cannot be decoded; save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)"
                )
    return DataError(f"{path}: not UTF-8 text; save the file as UTF-8")


def read_documents(paths: Sequence[str | Path]) -> list[list[str]]:
    """Documents as lists of sentences: one sentence per line, documents separated by blank lines. Every input that
    cannot be read is named, in one error (a fix of the first would otherwise meet the next)."""
    documents: list[list[str]] = []
    problems: list[str] = []
    for path in map(Path, paths):
        try:
            read = _read_one(path)
        except DataError as e:
            problems.append(str(e))
            continue
        if not read and len(paths) > 1:  # one empty file alone is said below
            problems.append(f"{path}: no text in it (empty, or blank lines only); remove it from --input, or give one "
                            "sentence per line, blank lines between documents")  # fmt: skip
        documents += read
    if len(problems) == 1:
        raise DataError(problems[0])
    if problems:
        raise DataError(f"{len(problems)} of the {len(paths)} inputs cannot be read:\n" + "\n".join(
            f"  {problem}" for problem in problems))  # fmt: skip
    if not documents:
        raise DataError(
            f"no text found in {[str(p) for p in paths]}; give one sentence per line, blank lines between documents"
        )
    return documents


def _read_one(path: Path) -> list[list[str]]:
    """One input file's documents; DataError naming it where it is not a readable UTF-8 text file."""
    if path.is_dir():
        raise DataError(f"{path}: is a directory: pass the text files in it, e.g. --input {path}/*.txt")
    if not path.is_file():
        raise DataError(f"{path}: input text file not found; pass existing files to --input")
    documents: list[list[str]] = []
    current: list[str] = []
    try:
        with path.open(encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line:
                    current.append(line)
                elif current:
                    documents.append(current)
                    current = []
    except UnicodeDecodeError:
        raise not_utf8(path) from None
    if current:
        documents.append(current)
    return documents


def train_vocab(paths: Sequence[str | Path], out_dir: Path, vocab_size: int, lowercase: bool) -> Path:
    """Train a WordPiece vocabulary on the text files and write `out_dir/vocab.txt`.

    The training is deterministic (`trainer.data.wordpiece`): the same text gives the same file in every run.
    The special tokens come first, the others follow sorted.
    """
    tokens = train_wordpiece(count_words(paths, lowercase), vocab_size, SPECIAL_TOKENS)
    others = sorted(set(tokens) - set(SPECIAL_TOKENS))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "vocab.txt"
    path.write_text("\n".join([*SPECIAL_TOKENS, *others]) + "\n", encoding="utf-8")
    return path


def load_tokenizer(vocab: str | Path, lowercase: bool):
    """A BERT WordPiece tokenizer for `vocab`; DataError when the file or a special token is missing."""
    from tokenizers import BertWordPieceTokenizer

    if not Path(vocab).is_file():
        raise DataError(f"{vocab}: vocabulary file not found; pass an existing vocab.txt or omit --vocab")
    try:
        text = Path(vocab).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise not_utf8(Path(vocab)) from None
    # As the tokenizer reads the file: one token a line, trailing spaces dropped, no line after the last newline; a
    # blank line is a token too (the empty one)
    lines = [line.rstrip() for line in text.removesuffix("\n").split("\n")] if text else []
    tokens, first = set(lines), {}
    for number, token in enumerate(lines, 1):
        if token in first:  # the tokenizer numbers a token given twice with its later id: ids past the size
            what = f"token {token!r}" if token else "a blank line (the empty token)"
            raise DataError(f"{vocab}: line {number}: {what} again (first on line {first[token]}); each token must be "
                            "on one line only" + ("; remove the blank lines" if not token else ""))  # fmt: skip
        first[token] = number
    missing = [t for t in SPECIAL_TOKENS if t not in tokens]
    if missing:
        raise DataError(f"{vocab}: vocabulary lacks the special tokens {missing}; add them or train a new vocab")
    return BertWordPieceTokenizer(str(vocab), lowercase=lowercase)


def tokenize_documents(documents: list[list[str]], tokenizer) -> list[Document]:
    """Token ids of every sentence (no special tokens); sentences that give no token are dropped."""
    sentences = [s for doc in documents for s in doc]
    encoded = iter(tokenizer.encode_batch(sentences, add_special_tokens=False))
    tokenized = [[ids for ids in (next(encoded).ids for _ in doc) if ids] for doc in documents]
    return [doc for doc in tokenized if doc]


def split_documents(documents: list, eval_fraction: float, rng: np.random.Generator) -> tuple[list, list]:
    """Random (train, eval) split by document, so no eval text is seen in training."""
    order = rng.permutation(len(documents))
    num_eval = int(round(len(documents) * eval_fraction))
    if eval_fraction > 0 and len(documents) > 1:
        num_eval = min(max(num_eval, 1), len(documents) - 1)
    return [documents[i] for i in order[num_eval:]], [documents[i] for i in order[:num_eval]]


# ------------------------------------------------------------------------------------------- instances


def create_instances(
    documents: list[Document], options: PrepareOptions, rng: np.random.Generator
) -> list[PairInstance]:
    """Sentence-pair instances of all documents, `dupe_factor` times over, shuffled."""
    instances = []
    for _ in range(options.dupe_factor):
        for index in range(len(documents)):
            instances.extend(instances_from_document(documents, index, options, rng))
    return [instances[i] for i in rng.permutation(len(instances))]


def instances_from_document(
    documents: list[Document], index: int, options: PrepareOptions, rng: np.random.Generator
) -> list[PairInstance]:
    """Google's algorithm: gather sentences up to a target length, split them into A and B at a random
    sentence boundary, and half of the time replace B by text of a random other document."""
    document = documents[index]
    max_num_tokens = options.max_seq_length - 3  # [CLS], [SEP], [SEP]
    target_length = max_num_tokens
    if rng.random() < options.short_seq_prob:
        target_length = int(rng.integers(2, max_num_tokens + 1))
    instances, chunk, chunk_length, i = [], [], 0, 0
    while i < len(document):
        chunk.append(document[i])
        chunk_length += len(document[i])
        if i == len(document) - 1 or chunk_length >= target_length:
            a_end = int(rng.integers(1, len(chunk))) if len(chunk) >= 2 else 1
            tokens_a = [t for sentence in chunk[:a_end] for t in sentence]
            is_random_next = len(chunk) == 1 or rng.random() < 0.5
            if is_random_next:
                tokens_b = random_segment(documents, index, target_length - len(tokens_a), rng)
                i -= len(chunk) - a_end  # the unused sentences start the next instance
            else:
                tokens_b = [t for sentence in chunk[a_end:] for t in sentence]
            truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
            if tokens_a and tokens_b:
                instances.append(PairInstance(tokens_a, tokens_b, is_random_next))
            chunk, chunk_length = [], 0
        i += 1
    return instances


def random_segment(documents: list[Document], index: int, length: int, rng: np.random.Generator) -> list[int]:
    """At least `length` tokens (or to the document's end) from a random place in another document."""
    other = index
    for _ in range(10):  # as Google's script; with a single document B comes from the same one
        other = int(rng.integers(len(documents)))
        if other != index:
            break
    document = documents[other]
    tokens: list[int] = []
    for sentence in document[int(rng.integers(len(document))) :]:
        tokens.extend(sentence)
        if len(tokens) >= length:
            break
    return tokens


def truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int, rng: np.random.Generator):
    """Shorten the longer side, from the front or the back at random, until both fit in `max_num_tokens`.

    Google's algorithm and random draws (one per token removed), with the lists cut once at the end: a sentence
    of a million tokens takes linear time, not quadratic."""
    spans = [[0, len(tokens_a)], [0, len(tokens_b)]]  # [start, end) kept of each
    length_a, length_b = len(tokens_a), len(tokens_b)
    while length_a + length_b > max_num_tokens:
        longer = 0 if length_a > length_b else 1
        if rng.random() < 0.5:
            spans[longer][0] += 1
        else:
            spans[longer][1] -= 1
        length_a, length_b = (length_a - 1, length_b) if longer == 0 else (length_a, length_b - 1)
    for tokens, (start, end) in zip((tokens_a, tokens_b), spans, strict=True):
        del tokens[end:]
        del tokens[:start]


def build_samples(
    instances: list[PairInstance], rule: MaskingRule, max_seq_length: int, rng: np.random.Generator
) -> PretrainingSamples:
    """Encode instances as [CLS] A [SEP] B [SEP], mask them and pad to `max_seq_length`."""
    n, special = len(instances), rule.special
    samples = PretrainingSamples(
        input_ids=np.full((n, max_seq_length), special.pad, dtype=np.int32),
        input_mask=np.zeros((n, max_seq_length), dtype=np.int8),
        segment_ids=np.zeros((n, max_seq_length), dtype=np.int8),
        masked_lm_positions=np.zeros((n, rule.max_predictions), dtype=np.int32),
        masked_lm_ids=np.zeros((n, rule.max_predictions), dtype=np.int32),
        next_sentence_labels=np.array([inst.is_random_next for inst in instances], dtype=np.int8),
    )
    for row, inst in enumerate(instances):
        tokens = np.array([special.cls, *inst.tokens_a, special.sep, *inst.tokens_b, special.sep], dtype=np.int32)
        masked, positions, labels = mask_tokens(tokens, rule, rng)
        length = len(tokens)
        samples.input_ids[row, :length] = masked
        samples.input_mask[row, :length] = 1
        samples.segment_ids[row, len(inst.tokens_a) + 2 : length] = 1
        samples.masked_lm_positions[row, : len(positions)] = positions
        samples.masked_lm_ids[row, : len(labels)] = labels
    return samples


# ---------------------------------------------------------------------------------------------- output


def write_shards(samples: PretrainingSamples, directory: Path, samples_per_shard: int, compress: bool) -> list[Path]:
    """Write `samples` as `directory/part-00000.h5`, ... of at most `samples_per_shard` samples each.

    Shards of an earlier run in `directory` are removed first, so that they are not read with the new ones.
    """
    for old in directory.glob("part-*.h5"):
        old.unlink()
    paths = []
    for number, start in enumerate(range(0, max(len(samples), 1), samples_per_shard)):
        path = directory / f"part-{number:05d}.h5"
        write_shard(path, samples.subset(slice(start, start + samples_per_shard)), compress=compress)
        paths.append(path)
    return paths


def masked_labels(samples: PretrainingSamples) -> np.ndarray:
    """All real masked-LM labels (padding entries, whose position is 0, left out)."""
    return samples.masked_lm_ids[samples.masked_lm_positions > 0]


def most_frequent_token_baseline(train: PretrainingSamples, eval_: PretrainingSamples) -> tuple[int, float]:
    """The most frequent masked label of `train` and the eval MLM accuracy of always predicting it."""
    train_labels, eval_labels = masked_labels(train), masked_labels(eval_)
    token_id = int(np.bincount(train_labels).argmax())
    accuracy = float((eval_labels == token_id).mean()) if len(eval_labels) else 0.0
    return token_id, accuracy


def describe(train: PretrainingSamples, eval_: PretrainingSamples, tokenizer, options: PrepareOptions) -> dict:
    """The content of meta.json."""
    token_id, accuracy = most_frequent_token_baseline(train, eval_)
    return {
        "vocab_size": tokenizer.get_vocab_size(),
        "max_seq_length": options.max_seq_length,
        "max_predictions": options.max_predictions,
        "train_samples": len(train),
        "eval_samples": len(eval_),
        "train_masked_tokens": int(masked_labels(train).size),
        "eval_masked_tokens": int(masked_labels(eval_).size),
        "train_mean_length": float(train.lengths.mean()) if len(train) else 0.0,
        "train_full_length_fraction": float((train.lengths == options.max_seq_length).mean()) if len(train) else 0.0,
        "most_frequent_masked_token": tokenizer.id_to_token(token_id),
        "most_frequent_masked_token_id": token_id,
        # eval accuracy of always predicting that token: the chance level (None without an evaluation set)
        "baseline_mlm_accuracy": accuracy if len(eval_) else None,
        "options": asdict(options),
    }


# ---------------------------------------------------------------------------------------------- driver


def check_options(options: PrepareOptions) -> None:
    """Refuse options that cannot make shards, naming the command-line flag, before any work."""
    rules = [
        ("--vocab-size", options.vocab_size, options.vocab_size > len(SPECIAL_TOKENS), f"> {len(SPECIAL_TOKENS)}"),
        ("--max-seq-length", options.max_seq_length, options.max_seq_length >= 8, ">= 8"),
        ("--max-predictions", options.max_predictions, options.max_predictions >= 1, ">= 1"),
        ("--masked-lm-prob", options.masked_lm_prob, 0 < options.masked_lm_prob <= 1, "in (0, 1]"),
        ("--short-seq-prob", options.short_seq_prob, 0 <= options.short_seq_prob <= 1, "in [0, 1]"),
        ("--dupe-factor", options.dupe_factor, options.dupe_factor >= 1, ">= 1"),
        ("--eval-fraction", options.eval_fraction, 0 <= options.eval_fraction < 1, "in [0, 1)"),
        ("--samples-per-shard", options.samples_per_shard, options.samples_per_shard >= 1, ">= 1"),
        ("--seed", options.seed, options.seed >= 0, ">= 0"),
    ]
    for flag, value, ok, need in rules:
        if not ok:
            raise DataError(f"{flag} {value}: must be {need}")


def check_out_dir(out_dir: Path) -> None:
    """--out is a directory, or can be made one: not a file, nor under one."""
    if where := file_in_the_way(out_dir):
        raise DataError(f"--out {out_dir} {where}; give a directory (it is made if missing)")


def resolve_vocab(inputs: Sequence[str | Path], out_dir: Path, options: PrepareOptions) -> Path:
    """`out_dir/vocab.txt`: a copy of `options.vocab`, or a vocabulary trained on the input."""
    if not options.vocab:
        return train_vocab(inputs, out_dir, options.vocab_size, options.lowercase)
    load_tokenizer(options.vocab, options.lowercase)  # fails early on a missing or incomplete file
    target = out_dir / "vocab.txt"
    out_dir.mkdir(parents=True, exist_ok=True)
    if not (target.exists() and target.samefile(options.vocab)):
        shutil.copyfile(options.vocab, target)
    return target


def prepare_corpus(
    inputs: Sequence[str | Path], out_dir: str | Path, options: PrepareOptions = PrepareOptions(), log: Log = print
) -> dict:
    """Turn raw text files into `out_dir/{train,eval}/part-*.h5`, `out_dir/vocab.txt` and `out_dir/meta.json`.

    Returns the content of meta.json.
    """
    check_options(options)
    out_dir, start, rng = Path(out_dir), time.perf_counter(), np.random.default_rng(options.seed)
    check_out_dir(out_dir)
    documents = read_documents(inputs)
    if options.eval_fraction > 0 and len(documents) < 2:
        where = [str(p) for p in inputs]
        raise DataError(f"{len(documents)} document in {where}: an eval set needs at least 2 (one goes to eval); "
                        "give more text (blank lines between documents) or --eval-fraction 0")  # fmt: skip
    log(f"read {len(documents)} documents, {sum(map(len, documents))} sentences from {len(inputs)} file(s)")
    tokenizer = load_tokenizer(resolve_vocab(inputs, out_dir, options), options.lowercase)
    tokenized = tokenize_documents(documents, tokenizer)
    log(f"tokenized with a vocabulary of {tokenizer.get_vocab_size()} [{time.perf_counter() - start:.1f} s]")
    rule = MaskingRule.for_vocab(tokenizer.get_vocab(), options.max_predictions, masked_lm_prob=options.masked_lm_prob)
    splits = dict(zip(("train", "eval"), split_documents(tokenized, options.eval_fraction, rng), strict=True))
    samples = {}
    for name, docs in splits.items():
        samples[name] = build_samples(create_instances(docs, options, rng), rule, options.max_seq_length, rng)
        if name == "eval" and options.eval_fraction == 0:  # no evaluation set: no empty shard a run would fail on
            log("eval: none (--eval-fraction 0): give a run another preparation's evaluation set as data.eval")
            continue
        paths = write_shards(samples[name], out_dir / name, options.samples_per_shard, options.compress)
        log(
            f"{name}: {len(docs)} documents -> {len(samples[name])} samples in {len(paths)} shard(s) "
            f"[{time.perf_counter() - start:.1f} s]"
        )
    if not len(samples["train"]):
        raise DataError(f"no training samples from {[str(p) for p in inputs]}; give more text or a lower eval_fraction")
    meta = describe(samples["train"], samples["eval"], tokenizer, options)
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    token, accuracy = meta["most_frequent_masked_token"], meta["baseline_mlm_accuracy"]
    if accuracy is not None:
        log(f"baseline (always '{token}'): eval MLM accuracy {accuracy:.4f}")
    return meta


def parse_args(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, PrepareOptions]:
    defaults = PrepareOptions()
    parser = argparse.ArgumentParser(prog="python -m trainer.data.prepare", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--input", nargs="+", required=True, help="text files: one sentence per line, blank line between documents"
    )
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--vocab", default=None, help="existing vocab.txt (default: train one on the input)")
    parser.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help=f"of a vocabulary trained on the input (default: {defaults.vocab_size}; not with --vocab)",
    )
    parser.add_argument("--cased", action="store_true", help="keep case (default: lowercase, as MLPerf)")
    parser.add_argument("--max-seq-length", type=int, default=defaults.max_seq_length)
    parser.add_argument("--max-predictions", type=int, default=defaults.max_predictions)
    parser.add_argument("--masked-lm-prob", type=float, default=defaults.masked_lm_prob)
    parser.add_argument("--short-seq-prob", type=float, default=defaults.short_seq_prob)
    parser.add_argument("--dupe-factor", type=int, default=defaults.dupe_factor)
    parser.add_argument("--eval-fraction", type=float, default=defaults.eval_fraction)
    parser.add_argument("--samples-per-shard", type=int, default=defaults.samples_per_shard)
    parser.add_argument("--compress", action="store_true", help="gzip the HDF5 datasets")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    args = parser.parse_args(argv)
    options = PrepareOptions(
        vocab=args.vocab, vocab_size=defaults.vocab_size if args.vocab_size is None else args.vocab_size,
        lowercase=not args.cased, max_seq_length=args.max_seq_length,
        max_predictions=args.max_predictions, masked_lm_prob=args.masked_lm_prob, short_seq_prob=args.short_seq_prob,
        dupe_factor=args.dupe_factor, eval_fraction=args.eval_fraction, samples_per_shard=args.samples_per_shard,
        compress=args.compress, seed=args.seed,
    )  # fmt: skip
    return args, options


def main(argv: Sequence[str] | None = None) -> None:
    args, options = parse_args(argv)
    try:
        if args.vocab and args.vocab_size is not None:  # it would be ignored: the file's tokens are the vocabulary
            raise DataError(
                f"--vocab-size {args.vocab_size}: sets the size of a vocabulary trained on the input; "
                f"with --vocab the tokens of {args.vocab} are the vocabulary: leave --vocab-size out"
            )
        prepare_corpus(args.input, args.out, options)
    except DataError as e:  # bad input or options: said without a traceback, exit code 2 (as argparse's errors)
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
