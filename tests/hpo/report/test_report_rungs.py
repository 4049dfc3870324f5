"""The report's rungs of multi-fidelity experiments: the grouping of tuning trials into rungs and promotion chains
(hand-built trial records, the expected rungs written out by hand), and the page of a real smac_hyperband
experiment on the simulated runner, read back and checked against its stored trials."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

from hpo.cli.main import main
from hpo.report.data import ArmRungs, Rung, RungStep, promotion_rungs
from hpo.storage import SqlStorage
from hpo.storage.base import TrialRecord
from hpo.trials import TrialKind, TrialState
from tests.hpo.report.test_report import Page, table_with
from tests.hpo.simulation.conftest import MAX_SAMPLES
from tests.hpo.simulation.test_simulated_runner import experiment_file

T0 = datetime(2024, 1, 1, tzinfo=UTC)
FULL = 12_288  # budget.max_samples: rungs 1/9, 1/3 and 1 are 1,365, 4,096 and 12,288 samples
A, B = "optimizer.name=adamw", "optimizer.name=lamb"


def record(number: int, lr: float, budget: float, arm: str = A, outcome: str = "reached", kind=TrialKind.TUNING):
    """A stored trial: `reached` (at half its budget's samples), `missed`, `failed` or `running`."""
    samples = round(FULL * budget)
    state = {"reached": TrialState.COMPLETED, "missed": TrialState.COMPLETED, "failed": TrialState.FAILED,
             "running": TrialState.RUNNING}[outcome]  # fmt: skip
    hit = samples // 2 if outcome == "reached" else None
    objective = float(hit) if hit else 3.0 * samples if outcome == "missed" else None
    return TrialRecord(number + 1, 1, number, state, {"optimizer.name": arm.split("=")[1], "optimizer.lr": lr}, arm,
                       budget, (), 32, None, objective, hit, None, 0.2, 1.0, {"samples": samples}, "h", 1, T0, T0,
                       T0 if state.finished else None, kind=kind)  # fmt: skip


def test_trials_group_into_rungs_and_promotion_chains():
    records = [
        record(0, 1e-3, 1 / 9, outcome="reached"),  # A: three configurations at the first rung
        record(1, 2e-3, 1 / 9, outcome="missed"),
        record(2, 3e-3, 1 / 9, outcome="missed"),
        record(3, 1e-2, 1 / 9, arm=B, outcome="reached"),  # B: two
        record(4, 2e-2, 1 / 9, arm=B, outcome="missed"),
        record(5, 1e-3, 1 / 3, outcome="reached"),  # promotions: #0 -> #5 -> #8, #1 -> #6, B's #3 -> #7
        record(6, 2e-3, 1 / 3, outcome="missed"),
        record(7, 1e-2, 1 / 3, arm=B, outcome="failed"),
        record(8, 1e-3, 1.0, outcome="running"),
        record(9, 1e-3, 1 / 9, outcome="reached"),  # the first configuration sampled again: a new chain of its own
        record(10, 1e-3, 1.0, kind=TrialKind.CONFIRMATION),  # a confirmation is not a rung's trial
    ]
    rungs = promotion_rungs(records, FULL, "samples_to_target")
    assert list(rungs) == [A, B]
    assert rungs[A] == ArmRungs(
        A,
        (Rung(1 / 9, 1365, 4, 2), Rung(1 / 3, 4096, 2, 1), Rung(1.0, 12288, 1, 0)),
        (
            (RungStep(0, 1 / 9, 1365, "reached", 682.0), RungStep(5, 1 / 3, 4096, "reached", 2048.0),
             RungStep(8, 1.0, 12288, "unfinished", None)),
            (RungStep(1, 1 / 9, 1365, "missed", None), RungStep(6, 1 / 3, 4096, "missed", None)),
        ),
    )  # fmt: skip
    assert rungs[B] == ArmRungs(
        B,
        (Rung(1 / 9, 1365, 2, 1), Rung(1 / 3, 4096, 1, 0)),
        ((RungStep(3, 1 / 9, 1365, "reached", 682.0), RungStep(7, 1 / 3, 4096, "failed", None)),),
    )


def test_a_single_fidelity_experiment_has_no_rungs():
    records = [record(n, 1e-3 * (n + 1), 1.0) for n in range(4)]
    records.append(record(4, 1e-3, 1.0, kind=TrialKind.CONFIRMATION))
    assert promotion_rungs(records, FULL, "samples_to_target") == {}
    assert promotion_rungs([], FULL, "samples_to_target") == {}


def test_an_arm_without_promotions_has_rungs_but_no_chain():
    records = [record(0, 1e-3, 1 / 9), record(1, 1e-3, 1 / 3), record(2, 1e-2, 1 / 3, arm=B)]
    rungs = promotion_rungs(records, FULL, "samples_to_target")
    assert rungs[B] == ArmRungs(B, (Rung(1 / 3, 4096, 1, 0),), ())
    assert len(rungs[A].chains) == 1


# --------------------------------------------------------------------------- the page of a real experiment


def report_page(tmp_path, name: str, **kwargs) -> tuple[Page, str, list[TrialRecord]]:
    path = experiment_file(tmp_path, name, **kwargs)
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    assert main(["--db", url, "run", str(path), "--quiet", "--run-dir", str(tmp_path / "run")]) == 0
    assert main(["--db", url, "report", name, "-o", str(tmp_path / "report")]) == 0
    html = (tmp_path / "report" / f"{name}.html").read_text()
    with SqlStorage(url) as storage:
        trials = storage.list_trials(storage.get_experiment_by_name(name).id)
    return Page(html), html, trials


def test_the_report_of_a_hyperband_experiment_shows_its_rungs_and_promotions(tmp_path):
    page, html, trials = report_page(tmp_path, "sim-rungs", tuner="smac_hyperband", trials=40, slots=8,
                                     min_budget=1 / 8, max_budget=1.0, eta=2)  # fmt: skip
    assert "<h2>Rungs</h2>" in html
    tuning = [t for t in trials if t.kind is TrialKind.TUNING]
    promotions = reached = 0
    for arm in (A, B):
        mine = sorted((t for t in tuning if t.arm == arm), key=lambda t: t.number)
        per_budget = Counter(t.budget for t in mine)
        assert len(per_budget) > 1
        # promotions: a configuration's next trial at a larger budget (here every configuration climbs only)
        by_config: dict = {}
        for t in mine:
            by_config.setdefault(tuple(sorted(t.params.items())), []).append(t)
        for runs in by_config.values():
            assert [t.budget for t in runs] == sorted({t.budget for t in runs})
        promoted = Counter(t.budget for runs in by_config.values() for t in runs[:-1])
        for budget, count in per_budget.items():
            samples = round(MAX_SAMPLES * budget)
            assert page.cells[(arm, f"rung_{samples}_trials")] == str(count)
            assert page.cells[(arm, f"rung_{samples}_promoted")] == str(promoted[budget])
            assert page.cells[(arm, f"rung_{samples}_budget")] == f"{budget:.4g}"
        for runs in (r for r in by_config.values() if len(r) > 1):
            first, *rest = runs
            text = page.cells[(arm, f"chain_{first.number}")]
            assert text.startswith(f"trial #{first.number} ({round(MAX_SAMPLES * first.budget):,} samples, ")
            for t in rest:
                assert f"#{t.number} ({round(MAX_SAMPLES * t.budget):,}, " in text
            last = runs[-1]
            if last.samples_to_target is not None:
                assert text.endswith(f"#{last.number} ({round(MAX_SAMPLES * last.budget):,}, reached: "
                                     f"{last.objective:,.6g})")  # fmt: skip
                reached += 1
            else:
                said = "missed" if last.state is TrialState.COMPLETED else last.state.value  # a miss, never its penalty
                assert text.endswith(f"#{last.number} ({round(MAX_SAMPLES * last.budget):,}, {said})")
            promotions += 1
    assert promotions >= 6 and reached >= 2  # chains to the third rung reach the target there
    rungs_table = table_with(page, "rung (samples)")
    assert rungs_table[1][0] == f"{MAX_SAMPLES // 8:,}"


def test_a_single_fidelity_report_has_no_rungs(tmp_path):
    page, html, trials = report_page(tmp_path, "sim-flat", tuner="random", trials=6, slots=4)
    assert len({t.budget for t in trials}) == 1
    assert "Rungs" not in html and not any(field.startswith("rung_") for _, field in page.cells)
