"""`hpo plan` of a batch-size study: its question is the verdict at each batch size, so a right answer (what
`--power`'s advice counts) is the verdict at every batch size right against the truth there, in the forecast on
the table and in the chances drawn from a spread (`--cv`/`--difference`, `--like`)."""

from __future__ import annotations

from pathlib import Path

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


def rows_at(out: str, heading: str) -> dict[str, int]:
    """The outcome rows (label -> count) under `  heading` of the chances' table, up to the next heading."""
    lines = out.splitlines()
    start = lines.index(heading)
    rows = {}
    for line in lines[start + 1 :]:
        if not line.startswith("    "):
            break
        rows[line[:46].strip()] = int(line[46:].split()[0])
    return rows


def every_count(out: str) -> int:
    line = next(line for line in out.splitlines() if line.startswith("  a right answer at every batch size"))
    return int(line[44:].split()[0])


def welch_power(runs: int, level: float, cv: float = 0.1, difference: float = 0.2) -> float:
    """The chance that Welch's test on ln values (scipy's ttest_ind) names the faster of two log-normal arms at this
    CV, one (1 - difference) x the other, at this two-sided level, with `runs` runs each: over 200,000 seeded draws
    (Welch's power has no closed form; Student's, the noncentral t, is some 2 points higher at 6 runs)."""
    import math

    import numpy as np
    from scipy import stats

    sigma, rng = math.sqrt(math.log1p(cv * cv)), np.random.default_rng(0)
    fast, slow = rng.normal(math.log1p(-difference), sigma, (200_000, runs)), rng.normal(0.0, sigma, (200_000, runs))
    test = stats.ttest_ind(fast, slow, axis=1, equal_var=False)
    return float(np.mean((test.pvalue < level) & (test.statistic < 0)))


def stated_chances(tmp_path, capsys, difference: str, draws: int, confirm_seeds: int, one_optimizer: bool = False
                   ) -> str:  # fmt: skip
    """What `hpo plan --cv 10% --difference D --verdict-only` prints of a copy of the preset with `confirm_seeds` (of
    AdamW alone: `one_optimizer`); no database is opened."""
    import yaml

    data = yaml.safe_load(PRESET.read_text())
    data["budget"]["confirm_seeds"] = confirm_seeds
    data["base_config"] = "demo_cpu"  # the shipped config by name, from the copy's folder
    if one_optimizer:
        data["space"]["optimizer.name"] = {"choice": ["adamw"]}
        data["space"] = {name: param for name, param in data["space"].items() if "lamb" not in name}
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["--db", f"sqlite:///{tmp_path / 'none.db'}", "plan", str(path), "--cv", "10%", "--difference",
                 difference, "--verdict-only", "--draws", str(draws)]) == 0  # fmt: skip
    return capsys.readouterr().out


def test_stated_chances_of_a_batch_size_study_are_the_t_tests_power_at_each_batch_size(tmp_path, capsys):
    """A stated spread (CV 10 %, AdamW 20 % faster at every batch size), 6 runs per arm: the verdict at each of the
    2 batch sizes is a Welch test at half the level (the error shared over them), so its chance of naming AdamW is
    the power of Welch's test on ln values at that level (`welch_power`, with scipy); the study is right where both
    are, and the draws at the two batch sizes are independent."""
    from hpo.evidence.verdict import ALPHA

    draws, k = 1000, 6
    out = stated_chances(tmp_path, capsys, "20%", draws, k)
    power = welch_power(k, ALPHA / 2)  # two-sided at ALPHA / 2 batch sizes (the whole level: 0.91; a third: 0.76)
    assert "the truth at every batch size: adamw needs 20.0% fewer samples than lamb" in out
    assert "the verdict at each of 2 batch sizes (the error shared over them" in out
    shares = {}
    for batch in (32, 128):
        rows = rows_at(out, f"  at batch {batch}:")
        assert rows["right: adamw named"] == rows["a right answer"] and rows["wrong: another arm named"] == 0
        assert rows["a right answer"] + rows["not yet"] == draws
        shares[batch] = rows["a right answer"] / draws
        assert abs(shares[batch] - power) < 0.035, (shares, power)
    assert abs(every_count(out) / draws - shares[32] * shares[128]) < 0.05
    assert not (tmp_path / "none.db").exists()


