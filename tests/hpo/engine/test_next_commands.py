"""The commands `hpo run` suggests at its end: short where this environment's `python` and `hpo` are on the PATH."""

from __future__ import annotations

import sys

from hpo.engine.local import next_commands


def executables(folder, *names):
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_text("#!/bin/sh\n")
        (folder / name).chmod(0o755)
    return folder


def test_the_short_commands_where_the_environments_python_and_hpo_are_on_the_path(tmp_path, monkeypatch):
    """A virtual environment made with `python3.11 -m venv` runs hpo as bin/python3.11: still its own `python`."""
    env = executables(tmp_path / "venv" / "bin", "python", "python3.11", "hpo")
    monkeypatch.setattr(sys, "executable", str(env / "python3.11"))
    monkeypatch.setenv("PATH", f"{env}:/usr/bin:/bin")
    assert next_commands(None) == ("hpo", "python")
    assert next_commands("sqlite:////elsewhere/hpo.db") == ("hpo --db sqlite:////elsewhere/hpo.db", "python")


def test_the_interpreters_path_where_another_python_comes_first_on_the_path(tmp_path, monkeypatch):
    env = executables(tmp_path / "venv" / "bin", "python", "python3.11", "hpo")
    other = executables(tmp_path / "other" / "bin", "python")
    monkeypatch.setattr(sys, "executable", str(env / "python3.11"))
    monkeypatch.setenv("PATH", f"{other}:{env}:/usr/bin:/bin")
    monkeypatch.chdir(tmp_path / "other")
    assert next_commands(None) == (f"{env / 'python3.11'} -m hpo", str(env / "python3.11"))
