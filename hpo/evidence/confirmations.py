"""Confirmation runs: how many each arm gets, in which rounds, and the verdict over the stored trials.

When an arm's tuning is over, its best configuration (as the storage names it then) is re-run with other
training seeds: these confirmation runs are the verdict's evidence (`hpo.evidence.verdict`). `budget.confirm_seeds: N`
is one round of N runs per arm. `budget.confirm_seeds: auto` runs rounds (`Budget.confirmation_rounds`: 3, 6, 9,
12 runs per arm with the default cap of 12): when every arm has finished a round, the verdict is asked at that
look; a winner or "equivalent" ends the confirmations, "not yet" queues the next round for every arm, up to the
cap, unless more runs would not decide (`Verdict.runs_needed` None: no arm reached the target, an arm's tuning
found nothing that does, every arm missed the target in some run, or a pick was lucky). Each look is tested at its
share of the error (alpha spending, see `hpo.evidence.verdict`) on each arm's runs of the rounds up to it, so
stopping early does not raise the wrong-answer rate. In a batch-size study the question is answered at each batch
size (`Evidence.deciding`): the rounds go on while the verdict at some batch size is "not yet" and more runs may
decide it, whatever the experiment's verdict across batch sizes says.

Everything here is computed from the stored trials, so a resumed controller, `hpo status`, the report and the
API all see the same round and the same verdict. The study loop and the NNI engine only queue what
`runs_to_queue` says. The rounds and the verdict read only the confirmation trials, each arm's best trial and
whether an arm's tuning reached the target (`stored_evidence`: queries that do not grow with the tuning trials):
the functions that take `trials` answer the same for the confirmation trials alone (the verdict with `reached`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from hpo.evidence.verdict import ArmRuns, Outcome, Verdict, arm_runs, batch_size_verdicts, decide, unselected
from hpo.experiment.arms import BATCH_STUDY_NOTE, arm_label, arms, batch_study, declared_batch_sizes, trial_config
from hpo.mlperf import imported
from hpo.storage.base import ExperimentRecord, Storage, TrialRecord, TrialTally
from hpo.trials import TrialKind, TrialState


def arm_keys(spec, best: Collection[str | None] | None = None) -> list[str | None]:
    """The arm label of every arm (None: an experiment without compare); with `best` (the arms with a best trial,
    `Evidence.best`), only those: an arm none of whose tuning trials completed has nothing to confirm, so the rounds
    do not wait for its runs (the verdict says it found nothing)."""
    keys = [arm_label(fixed) if fixed else None for fixed in arms(spec)]
    return keys if best is None else [key for key in keys if key in best]


def _per_arm(trials: Sequence[TrialRecord], finished: bool) -> Counter:
    """Per arm its confirmation runs and unselected tuning runs (`hpo.evidence.verdict.unselected`: evidence as
    well)."""
    return Counter(t.arm for t in trials if (t.kind is TrialKind.CONFIRMATION or unselected(t))
                   and (t.state.finished or not finished))  # fmt: skip


def completed_rounds(spec, trials: Sequence[TrialRecord], best: Collection[str | None] | None = None) -> int:
    """How many rounds every arm (with a best trial, where `best` is given: `arm_keys`) has finished (all their runs
    ended, whatever the outcome)."""
    done = _per_arm(trials, finished=True)
    keys = arm_keys(spec, best)
    return sum(1 for runs in spec.budget.confirmation_rounds if keys and all(done[key] >= runs for key in keys))


def look(spec, trials: Sequence[TrialRecord], best: Collection[str | None] | None = None) -> tuple[int, int]:
    """(look, looks) of the verdict over these trials: the last finished round (at least the first) of all."""
    looks = max(1, len(spec.budget.confirmation_rounds))
    return max(1, min(completed_rounds(spec, trials, best), looks)), looks


def at_look(spec, best: dict, trials: Sequence[TrialRecord], curves: dict,
            reached: Collection[str | None] | None = None) -> tuple[list[ArmRuns], int, int]:  # fmt: skip
    """Every arm's evidence at the current look, and (look, looks) (`trials` in number order; `curves`: trial id ->
    its (samples, mlm_accuracy) evaluations, see `stored_curves`; `reached`: the arms whose tuning reached the
    target, where `trials` are only the confirmation trials, see `arm_runs`). Look j is asked of each arm's first
    rounds[j - 1] runs: mid-round, or in a stopped experiment, an arm may have finished more, but the look's level
    is spent on its round's runs (`hpo plan` simulates the looks so); the round line counts them all."""
    at, looks = look(spec, trials, best)
    evidence = arm_runs(spec, best, trials, curves, reached)
    rounds = spec.budget.confirmation_rounds
    if rounds:
        evidence = [replace(a, samples_to_target=a.samples_to_target[: rounds[at - 1]]) for a in evidence]
    return evidence, at, looks


