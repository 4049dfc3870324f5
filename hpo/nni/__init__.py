"""The NNI engine: an experiment run as NNI experiments (one per `compare` arm, and one per round of confirmation
runs), so NNI's web UI shows its trials. `config` builds NNI's experiment config from a spec and checks what NNI
can run, `engine` starts, watches and stops the NNI experiments, `jobs` turns NNI's trial jobs into our trial rows
(and a resumed arm's history), `confirm` queues the confirmation rounds, `launch` starts or views one NNI
experiment in a process of its own, `manager` talks to NNI's manager process and REST API, `trial` is the entry
NNI starts for each trial (it records itself like `hpo.trial.entry`), `tuners` and `smac_tuner` are NNI's tuners
in-process and SMAC3 inside NNI, and `patch` fixes NNI 3.0's manager. Only this package imports `nni`; it may
import everything below the engine.
"""
