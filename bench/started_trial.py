"""For `bench.trial_latency`: a trial process that imports what the trial entry needs to claim its trial (the
storage), or with the argument `trainer` also what it needs to train (the trainer and torch, and torch._dynamo,
which torch.optim imports as an optimizer is made), then prints when it got there (`time.time()`) and the CPU time
it took (its own, from its start or its fork), and exits."""

import sys
import time

from hpo.storage import SqlStorage  # noqa: F401 - the import is what is measured

if sys.argv[1:] == ["trainer"]:
    import torch._dynamo  # noqa: F401

    import trainer.train  # noqa: F401

print(f"{time.time()!r} {time.process_time()!r}", flush=True)