def verdict_of(spec, best: dict, trials: Sequence[TrialRecord], curves: dict,
               reached: Collection[str | None] | None = None) -> Verdict:  # fmt: skip
    """The verdict at the current look, of every arm's runs `at_look`."""
    evidence, at, looks = at_look(spec, best, trials, curves, reached)
    return decide(evidence, spec.verdict.margin, at, looks)


def batch_points(spec, best: dict, evidence: Sequence[ArmRuns]) -> list[tuple[int, str, str, ArmRuns]]:
    """(global batch size, optimizer, arm label, its runs) of every arm with a best trial and runs: where the verdict
    at each batch size (`batch_size_verdicts`) places an arm's evidence (`evidence`: `arm_runs` of `spec`'s arms, in
    their order)."""
    points = []
    for fixed, runs in zip(arms(spec), evidence, strict=True):
        top = best.get(arm_label(fixed))
        if top is not None and top.global_batch_size is not None and runs.samples_to_target:
            points.append((top.global_batch_size, trial_config(spec, top.params).optimizer.name, top.arm, runs))
    return points


@dataclass(frozen=True)
class Evidence:
    """What the rounds and the verdict of a stored compare experiment read (`stored_evidence`)."""

    best: dict[str, TrialRecord]  # each arm's best tuning trial (`Storage.best_per_arm`)
    confirmations: list[TrialRecord]  # every confirmation trial and each arm's unselected best, in number order
    reached: frozenset[str | None]  # the arms with a completed tuning trial that reached the target
    curves: dict[int, list[tuple[int, float]]]  # `stored_curves` of the confirmation trials and of `best`
    imported: bool = False  # an imported experiment (hpo.mlperf): its runs are all there, none is to come

    def verdict(self, spec) -> Verdict:
        verdict = verdict_of(spec, self.best, self.confirmations, self.curves, self.reached)
        empty = [a.label for a in verdict.arms if not a.runs and a.label not in self.best] if self.imported else []
        if empty and verdict.outcome is Outcome.NOT_YET:  # an import's arm without runs never gets any
            return replace(verdict, line=f"not yet: {no_runs_line(empty)}", runs_needed=None)
        return verdict

    def batch_verdicts(self, spec) -> tuple[list[tuple[int, str, str, ArmRuns]], dict[int, Verdict]]:
        """The verdict at each batch size where two or more optimizers ran, at the current look (`batch_points` of
        the arms' runs `at_look`, and `batch_size_verdicts` of them, the error shared over the batch sizes the
        study declares; an import's, over those compared): a batch-size study's question."""
        evidence, at, looks = at_look(spec, self.best, self.confirmations, self.curves, self.reached)
        points = batch_points(spec, self.best, evidence)
        # an import's arms are every combination of the values its runs logged: those without runs get none later
        declared = () if self.imported else declared_batch_sizes(spec)
        verdicts = batch_size_verdicts(((batch, optimizer, runs) for batch, optimizer, _, runs in points),
                                       spec.verdict.margin, at, looks, declared)  # fmt: skip
        return points, verdicts

    def deciding(self, spec) -> dict[int | None, Verdict]:
        """The verdicts whose answers end the confirmation rounds (`runs_to_queue`): in a batch-size study
        (`batch_study`), the verdict at each batch size where two or more optimizers ran, keyed by the batch size
        (the experiment's verdict compares arms across batch sizes too, where a smaller batch needs fewer samples by
        construction, so it may never answer while every batch size has); otherwise, or where no batch size has two
        optimizers, the experiment's verdict, keyed None."""
        if batch_study(spec.compare):
            _, verdicts = self.batch_verdicts(spec)
            if verdicts:
                return dict(verdicts)
        return {None: self.verdict(spec)}


def no_runs_line(labels: Sequence[str]) -> str:
    """Why an imported experiment's verdict cannot answer where arms hold no run: its arms are every combination of
    the values compared, and an import holds every run it will have."""
    names = labels[0] if len(labels) == 1 else f"{', '.join(labels[:-1])} and {labels[-1]}"
    return (f"{names} {'has' if len(labels) == 1 else 'have'} no runs (an import's arms are every combination of the "
            "values its runs logged for the keys compared): compare by fewer keys (--compare), or import those arms' "
            "runs under another --name")  # fmt: skip


