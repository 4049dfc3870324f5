"""The API's models built from stored records."""

from __future__ import annotations

import math

from hpo.storage.base import MetricRecord
from server.schemas import CurvePublic


def test_a_curve_has_a_point_per_step_and_sample_count_even_where_every_step_is_0():
    """A simulated trial stored by an earlier version kept every point at step 0: its samples still tell the points
    apart (they merged into one, which said the last accuracy was seen at the first sample count)."""
    records = [MetricRecord(1, 0, 256, "loss", 6.5, None), MetricRecord(1, 0, 512, "loss", 6.1, None),
               MetricRecord(1, 0, 512, "mlm_accuracy", 0.05, None), MetricRecord(1, 0, 1024, "loss", math.nan, None),
               MetricRecord(1, 3, None, "time_s", 1.5, None)]  # fmt: skip
    curve = CurvePublic.from_records("e", 0, records)
    assert [(p.step, p.samples, p.loss, p.mlm_accuracy) for p in curve.points] == [
        (0, 256, 6.5, None), (0, 512, 6.1, 0.05), (0, 1024, None, None), (3, None, None, None)]  # fmt: skip
    assert curve.points[-1].time_s == 1.5 and curve.points[2].values == {"loss": None}
