"""The report's verdict per global batch size (`hpo.report.scaling.batch_verdicts`) reads the arms' runs as the
verdict does, the resolution of runs read at an evaluation included: against a Welch interval computed here, and
against the experiment's own verdict on the same runs (`hpo status`)."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from hpo.evidence.confirmations import stored_verdict
from hpo.evidence.verdict import ALPHA
from hpo.experiment import spec_from_stored
from hpo.report.data import load_experiment
from hpo.report.scaling import batch_verdicts, experiment_runs, scaling_points
from tests.hpo.evidence.test_confirmations import EVERY, write


def test_runs_read_at_one_evaluation_keep_the_spread_of_one_interval_per_batch_size(tmp_path):
    """Every run of an arm hit at the same evaluation: not identical measurements, so each arm's spread of ln samples
    is at least that of one evaluation interval (every / √12 / the arm's mean), never a zero-width interval."""
    adamw, lamb = [5120, 5120, 5120], [4096, 4096, 4096]  # multiples of the evaluation interval: read there
    storage, eid = write(tmp_path / "hpo.db", 3, {"adamw": adamw, "lamb": lamb}, {"adamw": 5120, "lamb": 4096})
    with storage:
        spec = spec_from_stored(storage.get_experiment(eid))
        data = load_experiment(storage, spec.name, with_noise=False)
        verdicts = batch_verdicts(scaling_points([data], experiment_runs([data])))
        status = stored_verdict(storage, eid, spec)
    assert list(verdicts) == [32]  # both optimizers at the preset's batch size
    (c,) = verdicts[32].comparisons
    assert (c.a, c.b) == ("lamb", "adamw")
    variance = [(EVERY / math.sqrt(12) / mean) ** 2 / 3 for mean in (4096, 5120)]  # ln samples, by hand
    se = math.sqrt(sum(variance))
    df = sum(variance) ** 2 / sum(v * v / 2 for v in variance)
    half = stats.t.ppf(1 - ALPHA / 2, df) * se
    assert c.high - c.low > 0.1
    assert (c.ratio, c.low, c.high) == pytest.approx((0.8, 0.8 * math.exp(-half), 0.8 * math.exp(half)), rel=1e-9)
    (s,) = status.comparisons  # the experiment's verdict on the same runs: the same interval
    assert (s.low, s.high) == pytest.approx((c.low, c.high), rel=1e-12)
