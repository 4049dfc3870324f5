"""Runners: where trial attempts run (`local` slots of this machine, a `dask` cluster, or a `simulated` one)."""

from __future__ import annotations

from hpo.errors import HpoError, ResourceError
from hpo.runners.base import Runner, TrialExit, TrialLaunch, classify_exit
from hpo.trial.launch import build_launch

__all__ = ["Runner", "TrialExit", "TrialLaunch", "build_runner", "check_runner_options", "classify_exit"]


def build_runner(spec, name: str | None = None, scheduler: str | None = None, launch_builder=None) -> Runner:
    """The runner of an experiment (`runner:` in the file, or the CLI's --runner/--scheduler). It checks the
    resources now, so an experiment that cannot run fails before anything is written."""
    check_runner_options(spec, name, scheduler)
    name = name or spec.runner.name
    builder = launch_builder or build_launch
    if name == "dask":
        from hpo.runners.dask import DaskRunner, check_address  # Dask distributed: about a second to import

        address = scheduler or spec.runner.scheduler
        if not address:
            raise HpoError("the dask runner needs a scheduler address: --scheduler tcp://HOST:8786 or runner.scheduler")
        check_address(address, "--scheduler" if scheduler else f"{spec.source}: runner.scheduler")
        return DaskRunner(address, spec.resources, spec.budget.max_parallel, builder, spec.runner.preload)
    if name == "simulated":
        from hpo.runners.simulated import SimulatedRunner  # reads the curve table: only when used

        return SimulatedRunner(spec, spec.budget.max_parallel)
    # Not at the top: the package must not import the launcher module, which runs as `python -m hpo.runners.preload`
    # (runpy would find it imported already and run a second copy as __main__).
    from hpo.runners.local import LocalRunner

    try:
        return LocalRunner(spec.resources, spec.budget.max_parallel, builder, spec.runner.preload)
    except ResourceError as e:  # GPUs asked for that this machine does not have: the experiment file is named
        raise ResourceError(f"{spec.source}: {e}") from None


def check_runner_options(spec, name: str | None, scheduler: str | None) -> None:
    """The CLI's --runner/--scheduler against the experiment, before anything starts: --scheduler only where the
    trials run on the dask runner (--runner dask, or the file's runner), and an address of the form the file's
    `runner.scheduler` must have (the experiment schema's own check, not a copy of it). A simulated experiment
    takes neither: its trials read a curve table and train nothing, on any runner but its own."""
    if name is not None and spec.runner.name == "simulated":
        raise HpoError(
            f"--runner {name}: {spec.source} runs on runner: simulated (its trials read the curve table of "
            "runner.simulation and train nothing), which no other runner can run; leave --runner out, or train for "
            "real with an experiment file without runner.simulation"
        )
    if name == "dask":
        from hpo.experiment.checks import ignored_on_dask

        if ignored := ignored_on_dask(spec.resources):
            raise HpoError(f"--runner dask: {spec.source}: {ignored}")
    if scheduler is None:
        return
    runner = name or spec.runner.name
    if runner != "dask":
        raise HpoError(
            f"--scheduler needs --runner dask: the trials would run on the {runner} runner "
            f"({f'--runner {name}' if name else f'the runner of {spec.source}'}), which uses no scheduler; "
            "add --runner dask, or leave --scheduler out"
        )
    from pydantic import ValidationError

    from hpo.experiment.schema import Runner as RunnerSection

    try:
        RunnerSection.model_validate({"name": "dask", "scheduler": scheduler})
    except ValidationError as exc:
        error = exc.errors()[0]
        reason = error.get("ctx", {}).get("error") or error["msg"]
        raise HpoError(f"--scheduler: {reason}") from None
