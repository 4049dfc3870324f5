"""Waiting for something another process does, with a deadline (tests never assert a duration)."""

from __future__ import annotations

import time


def wait_for(predicate, timeout_s: float = 300.0, interval_s: float = 0.1):
    """The first truthy value `predicate()` returns; AssertionError if none within `timeout_s` (a safety net)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"not true within {timeout_s} s")
