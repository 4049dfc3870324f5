"""Cost to an answer at scale: simulated GPU-hours and wall-clock of an ADAM-vs-LAMB answer on 8, 64 and 1,024 slots.

On the simulated cluster (`runner: simulated` over the learning-curve table, hpo/simulation/tables/curves.jsonl; a
slot is
8 A100s, one table sample stands for 256 BERT-large samples: the runner's duration model, a conversion and not a
GPU measurement), one `adam_vs_lamb_simulated`-style experiment per repetition:

- the space is the table's dimensions (optimizer: the compared arms; log learning rate over `--lr`; warmup 0 or
  40), at global batch `--batch`;
- trials scale with the cluster: trials = max(`--min-trials`, `--trials-per-slot` x slots) = max(20, 2 x slots),
  split equally over the two arms (two waves of trials on a full cluster), then `--confirm` (2) confirmation
  runs of each arm's best configuration;
- repetition r: tuner seed r, training seed 1000 + r for the tuning trials (as bench/verdict_calibration.py),
  1001 + r, 1002 + r for the confirmations.

Tuners. Ours, through the real control plane (`hpo run` in-process: Study, tuners, SQLite storage in /dev/shm,
verdict): `random`, `smac_bo`, `smac_hyperband` and `asha` (its defaults: eta 3, rungs 1,024, 4,096 and 12,288
samples, new configurations from SMAC3's random forest); under the multi-fidelity tuners promoted configurations
continue from their checkpoint: only new samples are charged. Peers, on the same surrogate, the same duration
model, the same arms, budgets and training seeds, the same rule for the best configuration (lowest objective
among completed tuning trials, ties to the earliest) and the same confirmation runs and verdict rule
(`hpo.evidence.verdict`):

- `optuna_tpe_median`, `optuna_tpe_sh`: Optuna's TPE sampler (seeded with the tuner seed, defaults otherwise)
  with its MedianPruner (defaults) / SuccessiveHalvingPruner (reduction factor 3 from the first evaluation, as
  Syne Tune's ASHA: rungs at 1,024, 3,072 and 9,216 samples), one study per arm, asked round-robin as our Study
  asks its arms' controllers, driven through ask/tell by a discrete-event clock of N slots here. Each evaluation
  is reported as an intermediate value (the objective the trial would score if it stopped there: the
  experiment's miss penalty from its best accuracy so far) and the pruner is asked; a pruned trial stops at that
  evaluation and is charged only the samples it trained (its slot is free from that moment).
- `synetune_asha`, `synetune_bohb`, `synetune_tpe`, `synetune_cqr`: Syne Tune 0.16's own simulator backend
  (`UserBlackboxBackend` + `SimulatorCallback`, N workers) over a user blackbox backed by our surrogate; ASHA
  (stopping type, grace period one evaluation, reduction factor 3, rungs in evaluations), BOHB (the same ASHA
  with TPE's kernel densities proposing new configurations: Syne Tune 0.16's model-based multi-fidelity
  baseline; MOBSTER and Hyper-Tune are gone from 0.16), and two of its single-fidelity model-based baselines:
  TPE (its kernel-density BO) and CQR (conformal quantile regression, gradient-boosted
  trees; its import needs xgboost). One scheduler per arm behind a scheduler that asks them round-robin with the
  same quotas. Syne Tune 0.16 no longer has its Gaussian-process `BayesianOptimization` (the GP baseline is
  `BOTorch`, which needs botorch and gpytorch: not installed here); BORE imports xgboost too. The runs end at the
  table's events: `_advance_by_outside_time` is switched off (Syne Tune would add this process's real seconds to
  the simulated clock; here every tuner's decision time is left out of simulated time and shown apart, as CPU
  seconds), start/stop/report delays are 0, and the tuner looks for ended trials every simulated second.
  Install: `make bench-deps` (pip `--no-deps`: syne-tune 0.16 requires xgboost, whose wheel requires a 350 MB
  NCCL wheel used only for multi-GPU training; ASHA, TPE and the simulator import without xgboost, CQR needs it).

Per tuner, slots and repetition (simulated time starts when the first trial is created):

- first hit (`hpo.plan.forecast.first_hit`, as `hpo plan`): the first trial, in simulated finishing time, that reached
the
  target (samples_to_target recorded): wall-clock = its end - the start; GPU-hours = the busy slot-time of every
  trial up to that moment (trials still running then count up to it) x 8 GPUs;
- answer (the verdict): the end of the experiment (the last confirmation run): GPU-hours, wall-clock, and the
  fraction of slot-time left idle (`hpo.simulation.cost`: slots x wall-clock - busy, over slots x wall-clock);
- the verdict (which arm wins, or no winner) and the CPU seconds this process spent on the repetition (ours: the
  control plane with its SQLite storage and the simulated runner's records; peers: the tuner and this file's
  simulation).

Summaries over `--seeds` repetitions: the median and its 95 % distribution-free interval from order statistics
(the j-th and k-th smallest values with P(j <= B < k) >= 0.95, B ~ Binomial(n, 1/2); it needs n >= 6, below
that the range is shown). A repetition without any hit counts as infinitely late.

Controller CPU (`--cpu-trials`): our study loop alone on the simulated runner (one arm over the whole space,
`--cpu-slots` 64 slots, so that results come back while the history grows; no confirmations), for `random` and
`smac_bo` at 100, 1,000 and 10,000 trials: process CPU per trial of the loop without the simulated runner's own
work (on a real cluster the trials write their records), and the tuner's ask + tell CPU per decision over the last
tenth of the trials (at that history), and that cost over each tenth of the asks (the trend). A run is stopped
after `--cpu-limit-s` CPU seconds (at the loop's next turn; the trials it reached are reported), and larger sizes
are then skipped. 1,024 slots of 10-minute trials need about 1.7 decisions a second; the cost table's CPU column
shows what whole experiments took with 1,024 trials in flight.

The runs use a copy of the table without its training-loss and noise-scale series (`--full-records` keeps them):
the simulated runner writes every point of them as a record, which is most of its time and changes no duration,
objective or decision.

Run time (process CPU per repetition on the 2-core Xeon, measured on the test suite's synthetic table and a
partial real one): at 8 and 64 slots at most 3 and 10 s (smac_bo), most tuners well under a second; at 1,024 slots
(2,048 trials) random 13-18 s, Optuna about 9 s, Syne Tune 3-16 s, smac_hyperband about 520 s and smac_bo about
1,240 s (SMAC's ask with a thousand trials in flight and a growing history). 50 seeds of everything would take
about a day; `--seed-cap` gives SMAC fewer repetitions at 1,024 slots (the table's n column says how many), and
`--jobs` runs repetitions in parallel processes (the figures do not depend on it).

    python -m bench.cost_at_scale --jobs 2 --seed-cap smac_bo@1024=6 --seed-cap smac_hyperband@1024=10

`--rows FILE` appends each repetition's row to FILE as it ends and skips, on a later run with the same set-up,
the repetitions FILE already holds: a run stopped half-way goes on where it stopped, and more tuners or seeds can
be added to the same table later (the CPU column then mixes runs: say so where it is quoted).
    python -m bench.cost_at_scale --seeds 3 --slots 8 64 --table T   # a quick look (T: a smaller table)

The package, one module per part: `common` (the experiment file, a simulated trial, the outcome row), `ours`,
`optuna_peer` and `synetune_peer` (one module per peer, each driven on the same surrogate and clock),
`repetitions` (one repetition in a worker, the rows file), `controller_cpu` (ask/tell CPU per trial), `tables`
(what BENCHMARKS.md quotes) and `__main__` (the command line).
"""
