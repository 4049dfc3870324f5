"""bench/mlperf_corpus.py on the excerpts of published results in tests/hpo/mlperf/results (training 0.7: NVIDIA's
dgx1 log imports, Google's tpu-v3-8192-TF log is refused and does not end with train_samples), with its checker cache
in tmp_path. The checker fails the excerpts (they keep only the lines the importer reads): that is its verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import mlperf_corpus

PUBLISHED = Path(__file__).parents[1] / "hpo" / "mlperf" / "results"


def test_a_round_of_published_results_imported_beside_the_checker(tmp_path, capsys):
    cache = tmp_path / "cache.json"
    assert (
        mlperf_corpus.main([str(PUBLISHED), "--rounds", "0.7", "--jobs", "1", "--cache", str(cache), "--markdown"]) == 0
    )
    out = capsys.readouterr().out
    assert "training 0.7 (ruleset 0.7.0, training_results_v0.7): 2 BERT result directories, 1 imported (1 runs), 1 " \
           "refused; the checker passes 0 of 2 files" in out  # fmt: skip
    nvidia = next(line for line in out.splitlines() if line.startswith("  NVIDIA/results/dgx1_ngc20.06_pytorch:"))
    assert "imported 1 runs, 1 reached the target; lamb (--optimizer), batch 288, positions command line, " \
           "accelerators 8; checker 0/1 pass (" in nvidia  # fmt: skip
    google = next(line for line in out.splitlines() if line.startswith("  Google/results/tpu-v3-8192-TF:"))
    assert "refused: Google/results/tpu-v3-8192-TF/bert/result_0.txt:" in google and "epoch_num counts" in google
    assert "| 0.7 | 2 | 1 (1) | 1 | 0 | 0 of 2 | 1 |" in out and "| all | 2 | 1 (1) | 1 | 0 | 0 of 2 | 1 |" in out
    assert len(json.loads(cache.read_text())) == 2  # one checker answer per file, kept for the next run


def test_only_folders_of_rounds_are_read(tmp_path):
    (tmp_path / "something_else").mkdir()
    with pytest.raises(SystemExit, match="no training_results_vX.Y folder"):
        mlperf_corpus.main([str(tmp_path)])
