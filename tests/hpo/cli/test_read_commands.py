"""The read commands on an experiment stored by `hpo run` (the simulated preset, small): `hpo status`, `hpo best
--per-arm` and the report's data print the numbers computed here from every trial (`list_trials`, `get_metrics`), as
they did when the commands listed every trial themselves; and no read command writes to the database."""

from __future__ import annotations

import contextlib
import hashlib
import io
import math
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from sqlalchemy import create_engine, text

from hpo.cli.main import main
from hpo.evidence.confirmations import round_line, verdict_of
from hpo.experiment import spec_from_stored
from hpo.report.data import load_experiment
from hpo.storage import SqlStorage, upgrade_database
from hpo.trials import TrialKind, TrialState
from tests.hpo.plan.test_plan import small_preset, write
from tests.hpo.storage.conftest import POSTGRES_SKIP_REASON, POSTGRES_URL_ENV, postgres_schema_url

ROOT = Path(__file__).resolve().parents[3]
NAME = "stored"
# PostgreSQL's read commands are slow (`make test-all`), as tests/server/conftest.py makes the server folder's: by
# default PostgreSQL is covered by tests/hpo/storage/test_contract.py's [postgresql] params and
# tests/server/test_api.py's [postgresql] API over a real experiment
BACKENDS = ["sqlite", pytest.param("postgresql", marks=[pytest.mark.postgres, pytest.mark.slow])]


@pytest.fixture(scope="module", params=BACKENDS)
def stored(request, tmp_path_factory):
    """(database URL, storage) of the simulated preset run by `hpo run`: 60 random-search trials on 16 slots and
    its confirmation rounds, on each backend."""
    directory = tmp_path_factory.mktemp("stored")
    if request.param == "sqlite":
        urls = iter([f"sqlite:///{directory / 'hpo.db'}"])
    else:
        if not os.environ.get(POSTGRES_URL_ENV):
            pytest.skip(POSTGRES_SKIP_REASON)
        urls = postgres_schema_url(os.environ[POSTGRES_URL_ENV])
    url = next(urls)
    if request.param != "sqlite":
        upgrade_database(url)  # `hpo db upgrade`: a database server's schema is created by hand
    path = write(directory / "stored.yaml", small_preset(name=NAME, budget={"trials": 60, "max_parallel": 16,
                                                                          "confirm_seeds": "auto"}))  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["--db", url, "run", str(path), "--run-dir", str(directory / "run")]) == 0
    storage = SqlStorage(url)
    yield url, storage
    storage.close()
    for _ in urls:  # drops the PostgreSQL schema
        pass


def run(url: str, *args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["--db", url, *args]) == 0
    return out.getvalue()


def best_by_arm(trials) -> dict:
    """Each arm's best trial as the storage contract defines it: the completed tuning trial with the lowest
    objective (minimize), ties to the lowest number."""
    best = {}
    rivals = [t for t in trials if t.kind is TrialKind.TUNING and t.state is TrialState.COMPLETED and t.objective]
    for t in sorted(rivals, key=lambda t: t.number):
        if t.arm not in best or t.objective < best[t.arm].objective:
            best[t.arm] = t
    return best


def verdict_from_every_trial(storage: SqlStorage, spec, trials):
    """The verdict over every trial, as the commands computed it before they read aggregates."""
    curves = {t.id: [(m.samples, m.value) for m in storage.get_metrics(t.id, "mlm_accuracy") if m.samples is not None]
              for t in trials if t.kind is TrialKind.CONFIRMATION and t.state is TrialState.COMPLETED}  # fmt: skip
    return verdict_of(spec, best_by_arm(trials), trials, curves)


