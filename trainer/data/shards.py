"""MLPerf BERT pretraining shards: HDF5 files with six fixed keys, read into memory as `PretrainingSamples`.

Layout of one shard (N samples, S = max_seq_length, P = max_predictions; MLPerf uses S = 512, P = 76):

    input_ids             int32 [N, S]  token ids, [CLS] A [SEP] B [SEP] then [PAD] = 0
    input_mask            int8  [N, S]  1 for valid tokens, always a prefix of the row
    segment_ids           int8  [N, S]  0 for [CLS] A [SEP], 1 for B [SEP]
    masked_lm_positions   int32 [N, P]  positions of the masked tokens, zero-padded (position 0 is [CLS])
    masked_lm_ids         int32 [N, P]  original ids at those positions, zero-padded
    next_sentence_labels  int8  [N]     0 = B follows A (IsNext), 1 = B is random (NotNext)
"""

from __future__ import annotations

import glob
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

import h5py
import numpy as np

from trainer.errors import DataError

# Key -> (dtype, dimension name per axis). Both the order and the dtypes are those of the MLPerf shards.
SHARD_LAYOUT: dict[str, tuple[np.dtype, tuple[str, ...]]] = {
    "input_ids": (np.dtype(np.int32), ("N", "S")),
    "input_mask": (np.dtype(np.int8), ("N", "S")),
    "segment_ids": (np.dtype(np.int8), ("N", "S")),
    "masked_lm_positions": (np.dtype(np.int32), ("N", "P")),
    "masked_lm_ids": (np.dtype(np.int32), ("N", "P")),
    "next_sentence_labels": (np.dtype(np.int8), ("N",)),
}
SHARD_SUFFIXES = (".h5", ".hdf5")


@dataclass(eq=False)
class PretrainingSamples:
    """Pretraining samples in memory, one row per sequence; the arrays and dtypes of an MLPerf shard."""

    input_ids: np.ndarray
    input_mask: np.ndarray
    segment_ids: np.ndarray
    masked_lm_positions: np.ndarray
    masked_lm_ids: np.ndarray
    next_sentence_labels: np.ndarray

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def max_seq_length(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def max_predictions(self) -> int:
        return int(self.masked_lm_positions.shape[1])

    @property
    def lengths(self) -> np.ndarray:
        """Valid tokens per sample (int64 [N])."""
        return self.input_mask.sum(axis=1, dtype=np.int64)

    def arrays(self) -> dict[str, np.ndarray]:
        """The six arrays by their shard key."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def subset(self, index) -> PretrainingSamples:
        """The samples selected by `index` (a slice, an integer array or a boolean mask over N)."""
        if isinstance(index, (int, np.integer)):
            index = [int(index)]  # keep the sample axis
        return PretrainingSamples(**{key: array[index] for key, array in self.arrays().items()})

    def truncated(self, max_seq_length: int) -> PretrainingSamples:
        """Every row cut to its first `max_seq_length` positions; masked positions past the cut (and their labels)
        become padding (0). Samples no wider are returned as they are."""
        if max_seq_length >= self.max_seq_length:
            return self
        inside = self.masked_lm_positions < max_seq_length
        return PretrainingSamples(
            input_ids=self.input_ids[:, :max_seq_length],
            input_mask=self.input_mask[:, :max_seq_length],
            segment_ids=self.segment_ids[:, :max_seq_length],
            masked_lm_positions=np.where(inside, self.masked_lm_positions, 0).astype(np.int32),
            masked_lm_ids=np.where(inside, self.masked_lm_ids, 0).astype(np.int32),
            next_sentence_labels=self.next_sentence_labels,
        )

    @staticmethod
    def concatenate(parts) -> PretrainingSamples:
        """All samples of `parts` in order; the parts must share max_seq_length and max_predictions."""
        parts = list(parts)
        if not parts:
            raise DataError("cannot concatenate an empty list of PretrainingSamples; load at least one shard")
        shapes = {(p.max_seq_length, p.max_predictions) for p in parts}
        if len(shapes) > 1:
            raise DataError(
                f"cannot concatenate samples with different (max_seq_length, max_predictions): {sorted(shapes)}; "
                "prepare all shards of one data set with the same settings"
            )
        return PretrainingSamples(
            **{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(PretrainingSamples)}
        )


def write_shard(path, samples: PretrainingSamples, compress: bool = False) -> None:
    """Write `samples` as one HDF5 shard with the MLPerf keys and dtypes (gzip-compressed if `compress`)."""
    path = Path(path)
    _check_samples(samples, where=str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    options = {"compression": "gzip", "compression_opts": 4} if compress else {}
    with h5py.File(path, "w") as f:
        for key in SHARD_LAYOUT:
            f.create_dataset(key, data=_cast(getattr(samples, key), key, path), track_times=False, **options)


def read_shard(path) -> PretrainingSamples:
    """Read and validate one shard. Integer arrays of another dtype are cast when every value fits."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: shard file not found; check data paths or run `python -m trainer.data.prepare`")
    try:
        with h5py.File(path, "r") as f:
            arrays = {key: _read_key(f, key, path) for key in SHARD_LAYOUT}
    except (OSError, RuntimeError, KeyError, ValueError) as e:  # h5py's errors for damage inside the file
        raise DataError(f"{path}: not a readable HDF5 file ({e}); re-create the shard") from e
    if arrays["next_sentence_labels"].ndim == 2 and arrays["next_sentence_labels"].shape[1] == 1:
        arrays["next_sentence_labels"] = arrays["next_sentence_labels"].reshape(-1)  # some converters write [N, 1]
    samples = PretrainingSamples(**arrays)
    _check_samples(samples, where=str(path))
    return samples


