"""Runners: where trial attempts run (`local` slots of this machine, a `dask` cluster, or a `simulated` one)."""

from __future__ import annotations

from hpo.errors import HpoError
from hpo.runners.base import Runner, TrialExit, TrialLaunch, classify_exit
from hpo.trial.launch import build_launch

__all__ = ["Runner", "TrialExit", "TrialLaunch", "build_runner", "classify_exit"]


def build_runner(spec, name: str | None = None, scheduler: str | None = None, launch_builder=None) -> Runner:
    """The runner of an experiment (`runner:` in the file, or the CLI's --runner/--scheduler). It checks the
    resources now, so an experiment that cannot run fails before anything is written."""
    name = name or spec.runner.name
    builder = launch_builder or build_launch
    if name == "dask":
        from hpo.runners.dask import DaskRunner  # Dask distributed: about a second to import, only when used

        address = scheduler or spec.runner.scheduler
        if not address:
            raise HpoError("the dask runner needs a scheduler address: --scheduler tcp://HOST:8786 or runner.scheduler")
        return DaskRunner(address, spec.resources, spec.budget.max_parallel, builder, spec.runner.preload)
    if name == "simulated":
        from hpo.runners.simulated import SimulatedRunner  # reads the curve table: only when used

        return SimulatedRunner(spec, spec.budget.max_parallel)
    # Not at the top: the package must not import the launcher module, which runs as `python -m hpo.runners.preload`
    # (runpy would find it imported already and run a second copy as __main__).
    from hpo.runners.local import LocalRunner

    return LocalRunner(spec.resources, spec.budget.max_parallel, builder, spec.runner.preload)
