"""Every output that lists a compare experiment's arms lists them in the order its file declares them
(`hpo.experiment.arms.arms`), not alphabetically nor in the order their trials were made: `hpo status`, `hpo best
--per-arm`, the summary and live status of `hpo run`, the verdict's lines and the report. The experiment declares
three clipping strategies in an order that is neither alphabetical nor that of its first trials, and is written
straight through the storage API (no trainer runs). The API's routes are checked on the same experiment in
tests/server/test_arm_order.py."""

from __future__ import annotations

import contextlib
import io
from html.parser import HTMLParser
from pathlib import Path

import yaml

from hpo.cli.main import main
from hpo.engine.local import print_summary
from hpo.engine.progress import ProgressView
from hpo.evidence.confirmations import stored_verdict
from hpo.evidence.verdict import verdict_lines
from hpo.experiment import experiment_from_dict, spec_from_stored, stored_form
from hpo.report.html import experiment_report
from hpo.storage import SqlStorage
from hpo.trials import TrialKind, TrialResult, TrialSpec, TrialState

NAME = "order"
DECLARED = ["none", "bucketwise", "after_allreduce"]  # the file's order
LABELS = [f"clipping.strategy={strategy}" for strategy in DECLARED]
MADE = ["bucketwise", "none", "after_allreduce"]  # the order the trials are made in: neither the file's nor sorted
assert sorted(LABELS) != LABELS and MADE not in (DECLARED, sorted(DECLARED))


def store_experiment(directory: Path) -> str:
    """The URL of a database holding the experiment, finished: per arm a tuning trial and 2 confirmation runs that
    reached the target (each strategy at its own samples, so the verdict compares them)."""
    data = {
        "name": NAME, "base_config": {}, "description": "arms declared out of alphabetical order",
        "overrides": {"batch.global_batch_size": 16, "batch.micro_batch_size": 8, "eval.target_mlm_accuracy": 0.5,
                      "budget.max_samples": 512, "eval.every_samples": 64, "device": "cpu"},
        "space": {"optimizer.lr": {"float": [1e-4, 1e-2], "log": True}, "clipping.strategy": {"choice": DECLARED}},
        "compare": ["clipping.strategy"], "tuner": {"name": "random", "seed": 0},
        "budget": {"trials": 3, "max_parallel": 1, "confirm_seeds": 2},
        "objective": {"metric": "samples_to_target"},
        "resources": {"gpus": "none", "cpu_slots": 1, "cpu_ranks_per_trial": 2},
    }  # fmt: skip
    spec = experiment_from_dict(data, f"{NAME}.yaml", base_dir=directory)
    url = f"sqlite:///{directory / 'hpo.db'}"
    with SqlStorage(url, upgrade=True) as storage:
        eid = storage.create_experiment(NAME, stored_form(spec, directory / "run"), spec.direction)
        for strategy in MADE:
            params = {"optimizer.lr": 1e-3, "clipping.strategy": strategy}
            offset = 10 * DECLARED.index(strategy)
            for kind, seed, samples in ((TrialKind.TUNING, None, 256), (TrialKind.CONFIRMATION, 1, 200 + offset),
                                        (TrialKind.CONFIRMATION, 2, 230 + offset)):  # fmt: skip
                trial = TrialSpec(None, params, arm=f"clipping.strategy={strategy}", global_batch_size=16, kind=kind,
                                  seed=seed)  # fmt: skip
                trial_id = storage.create_trial(eid, trial)
                storage.mark_trial_running(trial_id, pid=1, host="h")
                storage.finish_trial(trial_id, TrialResult(TrialState.COMPLETED, objective=float(samples),
                                                           samples_to_target=samples, best_mlm_accuracy=0.55,
                                                           metrics={"samples": samples}))  # fmt: skip
        storage.set_experiment_status(eid, "finished")
    return url


def named(text: str) -> list[str]:
    """The arm labels in `text`, in the order of their first mention."""
    return sorted((label for label in LABELS if label in text), key=text.index)


def in_lines(lines: list[str]) -> list[str]:
    """The arm of each line that names exactly one arm, in line order."""
    return [found[0] for line in lines if len(found := named(line)) == 1]


class TaggedArms(HTMLParser):
    """Each tagged field of a page (data-field) -> the arms (data-arm) of its elements, in page order."""

    def __init__(self, html: str):
        super().__init__()
        self.fields: dict[str, list[str]] = {}
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("data-arm") and "data-field" in attrs:
            self.fields.setdefault(attrs["data-field"], []).append(attrs["data-arm"])


def html_arms(html: str) -> dict[str, list[str]]:
    return TaggedArms(html).fields


def run(url: str, *args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["--db", url, *args]) == 0
    return out.getvalue()


def test_every_command_lists_the_arms_in_the_order_the_file_declares_them(tmp_path, capsys):
    url = store_experiment(tmp_path)
    (round_line,) = [line for line in run(url, "status", NAME).splitlines() if line.startswith("confirmation runs")]
    assert named(round_line) == LABELS, round_line

    best = yaml.safe_load(run(url, "best", NAME, "--per-arm"))
    verdict = best.pop("verdict")
    assert list(best) == LABELS and list(verdict["runs_per_arm"]) == LABELS

    with SqlStorage(url) as storage:
        record = storage.get_experiment_by_name(NAME)
        spec = spec_from_stored(record)
        lines = verdict_lines(stored_verdict(storage, record.id, spec), spec.budget.confirmation_plan())
        assert in_lines(lines) == LABELS, lines

        print_summary(storage, record.id, spec, database_url=url)  # what `hpo run` prints when it ends
        summary = capsys.readouterr().out.splitlines()
        assert in_lines([line for line in summary if line.startswith("best for ")]) == LABELS, summary
        verdict_arms = [line for line in summary if line.startswith("  clipping.strategy=")]  # its verdict_lines
        assert in_lines(verdict_arms) == LABELS, summary

        stream = io.StringIO()  # the live status of `hpo run`, its best trial per arm
        ProgressView(storage, record.id, total=9, stream=stream, spec=spec).start().stop()
        status = stream.getvalue().splitlines()[-1]
        assert named(status.split(" | best: ")[1]) == LABELS, status

        html = experiment_report(storage, NAME)
    fields = html_arms(html)
    assert {"runs", "best_trial"} <= set(fields)  # the verdict's table and the best trial per arm
    assert all(arms == LABELS for arms in fields.values()), fields
    assert run(url, "report", NAME, "-o", str(tmp_path / "reports")).startswith("wrote ")
    assert html_arms((tmp_path / "reports" / f"{NAME}.html").read_text()) == fields
