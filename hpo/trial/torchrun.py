"""torchrun for a trial's ranks, ending with the exit code of the rank that says why the trial failed.

    python -m hpo.trial.torchrun TORCHRUN_ARGS -m hpo.trial.entry ARGS

torchrun itself exits with 1 whatever a rank's code was, so a trial of several ranks would lose what the trial
entry says with its exit code and the study loop reads (`hpo.trial.entry`): 5, the database stayed unreachable
(re-queued), 7, its disk is full (re-queued, the experiment stopped), 4, the attempt was not this one's (a Dask
worker re-ran it). This runs torchrun in this process (`torch.distributed.run`, the same arguments, the same
ranks as its children) and, where a rank failed, prints torchrun's summary of the failures and exits with the
code of the rank that says why (the first to exit with a code of its own, else the first it saw fail), as a
single-process trial would have; a rank ended by a signal (a negative code) gives 1, torchrun's own.
"""

from __future__ import annotations

import sys


def telling_failure(error) -> tuple[int, object]:
    """(rank, failure) of a `ChildFailedError` that says why the trial failed: the first rank to exit with a code of
    its own (above 1: the trial entry's codes for a full disk, an unreachable database, ...), else the first failure.
    A rank that stops with such a code takes the others down (their collectives fail, exit code 1), and torchrun may
    see one of them fail first."""
    ranks = sorted(error.failures, key=lambda rank: error.failures[rank].timestamp)
    rank = next((r for r in ranks if error.failures[r].exitcode > 1), ranks[0])
    return rank, error.failures[rank]


def root_cause_code(error) -> int:
    """The exit code of a `ChildFailedError`'s telling failure (`telling_failure`): a rank's own code, else 1."""
    _, failure = telling_failure(error)
    return failure.exitcode if failure.exitcode > 0 else 1


def root_cause_line(error) -> str:
    """One line for the end of stderr, which the study loop quotes as the reason of a trial that recorded no result
    (torchrun's summary ends with a rule): 'rank 1 failed first: killed by SIGKILL' or 'rank 0 failed: exit code 7'
    (a rank's own code, after another rank's failure torchrun saw first)."""
    rank, failure = telling_failure(error)
    first = rank == error.get_first_failure()[0]
    how = f"killed by {failure.signal_name()}" if failure.exitcode < 0 else f"exit code {failure.exitcode}"
    return f"rank {rank} failed{' first' if first else ''}: {how}"


def main() -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    try:
        torchrun()
    except ChildFailedError as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)  # what torchrun's traceback would have ended with
        print(root_cause_line(e), file=sys.stderr)
        return root_cause_code(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
