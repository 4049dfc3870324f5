"""Start or view one NNI experiment through NNI's Python API, in a process of its own.

    python -m hpo.nni.launch start CONFIG.json NNI_ID PORT
    python -m hpo.nni.launch view NNI_ID PORT

The engine runs this with HOME set to the experiment's NNI directory: NNI binds its list of experiments
(`~/nni-experiments/.experiment`) to HOME when it is imported, so a process of its own is the one way to keep
every file NNI writes under the run directory. The NNI manager is started detached and outlives this process;
the last line printed is JSON: {"pid": <manager pid>, "port": <port>}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def start(config_path: Path, nni_id: str, port: int) -> int:
    from nni.experiment import Experiment, ExperimentConfig, RunMode

    config = ExperimentConfig(**json.loads(config_path.read_text()))
    experiment = Experiment(config, id=nni_id)
    experiment.start(port, run_mode=RunMode.Detach)
    return experiment._proc.pid  # NNI keeps the manager's process only here


def view(nni_id: str, port: int) -> int:
    from nni.experiment import Experiment

    experiment = Experiment(None, id=nni_id).view(port, non_blocking=True)
    return experiment._proc.pid


def main(argv: list[str]) -> int:
    action, *args = argv
    if action == "start":
        pid = start(Path(args[0]), args[1], int(args[2]))
    elif action == "view":
        pid = view(args[0], int(args[1]))
    else:
        print(f"unknown action {action!r}; use start or view", file=sys.stderr)
        return 2
    print(json.dumps({"pid": pid, "port": int(args[-1])}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
