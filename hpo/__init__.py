"""The control plane of bert-hpo: experiments of the BERT trainer, tuned, run, stored and judged.

The tree is the table of contents. At the root only the shared vocabulary: `errors` (the one exception root),
`trials` (trial states, specs and results shared by every layer) and `objective` (what a trial scores and what a
tuner is told). Each package owns one concept: `experiment` (the file, its schema and arms), `controllers` (tuners
as ask/tell adapters), `runners` (where trial attempts run, and the GPU slots), `trial` (what runs inside a trial
process), `storage` (the database), `simulation` (the curve table and its surrogate), `engine` (the study loop and
what drives it), `evidence` (the verdict, confirmation rounds, batch scaling), `plan` (forecasts), `report` (the
HTML report), `export` (a best trial as a production config), `mlperf` (MLPerf results in), `nni` (the NNI engine)
and `cli` (the `hpo` command). docs/architecture.md draws the layers; tests/test_layers.py enforces them.
"""
