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
