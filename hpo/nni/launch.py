"""Start or view one NNI experiment through NNI's Python API, in a process of its own.

    python -m hpo.nni.launch start CONFIG.json NNI_ID PORT
    python -m hpo.nni.launch view NNI_ID PORT

The engine runs this with HOME set to the experiment's NNI directory: NNI binds its list of experiments
(`~/nni-experiments/.experiment`) to HOME when it is imported, so a process of its own is the one way to keep
every file NNI writes under the run directory. The NNI manager is started detached and outlives this process;
the last line printed is JSON: {"pid": <manager pid>, "port": <port>}, or, when NNI could not start it,
{"error": <NNI's error>, "manager_exit": <the manager's exit code, or null while it still ran>} (exit code 1).
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any

started: list[Any] = []  # the NNI manager's process, once NNI's launcher has started it


def watch_manager_start() -> None:
    """Keep the manager's process NNI's launcher starts: when the manager exits before it answers, NNI raises a
    connection error and drops the process; its exit code tells the engine (and the user) what happened."""
    from nni.experiment import launcher

    start_rest_server = getattr(launcher, "_start_rest_server", None)
    if start_rest_server is None:  # another NNI than 3.0: only the exit code goes unreported
        return

    def keep(*args: Any, **kwargs: Any) -> Any:
        process = start_rest_server(*args, **kwargs)
        started.append(process)
        return process

    launcher._start_rest_server = keep


def start(config_path: Path, nni_id: str, port: int) -> int:
    from nni.experiment import Experiment, ExperimentConfig, RunMode

    config = ExperimentConfig(**json.loads(config_path.read_text()))
    experiment = Experiment(config, id=nni_id)
    watch_manager_start()
    experiment.start(port, run_mode=RunMode.Detach)
    return experiment._proc.pid  # NNI keeps the manager's process only here


def view(nni_id: str, port: int) -> int:
    from nni.experiment import Experiment

    watch_manager_start()
    experiment = Experiment(None, id=nni_id).view(port, non_blocking=True)
    return experiment._proc.pid


def manager_exit() -> int | None:
    """The exit code of the manager NNI started (negative: the signal that ended it), None while it runs."""
    return started[-1].poll() if started else None


def main(argv: list[str]) -> int:
    action, *args = argv
    try:
        if action == "start":
            pid = start(Path(args[0]), args[1], int(args[2]))
        elif action == "view":
            pid = view(args[0], int(args[1]))
        else:
            print(f"unknown action {action!r}; use start or view", file=sys.stderr)
            return 2
    except Exception as e:  # noqa: BLE001 - every failure of NNI's launcher is reported to the engine
        traceback.print_exc()
        print(json.dumps({"error": f"{type(e).__name__}: {e}", "manager_exit": manager_exit()}))
        return 1
    print(json.dumps({"pid": pid, "port": int(args[-1])}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
