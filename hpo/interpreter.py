"""How hpo starts interpreters of its own (`python -m hpo ...`): with the import path the current one has.

`python -m` puts the current folder first on the import path, where a user's own `trainer.py` or `trainer/` folder
(common in an ML project's folder) would stand in for the trainer's package and every command that starts one
would fail with an ImportError. Where hpo is not imported from the current folder (a checkout run in place),
`PYTHONSAFEPATH` keeps it off the path (Python 3.11 and later), and a marker says it was set here, so that the
started interpreter drops it again before starting processes of its own (a trial's own `-m` is the user's).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

SAFE_PATH_SET = "HPO_SAFE_PATH_SET"  # PYTHONSAFEPATH was set by `module_env`, not by the user


def module_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` for a `python -m hpo ...` started from the current folder (see the module docstring)."""
    import hpo

    env = dict(env)
    root = os.path.dirname(os.path.dirname(os.path.abspath(hpo.__file__)))
    if "PYTHONSAFEPATH" not in env and os.path.realpath(root) != os.path.realpath(os.getcwd()):
        env.update({"PYTHONSAFEPATH": "1", SAFE_PATH_SET: "1"})
    return env


def drop_safe_path() -> None:
    """In an interpreter `module_env` started: PYTHONSAFEPATH was read at its start and is not passed on."""
    if os.environ.pop(SAFE_PATH_SET, None):
        os.environ.pop("PYTHONSAFEPATH", None)
