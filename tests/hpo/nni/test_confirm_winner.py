"""Confirmation runs under a real NNI manager that end in a winner: the seeds table's pair
(hpo/simulation/tables/seeds.jsonl:
AdamW lr 1e-3 and LAMB lr 1e-2 at batch 32, warmup 0, on the demo corpus) as an `engine: nni` experiment, one
tuning trial per arm at training seed 0, then `confirm_seeds: auto` (rounds of 3, at most 6). The table recorded
these runs, so it says at which look the confirmation seeds (1-3, then 1-6) decide: the experiment must stop after
that round with LAMB named (LAMB about a quarter faster), its verdict equal to the one `decide` gives at that look on
the table's own records of those seeds (an independent reading: the trainer ran here under NNI). With the table of
2026-11-30 (trainer revision 2) seeds 1-3 do not decide and seeds 1-6 do: two rounds."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpo.evidence.verdict import ArmRuns, Outcome, decide, samples_between_evaluations
from hpo.storage import SqlStorage
from hpo.trials import TrialKind

ROOT = Path(__file__).resolve().parents[3]
SEEDS_TABLE = ROOT / "hpo" / "simulation" / "tables" / "seeds.jsonl"
ADAMW, LAMB = "optimizer.name=adamw", "optimizer.name=lamb"
BEST = {"adamw": 1e-3, "lamb": 1e-2}


def recorded(optimizer: str, seeds: range) -> list[float]:
    """The table's interpolated samples to target of `optimizer` at its best point under these seeds."""
    values = {}
    for line in SEEDS_TABLE.read_text().splitlines():
        run = json.loads(line)
        if run["kind"] == "run" and run["optimizer"] == optimizer and run["seed"] in seeds:
            values[run["seed"]] = samples_between_evaluations(run["curve"], 0.12, run["samples_to_target"])
    return [values[s] for s in seeds]


@pytest.mark.nni
@pytest.mark.slow
def test_confirmation_runs_under_nni_name_the_winner_the_recorded_runs_name(tmp_path):
    corpus = [sys.executable, "-m", "trainer.data.demo_corpus", "--out", str(tmp_path / "data" / "demo")]
    subprocess.run(corpus, check=True, capture_output=True, timeout=600)
    experiment = {
        "name": "nni_winner",
        "base_config": str(ROOT / "trainer" / "configs" / "demo_cpu.yaml"),
        "overrides": {"budget.max_samples": 12288, "budget.max_time_s": None, "eval.every_samples": 1024,
                      "eval.max_samples": 512, "eval.target_mlm_accuracy": 0.12, "batch.global_batch_size": 32,
                      "batch.micro_batch_size": 16, "schedule.warmup_steps": 0, "seed": 0},  # the table's set-up
        "space": {"optimizer.name": {"choice": ["adamw", "lamb"]},
                  "optimizer.lr@adamw": {"choice": [BEST["adamw"]], "when": {"optimizer.name": "adamw"}},
                  "optimizer.lr@lamb": {"choice": [BEST["lamb"]], "when": {"optimizer.name": "lamb"}}},
        "objective": {"metric": "samples_to_target", "direction": "minimize"},
        "compare": ["optimizer.name"],
        "allow_unequal_arms": "each arm runs its best point of the seeds table, one learning rate each: nothing is "
        "tuned, the test is about the confirmation runs",
        "tuner": {"name": "nni_random", "seed": 0, "options": {"assessor": "none"}},
        "budget": {"trials": 2, "confirm_seeds": "auto", "max_confirm_seeds": 6, "max_parallel": 2,
                   "trial_timeout_s": 900},
        "resources": {"gpus": "none", "cpu_slots": 2},
        "engine": "nni",
    }  # fmt: skip
    path = tmp_path / "nni_winner.yaml"
    path.write_text(yaml.safe_dump(experiment))
    db = f"sqlite:///{tmp_path / 'hpo.db'}"
    run = subprocess.run([sys.executable, "-m", "hpo", "--db", db, "run", str(path), "--port", "18950"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=3600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    storage = SqlStorage(db)
    rows = storage.list_trials(storage.get_experiment_by_name("nni_winner").id)
    confirmations = {arm: sorted(t.seed for t in rows if t.kind is TrialKind.CONFIRMATION and t.arm == arm)
                     for arm in (ADAMW, LAMB)}  # fmt: skip
    for look in (1, 2):  # the table's verdict at each look, as `hpo run` asks it: the first that decides
        seeds = range(1, 1 + 3 * look)
        expected = decide([ArmRuns(ADAMW, tuple(recorded("adamw", seeds)), 12288),
                           ArmRuns(LAMB, tuple(recorded("lamb", seeds)), 12288)], look=look, looks=2)  # fmt: skip
        if expected.outcome is not Outcome.NOT_YET:
            break
    assert expected.outcome is Outcome.WINNER and expected.winner == LAMB  # the premise, from the table
    assert confirmations == {ADAMW: list(seeds), LAMB: list(seeds)}  # stopped at the look that decides
    assert all(t.state.value == "completed" and t.samples_to_target for t in rows)
    shown = re.search(rf"^verdict \(look {look} of 2\): (.*)$", run.stdout, re.M)
    assert shown and shown[1].startswith(f"{LAMB} needs "), run.stdout[-3000:]
    assert re.search(rf"NNI experiment hpo1-arm\d-confirm{look}, 3 confirmation runs", run.stdout), run.stdout[-3000:]
