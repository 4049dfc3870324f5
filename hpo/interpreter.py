"""How hpo starts interpreters of its own (`python -m hpo ...`, the trials' launcher, the trials): with the import
path the current one has.

`python -m` puts the current folder first on the import path, where a user's own `trainer.py` or `trainer/` folder
(common in an ML project's folder) would stand in for the trainer's package and every process hpo starts there
would fail with an ImportError: the restarted command, the API's plans, the launcher that forks trials and every
trial. Where hpo is not imported from the current folder (a checkout run in place), `PYTHONSAFEPATH` keeps it off
the path (hence Python 3.11 or later: `requires-python`). Every module these processes run is hpo's own
(`hpo.trial.entry`, the trainer it wraps, `hpo.runners.preload`), so it is passed on to the processes they start
in turn.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def module_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` for a `python -m hpo...` started from the current folder (see the module docstring)."""
    import hpo

    env = dict(env)
    root = os.path.dirname(os.path.dirname(os.path.abspath(hpo.__file__)))
    if "PYTHONSAFEPATH" not in env and os.path.realpath(root) != os.path.realpath(os.getcwd()):
        env["PYTHONSAFEPATH"] = "1"
    return env
