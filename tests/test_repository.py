"""What the repository tracks: nothing its own .gitignore says to leave out (a server's pid file, a run's output)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_no_tracked_file_is_one_the_gitignore_leaves_out():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files", "--cached", "--ignored", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    assert tracked == []


def test_the_set_up_refuses_a_python_older_than_the_package_allows_before_it_installs_anything(tmp_path):
    """`make setup` with a Python 3.10 (which pyproject's requires-python refuses) says what to do, before it makes a
    venv or runs pip: with `-W pyproject.toml` make runs the set-up's recipe as if the project had changed."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    old = tmp_path / "python3.10"
    old.write_text('#!/bin/sh\nif [ "$1" = "--version" ]; then echo "Python 3.10.12"; exit 0; fi\nexit 1\n')
    old.chmod(0o755)
    venv = tmp_path / "venv"
    done = subprocess.run(["make", "-W", "pyproject.toml", "setup", f"PYTHON={old}", f"VENV={venv}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2, done
    said = f"hpo needs Python 3.11 or later; {old} is Python 3.10.12: give another with PYTHON=python3.11"
    assert said in done.stderr
    assert not venv.exists()
    requires = next(line for line in (ROOT / "pyproject.toml").read_text().splitlines() if "requires-python" in line)
    assert requires == 'requires-python = ">=3.11"'  # the same bound as the Makefile's check
