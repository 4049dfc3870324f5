"""Our tuners (random, smac_bo, smac_hyperband, asha) on the simulated runner, through `hpo run`'s own study loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.cost_at_scale.common import experiment, trials_for
from hpo.evidence.confirmations import stored_verdict


def run_ours(tuner: str, slots: int, rep: int, args, directory: Path) -> list[Any]:
    """One repetition through `hpo run` (in this process); its stored trials and spec."""
    from bench.verdict_calibration import run_quietly
    from hpo.experiment import spec_from_stored
    from hpo.storage import SqlStorage

    name = f"{tuner}-{slots}-{rep}"
    data = experiment(
        name,
        args.run_table,
        tuner,
        rep,
        args.batch,
        args.lr,
        slots,
        trials_for(slots, args.trials_per_slot, args.min_trials),
        args.confirm,
        cap=args.cap,
    )
    url = f"sqlite:///{directory / f'{name}.db'}"
    run_quietly(name, data, directory, url)
    with SqlStorage(url) as storage:
        record = storage.get_experiment_by_name(name)
        trials, spec = storage.list_trials(record.id), spec_from_stored(record)
        verdict = stored_verdict(storage, record.id, spec)
    for suffix in ("", "-wal", "-shm"):
        (directory / f"{name}.db{suffix}").unlink(missing_ok=True)
    return [trials, spec, verdict]


# ------------------------------------------------------------------------------------------------ Optuna
