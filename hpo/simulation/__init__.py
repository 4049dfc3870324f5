"""A simulated cluster: trials that read their learning curves from a recorded table instead of training.

`table` reads a learning-curve table (hpo/simulation/tables/curves.jsonl with one sample budget, large_batch.jsonl
with one
per global batch size), `surrogate` gives any configuration's curve from it, `clock` is the simulated time. The
simulated runner (hpo/runners/simulated.py) puts them behind the `Runner` interface, so the study loop, the tuners,
the storage, the verdict, the report and the API run unchanged.
"""
