"""The demo data is the same in every process and on every clone: two generations agree byte for byte.

Each generation runs in its own Python process with its own hash seed (and the `tokenizers` library its own
hash-map order), which is where a vocabulary trained by `tokenizers` differed from run to run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DEMO_FILES = {"corpus.txt", "vocab.txt", "meta.json", "train/part-00000.h5", "eval/part-00000.h5"}


def generate(out: Path, hash_seed: int, documents: int | None = None) -> None:
    """`python -m trainer.data.demo_corpus --out OUT` in a fresh process."""
    args = [sys.executable, "-m", "trainer.data.demo_corpus", "--out", str(out)]
    if documents is not None:
        args += ["--documents", str(documents)]
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONHASHSEED": str(hash_seed), "PYTHONPATH": path}
    subprocess.run(args, env=env, cwd=ROOT, check=True, capture_output=True)


def file_bytes(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def assert_byte_identical(first: Path, second: Path) -> None:
    a, b = file_bytes(first), file_bytes(second)
    assert set(a) >= DEMO_FILES and sorted(a) == sorted(b)
    assert [name for name in sorted(a) if a[name] != b[name]] == []


def test_a_small_demo_corpus_generated_three_times_is_byte_identical(tmp_path):
    # 300 documents are enough: merges whose ties follow the hash order (the bug) gave three different
    # vocabularies at 300 documents, as at 1,000 (where eleven generations with the `tokenizers` trainer gave ten
    # different vocabularies: three equal ones by chance are unlikely).
    for name, hash_seed in (("a", 1), ("b", 2), ("c", 3)):
        generate(tmp_path / name, hash_seed, documents=300)
    assert_byte_identical(tmp_path / "a", tmp_path / "b")
    assert_byte_identical(tmp_path / "a", tmp_path / "c")


@pytest.mark.slow
def test_the_demo_data_generated_twice_is_byte_identical(tmp_path):
    generate(tmp_path / "a", hash_seed=1)
    generate(tmp_path / "b", hash_seed=2)
    assert_byte_identical(tmp_path / "a", tmp_path / "b")
    assert {"train/part-00001.h5", "train/part-00002.h5"} <= set(file_bytes(tmp_path / "a"))