def find_shards(spec: str, key: str | None = None) -> list[Path]:
    """The shard files named by `spec`: a directory (its *.h5 / *.hdf5 files), one file, or a glob; sorted.
    `DataError` where it names none, saying why (a directory without shards, a path that does not exist, a glob that
    matches no file), prefixed with the config `key` (data.train, data.eval) when given."""
    path = Path(spec)
    if path.is_dir():
        found = [p for p in path.iterdir() if p.suffix in SHARD_SUFFIXES and p.is_file()]
        why = "a directory without *.h5/*.hdf5 files"
    elif path.is_file():
        found = [path]
    else:
        found = [Path(p) for p in glob.glob(spec, recursive=True) if Path(p).is_file()]
        why = "a pattern that matches no file" if glob.has_magic(spec) else "it does not exist"
        if not path.is_absolute():
            why += f"; a relative path is read from the current directory, {Path.cwd()}"
    if not found:
        raise DataError(
            f"{key + ': ' if key else ''}no shard files found for {spec!r} ({why}): give a directory with "
            "*.h5/*.hdf5 files, a file or a glob (create shards with `python -m trainer.data.prepare` or "
            "`python -m trainer.data.demo_corpus`)"
        )
    return sorted(found)


def missing_shards(paths: dict[str, str]) -> str | None:
    """Why the first of `paths` (config key -> path) names no shard file from this process's working directory
    (`find_shards`'s message), or None where each names some: what a Dask worker, whose trials read the data from
    its own working directory, is asked before an experiment starts there."""
    for key, spec in paths.items():
        try:
            find_shards(spec, key)
        except DataError as e:
            return str(e)
    return None


def count_samples(spec: str, key: str | None = None) -> int:
    """How many samples the shards named by `spec` hold, read from each file's HDF5 header (no rows are read): what
    `load_samples` loads without a limit. `DataError` naming a shard that cannot be opened or has no input_ids array
    (the checks of `read_shard` then say more)."""
    total = 0
    for path in find_shards(spec, key):
        try:
            with h5py.File(path, "r") as f:
                rows = f.get("input_ids")
                if not isinstance(rows, h5py.Dataset) or rows.ndim < 1:
                    raise DataError(f"{path}: HDF5 key 'input_ids' is missing or not an array of rows")
                total += int(rows.shape[0])
        except (OSError, RuntimeError, ValueError) as e:
            raise DataError(f"{path}: not a readable HDF5 file ({e}); re-create the shard") from e
    return total


