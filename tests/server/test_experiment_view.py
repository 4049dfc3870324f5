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
