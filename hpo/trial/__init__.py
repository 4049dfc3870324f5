"""The trial side: what runs inside a trial process and how it is started and ended. `launch` builds a trial's
command line and environment (a pure function every runner shares), `entry` is that command (`python -m
hpo.trial.entry`: it claims the trial, trains and records itself straight into the database), `torchrun` starts a
trial's ranks (torchrun, ending with the exit code of the rank that says why it failed), and `exit` is how the process
tells its runner it is done before it is gone. It may import the vocabulary, storage, the experiment and
the trainer; nothing here imports the study loop, a controller or a runner.
"""
