"""Export: a best trial as a production run. `production` renders an experiment's stored spec and a trial as a
complete trainer config (YAML or JSON) or the `torchrun` line that runs it. It is pure (records in, text out) and
imports only the vocabulary and the storage records, so the REST API can serve it without torch, SMAC or NNI.
"""