def test_status_prints_the_counts_rounds_verdict_and_cost_of_every_trial(stored):
    url, storage = stored
    record = storage.get_experiment_by_name(NAME)
    spec = spec_from_stored(record)
    trials = storage.list_trials(record.id)
    states = Counter(t.state for t in trials)
    tuning = [t for t in trials if t.kind is TrialKind.TUNING]
    confirmations = [t for t in trials if t.kind is TrialKind.CONFIRMATION]
    assert len(tuning) == 60 and len(confirmations) >= 6 and all(t.state.finished for t in trials)
    verdict = verdict_from_every_trial(storage, spec, trials)
    busy_s = sum((t.finished_at - t.started_at).total_seconds() for t in trials)
    wall_s = (max(t.finished_at for t in trials) - min(t.created_at for t in trials)).total_seconds()
    expected = [
        f"{NAME}: finished",
        "trials: " + ", ".join(f"{n} {s.value}" for s in TrialState if (n := states[s])),
        f"60/60 tuning trials done, {len(confirmations)}/{len(confirmations)} confirmation runs",
        round_line(spec, trials),
        f"verdict now (look {verdict.look} of 4): {verdict.line}",
        f"simulated on 16 slot(s) of A100 GPUs: {busy_s * 8 / 3600:,.1f} GPU-hours, {wall_s / 3600:,.2f} h "
        f"wall-clock, {1 - busy_s / (16 * wall_s):.1%} of slot-time idle",
    ]
    assert run(url, "status", NAME).splitlines() == expected
    assert run(url, "status").splitlines() == [f"{NAME:<32} {'finished':<11} {expected[2]}"]


def test_best_per_arm_prints_the_best_trials_and_the_verdict_of_every_trial(stored):
    url, storage = stored
    record = storage.get_experiment_by_name(NAME)
    trials = storage.list_trials(record.id)
    best = best_by_arm(trials)
    verdict = verdict_from_every_trial(storage, spec_from_stored(record), trials)
    printed = run(url, "best", NAME, "--per-arm")
    out = yaml.safe_load(printed)
    assert out.pop("verdict") == yaml.safe_load(yaml.safe_dump(verdict.as_dict()))
    assert printed.endswith(f"# verdict: {verdict.line}\n")
    assert sorted(out) == sorted(best) == ["optimizer.name=adamw", "optimizer.name=lamb"]
    for arm, trial in best.items():
        runs = [t for t in trials if t.kind is TrialKind.CONFIRMATION and t.arm == arm and t.params == trial.params]
        assert out[arm]["trial"] == trial.number and out[arm]["objective"] == trial.objective
        assert out[arm]["params"] == trial.params
        assert out[arm]["evidence"]["runs"] == len(runs)
        assert out[arm]["evidence"]["reached_target"] == sum(t.samples_to_target is not None for t in runs)


def late_median(storage: SqlStorage, trial_id: int) -> float | None:
    """The median of the positive, finite noise-scale values over the second half of the samples (computed here)."""
    points = [(m.samples, m.value) for m in storage.get_metrics(trial_id, "noise_scale")
              if m.samples is not None and math.isfinite(m.value) and m.value > 0]  # fmt: skip
    if not points:
        return None
    half = max(s for s, _ in points) / 2
    return statistics.median(v for s, v in points if s >= half)


def test_the_report_reads_the_noise_scale_of_every_trial_kept_or_from_its_records(stored, tmp_path):
    url, storage = stored
    record = storage.get_experiment_by_name(NAME)
    trials = storage.list_trials(record.id)
    expected = {t.number: late_median(storage, t.id) for t in trials}
    assert sum(v is not None for v in expected.values()) == len(trials)  # every simulated trial reports one
    data = load_experiment(storage, NAME)
    assert {r.number: r.noise_scale for r in data.trials} == expected
    assert {r.number: r.noise_undefined for r in data.trials} == dict.fromkeys(expected, 0.0)  # no big-batch norms
    assert data.verdict == verdict_from_every_trial(storage, spec_from_stored(record), trials)
    if not url.startswith("sqlite"):
        return
    # A database upgraded from before the noise scale was kept: its older trials are read from their records.
    older = copy_database(url, tmp_path / "older.db")
    engine = create_engine(f"sqlite:///{older}")
    with engine.begin() as connection:
        forget = "UPDATE trials SET late_noise_scale = NULL, late_noise_undefined = NULL WHERE number % 2 = 0"
        connection.execute(text(forget))
    engine.dispose()
    with SqlStorage(f"sqlite:///{older}") as upgraded:
        forgotten = [t.number for t in upgraded.list_trials(record.id) if t.late_noise_undefined is None]
        assert forgotten == [t.number for t in trials if t.number % 2 == 0] and forgotten
        again = load_experiment(upgraded, NAME)
    assert [(r.number, r.noise_scale, r.noise_undefined, r.outcome) for r in again.trials] == [
        (r.number, r.noise_scale, r.noise_undefined, r.outcome) for r in data.trials
    ]


