"""For `bench.trial_latency`: a trial process that imports what the trial entry needs to claim its trial (the
storage), then prints when it got there (`time.time()`) and the CPU time it took (its own, from its start or
its fork), and exits."""

import time

from hpo.storage import SqlStorage  # noqa: F401 - the import is what is measured

print(f"{time.time()!r} {time.process_time()!r}", flush=True)
