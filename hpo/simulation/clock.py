"""The simulated clock: the time of a simulated experiment, advanced by its runner from one trial's end to the next.

The storage stamps trials (created, started, finished) with it, so a simulated experiment's records carry
simulated times and read like a real experiment's (durations, timelines, the order a resume replays).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone


class SimulatedClock:
    """A clock that moves only when told to. `now()` is timezone-aware UTC, like the storage's own clock."""

    def __init__(self, start: datetime | None = None):
        self._now = start or datetime.now(timezone.utc)

    def now(self) -> datetime:
        return self._now

    def start_after(self, moment: datetime | None) -> None:
        """Never before `moment` (a resumed experiment's last recorded event)."""
        if moment is not None and moment > self._now:
            self._now = moment

    def advance_to(self, moment: datetime) -> None:
        if moment < self._now:
            raise ValueError(f"the simulated clock cannot go back ({moment} < {self._now})")
        self._now = moment

    def after(self, seconds: float) -> datetime:
        """The moment `seconds` from now."""
        return self._now + timedelta(seconds=seconds)