def copy_database(url: str, path: Path) -> Path:
    """A copy of the SQLite database at `url` with everything committed (its WAL file's pages included)."""
    source, copy = sqlite3.connect(url.removeprefix("sqlite:///")), sqlite3.connect(path)
    source.backup(copy)
    source.close()
    copy.close()
    return path


def snapshot(directory: Path) -> dict:
    """Every file in the directory: its bytes' hash and modification time."""
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) for p in directory.iterdir()}


def hpo(url: str, *args: str) -> None:
    result = subprocess.run([sys.executable, "-m", "hpo", "--db", url, *args], capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr


def without_root_file_access() -> list[str]:
    """The prefix of a command that runs without root's access to every file (setpriv; none needed as a user)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is needed to run the commands without root's file access")
    caps = "-dac_override,-dac_read_search,-fowner"
    return [setpriv, "--bounding-set", caps, "--inh-caps", caps, "--"]


def sqlite_copy(stored, tmp_path: Path) -> Path:
    """A folder holding a copy of the stored SQLite database as hpo.db (PostgreSQL: skipped, a file shows writes)."""
    url, _ = stored
    if not url.startswith("sqlite"):
        pytest.skip("a SQLite file shows every write")
    directory = tmp_path / "db"
    directory.mkdir()
    copy_database(url, directory / "hpo.db")
    return directory


STATUS_TRIALS = [["status"], ["status", NAME], ["trials", NAME, "--limit", "5"]]
BEST = [["best", NAME], ["best", NAME, "--per-arm"]]
REPORT = [["report", NAME, "-o", "{reports}"]]


# hpo's own files are WAL; another tool may have changed it. The report imports the plotting (3 s): slow. By default
# each command runs in one journal mode and each mode is read by some: [wal-best] is slow ([delete-best] runs the same
# commands, [wal-status-trials] the same journal mode), and so is [delete-status-trials] ([wal-status-trials] runs
# the same commands, [delete-best] the same journal mode)
@pytest.mark.parametrize(("journal", "commands"), [
    pytest.param("wal", STATUS_TRIALS, id="wal-status-trials"),
    pytest.param("wal", BEST, id="wal-best", marks=pytest.mark.slow),
    pytest.param("wal", REPORT, id="wal-report", marks=pytest.mark.slow),
    pytest.param("delete", STATUS_TRIALS, id="delete-status-trials", marks=pytest.mark.slow),
    pytest.param("delete", BEST, id="delete-best"),
    pytest.param("delete", REPORT, id="delete-report", marks=pytest.mark.slow),
])  # fmt: skip
def test_a_read_command_never_writes_to_the_database(stored, tmp_path, journal, commands):
    directory = sqlite_copy(stored, tmp_path)
    connection = sqlite3.connect(directory / "hpo.db")
    assert connection.execute(f"PRAGMA journal_mode = {journal}").fetchone() == (journal,)
    connection.close()
    before = snapshot(directory)
    for command in commands:
        hpo(f"sqlite:///{directory / 'hpo.db'}", *(a.format(reports=tmp_path / "reports") for a in command))
    assert snapshot(directory) == before  # the same bytes and times, and no new file (no -wal or -shm left)


def test_a_read_command_reads_a_log_a_killed_writer_left_and_leaves_the_file_and_log_as_they_were(stored, tmp_path):
    """A controller killed outright leaves its last commits in hpo.db-wal. A read command sees them, and its close
    does not fold the log into the file, which SQLite's last connection to close does (it rewrote the file)."""
    directory = sqlite_copy(stored, tmp_path)
    killed_writer = (
        "import os, sqlite3, sys\n"
        "c = sqlite3.connect(sys.argv[1]); c.execute('PRAGMA wal_autocheckpoint = 0')\n"
        "c.execute(\"UPDATE experiments SET controller_note = 'from the log' WHERE name = ?\", (sys.argv[2],))\n"
        "c.commit(); os._exit(0)  # no close: the log stays, as a SIGKILL leaves it\n"
    )
    subprocess.run([sys.executable, "-c", killed_writer, str(directory / "hpo.db"), NAME], check=True, timeout=60)
    assert (directory / "hpo.db-wal").stat().st_size > 0
    before = snapshot(directory)
    url = f"sqlite:///{directory / 'hpo.db'}"
    for command in (["status", NAME], ["trials", NAME, "--limit", "3"], ["best", NAME, "--per-arm"]):
        hpo(url, *command)
    after = snapshot(directory)
    assert after.keys() == before.keys() == {"hpo.db", "hpo.db-wal", "hpo.db-shm"}
    assert {name for name in after if after[name] != before[name]} <= {"hpo.db-shm"}  # SQLite's index of the log
    with SqlStorage(url, read_only=True, one_shot=True, writes=False) as storage:  # what the commands open
        assert storage.get_experiment_by_name(NAME).controller_note == "from the log"


def test_a_read_command_on_a_sqlite_file_it_may_not_write_leaves_no_wal_or_shm_beside_it(stored, tmp_path):
    """A results file shared read-only (a file this user may not write, in a folder it may): SQLite opened it as
    usual and left -wal and -shm files beside it; it is read as an immutable file."""
    directory = sqlite_copy(stored, tmp_path)
    (directory / "hpo.db").chmod(0o444)
    as_a_user = without_root_file_access()
    before = snapshot(directory)
    for command in (["status", NAME], ["best", NAME, "--per-arm"], ["trials", NAME, "--limit", "3"]):
        result = subprocess.run([*as_a_user, sys.executable, "-m", "hpo", "--db", f"sqlite:///{directory / 'hpo.db'}",
                                 *command], capture_output=True, text=True, timeout=120)  # fmt: skip
        assert result.returncode == 0, result.stderr
    assert snapshot(directory) == before  # no -wal or -shm left


def test_only_a_commands_reads_of_a_closed_wal_file_read_it_as_immutable(stored, tmp_path):
    """Immutable means no locks and no WAL: a writer that starts later goes unseen (stale answers, for ever in a
    server). So a long-lived reader (the API's storage) opens such a file as usual, and so does a command on a file
    in rollback-journal mode, which a live writer may be changing without a -wal file."""
    directory = sqlite_copy(stored, tmp_path)
    journal = directory / "journal.db"
    shutil.copy(directory / "hpo.db", journal)
    with contextlib.closing(sqlite3.connect(journal)) as connection:
        assert connection.execute("PRAGMA journal_mode = DELETE").fetchone() == ("delete",)
    for path in (directory / "hpo.db", journal):
        path.chmod(0o444)
    as_a_user = without_root_file_access()
    probe = ("import sys; from hpo.storage.engine import create_storage_engine as c; "
             "print(c(sys.argv[1], read_only=True, one_shot=sys.argv[2] == '1').url)")  # fmt: skip

    def opened(path: Path, one_shot: bool) -> str:
        done = subprocess.run([*as_a_user, sys.executable, "-c", probe, f"sqlite:///{path}", "1" if one_shot else "0"],
                              capture_output=True, text=True, timeout=60, cwd=ROOT)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert "immutable=1" in opened(directory / "hpo.db", one_shot=True)
    assert "immutable" not in opened(directory / "hpo.db", one_shot=False)  # the API's storage
    assert "immutable" not in opened(journal, one_shot=True)


@pytest.mark.parametrize("scheme", ["sqlite", "sqlite+pysqlite"])
def test_a_read_command_on_a_missing_sqlite_file_creates_neither_file_nor_directory(tmp_path, scheme, capsys):
    path = tmp_path / "nowhere" / "hpo.db"
    assert main(["--db", f"{scheme}:///{path}", "status"]) == 2  # in this process: what it leaves is under test
    err = capsys.readouterr().err
    assert f"there is no database at {path}" in err, err
    assert not (tmp_path / "nowhere").exists()


def test_a_reader_that_leaves_early_ends_the_command_quietly(tmp_path):
    """`hpo trials NAME | head`: the command stops at its next write, with the exit status of a Unix filter killed by
    SIGPIPE and no traceback. The listing (2,000 trials) is larger than a pipe holds, so the reader leaves first."""
    from bench.storage import load_trials
    from tests.hpo.engine.test_study import make_spec

    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    spec = make_spec(tmp_path, trials=2000)
    with SqlStorage(url, upgrade=True) as storage:
        eid = storage.create_experiment(spec.name, {"experiment": spec.self_contained(), "run_dir": "run"}, "minimize")
    load_trials(url, eid, 2000)  # one bulk insert, as tests/hpo/storage/test_sql.py loads its trials
    command = [sys.executable, "-m", "hpo", "--db", url, "trials", spec.name]
    listing = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # noqa: S603
    assert listing.stdout.readline().split()[:2] == [b"#", b"state"]
    listing.stdout.close()
    _, err = listing.communicate(timeout=120)
    assert listing.returncode == 141 and err == b"", err.decode()[-2000:]


def columns(line: str, fields: int) -> list[tuple[int, int]]:
    """The (start, end) offsets of the first `fields` space-separated values of a line."""
    spans, at = [], 0
    for value in line.split()[:fields]:
        start = line.index(value, at)
        spans.append((start, start + len(value)))
        at = start + len(value)
    return spans


def test_trials_and_status_columns_fit_their_values(tmp_path, capsys):
    """A state of 11 letters (interrupted), an arm of more than 24 and an experiment name of more than 32 pushed the
    columns after them out of line with the header and the other rows."""
    from tests.hpo.report.test_report_edges import ADAMW, LAMB, add_trial, make_experiment

    storage, eid, url = make_experiment(tmp_path, name="a-rather-long-experiment-name-of-40-chars")
    add_trial(storage, eid, ADAMW, "reached")
    storage.interrupt_trial(add_trial(storage, eid, LAMB, "running", lr=2e-3), "its controller stopped")
    add_trial(storage, eid, "optimizer.name=adamw,batch.global_batch_size=16", "failed", lr=3e-3)
    make_experiment(tmp_path, name="short")
    assert main(["--db", url, "trials", "a-rather-long-experiment-name-of-40-chars"]) == 0
    head, *rows = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in rows] == ["completed", "interrupted", "failed"]
    expected = columns(head, 6)  # #, budget, objective, acc right-aligned; state, arm left-aligned
    for line in rows:
        spans = columns(line, 6)
        assert [spans[i][1] for i in (0, 3, 4, 5)] == [expected[i][1] for i in (0, 3, 4, 5)], line
        assert [spans[i][0] for i in (1, 2)] == [expected[i][0] for i in (1, 2)], line
        assert line[spans[5][1] : spans[5][1] + 2] == "  "  # the reason after two spaces, as in the header
    assert main(["--db", url, "status"]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert len(listing) == 2 and len({columns(line, 3)[1][0] for line in listing}) == 1, listing
    assert len({columns(line, 3)[2][0] for line in listing}) == 1, listing


def test_status_of_a_stopped_experiment_says_that_hpo_resume_finishes_it(tmp_path, capsys):
    """Stopped by Ctrl-C (or SIGTERM, the API's stop): its status said `stopped` and no more, while `hpo run` had said
    what to do next; an interrupted one (its controller gone) names `hpo resume`, a finished one nothing to do."""
    from hpo.storage.base import ExperimentStatus
    from tests.hpo.report.test_report_edges import ADAMW, LAMB, add_trial, make_experiment

    storage, eid, url = make_experiment(tmp_path, name="halted")
    add_trial(storage, eid, ADAMW, "reached")
    storage.interrupt_trial(add_trial(storage, eid, LAMB, "running", lr=2e-3), "interrupted by the user (Ctrl-C)")
    storage.set_experiment_status(eid, ExperimentStatus.STOPPED)
    assert main(["--db", url, "status", "halted"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "halted: stopped"
    assert lines[-1] == "stopped before it finished; `hpo resume halted` finishes the experiment"
    storage.set_experiment_status(eid, ExperimentStatus.FINISHED)
    assert main(["--db", url, "status", "halted"]) == 0
    assert "hpo resume" not in capsys.readouterr().out


def test_status_names_where_the_nni_web_ui_was_last_served_as_the_report_links_it(tmp_path, capsys):
    """engine: nni stores where each arm's web UI was last served; the report and the API linked it, `hpo status`
    said nothing of it."""
    from hpo.report.html import experiment_report
    from hpo.storage.base import NNI_WEBUI_KEY
    from tests.hpo.report.test_report_edges import make_experiment as recorded_experiment

    storage, eid, url = recorded_experiment(tmp_path)
    links = [{"arm": "optimizer.name=adamw", "nni_experiment": "hpo1-arm0", "url": "http://127.0.0.1:8080"},
             {"arm": "optimizer.name=lamb", "nni_experiment": "hpo1-arm1", "url": "http://127.0.0.1:8081"}]  # fmt: skip
    storage.annotate_experiment(eid, NNI_WEBUI_KEY, links)
    page = experiment_report(storage, "edge")
    assert all(f'href="{link["url"]}"' in page for link in links)
    assert main(["--db", url, "status", "edge"]) == 0
    assert capsys.readouterr().out.splitlines()[1:4] == [
        "NNI web UI, where last served (each answers while the experiment runs it; `hpo webui edge` reopens them all):",
        "  optimizer.name=adamw: http://127.0.0.1:8080 (NNI experiment hpo1-arm0)",
        "  optimizer.name=lamb: http://127.0.0.1:8081 (NNI experiment hpo1-arm1)",
    ]


def test_trials_that_list_none_say_so_on_standard_error(tmp_path, capsys):
    """`hpo trials NAME --state failed` without a failed trial printed the header alone."""
    from tests.hpo.report.test_report_edges import ADAMW, add_trial, make_experiment

    storage, eid, url = make_experiment(tmp_path, name="one")
    assert main(["--db", url, "trials", "one"]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 1 and err == "no trial yet\n"
    add_trial(storage, eid, ADAMW, "reached")
    assert main(["--db", url, "trials", "one", "--state", "failed"]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 1 and err == "no trial in state failed\n"
    assert main(["--db", url, "trials", "one", "--after", "1"]) == 0
    assert capsys.readouterr().err == "no trial on this page\n"
    assert main(["--db", url, "trials", "one"]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 2 and err == ""


@pytest.mark.parametrize("metric", ["samples_to_target", "best_mlm_accuracy"])
def test_trials_says_which_completed_trials_missed_the_target(tmp_path, capsys, metric):
    """A trial that used its whole budget below the target accuracy is `completed` like one that reached it; under a
    *_to_target objective its objective is the penalty (twice the budget here), which read as a sample count."""
    from tests.hpo.report.test_report_edges import ADAMW, LAMB, MAX_SAMPLES, add_trial
    from tests.hpo.report.test_report_edges import make_experiment as recorded_experiment

    storage, eid, url = recorded_experiment(tmp_path, metric=metric)
    add_trial(storage, eid, ADAMW, "reached")
    add_trial(storage, eid, LAMB, "missed", lr=2e-3)
    add_trial(storage, eid, LAMB, "failed", lr=3e-3)
    capsys.readouterr()
    assert main(["--db", url, "trials", "edge"]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    details = [row.split(None, 6)[6] for row in rows]
    penalty = "; its objective is the penalty" if metric == "samples_to_target" else ""
    assert details[0].startswith("{") and details[2] == "crashed"
    assert details[1].startswith(f"missed the target{penalty}: {{"), details[1]
    if metric == "samples_to_target":
        assert rows[1].split()[4] == f"{2 * MAX_SAMPLES:,}"
