"""How a process that imported torch ends: the interpreter's exit work without its finalization.

Python's finalization collects and tears down every object of every module; with what the trainer imports (torch,
`torch._dynamo`, which the optimizers import, and Triton's bindings, which torch imports where Triton is
installed) that costs one to two seconds at the end of every run and of every rank, and Triton's bindings print
pages of "nanobind: leaked ..." there. `leave` does what a normal exit needs and no more: join the threads that
are not daemons, run the exit handlers (logging's flush among them), flush the standard streams, and end the
process with `code`."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import NoReturn


def leave(code: int) -> NoReturn:
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):  # a closed or broken stream must not change the exit code
            stream.flush()
    os._exit(code)
