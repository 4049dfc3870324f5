"""hpo.trial.torchrun: torchrun's ranks, ending with the code of the rank that says why and a line naming it."""

from __future__ import annotations

import subprocess
import sys

import pytest

RANK_SCRIPT = """
import os, pathlib, signal, sys
if os.environ["RANK"] == "1":
    {action}
pathlib.Path(__file__).with_name("rank" + os.environ["RANK"]).write_text(os.environ["WORLD_SIZE"])
sys.exit(0)
"""


@pytest.mark.parametrize(("action", "code", "line"), [
    # a full disk (hpo.trial.entry): torchrun's own is 1. Slow: by default the SIGKILL case below runs torchrun end
    # to end, and test_a_rank_that_exits_with_a_code_of_its_own_says_why_even_after_another_ranks_failure maps codes
    pytest.param("sys.exit(7)", 7, "rank 1 failed first: exit code 7", marks=pytest.mark.slow),
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
    assert [(tmp_path / f"rank{r}").read_text() for r in (0, 1)] == ["2", "2"]  # both ranks ran to their end
    assert "failed" not in ran.stderr, ran.stderr


@pytest.mark.parametrize(("codes", "code", "line"), [
    ({1: 1, 0: 7}, 7, "rank 0 failed: exit code 7"),  # rank 1 lost its peer first; rank 0's full disk says why
    ({1: -9, 0: 5}, 5, "rank 0 failed: exit code 5"),  # its database stayed away; rank 1 was killed after it
    ({1: 1, 0: 1}, 1, "rank 1 failed first: exit code 1"),  # no code of its own: the first failure
    ({1: -9, 0: 1}, 1, "rank 1 failed first: killed by SIGKILL"),
])  # fmt: skip
def test_a_rank_that_exits_with_a_code_of_its_own_says_why_even_after_another_ranks_failure(tmp_path, codes, code,
                                                                                             line):  # fmt: skip
    """A rank that stops with the trial entry's code (7: a full disk) takes the others down through their collectives
    (exit code 1), and torchrun may see one of those first: under load the trial was failed ('exit code 1 without a
    result') instead of queued again. Failures in the order torchrun recorded them (their timestamps)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from hpo.trial.torchrun import root_cause_code, root_cause_line

    failures = {}
    for order, (rank, exitcode) in enumerate(codes.items()):
        failures[rank] = ProcessFailure(rank, 1000 + rank, exitcode, str(tmp_path / f"no_error_file_{rank}"))
        failures[rank].timestamp = 100 + order
    error = ChildFailedError("trial", failures)
    assert (root_cause_code(error), root_cause_line(error)) == (code, line)
