"""Upper bounds of the counts an experiment file, the command line and the API take: far past any real experiment,
so that a typo (a count of 10**9) is refused, naming the field or option, instead of filling the machine's memory with
a billion slots or running a plan for days. No imports: the command line reads them before it parses."""

MAX_COUNT = 2**31 - 1  # a count or id in general: what a database's INTEGER column and the API's queries take
MAX_TRIALS = 1_000_000  # budget.trials
MAX_SLOTS = 1_000_000  # trials at a time (budget.max_parallel; a simulated cluster's slots: hpo plan --slots, the API)
MAX_CONFIRM_SEEDS = 10_000  # confirmation runs per arm
MAX_PROCESSES = 1024  # trials or ranks side by side on one machine or GPU, ranks of one trial, GPUs of one slot
MAX_REPETITIONS = 10_000  # hpo plan --repetitions (the API takes fewer: a server's time is shared)
MAX_DRAWS = 1_000_000  # hpo plan --draws (about 90 bytes and 1 ms a draw)
