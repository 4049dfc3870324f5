"""How a trial's objective reads: every digit of a count of samples or seconds, four significant digits otherwise."""

from __future__ import annotations

import pytest

from hpo.trials import objective_text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (98_304.0, "98,304"),  # was 9.83e+04: trials a few samples apart looked equal
        (5_533_259.0, "5,533,259"),  # was 5.53326e+06 in the report
        (8_737.34, "8,737"),  # a penalty: whole samples
        (1_000.0, "1,000"),
        (999.5, "999.5"),
        (0.11754, "0.1175"),  # an accuracy objective
        (-0.11754, "-0.1175"),  # a maximized one, as the tuner minimizes it
        (12.5, "12.5"),
        (float("inf"), "inf"),
        (1e300, "1e+300"),
    ],
)
def test_objectives_read_with_their_digits(value, text):
    assert objective_text(value) == text
