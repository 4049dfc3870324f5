"""The evidence: what the stored runs say. `verdict` is the comparison's rule (a pure function of each arm's runs:
a winner by a margin, equivalent, or not yet), `confirmations` is how many confirmation runs each arm gets and the
verdict over stored trials, and `batch_scaling` fits samples to target against batch size (E_min, B_crit). The
rules are pure and computed with scipy; they may import the vocabulary, storage records and the experiment's arms,
and are imported by every reader (study loop, CLI, report, API, benchmarks).
"""