def test_a_pilot_batch_size_study_gives_the_truth_and_the_chances_at_each_batch_size(tmp_path, capsys):
    """--like a pilot batch-size study of the file's arms, LAMB faster at 32 and AdamW at 64 in its runs: the truth
    is said at each batch size between its optimizers, each batch size's verdict is judged against its own truth
    (LAMB named right at 32, AdamW at 64), and the pilot's database is only read."""
    import yaml

    from tests.hpo.evidence.test_batch_study import study, study_file

    arms = {("adamw", 32): (9000, [9000, 9100, 8950, 9050]), ("lamb", 32): (6100, [6000, 6050, 5950, 6020]),
            ("adamw", 64): (7000, [7000, 7100, 6900, 7050]),
            ("lamb", 64): (9500, [9500, 9400, 9600, 9450])}  # fmt: skip
    db_file = tmp_path / "pilot.db"
    storage, _ = study(db_file, 4, arms)
    storage.close()
    before = db_file.read_bytes()
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study_file(4) | {"name": "next"}))
    assert main(["--db", f"sqlite:///{db_file}", "plan", str(path), "--like", "study", "--verdict-only", "--draws",
                 "300"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "  the truth at batch 32: lamb needs 33." in out and "  the truth at batch 64: adamw needs 26." in out
    assert rows_at(out, "  at batch 32:")["right: lamb named"] > 250
    assert rows_at(out, "  at batch 64:")["right: adamw named"] > 250
    # with the forecast: the file is moved onto the shipped table, which reads 64 at its 128, but the chances are
    # of the file's own arms, as the pilot's
    assert main(["--db", f"sqlite:///{db_file}", "plan", str(path), "--like", "study", "--repetitions", "1", "--draws",
                 "300"]) == 0  # fmt: skip
    full = capsys.readouterr().out
    assert "global batch sizes read the table's, smallest to smallest: 32 -> 32, 64 -> 128" in full
    assert full.endswith(out)  # the same chances, after the forecast
    assert db_file.read_bytes() == before


def test_at_a_tie_the_verdicts_at_each_batch_size_name_a_wrong_winner_at_their_shared_error(tmp_path, capsys):
    """A stated tie at both batch sizes, 10 runs per arm: each verdict is a Welch test at half the level, so each
    names a winner (wrong at a tie) in about ALPHA / 2 of experiments, and the study is wrong somewhere in about
    1 - (1 - ALPHA / 2)² (independent batch sizes), at most ALPHA: the error is shared, not spent whole at each."""
    from hpo.evidence.verdict import ALPHA

    draws = 2000
    out = stated_chances(tmp_path, capsys, "0", draws, 10)
    for batch in (32, 128):
        assert abs(rows_at(out, f"  at batch {batch}:")["wrong: an arm named"] / draws - ALPHA / 2) < 0.01
    line = next(line for line in out.splitlines() if line.startswith("  a wrong answer at some batch size"))
    share = int(line[44:].split()[0]) / draws
    assert abs(share - (1 - (1 - ALPHA / 2) ** 2)) < 0.013 and share < ALPHA + 0.013


def test_a_batch_size_study_of_one_optimizer_gets_the_chances_of_its_one_verdict(tmp_path, capsys):
    """One optimizer at two batch sizes has no verdict at each batch size (nothing to compare there): the service
    asks the experiment's verdict between its arms, so the chances are of that verdict, the first arm (batch 32)
    20 % faster. 6 runs per arm at the whole level: the power of Welch's test on ln values (`welch_power`). (They
    were drawn at each batch size, 100 % "not yet", the truth "adamw needs 20.0% fewer samples than " nothing.)"""
    from hpo.evidence.verdict import ALPHA

    draws, k = 1000, 6
    out = stated_chances(tmp_path, capsys, "20%", draws, k, one_optimizer=True)
    first, second = (f"optimizer.name=adamw,batch.global_batch_size={batch}" for batch in (32, 128))
    assert f"the truth: {first} needs 20.0% fewer samples than {second}" in out
    assert "at batch" not in out
    power = welch_power(k, ALPHA)  # one verdict, at the whole level
    right = next(line for line in out.splitlines() if line.startswith(f"  right: {first} named"))
    assert abs(int(right.split()[-5]) / draws - power) < 0.03, (right, power)
    assert not (tmp_path / "none.db").exists()


def test_json_gives_a_batch_size_studys_chances_at_each_batch_size_as_numbers(tmp_path, capsys):
    """`hpo plan --like PILOT --power --json` of a batch-size study (the pilot's LAMB faster at 32, AdamW at 64):
    `chances` carries per batch size its truth and the verdict's outcomes there (count, share of the draws, the
    share's 95 % Wilson interval, from its formula), the study's right answer at every batch size and wrong one at
    some, the mean runs per arm and the advice; the same numbers as the same command prints without --json."""
    import json

    import yaml

    from tests.hpo.evidence.test_batch_study import study, study_file
    from tests.hpo.plan.test_plan import check_advice, check_share, printed_shares, same_as_printed

    arms = {("adamw", 32): (9000, [9000, 9400, 8650, 9050]), ("lamb", 32): (8100, [8000, 8450, 7700, 8020]),
            ("adamw", 64): (7000, [7000, 7100, 6900, 7050]),
            ("lamb", 64): (9500, [9500, 9400, 9600, 9450])}  # fmt: skip
    db_file = tmp_path / "pilot.db"
    storage, _ = study(db_file, 4, arms)
    storage.close()
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study_file(4) | {"name": "next"}))
    draws = 30
    args = ["--db", f"sqlite:///{db_file}", "plan", str(path), "--like", "study", "--repetitions", "1", "--draws",
            str(draws), "--power", "0.8"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert main([*args, "--json"]) == 0
    chances = json.loads(capsys.readouterr().out)["chances"]
    assert out.endswith("\n".join(chances["lines"]) + "\n")
    assert chances["by_batch"] is True and chances["truth"] is None and chances["arms"] == 4
    assert chances["confirmations"] == {"confirm_seeds": 4, "max_confirm_seeds": None, "rounds": [4]}
    assert chances["runs_per_arm"] == 4
    at = chances["at_batches"]
    assert {b: there["truth"] for b, there in at.items()} == {
        "32": {"better": "lamb", "within": False},
        "64": {"better": "adamw", "within": False},
    }
    lines = out.splitlines()
    for batch, there in at.items():
        outcomes = there["outcomes"]
        assert list(outcomes) == ["right_winner", "wrong_winner", "equivalent", "not_yet", "right"]
        assert sum(outcomes[k]["count"] for k in ("right_winner", "wrong_winner", "equivalent", "not_yet")) == draws
        assert outcomes["right"]["count"] == outcomes["right_winner"]["count"]
        start = lines.index(f"  at batch {batch}:") + 1
        printed = printed_shares(lines[start : start + len(outcomes)])
        for row in outcomes.values():
            check_share(row, draws)
            assert same_as_printed(row, printed[row["label"]]), (batch, row, printed)
    every = chances["outcomes"]  # the truth is no tie at either: "equivalent" there is wrong
    wrong_there = [sum(there["outcomes"][k]["count"] for k in ("wrong_winner", "equivalent")) for there in at.values()]
    assert list(every) == ["right", "wrong"]
    assert every["right"]["count"] <= min(there["outcomes"]["right"]["count"] for there in at.values())
    assert max(wrong_there) <= every["wrong"]["count"] <= sum(wrong_there)
    assert every["right"]["count"] + every["wrong"]["count"] <= draws
    printed = printed_shares(lines)
    for row in every.values():
        check_share(row, draws)
        assert same_as_printed(row, printed[row["label"]])
    check_advice(chances["advice"], out, draws, 4, 0.8)
    own = next(r for r in chances["advice"]["budgets"] if r["confirm_seeds"] == 4)  # the file's budget, reused
    assert own["right"] == every["right"]["count"] and own["wrong"] == every["wrong"]["count"]
