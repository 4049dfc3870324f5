"""The NNI variant of the CPU demo preset end to end, as the README runs it: `hpo run` of the shipped file on
the generated demo corpus, under a real NNI manager (10 tuning trials and 6 to 12 confirmation runs of about 30 s
each on an idle 2-core machine), to the verdict."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpo.storage import SqlStorage
from hpo.trials import TrialKind

PRESET = Path(__file__).resolve().parents[3] / "search_spaces" / "presets" / "adam_vs_lamb_demo_cpu_nni.yaml"


@pytest.mark.nni
@pytest.mark.slow
def test_the_nni_demo_preset_runs_end_to_end(tmp_path):
    corpus = [sys.executable, "-m", "trainer.data.demo_corpus", "--out", str(tmp_path / "data" / "demo")]
    subprocess.run(corpus, check=True, capture_output=True, timeout=600)
    db = f"sqlite:///{tmp_path / 'hpo.db'}"
    run = subprocess.run([sys.executable, "-m", "hpo", "--db", db, "run", str(PRESET), "--port", "18900"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=4200)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    for index, arm in enumerate(("optimizer.name=adamw", "optimizer.name=lamb")):
        shown = rf"adam_vs_lamb_demo_cpu_nni {re.escape(arm)}: NNI web UI at http://127\.0\.0\.1:\d+ "
        assert re.search(shown + rf"\(NNI experiment hpo1-arm{index}, 5 trials\)", run.stdout), run.stdout
        assert re.search(shown + rf"\(NNI experiment hpo1-arm{index}-confirm1, 3 confirmation runs\)", run.stdout)
    storage = SqlStorage(db)
    rows = storage.list_trials(storage.get_experiment_by_name("adam_vs_lamb_demo_cpu_nni").id)
    tuning = [t for t in rows if t.kind is TrialKind.TUNING]
    assert sorted(t.arm for t in tuning) == ["optimizer.name=adamw"] * 5 + ["optimizer.name=lamb"] * 5
    assert all(t.state.finished for t in rows)
    assert sum(t.state.value == "completed" for t in tuning) >= 8  # the demo's ranges reach the target
    runs = sorted(t.arm for t in rows if t.kind is TrialKind.CONFIRMATION)  # one or two rounds of 3 per arm
    assert runs in [["optimizer.name=adamw"] * n + ["optimizer.name=lamb"] * n for n in (3, 6)], runs
    assert re.search(r"^verdict \(look [12] of 2\): ", run.stdout, re.M), run.stdout[-3000:]