def load_samples(
    spec: str,
    limit: int | None = None,
    check: Callable[[PretrainingSamples, Path], None] | None = None,
    max_seq_length: int | None = None,
    key: str | None = None,
) -> PretrainingSamples:
    """All samples of the shards named by `spec` (the config key `key`, for messages) in file order, or only the
    first `limit` of them, each row cut to `max_seq_length` tokens when given (`PretrainingSamples.truncated`).

    `check(part, path)` is called with the samples taken from each shard (row numbers are the shard's own).
    """
    parts, total = [], 0
    for path in find_shards(spec, key):
        if limit is not None and total >= limit:
            break
        part = read_shard(path)
        if limit is not None and total + len(part) > limit:
            part = part.subset(slice(0, limit - total))
        if max_seq_length is not None:
            part = part.truncated(max_seq_length)
        if check is not None:
            check(part, path)
        parts.append(part)
        total += len(part)
    return PretrainingSamples.concatenate(parts)


def _read_key(f: h5py.File, key: str, path: Path) -> np.ndarray:
    if key not in f:
        raise DataError(
            f"{path}: HDF5 key '{key}' is missing (found {sorted(f.keys())}); a BERT shard needs the MLPerf keys "
            f"{list(SHARD_LAYOUT)}"
        )
    if not isinstance(f[key], h5py.Dataset):
        raise DataError(
            f"{path}: HDF5 key '{key}' is a {type(f[key]).__name__.lower()}, not a dataset; a BERT shard holds each "
            f"of {list(SHARD_LAYOUT)} as an array at the top level (re-create the shard)"
        )
    return _cast(f[key][...], key, path)


def _cast(array: np.ndarray, key: str, where) -> np.ndarray:
    """`array` in the MLPerf dtype of `key`; integers of another dtype only if every value fits."""
    dtype = SHARD_LAYOUT[key][0]
    if array.dtype == dtype:
        return array
    if array.dtype.kind not in "iub":
        raise DataError(f"{where}: HDF5 key '{key}' has dtype {array.dtype}, expected integers ({dtype})")
    info = np.iinfo(dtype)
    if array.size and (array.min() < info.min or array.max() > info.max):
        raise DataError(
            f"{where}: HDF5 key '{key}' has values in [{array.min()}, {array.max()}] that do not fit {dtype}"
        )
    return array.astype(dtype)


def _check_samples(samples: PretrainingSamples, where: str) -> None:
    """Shapes agree across keys and values are in range; raises DataError naming `where` and the key."""
    sizes: dict[str, int] = {}
    for key, (_, dims) in SHARD_LAYOUT.items():
        shape = getattr(samples, key).shape
        if len(shape) != len(dims):
            raise DataError(f"{where}: HDF5 key '{key}' has shape {shape}, expected [{', '.join(dims)}]")
        for dim, size in zip(dims, shape, strict=True):
            if sizes.setdefault(dim, size) != size:
                raise DataError(
                    f"{where}: HDF5 key '{key}' has shape {shape}, but other keys have {dim} = {sizes[dim]}; "
                    "all keys of a shard must describe the same samples"
                )
    _check_values(samples, where)


def _check_values(samples: PretrainingSamples, where: str) -> None:
    mask = samples.input_mask
    if not np.isin(mask, (0, 1)).all():
        raise DataError(f"{where}: HDF5 key 'input_mask' must contain only 0 and 1")
    prefix = np.arange(mask.shape[1]) < samples.lengths[:, None]
    if not np.array_equal(mask.astype(bool), prefix):
        raise DataError(f"{where}: HDF5 key 'input_mask' must mark a prefix of each row (valid tokens first)")
    positions = samples.masked_lm_positions
    if positions.size and (positions.min() < 0 or positions.max() >= samples.max_seq_length):
        raise DataError(
            f"{where}: HDF5 key 'masked_lm_positions' has values outside [0, {samples.max_seq_length}); "
            "positions index into input_ids"
        )
    if not np.isin(samples.next_sentence_labels, (0, 1)).all():
        raise DataError(f"{where}: HDF5 key 'next_sentence_labels' must contain only 0 (IsNext) and 1 (NotNext)")
