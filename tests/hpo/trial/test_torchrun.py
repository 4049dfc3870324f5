"""hpo.trial.torchrun: torchrun's ranks, ending with the code of the rank that failed first and a line naming it."""

from __future__ import annotations

import subprocess
import sys

import pytest

RANK_SCRIPT = """
import os, signal, sys
if os.environ["RANK"] == "1":
    {action}
sys.exit(0)
"""


@pytest.mark.parametrize(("action", "code", "line"), [
    ("sys.exit(7)", 7, "rank 1 failed first: exit code 7"),  # a full disk (hpo.trial.entry): torchrun's own is 1
    ("os.kill(os.getpid(), signal.SIGKILL)", 1, "rank 1 failed first: killed by SIGKILL"),
])  # fmt: skip
def test_the_first_failed_ranks_code_and_a_line_naming_it_end_the_run(tmp_path, action, code, line):
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT.format(action=action))
    ran = subprocess.run([sys.executable, "-m", "hpo.trial.torchrun", "--nnodes=1", "--nproc_per_node=2",
                          "--master_addr=127.0.0.1", "--master_port=0", str(script)],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert ran.returncode == code, ran.stderr
    assert ran.stderr.strip().splitlines()[-1] == line, ran.stderr


def test_ranks_that_all_succeed_end_with_0(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT.format(action="pass"))
    ran = subprocess.run([sys.executable, "-m", "hpo.trial.torchrun", "--nnodes=1", "--nproc_per_node=2",
                          "--master_addr=127.0.0.1", "--master_port=0", str(script)],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
