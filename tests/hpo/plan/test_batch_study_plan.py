"""`hpo plan` of a batch-size study: its question is the verdict at each batch size, so a right answer (what
`--power`'s advice counts) is the verdict at every batch size right against the truth there, and the chances
drawn from a spread (`--cv`/`--difference`, `--like`), which are of one verdict between the file's arms, are
refused before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpo.cli.main import main
from hpo.plan.forecast import Plan, PlanOptions, Repetition, judged_counts, right_answers
from hpo.plan.truth import ArmTruth, Truth

PRESET = Path(__file__).resolve().parents[3] / "search_spaces" / "presets" / "batch_scaling_demo_cpu.yaml"


def truth(better: str) -> Truth:
    figures = {"adamw": 100.0, "lamb": 80.0} if better == "lamb" else {"adamw": 80.0, "lamb": 100.0}
    return Truth(tuple(ArmTruth(name, {}, f, f) for name, f in figures.items()), better, "samples_to_target")


def repetition(outcome: str, winner: str | None, at_batches) -> Repetition:
    return Repetition(0, 0, 0, 1.0, 1.0, 2.0, 2.0, 0.1, outcome, winner, 8, 4, tuple(at_batches))


def test_a_right_answer_of_a_batch_size_study_is_the_verdict_at_every_batch_size_right():
    """LAMB is truly better at 32 and AdamW at 64 (the truth there); the experiment's verdict across batch sizes is
    judged against its own truth (LAMB at 32 overall). Counted by hand: only the repetition right at both batch
    sizes is a right answer of the study, whatever its experiment's verdict says."""
    overall = Truth((ArmTruth("optimizer.name=lamb,batch.global_batch_size=32", {}, 80.0, 80.0),
                     ArmTruth("optimizer.name=adamw,batch.global_batch_size=64", {}, 90.0, 90.0)),
                    "optimizer.name=lamb,batch.global_batch_size=32", "samples_to_target")  # fmt: skip
    plan = Plan("f.yaml", {}, None, Path("t.jsonl"), None, PlanOptions(), (0, 0), overall,
                batch_truths={32: truth("lamb"), 64: truth("adamw")})  # fmt: skip
    lamb_32 = "optimizer.name=lamb,batch.global_batch_size=32"
    repetitions = [
        repetition("not yet", None, [(32, "winner", "lamb"), (64, "winner", "adamw")]),  # right at both
        repetition("winner", lamb_32, [(32, "winner", "lamb"), (64, "not yet", None)]),  # 64 undecided
        repetition("winner", lamb_32, [(32, "winner", "lamb"), (64, "winner", "lamb")]),  # wrong at 64
        repetition("winner", lamb_32, [(32, "winner", "lamb")]),  # no verdict asked at 64: not yet there
    ]
    assert right_answers(plan, repetitions) == 1
    assert judged_counts(plan, repetitions)["right"] == 3  # the experiment's verdict: another count


@pytest.mark.parametrize("spread", [["--cv", "10%", "--difference", "20%"], ["--like", "pilot"]])
@pytest.mark.parametrize("verdict_only", [True, False])
def test_chances_from_a_spread_are_refused_for_a_batch_size_study_before_any_work(tmp_path, capsys, spread,
                                                                                  verdict_only):  # fmt: skip
    db = tmp_path / "hpo.db"  # never created: the pilot is not read
    args = ["--db", f"sqlite:///{db}", "plan", str(PRESET), *spread, *(["--verdict-only"] if verdict_only else [])]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "plan:" not in captured.err
    assert "batch-size study, whose question is the verdict at each batch size" in captured.err
    assert "plan a file of one batch size (compare: [optimizer.name])" in captured.err
    assert not db.exists()
