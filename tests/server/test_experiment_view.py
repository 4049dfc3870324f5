"""The API's experiment view reads the verdict from the stored evidence (the confirmation runs and a few
aggregates), not from every trial: on an experiment stored by `hpo run`, its verdict is the one computed here from
every trial, and it never lists the trials."""

from __future__ import annotations

import pytest

from hpo.evidence.confirmations import round_line
from hpo.experiment import spec_from_stored
from server.routes.experiments import experiment_verdict
from server.schemas import VerdictPublic
from server.storage import SpecCache
from tests.hpo.cli.test_read_commands import NAME, stored, verdict_from_every_trial  # noqa: F401 (the fixture)


def test_the_experiment_views_verdict_is_the_one_over_every_trial_without_listing_them(stored, monkeypatch):  # noqa: F811
    _, storage = stored
    record = storage.get_experiment_by_name(NAME)
    spec = spec_from_stored(record)
    trials = storage.list_trials(record.id)
    expected = verdict_from_every_trial(storage, spec, trials)
    budget = spec.budget
    counts = storage.count_trials_by_state(record.id)

    def refuse(*args, **kwargs):
        pytest.fail("the experiment view listed the experiment's trials")

    monkeypatch.setattr(storage, "list_trials", refuse)
    public = experiment_verdict(record, storage, SpecCache(), counts)
    assert public == VerdictPublic.from_verdict(expected, budget.confirm_seeds, budget.confirmation_plan(),
                                                round_line(spec, trials))  # fmt: skip
    assert public.line == expected.line and public.outcome == expected.outcome.value


def test_a_batch_size_studys_view_gives_the_verdict_at_each_batch_size_as_hpo_status_prints_it(tmp_path, capsys):
    """A batch-size study (AdamW and LAMB at 32 and 64, AdamW's tuning trial at each a lucky seed): over HTTP the
    experiment view's verdict has the verdict at each batch size (LAMB at both), the same lines `hpo status`
    prints, and the report's verdict at each batch size."""
    from fastapi.testclient import TestClient

    from hpo.cli.main import main
    from hpo.evidence.verdict import ALPHA
    from hpo.report.data import load_experiment
    from hpo.report.scaling import batch_verdicts, experiment_runs, scaling_points
    from hpo.storage import SqlStorage
    from server.app import create_app
    from server.settings import Settings
    from tests.hpo.export.test_export import lucky_batch_db

    db = lucky_batch_db(tmp_path)
    with SqlStorage(db) as storage:
        data = load_experiment(storage, "lucky_batch", with_noise=False)
    report = batch_verdicts(scaling_points([data], experiment_runs([data])))
    assert main(["--db", db, "status", "lucky_batch"]) == 0
    status = capsys.readouterr().out.splitlines()
    with TestClient(create_app(Settings(database_url=db))) as client:
        answer = client.get("/api/v1/experiments/lucky_batch")
    assert answer.status_code == 200, answer.text
    verdict = answer.json()["verdict"]
    assert {int(b): (v["outcome"], v["winner"], v["line"]) for b, v in verdict["at_batches"].items()} == {
        b: (v.outcome.value, v.winner, v.line) for b, v in report.items()
    }
    assert {b: v.winner for b, v in report.items()} == {32: "lamb", 64: "lamb"}
    # the error shared over the 2 batch sizes: each difference's confidence is that of half the level
    assert [v["shared"] for v in verdict["at_batches"].values()] == [2, 2]
    assert {d["confidence"] for v in verdict["at_batches"].values() for d in v["differences"]} == {1 - ALPHA / 2}
    batch_lines = verdict["lines"][-3:]
    start = status.index(batch_lines[0])
    assert batch_lines[0].startswith("(a batch-size study") and batch_lines == status[start : start + 3]