def stored_evidence(storage: Storage, experiment_id: int, tallies: Sequence[TrialTally] | None = None) -> Evidence:
    """The evidence of a compare experiment in a few queries, however many tuning trials it has (`tallies`: its
    `Storage.tally_trials`, read here unless given)."""
    best = storage.best_per_arm(experiment_id)
    # an arm's best tuning trial that nothing picked on its outcome (an imported run) is evidence as well
    runs = [*storage.list_confirmations(experiment_id), *(t for t in best.values() if unselected(t))]
    runs.sort(key=lambda t: t.number)
    reached = reached_arms(storage.tally_trials(experiment_id) if tallies is None else tallies)
    record = storage.get_experiment(experiment_id)
    if imported(record) is not None:  # a trial an import was writing when it stopped is no run (written again)
        runs = [t for t in runs if t.state.finished]
    return Evidence(best, runs, reached, stored_curves(storage, runs, best.values()), imported(record) is not None)


def reached_arms(tallies: Sequence[TrialTally]) -> frozenset[str | None]:
    """The arms with a completed tuning trial that reached the target (`Storage.tally_trials`)."""
    return frozenset(t.arm for t in tallies
                     if t.kind is TrialKind.TUNING and t.state is TrialState.COMPLETED and t.reached)  # fmt: skip


def shown_batch_verdicts(spec, evidence: Evidence) -> dict[int, Verdict] | None:
    """A batch-size study's verdict at each batch size, as the outputs show it under the experiment's verdict; None
    for another experiment, or while runs are at one batch size only (an MLPerf import's of one: nothing is across;
    the report alike)."""
    if not batch_study(spec.compare):
        return None
    points, verdicts = evidence.batch_verdicts(spec)
    return verdicts if len({batch for batch, *_ in points}) >= 2 else None


def batch_verdict_lines(spec, verdicts: Mapping[int, Verdict] | None) -> list[str]:
    """`shown_batch_verdicts` as lines: the batch-size study's note, and the verdict at each batch size (the study's
    question, which the confirmation rounds follow under `confirm_seeds: auto`): `  at batch 128: lamb needs ...`;
    none where None."""
    if verdicts is None:
        return []
    if not verdicts:
        return [f"({BATCH_STUDY_NOTE}: no batch size has confirmation runs of two or more optimizers to compare)"]
    follow = ", which the confirmation rounds follow" if spec.budget.sequential else ""
    return [f"({BATCH_STUDY_NOTE}{follow}):",
            *(f"  at batch {batch:,}: {verdict.line}" for batch, verdict in verdicts.items())]  # fmt: skip


def stored_verdict(storage: Storage, experiment_id: int, spec) -> Verdict:
    """The verdict of a compare experiment from its stored trials and their curves."""
    return stored_evidence(storage, experiment_id).verdict(spec)


def stored_winner_at(storage: Storage, experiment_id: int, spec, global_batch_size: int | None) -> str | None:
    """The arm whose best trial at `global_batch_size` the verdict that compared runs at that batch size names the
    winner (what `hpo export --batch-size` exports; None: the experiment's verdict's winner); None where no verdict
    names one there. In a batch-size study (`batch_study`) that is the verdict at that batch size, as the report
    gives it (`batch_size_verdicts` of every arm's runs at its best configuration's batch size and optimizer): the
    experiment's verdict compares arms across batch sizes too. Otherwise it is the experiment's verdict, where the
    winner's confirmed configuration trained at that batch size."""
    evidence = stored_evidence(storage, experiment_id)
    if global_batch_size is None or not batch_study(spec.compare):
        winner = evidence.verdict(spec).winner
        top = evidence.best.get(winner) if winner is not None else None
        at = global_batch_size is None or (top is not None and top.global_batch_size == global_batch_size)
        return winner if at else None
    points, verdicts = evidence.batch_verdicts(spec)
    winner = verdicts[global_batch_size].winner if global_batch_size in verdicts else None
    named = [label for batch, optimizer, label, _ in points
             if winner is not None and batch == global_batch_size and optimizer == winner]  # fmt: skip
    return named[0] if len(named) == 1 else None  # several arms of the winner there: no one arm is named


def chosen_trial(storage: Storage, record: ExperimentRecord, spec, arm: str | None, global_batch_size: int | None
                 ) -> tuple[TrialRecord | None, str, str | None]:  # fmt: skip
    """The trial `hpo export` and the API's export give, why (`export_arm` over the stored verdicts), and the trials
    it is the best of where not all of the experiment's (`arm optimizer.name=lamb`, `global batch size 64`), which
    `render` names in its warning about a best that missed the target."""
    from hpo.export.production import export_arm

    def best_batch() -> int | None:  # the global batch size of the best trial of any arm
        best = storage.best_trial(record.id)
        return best.global_batch_size if best is not None else None

    def winner(batch: int | None) -> str | None:
        return stored_winner_at(storage, record.id, spec, batch)

    chosen_arm, chosen = export_arm(spec, arm, global_batch_size, winner, best_batch)
    among = [] if chosen_arm is None else [f"arm {chosen_arm}"]
    if global_batch_size is not None:
        among.append(f"global batch size {global_batch_size}")
    trial = storage.best_trial(record.id, arm=chosen_arm, global_batch_size=global_batch_size)
    return trial, chosen, " at ".join(among) or None


