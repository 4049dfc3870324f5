"""Hypothesis profiles for every property-based test (Hypothesis, and schemathesis, which runs on it).

- `ci` (the default): derandomized, so `make test` draws the same examples on every run and machine; a
  failure there is a real regression, never a new seed's find. `--hypothesis-seed` has no effect under it.
- `fuzz` (`make fuzz`, or `pytest -m hypothesis --hypothesis-profile=fuzz`): a new random seed per run and
  more examples, to explore; a failure prints the seed, and `make fuzz SEED=N` (or `--hypothesis-seed=N`
  with this profile) replays it.

Also one intra-op thread for torch (OMP_NUM_THREADS, unless set), in this process and the processes it starts
without their own setting (a trial's runner sets its own). The tests' models are tiny: a second thread gains
them nothing, and where the cores are shared (a trial or a server beside the tests, other work on a 2-core CI
machine) its barriers cost a lot: training the tiny BERT for 144 steps in-process took 32 s with torch's
default 2 threads and 2.7 s with one, on a busy 2-core machine.
"""

from __future__ import annotations

import os
from pathlib import Path

# Before anything imports torch: its thread pool reads this once per process.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

CI_PROFILE = "ci"
FUZZ_PROFILE = "fuzz"

# No example database in either: CI must not depend on files earlier runs left behind.
settings.register_profile(CI_PROFILE, derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile(FUZZ_PROFILE, derandomize=False, database=None, deadline=None, print_blob=True,
                          max_examples=1000)  # fmt: skip

# `--hypothesis-profile` (loaded by Hypothesis' pytest plugin, before or after this file) wins over the default.
if settings.get_current_profile_name() == "default":
    settings.load_profile(CI_PROFILE)


def examples(ci: int, fuzz: int) -> int:
    """How many examples a test draws under the current profile: `ci` in `make test`, `fuzz` in `make fuzz`."""
    return fuzz if settings.get_current_profile_name() == FUZZ_PROFILE else ci


# Tests never write into the checkout's runs/ (where `hpo run` puts an experiment's run directory by default): a
# run directory left there by one test is an earlier run's to the next, which `hpo run` then refuses.
_CHECKOUT_RUNS = Path(__file__).resolve().parents[1] / "runs"
_RUNS_BEFORE = pytest.StashKey[set]()


def _runs_entries() -> set[str]:
    return set(os.listdir(_CHECKOUT_RUNS)) if _CHECKOUT_RUNS.is_dir() else set()


def pytest_sessionstart(session) -> None:
    session.config.stash[_RUNS_BEFORE] = _runs_entries()


def pytest_sessionfinish(session, exitstatus) -> None:
    if hasattr(session.config, "workerinput"):
        return  # with xdist the controller looks, once every worker is done
    left = sorted(_runs_entries() - session.config.stash.get(_RUNS_BEFORE, set()))
    if left:
        print(f"\nerror: the tests left run directories in {_CHECKOUT_RUNS}: {', '.join(left)} (a test ran `hpo run` "
              "without --run-dir from the checkout)")  # fmt: skip
        if session.exitstatus == 0:  # an interrupted or failed session keeps its own status
            session.exitstatus = 1