def stored_curves(storage: Storage, trials: Sequence[TrialRecord],
                  best: Iterable[TrialRecord] = ()) -> dict[int, list[tuple[int, float]]]:  # fmt: skip
    """The evaluations of the runs whose curves the verdict reads: the completed confirmation runs and unselected
    tuning runs among `trials`, and each arm's best tuning trial (`best`, as `Storage.best_per_arm` gives them: the
    run that picked its configuration, whose samples to target the verdict's test of a lucky pick reads between
    evaluations as it reads the runs; without its curve, the pick would count at the evaluation after)."""
    wanted = {t.id: t for t in trials if t.kind is TrialKind.CONFIRMATION or unselected(t)}
    wanted.update((t.id, t) for t in best if t is not None)
    return {
        t.id: [(m.samples, m.value) for m in storage.get_metrics(t.id, "mlm_accuracy") if m.samples is not None]
        for t in wanted.values()
        if t.state is TrialState.COMPLETED
    }


def runs_to_queue(spec, trials: Sequence[TrialRecord], verdicts: Iterable[Verdict] | None,
                  best: Collection[str | None] | None = None) -> int:  # fmt: skip
    """Confirmation runs every arm should have created by now: the first round once tuning is over; with auto, the
    next round when every arm (with a best trial: `best`, see `arm_keys`) finished the current one and one of
    `verdicts` (asked at that look: `Evidence.deciding`) is "not yet" where more runs may decide
    (`Verdict.runs_needed`)."""
    rounds = spec.budget.confirmation_rounds
    if not rounds:
        return 0
    created = _per_arm(trials, finished=False)
    done = completed_rounds(spec, trials, best)
    keys = arm_keys(spec, best)
    current = max((k + 1 for k, runs in enumerate(rounds) if keys and all(created[key] >= runs for key in keys)),
                  default=0)  # fmt: skip
    if current == 0:
        return rounds[0]
    if done < current or current >= len(rounds) or verdicts is None:
        return rounds[current - 1]
    undecided = [v for v in verdicts if v.outcome is Outcome.NOT_YET and v.runs_needed is not None]
    return rounds[current] if undecided else rounds[current - 1]  # runs_needed None: more runs would not decide


def rounds_note(verdicts: Mapping[int | None, Verdict]) -> str:
    """`round 2 of at most 4 done, verdict not yet`; in a batch-size study each batch size's (`Evidence.deciding`):
    `..., verdict at batch 128 winner, at batch 512 not yet`."""
    first = next(iter(verdicts.values()))
    parts = [
        v.outcome.value if batch is None else f"at batch {batch:,} {v.outcome.value}" for batch, v in verdicts.items()
    ]
    return f"round {first.look} of at most {first.looks} done, verdict " + ", ".join(parts)


def round_line(spec, trials: Sequence[TrialRecord], best: Collection[str | None] | None = None) -> str:
    """Where the confirmations stand: `round 2 of at most 4 (6 of up to 12 runs per arm)` (the rounds of the arms
    with a best trial, where `best` is given: `arm_keys`); `none yet` before any arm's first run."""
    rounds = spec.budget.confirmation_rounds
    if not rounds:
        return "no confirmation runs (budget.confirm_seeds: 0)"
    created = _per_arm(trials, finished=False)
    per_arm = ", ".join(f"{key or 'all'} {created[key]}" for key in arm_keys(spec))
    keys = arm_keys(spec, best)
    current = sum(1 for runs in rounds if keys and all(created[key] >= runs for key in keys))
    finished = completed_rounds(spec, trials, best)
    if not spec.budget.sequential:
        return f"confirmation runs per arm: {per_arm} of {rounds[0]}"
    if not any(created.values()):  # tuning goes on: no round has begun
        return (f"confirmations: none yet; each arm's first round ({rounds[0]} runs) starts when its tuning is over "
                f"(at most {len(rounds)} rounds, up to {rounds[-1]} runs per arm)")  # fmt: skip
    return (f"confirmations round {max(current, 1)} of at most {len(rounds)} ({finished} finished); runs per arm: "
            f"{per_arm} of up to {rounds[-1]}")  # fmt: skip
