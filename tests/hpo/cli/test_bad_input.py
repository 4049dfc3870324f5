"""Bad input to the command line is refused before any work starts, with exit code 2 and a message that names the
file, option, path or arm and what to do, never a traceback; nothing is written to the database: a run directory
that is a file, an output path that cannot be written, a --scheduler that is no address or that nothing would use,
an arm or a batch size the experiment does not have, a database URL that does not parse."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from hpo.cli.main import main
from hpo.engine.liveness import liveness
from hpo.experiment import experiment_from_dict, stored_form
from hpo.runners.process import controller_here, process_state
from hpo.storage import SqlStorage, current_revision, head_revision, upgrade_database
from hpo.storage import retry as retry_module
from tests.hpo.plan import test_plan
from tests.hpo.plan.test_plan import ROOT, write, write_pilot
from tests.hpo.storage.conftest import POSTGRES_SKIP_REASON, POSTGRES_URL_ENV

PILOT = "pilot"
ARMS = "optimizer.name=adamw, optimizer.name=lamb"


def small_preset(**changes) -> dict:
    """The plan tests' small simulated preset (tests/hpo/plan/test_plan.py) with 8 trials, not 48: these tests are
    about what the commands refuse, say and keep around a run, and a run writes every trial to the database."""
    data = test_plan.small_preset(**changes)
    data["budget"] = {**data["budget"], "trials": 8}
    return data


def hpo(url: str, *args: str) -> int:
    return main(["--db", url, *args])


def experiments(db_file: Path) -> list[str]:
    """The names of the experiments in the database at db_file ([] when there is no database)."""
    if not db_file.exists():
        return []
    with SqlStorage(f"sqlite:///{db_file}") as storage:
        return [e.name for e in storage.list_experiments()]


@pytest.fixture
def pilot(tmp_path) -> str:
    """The URL of a database holding experiment PILOT: arms adamw and lamb, completed trials at global batch size 32."""
    db_file = tmp_path / "pilot.db"
    write_pilot(db_file, PILOT, {"adamw": [(9000, []), (9500, [])], "lamb": [(8000, []), (8500, [])]})
    return f"sqlite:///{db_file}"


# --------------------------------------------------------------------------- the run directory (hpo run, hpo resume)


@pytest.mark.parametrize("under", [False, True], ids=["the-file", "a-directory-under-it"])
def test_a_file_as_the_run_directory_is_refused_before_the_experiment_is_created(tmp_path, capsys, under):
    taken = tmp_path / "notes.txt"
    taken.write_text("not a directory")
    run_dir = taken / "run" if under else taken
    db_file = tmp_path / "hpo.db"
    path = write(tmp_path / "e.yaml", small_preset(name="rd"))
    assert hpo(f"sqlite:///{db_file}", "run", str(path), "--run-dir", str(run_dir), "--quiet") == 2
    err = capsys.readouterr().err
    assert f"--run-dir: the run directory {run_dir}" in err and f"{taken} is a file" in err and "Traceback" not in err
    assert experiments(db_file) == []  # not created: `hpo run` again would say it already exists
    assert taken.read_text() == "not a directory"


def test_a_file_where_the_default_run_directory_goes_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").write_text("")
    db_file = tmp_path / "hpo.db"
    path = write(tmp_path / "e.yaml", small_preset(name="rd"))
    assert hpo(f"sqlite:///{db_file}", "run", str(path), "--quiet") == 2
    err = capsys.readouterr().err
    assert f"the run directory {tmp_path / 'runs' / 'rd'} cannot be a directory: {tmp_path / 'runs'} is a file" in err
    assert "--run-dir chooses one" in err
    assert experiments(db_file) == []


def test_a_run_directory_of_an_earlier_experiment_is_refused_to_a_new_one_and_kept(tmp_path, capsys):
    """Its trials would have resumed the earlier run's checkpoints (a finished one trains nothing and reports the
    earlier result) and written over its trial directories and tuner state: with another database, or another
    experiment name in the same one."""
    run_dir = tmp_path / "run"
    path = write(tmp_path / "e.yaml", small_preset(name="first"))
    assert hpo(f"sqlite:///{tmp_path / 'a.db'}", "run", str(path), "--run-dir", str(run_dir), "--quiet") == 0
    for kept in ("trials/00000/report.jsonl", "checkpoints/7b71b77109811a45-seed1234/latest.pt"):  # a trainer's
        (run_dir / kept).parent.mkdir(parents=True)
        (run_dir / kept).write_text("the earlier run's")
    before = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")}
    other = write(tmp_path / "other.yaml", small_preset(name="second"))
    for db, experiment in (("b.db", path), ("a.db", other)):
        assert hpo(f"sqlite:///{tmp_path / db}", "run", str(experiment), "--run-dir", str(run_dir), "--quiet") == 2
        err = capsys.readouterr().err
        assert f"--run-dir: the run directory {run_dir} holds an earlier run's files (trials/, checkpoints/)" in err
        assert "choose another --run-dir" in err
    # the same experiment again, where it ran: told that it exists and what reads it (not to resume it)
    assert hpo(f"sqlite:///{tmp_path / 'a.db'}", "run", str(path), "--run-dir", str(run_dir), "--quiet") == 2
    err = capsys.readouterr().err
    assert "experiment 'first' already exists (status finished)" in err and "hpo resume" not in err
    assert experiments(tmp_path / "b.db") == [] and experiments(tmp_path / "a.db") == ["first"]
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")} == before


def stored_experiment(tmp_path, name: str, run_dir: Path) -> tuple[str, SqlStorage]:
    """(URL, storage) of a database with the experiment `name` (the small simulated preset) stored to run in
    run_dir, as `hpo run` left it after its controller stopped."""
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    spec = experiment_from_dict(small_preset(name=name), f"{name}.yaml")
    storage = SqlStorage(url, upgrade=True)
    storage.create_experiment(name, stored_form(spec, run_dir), spec.direction)
    return url, storage


def test_resume_refuses_a_run_directory_that_is_a_file_before_claiming_the_experiment(tmp_path, capsys):
    taken = tmp_path / "run"
    taken.write_text("")
    url, storage = stored_experiment(tmp_path, "rs", taken)
    with storage:
        assert hpo(url, "resume", "rs", "--quiet") == 2
        err = capsys.readouterr().err
        assert (
            f"experiment rs: the run directory {taken} is a file; move that file away (the run directory is "
            "recorded with the experiment)"
            in err
            and "Traceback" not in err
        )  # no other directory to choose
        assert storage.get_experiment_by_name("rs").controller_pid is None  # not claimed: a resume may follow


def test_a_run_directory_another_controller_drives_an_experiment_in_is_refused_to_run_and_resume(
    tmp_path, capsys, monkeypatch
):
    """Two experiments started in one --run-dir within moments of each other both saw it empty (no trial files
    yet) and both ran there, their trials sharing trial directories: the controller now holds the directory while
    it runs, and the second is refused, naming the first, before anything is recorded; once that controller has
    ended (however it ended: the kernel lets its lock go) the directory is free."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = subprocess.Popen(  # another controller: the claim `hpo run first` takes, in a process of its own
        [sys.executable, "-c", "import sys; from pathlib import Path; from hpo.cli.run import claim_run_dir; "
         f"claim_run_dir(Path({str(run_dir)!r}), '--run-dir', 'first'); print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)  # fmt: skip
    try:
        assert holder.stdout.readline() == "held\n"
        url = f"sqlite:///{tmp_path / 'hpo.db'}"
        second = write(tmp_path / "second.yaml", small_preset(name="second"))
        assert hpo(url, "run", str(second), "--run-dir", str(run_dir), "--quiet") == 2
        in_use = f"the run directory {run_dir} is in use by experiment first (controller pid {holder.pid} on "
        err = capsys.readouterr().err
        assert f"--run-dir: {in_use}" in err and "choose another --run-dir, or wait until it ends" in err
        assert experiments(tmp_path / "hpo.db") == []  # nothing recorded
        (tmp_path / "stored").mkdir()
        stored_url, storage = stored_experiment(tmp_path / "stored", "rs", run_dir)  # to run there, as resumed
        with storage:
            # its controller elsewhere, its heartbeat old (paused): the refused resume took its claim and gave it
            # back, and that controller, resumed, stopped ("another controller took 'rs' over"): nobody drove it
            record = storage.get_experiment_by_name("rs")
            storage.claim_controller(record.id, "paused-host", 999, stale_after_s=60)
            monkeypatch.setenv("HPO_HEARTBEAT_S", "0.1")  # so that its heartbeat is old in a moment
            time.sleep(0.3)  # twice the 0.15 s after which a silent controller counts as gone
            assert hpo(stored_url, "resume", "rs", "--quiet") == 2
            err = capsys.readouterr().err
            assert f"experiment rs: {in_use}" in err
            assert "--run-dir" not in err  # hpo resume has no such option: its run directory is recorded
            assert "wait until it ends, then resume again (the run directory is recorded with the experiment)" in err
            record = storage.get_experiment_by_name("rs")
            assert (record.controller_host, record.controller_pid) == ("paused-host", 999)  # its claim untouched
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert hpo(url, "run", str(second), "--run-dir", str(run_dir), "--quiet") == 0  # free once that one has ended


def test_a_resume_of_an_experiment_whose_controller_runs_says_so(tmp_path, capsys):
    """Its run directory is held by its own controller: the refusal said "in use by experiment rs ...; wait until it
    ends, then resume again", where once it ends there is nothing left to resume."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = subprocess.Popen(  # the experiment's own controller, holding its run directory as `hpo run rs` does
        [sys.executable, "-c", "import sys; from pathlib import Path; from hpo.cli.run import claim_run_dir; "
         f"claim_run_dir(Path({str(run_dir)!r}), '--run-dir', 'rs'); print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)  # fmt: skip
    try:
        assert holder.stdout.readline() == "held\n"
        url, storage = stored_experiment(tmp_path, "rs", run_dir)
        with storage:
            assert hpo(url, "resume", "rs", "--quiet") == 2
            err = capsys.readouterr().err
            assert err.startswith(f"error: experiment rs: its controller runs it now (controller pid {holder.pid} on ")
            assert err.rstrip().endswith("; `hpo status rs` shows its progress (`hpo resume` finishes an experiment "
                                         "whose controller stopped)"), err  # fmt: skip
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)


def test_an_experiment_that_ran_in_the_run_directory_before_the_claim_is_seen(tmp_path, capsys, monkeypatch):
    """The earlier run's files are looked for again once the directory is held: another experiment that started
    there before the first look and wrote its trials and ended before the claim left files the first look missed."""
    import hpo.cli.run as run_module

    real = run_module.claim_run_dir

    def after_another_run(path, *args, **kwargs):
        (path / "trials" / "0").mkdir(parents=True)  # what that experiment left there, meanwhile
        return real(path, *args, **kwargs)

    monkeypatch.setattr(run_module, "claim_run_dir", after_another_run)
    run_dir = tmp_path / "run"
    path = write(tmp_path / "e.yaml", small_preset(name="late"))
    assert hpo(f"sqlite:///{tmp_path / 'hpo.db'}", "run", str(path), "--run-dir", str(run_dir), "--quiet") == 2
    assert f"--run-dir: the run directory {run_dir} holds an earlier run's files (trials/)" in capsys.readouterr().err
    assert experiments(tmp_path / "hpo.db") == []  # nothing recorded


def test_a_resume_whose_run_directory_cannot_be_claimed_says_what_to_do_there(tmp_path, capsys):
    """A resume cannot choose another directory (hpo resume has no --run-dir): the refusal says what to do in it."""
    run_dir = tmp_path / "run"
    (run_dir / ".hpo-controller").mkdir(parents=True)  # in the way of the claim file
    url, storage = stored_experiment(tmp_path, "rs", run_dir)
    with storage:
        assert hpo(url, "resume", "rs", "--quiet") == 2
        err = capsys.readouterr().err
        assert f"experiment rs: cannot claim the run directory {run_dir} ({run_dir / '.hpo-controller'}: " in err
        assert f"move {run_dir / '.hpo-controller'} away, or make it a file this user can write" in err
        assert "choose another" not in err
        assert storage.get_experiment_by_name("rs").controller_pid is None  # its claim given back


@pytest.mark.parametrize("options, message", [
    (["--runner", "dask", "--scheduler", "tcp://10.0.0.1:8786"],
     "--runner dask: experiment rs (stored) runs on runner: simulated (its trials read the curve table"),
    (["--runner", "local"], "--runner local: experiment rs (stored) runs on runner: simulated"),
    (["--scheduler", "tcp://10.0.0.1:8786"], "--scheduler needs --runner dask: the trials would run on the simulated "
                                              "runner (the runner of experiment rs (stored))"),
], ids=["runner-dask", "runner-local", "without-runner-dask"])  # fmt: skip
def test_resume_refuses_a_runner_or_scheduler_option_it_cannot_use_before_claiming(tmp_path, capsys, options, message):
    """The stored experiment is a simulated one: no other runner runs it, and it uses no scheduler."""
    url, storage = stored_experiment(tmp_path, "rs", tmp_path / "run")
    with storage:
        assert hpo(url, "resume", "rs", *options, "--quiet") == 2
        assert message in capsys.readouterr().err
        assert storage.get_experiment_by_name("rs").controller_pid is None
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------- --scheduler (hpo run)


LOCAL = {"name": "loc", "base_config": str(ROOT / "trainer/configs/demo_cpu.yaml"),
         "space": {"optimizer.lr": {"float": [1e-3, 1e-2], "log": True}}, "budget": {"trials": 2},
         "resources": {"gpus": "none"}}  # fmt: skip


@pytest.mark.parametrize("data, options, message", [
    (LOCAL, ["--runner", "dask", "--scheduler", "foo"],
     "error: --scheduler: expected an address such as tcp://host:8786, got 'foo'"),
    (LOCAL, ["--runner", "dask", "--scheduler", "tcp://foo"],
     "error: --scheduler: 'tcp://foo' is not a Dask scheduler address (missing port number"),
    (LOCAL, ["--runner", "dask", "--scheduler", "tcp://127.0.0.1:99999"],
     "error: --scheduler: 'tcp://127.0.0.1:99999' has port 99999, not a TCP port"),
    (LOCAL, ["--scheduler", "tcp://10.0.0.1:8786"],
     "error: --scheduler needs --runner dask: the trials would run on the local runner (the runner of "),
    (LOCAL, ["--runner", "local", "--scheduler", "tcp://10.0.0.1:8786"],
     "error: --scheduler needs --runner dask: the trials would run on the local runner (--runner local)"),
    (small_preset(name="sim"), ["--scheduler", "tcp://10.0.0.1:8786"],
     "error: --scheduler needs --runner dask: the trials would run on the simulated runner"),
    ({**LOCAL, "runner": {"name": "dask", "scheduler": "tcp://foo"}}, [],
     "e.yaml: runner.scheduler: 'tcp://foo' is not a Dask scheduler address (missing port number"),
], ids=["no-address", "no-port", "port-too-big", "file-runner-local", "runner-local", "file-runner-simulated",
        "file-scheduler-no-port"])  # fmt: skip
def test_a_scheduler_that_is_no_address_or_that_nothing_would_use_is_refused_at_once(tmp_path, capsys, data, options,
                                                                                     message):  # fmt: skip
    db_file = tmp_path / "hpo.db"
    path = write(tmp_path / "e.yaml", data)
    assert hpo(f"sqlite:///{db_file}", "run", str(path), *options, "--run-dir", str(tmp_path / "run"), "--quiet") == 2
    assert message in capsys.readouterr().err
    assert not db_file.exists() and not (tmp_path / "run").exists()


def test_gpu_ids_of_a_local_experiment_on_a_dask_cluster_are_refused_at_once(tmp_path, capsys):
    """--runner dask would place the trials on the GPUs the workers declare: the file's ids would be ignored."""
    db_file = tmp_path / "hpo.db"
    path = write(tmp_path / "e.yaml", {**LOCAL, "resources": {"gpus": [0, 1]}})
    options = ["--runner", "dask", "--scheduler", "tcp://127.0.0.1:8786", "--run-dir", str(tmp_path / "run")]
    assert hpo(f"sqlite:///{db_file}", "run", str(path), *options) == 2
    assert f"error: --runner dask: {path}: resources.gpus: [0, 1] are GPU ids of this machine, but the dask " in (
        capsys.readouterr().err
    )
    assert not db_file.exists() and not (tmp_path / "run").exists()


@pytest.mark.parametrize("runner", ["local", "dask"])
def test_a_simulated_experiment_on_another_runner_is_refused_at_once(tmp_path, capsys, runner):
    """--runner would run a simulated experiment's trials where no curve table is read: every trial would fail."""
    db_file = tmp_path / "hpo.db"
    path = write(tmp_path / "e.yaml", small_preset(name="sim"))
    assert hpo(f"sqlite:///{db_file}", "run", str(path), "--runner", runner, "--run-dir", str(tmp_path / "run")) == 2
    assert f"error: --runner {runner}: {path} runs on runner: simulated (its trials read the curve table" in (
        capsys.readouterr().err
    )
    assert not db_file.exists() and not (tmp_path / "run").exists()


# --------------------------------------------------------------------------- -o (hpo export, hpo table)


@pytest.mark.parametrize("command", [["export", PILOT], ["table", PILOT]])
def test_an_output_path_that_cannot_be_written_is_refused_naming_it(pilot, tmp_path, capsys, monkeypatch, command):
    missing = tmp_path / "no" / "such" / "out.txt"
    assert hpo(pilot, *command, "-o", str(missing)) == 2
    assert f"-o {missing}: the directory {missing.parent} does not exist" in capsys.readouterr().err
    assert not (tmp_path / "no").exists()

    assert hpo(pilot, *command, "-o", str(tmp_path)) == 2
    assert f"-o {tmp_path}: is a directory; give -o a file name" in capsys.readouterr().err

    a_file = tmp_path / "file"
    a_file.write_text("")
    assert hpo(pilot, *command, "-o", str(a_file / "out.txt")) == 2
    assert f"-o {a_file / 'out.txt'}: {a_file} is not a directory" in capsys.readouterr().err

    monkeypatch.chdir(tmp_path)  # `-` is not standard output: a file named '-' was written here
    assert hpo(pilot, *command, "-o", "-") == 2
    instead = "leave -o out to print to standard output" if command[0] == "export" else "give -o a file name"
    assert f"-o -: '-' would be a file named '-', not standard output; {instead}" in capsys.readouterr().err
    assert not (tmp_path / "-").exists()

    assert hpo(pilot, *command, "-o", str(tmp_path / "out.txt")) == 0  # where it can write, it does
    assert (tmp_path / "out.txt").stat().st_size > 0


def test_a_link_as_the_output_is_judged_by_the_file_it_names(pilot, tmp_path, capsys):
    """-o LINK writes the file the link names: a link into a directory that is not there, or that is a file, is
    refused as that file would be (it was replaced by a file of its own, the link lost), and a link to a file not yet
    there makes that file."""
    nowhere = Path(os.path.realpath(tmp_path)) / "no" / "best.yaml"
    (tmp_path / "file").write_text("")
    in_a_file = nowhere.parent.parent / "file" / "best.yaml"
    for target, message in ((nowhere, f"the directory {nowhere.parent} does not exist"),
                            (in_a_file, f"{in_a_file.parent} is not a directory")):  # fmt: skip
        link = tmp_path / f"to-{target.parent.name}.yaml"
        link.symlink_to(target)
        assert hpo(pilot, "export", PILOT, "-o", str(link)) == 2
        assert f"error: -o {link} (a link to {target}): {message}" in capsys.readouterr().err
        assert link.is_symlink() and not link.exists()

    (tmp_path / "elsewhere").mkdir()
    link = tmp_path / "best.yaml"
    link.symlink_to(tmp_path / "elsewhere" / "best.yaml")
    assert hpo(pilot, "export", PILOT, "-o", str(link)) == 0
    assert link.is_symlink()
    link.unlink()
    assert hpo(pilot, "export", PILOT, "-o", str(link)) == 0  # the same export to a file of that name
    assert (tmp_path / "elsewhere" / "best.yaml").read_text() == link.read_text()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_export_says_which_file_it_could_not_write(pilot, capsys):
    assert hpo(pilot, "export", PILOT, "-o", "/dev/full") == 2  # every write there fails: no space left
    err = capsys.readouterr().err
    assert "error: -o /dev/full: cannot write it: No space left on device" in err and "Traceback" not in err


def test_the_curve_table_writer_names_a_path_it_cannot_write(tmp_path):
    from hpo.plan.pilot_table import PilotTableError, write_table

    missing = tmp_path / "no" / "table.jsonl"
    with pytest.raises(PilotTableError, match=f"{missing}: cannot write the curve table: No such file"):
        write_table(missing, {"kind": "meta"}, [])
    (tmp_path / "t.jsonl").write_text("")
    with pytest.raises(PilotTableError, match="t.jsonl: exists; give a new file"):
        write_table(tmp_path / "t.jsonl", {"kind": "meta"}, [])


# --------------------------------------------------------------------------- --arm and --batch-size


@pytest.mark.parametrize("command", [["best", PILOT], ["trials", PILOT], ["export", PILOT]])
def test_an_arm_the_experiment_does_not_have_is_refused_naming_its_arms(pilot, capsys, command):
    assert hpo(pilot, *command, "--arm", "lamb") == 2
    assert f"error: experiment {PILOT} has no arm 'lamb': its arms are {ARMS}" in capsys.readouterr().err
    assert hpo(pilot, *command, "--arm", "optimizer.name=lamb") == 0


@pytest.mark.parametrize("command", [["best", PILOT], ["export", PILOT]])
def test_a_batch_size_without_completed_trials_names_the_batch_sizes_that_have_them(pilot, capsys, command):
    assert hpo(pilot, *command, "--batch-size", "999") == 2
    err = capsys.readouterr().err
    assert f"experiment {PILOT} has no completed trial with global batch size 999" in err
    assert "its completed trials have global batch size 32: use --batch-size 32" in err
    assert hpo(pilot, *command, "--arm", "optimizer.name=lamb", "--batch-size", "999") == 2
    assert "its completed trials of arm optimizer.name=lamb have global batch size 32" in capsys.readouterr().err
    assert hpo(pilot, *command, "--batch-size", "32") == 0


@pytest.mark.parametrize("given", [["--arm", "optimizer.name=lamb"], ["--batch-size", "999"]])
def test_per_arm_with_an_arm_or_a_batch_size_is_refused_not_ignored(pilot, capsys, given):
    assert hpo(pilot, "best", PILOT, "--per-arm", *given) == 2  # it printed every arm's best at any batch size
    assert f"--per-arm shows every arm's best trial and cannot be combined with {given[0]}" in capsys.readouterr().err


# --------------------------------------------------------------------------- --db


@pytest.mark.parametrize("url", ["foo://host/db", "host:5432/db"])
@pytest.mark.parametrize("command", [["status"], ["best", "e"], ["db", "upgrade"]])
def test_a_database_url_that_cannot_be_used_is_bad_input(tmp_path, capsys, url, command, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["--db", url, *command]) == 2
    err = capsys.readouterr().err
    assert "error: cannot use the database URL" in err and "Expected e.g. sqlite:///path/hpo.db" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [["status"], ["db", "upgrade"], ["run", "adam_vs_lamb_simulated"]])
def test_a_files_path_given_for_the_database_url_is_answered_with_its_url(tmp_path, capsys, command, monkeypatch):
    """`--db runs/hpo.db` (or HPO_DATABASE_URL so) was "cannot use the database URL <unparsable database URL>"."""
    monkeypatch.chdir(tmp_path)
    assert main(["--db", "runs/hpo.db", *command]) == 2
    assert capsys.readouterr().err == (f"error: the database URL 'runs/hpo.db' is a file's path, not a URL: for a "
                                       f"SQLite file give sqlite:///{tmp_path / 'runs' / 'hpo.db'} (with --db, or in "
                                       "HPO_DATABASE_URL)\n")  # fmt: skip
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [["status"], ["best", "e"], ["db", "upgrade"], ["run", "adam_vs_lamb_simulated"]])
def test_a_database_url_whose_port_is_not_a_number_is_bad_input_without_its_password(tmp_path, capsys, command,
                                                                                     monkeypatch):  # fmt: skip
    """SQLAlchemy's parser raises a ValueError for it, which ended every command in a traceback."""
    monkeypatch.chdir(tmp_path)
    assert main(["--db", "postgresql+psycopg://u:s3cret-pw@127.0.0.1:54x2/d", *command]) == 2
    err = capsys.readouterr().err
    assert "error: cannot use the database URL" in err and "port '54x2' is not a number" in err, err
    assert "s3cret" not in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def unused_port() -> int:
    """A port nothing listens on: a connection to it is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_password_in_the_urls_query_is_not_shown(capsys):
    """libpq takes `?password=` (and `?sslpassword=`) as well as `user:password@`: errors showed them as given."""
    pytest.importorskip("psycopg")
    port = unused_port()
    url = f"postgresql+psycopg://u@127.0.0.1:{port}/d?password=s3cret-pw&sslpassword=s3cret-key&connect_timeout=2"
    assert main(["--db", url, "status"]) == 1
    err = capsys.readouterr().err
    assert "connection failed" in err and f"127.0.0.1:{port}/d?" in err and "connect_timeout=2" in err, err
    assert "s3cret" not in err and "password=***" in err and "HPO_DATABASE_URL (or --db)" in err


@pytest.mark.parametrize("command", [["status"], ["db", "upgrade"]])
@pytest.mark.parametrize("url", ["postgresql+psycopg://u:s3c@ret-pw@127.0.0.1:5432/d",
                                 # SQLAlchemy reads a port from what follows, which is no number: not a wrong port
                                 "postgresql+psycopg://u:s3c@ret:pw@127.0.0.1:5432/d",
                                 "postgresql+psycopg://u:s3c@ret-pw@[::1]:5432/d"])  # fmt: skip
def test_a_password_with_an_at_sign_not_percent_encoded_is_refused_without_showing_it(tmp_path, capsys, command, url,
                                                                                      monkeypatch):  # fmt: skip
    """The URL's first `@` ends the password: the rest of it was taken for the host, shown in the error and looked
    up as a host name (or, where a ':' or an IPv6 host followed, said to be a port that is not a number: 5432)."""
    monkeypatch.chdir(tmp_path)
    assert main(["--db", url, *command]) == 2
    err = capsys.readouterr().err
    assert "error: cannot use the database URL" in err and "%40" in err and "port" not in err, err
    assert "s3c" not in err and "ret-pw" not in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_a_database_that_cannot_be_reached_still_exits_1(capsys):
    pytest.importorskip("psycopg")
    port = unused_port()
    assert main(["--db", f"postgresql+psycopg://u@127.0.0.1:{port}/d", "status"]) == 1
    assert "connection failed" in capsys.readouterr().err


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///", "sqlite:///:memory:"])
@pytest.mark.parametrize("command", [["db", "upgrade"], ["status"], ["trials", "e"], ["run", "adam_vs_lamb_simulated"],
                                     ["serve"]])  # fmt: skip
def test_every_command_refuses_an_in_memory_database(tmp_path, capsys, monkeypatch, url, command):
    """`db upgrade` said "at revision None" of a database gone at exit; the others sent the user to `db upgrade`."""
    monkeypatch.chdir(tmp_path)
    assert main(["--db", url, *command]) == 2
    err = capsys.readouterr().err
    assert "is an in-memory SQLite database, which keeps nothing" in err and "hpo db upgrade" not in err, err
    assert list(tmp_path.iterdir()) == []


def test_an_empty_file_is_a_new_database_to_a_command_that_writes(tmp_path, capsys):
    """`touch hpo.db`: `hpo run` refused it ("no hpo tables yet: run hpo db upgrade") after it had written to it."""
    (tmp_path / "hpo.db").touch()
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    assert main(["--db", url, "status"]) == 2  # a read: nothing is written, and it says what is missing
    assert "has no hpo tables yet" in capsys.readouterr().err and (tmp_path / "hpo.db").stat().st_size == 0
    path = write(tmp_path / "exp.yaml", small_preset(name="touched"))
    assert main(["--db", url, "run", str(path), "--run-dir", str(tmp_path / "run"), "--quiet"]) == 0
    assert main(["--db", url, "status", "touched"]) == 0
    assert "finished" in capsys.readouterr().out


def test_another_programs_file_and_an_old_schema_are_refused_by_a_run_and_left_byte_for_byte(tmp_path, capsys):
    """A refused `hpo run` left such a file in WAL mode (a writer's first connection sets it), and another
    program's file was said to have "no hpo tables yet: run `hpo db upgrade`", which would add hpo's tables to it."""
    path = write(tmp_path / "exp.yaml", small_preset(name="refused"))
    theirs, old = tmp_path / "theirs.db", tmp_path / "old.db"
    with sqlite3.connect(theirs) as connection:
        connection.execute("CREATE TABLE invoices (id INTEGER)")
    upgrade_database(f"sqlite:///{old}", "0004_trial_noise_kind_index")
    with sqlite3.connect(old) as connection:
        connection.execute("PRAGMA journal_mode = DELETE")  # as a copy of it, or another tool, may have left it
    for file, says in ((theirs, "holds other tables (invoices) and none of hpo's: another program's database, or the "
                                "wrong --db"),
                       (old, "has schema revision 0004_trial_noise_kind_index, this code needs")):  # fmt: skip
        before = file.read_bytes()
        assert main(["--db", f"sqlite:///{file}", "run", str(path), "--run-dir", str(tmp_path / "run"), "--quiet"]) == 2
        assert says in capsys.readouterr().err
        assert file.read_bytes() == before, file  # its journal mode too
        assert sorted(p.name for p in tmp_path.iterdir()) == ["exp.yaml", "old.db", "theirs.db"]


@pytest.mark.parametrize("command", [["status"], ["db", "upgrade"], ["best", "e"]])
def test_a_sqlite_path_that_is_a_folder_or_under_a_file_is_bad_input_naming_the_file(tmp_path, capsys, command):
    (tmp_path / "folder.db").mkdir()
    (tmp_path / "notes").write_text("a file")
    assert main(["--db", f"sqlite:///{tmp_path / 'folder.db'}", *command]) == 2
    err = capsys.readouterr().err
    assert "cannot use the SQLite file" in err and "names a file (not a folder)" in err and "server" not in err
    assert main(["--db", f"sqlite:///{tmp_path / 'notes' / 'hpo.db'}", *command]) == 2  # a traceback from db upgrade
    says = ("cannot create the directory {notes}" if command == ["db", "upgrade"] else
            "there is no database at {notes}/hpo.db, nor can there be: {notes} is a file, not a folder")  # fmt: skip
    assert says.format(notes=tmp_path / "notes") in capsys.readouterr().err
    assert (tmp_path / "notes").read_text() == "a file" and list((tmp_path / "folder.db").iterdir()) == []


@pytest.mark.parametrize("command", [["status"], ["db", "upgrade"]])
def test_a_file_that_is_not_sqlite_is_bad_input_and_kept(tmp_path, capsys, command):
    not_sqlite = tmp_path / "notes.db"
    not_sqlite.write_text("not a database\n" * 100)
    assert main(["--db", f"sqlite:///{not_sqlite}", *command]) == 2
    assert "is not a SQLite database" in capsys.readouterr().err
    assert not_sqlite.read_text() == "not a database\n" * 100


@pytest.mark.parametrize("command", [["status"], ["db", "upgrade"]])
def test_a_database_with_tables_of_our_names_made_by_another_program_is_bad_input_and_kept(tmp_path, capsys, command):
    path = tmp_path / "theirs.db"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE experiments (id INTEGER PRIMARY KEY, owner TEXT)")
        connection.execute("INSERT INTO experiments VALUES (1, 'another team')")
    connection.close()
    before = path.read_bytes()
    assert main(["--db", f"sqlite:///{path}", *command]) == 2
    assert "tables named experiments but no hpo schema revision" in capsys.readouterr().err
    assert path.read_bytes() == before


@pytest.mark.parametrize("part", ["database", "user"])
def test_a_database_or_user_the_server_does_not_have_is_bad_input(capsys, part):
    """The PostgreSQL server answers, and refuses the URL's database or user: no wait would help (exit 2)."""
    url = os.environ.get(POSTGRES_URL_ENV)
    if not url:
        pytest.skip(POSTGRES_SKIP_REASON)
    parsed = make_url(url)
    wrong = parsed.set(database="hpo_no_such_database") if part == "database" else parsed.set(username="no_such_user")
    assert main(["--db", wrong.render_as_string(hide_password=False), "status"]) == 2
    err = capsys.readouterr().err
    assert "the database server refused" in err and "does not exist" in err and "names an existing database" in err


@pytest.mark.parametrize("command", [["run", "exp.yaml"], ["resume", "e"], ["webui", "e"], ["serve"]])
def test_a_port_beyond_65535_is_refused_by_every_command_that_takes_one(capsys, command):
    with pytest.raises(SystemExit) as stopped:
        main([*command, "--port", "70000"])
    assert stopped.value.code == 2
    assert "argument --port: expected a TCP port (1 to 65535), got 70000" in capsys.readouterr().err


def test_a_plan_seed_past_what_a_tuner_takes_names_the_option_not_the_file(capsys):
    path = ROOT / "search_spaces" / "presets" / "adam_vs_lamb_simulated.yaml"
    with pytest.raises(SystemExit) as stopped:
        main(["plan", str(path), "--seed", "99999999999999", "--repetitions", "1"])  # it blamed the file's tuner.seed
    assert stopped.value.code == 2
    assert "argument --seed: expected a whole number from 0 to 2147483647" in capsys.readouterr().err


def test_a_plan_seed_whose_last_repetition_would_pass_the_database_is_refused_before_any_repetition(capsys):
    """Repetition r trains with the file's seed + 1000 (SEED + r), its confirmation runs with the seeds after it:
    past 2**31 - 1 the second or third repetition failed, blaming the file's base_config, after the first had run."""
    from hpo.experiment import load_experiment
    from hpo.plan.forecast import PlanOptions, prepare_plan
    from trainer.config import config_from_dict

    path = ROOT / "search_spaces" / "presets" / "adam_vs_lamb_simulated.yaml"
    spec = load_experiment(path)
    training = config_from_dict(spec.resolved_base()).seed
    largest = (2**31 - 1 - spec.budget.most_confirm_seeds - training) // 1000 - 2  # 3 repetitions: r up to 2
    assert main(["plan", str(path), "--seed", str(largest + 1), "--repetitions", "3"]) == 2
    err = capsys.readouterr().err
    assert f"--seed {largest + 1}: repetition r trains with seed" in err and f"give --seed {largest} or less" in err
    assert prepare_plan(str(path), PlanOptions(repetitions=3, seed=largest)).seeds(2)[1] <= 2**31 - 1


def test_an_experiment_that_is_starting_is_live_from_its_first_record_while_its_tuners_load(tmp_path, monkeypatch):
    """From the moment `hpo run` records the experiment, and while its tuners load (seconds; here past the point a
    silent controller counts as gone), readers see it live, with its controller, not interrupted: the API's stop
    used to refuse it as "not running" and send the user to `hpo resume`."""
    import hpo.engine.liveness as liveness_module
    import hpo.engine.local as local
    from hpo.engine.liveness import controller_identity, liveness

    monkeypatch.setenv("HPO_HEARTBEAT_S", "1.0")  # a controller silent for 1.5 s counts as gone
    path = write(tmp_path / "exp.yaml", small_preset(name="starting"))
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    real_study, seen = local.Study, []

    def slow_to_load(spec, storage, experiment_id, *args, **kwargs):
        for _ in range(2):  # 2 s of loading, past the time after which a silent controller counts as gone
            seen.append(liveness(storage.get_experiment(experiment_id)))
            time.sleep(1.0)
        record = storage.get_experiment(experiment_id)
        seen.append((record.controller_host, record.controller_pid, liveness(record)))
        return real_study(spec, storage, experiment_id, *args, **kwargs)

    created = []
    real_create = SqlStorage.create_experiment

    def create_and_look(self, *args, **kwargs):
        experiment_id = real_create(self, *args, **kwargs)
        record = self.get_experiment(experiment_id)  # live as it is written, whatever the load delays this read by
        created.append((record.controller_pid, liveness(record, now=record.heartbeat_at)))
        return experiment_id

    monkeypatch.setattr(local, "Study", slow_to_load)
    monkeypatch.setattr(SqlStorage, "create_experiment", create_and_look)
    assert liveness_module.stale_after_s() == pytest.approx(1.5)
    assert main(["--db", url, "run", str(path), "--run-dir", str(tmp_path / "run"), "--quiet"]) == 0
    assert created == [(os.getpid(), "live")]
    assert seen == ["live", "live", (*controller_identity(), "live")]


def test_ctrl_c_before_the_first_trial_stops_the_experiment_cleanly_and_resume_runs_it(tmp_path, capsys, monkeypatch):
    """Ctrl-C while the study loads its tuners (seconds of imports), before the loop's signal handlers are in place:
    no traceback, the experiment recorded as stopped (not a controller that vanished), and `hpo resume` runs it."""
    import hpo.engine.local as local

    path = write(tmp_path / "exp.yaml", small_preset(name="early"))
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    real_study = local.Study

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(local, "Study", interrupted)
    assert main(["--db", url, "run", str(path), "--run-dir", str(tmp_path / "run"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "stopped (Ctrl-C) while it loaded its tuners; `hpo resume early` runs the experiment" in err
    assert "Traceback" not in err
    with SqlStorage(url) as storage:
        record = storage.get_experiment_by_name("early")
        assert record.status.value == "stopped" and storage.list_trials(record.id) == []
    assert main(["--db", url, "resume", "early", "--quiet"]) == 1  # a resume interrupted the same way
    with SqlStorage(url) as storage:  # leaves no claim behind: another process may resume at once
        record = storage.get_experiment_by_name("early")
        assert (record.status.value, record.controller_host, record.controller_pid) == ("stopped", None, None)
    monkeypatch.setattr(local, "Study", real_study)
    assert main(["--db", url, "resume", "early", "--quiet"]) == 0
    with SqlStorage(url) as storage:
        assert storage.get_experiment_by_name("early").status.value == "finished"


def test_running_a_finished_experiment_again_points_at_reading_it_not_at_resume(tmp_path, capsys):
    path = write(tmp_path / "exp.yaml", small_preset(name="done"))
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    assert main(["--db", url, "run", str(path), "--run-dir", str(tmp_path / "run"), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["--db", url, "run", str(path), "--run-dir", str(tmp_path / "run2"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "experiment 'done' already exists (status finished); `hpo status done` and `hpo report done` read it" in err
    assert "hpo resume" not in err
    with SqlStorage(url) as storage:
        ended = storage.get_experiment_by_name("done").ended_at
    assert main(["--db", url, "resume", "done", "--quiet"]) == 0  # nothing to run, and nothing written
    assert capsys.readouterr().err.startswith("experiment done is finished: nothing to resume")
    with SqlStorage(url) as storage:
        assert storage.get_experiment_by_name("done").ended_at == ended


def test_status_of_an_experiment_whose_controller_ended_unfinished_says_so_without_none(tmp_path, capsys):
    """A controller that ended on an error (a lost Dask scheduler) releases its claim and leaves the experiment
    running: it shows as interrupted, and the line said "controller None pid None"."""
    spec = experiment_from_dict(small_preset(name="cut"), "cut.yaml")
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    with SqlStorage(url, upgrade=True) as storage:
        eid = storage.create_experiment("cut", stored_form(spec, tmp_path / "run"), spec.direction)
        storage.claim_controller(eid, "gpu-node-3", 4242, stale_after_s=30.0)
        storage.heartbeat(eid, "gpu-node-3", 4242)
        storage.release_controller(eid, "gpu-node-3", 4242)
    assert main(["--db", url, "status", "cut"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("cut: interrupted (its controller ended without finishing it; last seen "), first
    assert "None" not in first


def held_by(tmp_path: Path, name: str, host: str, pid: int, beat_age_s: float) -> str:
    """A stored experiment claimed by (host, pid), its last heartbeat `beat_age_s` ago; its database URL."""
    spec = experiment_from_dict(small_preset(name=name), f"{name}.yaml")
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    with SqlStorage(url, upgrade=True) as storage:
        eid = storage.create_experiment(name, stored_form(spec, tmp_path / "run"), spec.direction)
        storage.claim_controller(eid, host, pid, stale_after_s=30.0)
    beat = (datetime.now(timezone.utc) - timedelta(seconds=beat_age_s)).strftime("%Y-%m-%d %H:%M:%S.%f")
    with sqlite3.connect(tmp_path / "hpo.db") as connection:
        connection.execute("UPDATE experiments SET heartbeat_at = ? WHERE id = ?", (beat, eid))
    return url


def test_resume_does_not_take_over_a_controller_that_still_runs_here_though_its_heartbeat_is_stale(
    tmp_path, capsys, monkeypatch
):
    """A controller that could not write its heartbeat (another process kept the SQLite file locked past the stale
    limit) still runs: `hpo resume` on its machine refuses to take its experiment over (it killed its trials). A
    process that only took its pid over later, or one that runs no experiment, is not it."""
    monkeypatch.setenv("HPO_HEARTBEAT_S", "0.2")  # stale after 0.3 s
    argv = [sys.executable, "-c", "import time; time.sleep(120)", "hpo", "run", "held"]
    controller = subprocess.Popen(argv)
    time.sleep(1.0)  # its heartbeat, 0.5 s ago below, comes after its start
    assert not controller_here(socket.gethostname(), controller.pid, datetime.now(timezone.utc) - timedelta(
        seconds=30))  # a beat before the process started: another process took the pid over  # fmt: skip
    assert not controller_here("another-host", controller.pid, datetime.now(timezone.utc))
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", ".hpo/hpo.db"])
    try:
        assert not controller_here(socket.gethostname(), other.pid, datetime.now(timezone.utc))
    finally:
        other.kill()
        other.wait()
    try:
        url = held_by(tmp_path, "held", socket.gethostname(), controller.pid, beat_age_s=0.5)
        with SqlStorage(url) as storage:
            assert liveness(storage.get_experiment_by_name("held")) == "interrupted"  # by its heartbeat alone
        assert main(["--db", url, "resume", "held", "--quiet"]) == 2
        err = capsys.readouterr().err
        assert f"is driven by a controller that still runs on this machine (pid {controller.pid})" in err
        assert "it could not write to the database" in err
        assert main(["--db", url, "status"]) == 0
        assert capsys.readouterr().out.split()[:2] == ["held", "unresponsive"]
        controller.send_signal(signal.SIGSTOP)  # Ctrl-Z in its terminal: Ctrl-C and `kill` wait until it continues
        while process_state(controller.pid)[0] != "T":
            time.sleep(0.01)
        assert main(["--db", url, "resume", "held", "--quiet"]) == 2
        assert f"it is stopped (Ctrl-Z: `kill -CONT {controller.pid}` continues it" in capsys.readouterr().err
        assert main(["--db", url, "status", "held"]) == 0  # not `interrupted`, which would say to resume it
        out = capsys.readouterr().out
        assert out.startswith(f"held: unresponsive (controller {socket.gethostname()} pid {controller.pid} last seen ")
        assert (f"the controller stopped heartbeating but still runs on this machine (pid {controller.pid}): it is "
                f"stopped (Ctrl-Z: `kill -CONT {controller.pid}` continues it") in out  # fmt: skip
        assert "hpo resume" not in out
        with SqlStorage(url) as storage:
            assert storage.get_experiment_by_name("held").controller_pid == controller.pid  # not taken over
    finally:
        controller.kill()
        controller.wait()
    assert main(["--db", url, "status", "held"]) == 0  # its process gone: interrupted, and `hpo resume` takes it over
    assert "the controller stopped heartbeating; `hpo resume held` takes the experiment over" in capsys.readouterr().out
    assert main(["--db", url, "resume", "held", "--quiet"]) == 0  # its process gone: resumed and finished
    with SqlStorage(url) as storage:
        assert storage.get_experiment_by_name("held").status.value == "finished"


def test_resume_right_after_its_controller_was_killed_here_waits_for_the_claim_to_lapse(tmp_path, capsys, monkeypatch):
    """A controller killed with SIGKILL leaves its last heartbeat fresh for up to 1.5 intervals: `hpo resume` on its
    machine was refused ("a live controller") and had to be run again. Its process gone, the resume waits for the
    claim to lapse, then runs the experiment; a holder whose process still runs is refused at once, as before."""
    monkeypatch.setenv("HPO_HEARTBEAT_S", "1")  # stale after 1.5 s
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    url = held_by(tmp_path, "killed", socket.gethostname(), gone.pid, beat_age_s=0)
    with SqlStorage(url) as storage:
        assert liveness(storage.get_experiment_by_name("killed")) == "live"  # by its heartbeat alone
    again = write(tmp_path / "killed.yaml", small_preset(name="killed"))  # `hpo run` of it again: told to resume
    assert main(["--db", url, "run", str(again), "--run-dir", str(tmp_path / "run2"), "--quiet"]) == 2
    assert "already exists (status running); use `hpo resume killed` to finish it" in capsys.readouterr().err
    assert main(["--db", url, "resume", "killed"]) == 0
    err = capsys.readouterr().err
    assert (f"experiment killed: its controller (pid {gone.pid}) no longer runs on this machine; waiting up to 1.5 s "
            "for its last heartbeat to lapse") in err  # fmt: skip
    with SqlStorage(url) as storage:
        assert storage.get_experiment_by_name("killed").status.value == "finished"
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (tmp_path / "alive").mkdir()
        url = held_by(tmp_path / "alive", "alive", socket.gethostname(), alive.pid, beat_age_s=0)
        assert main(["--db", url, "resume", "alive"]) == 2
        err = capsys.readouterr().err
        assert f"is driven by a live controller (host {socket.gethostname()}, pid {alive.pid}" in err
        assert "waiting" not in err
    finally:
        alive.kill()
        alive.wait()


def test_running_an_experiment_that_runs_now_says_so_not_to_resume_it(tmp_path, capsys):
    url = held_by(tmp_path, "busy", "gpu-node-3", 4242, beat_age_s=0)
    path = write(tmp_path / "busy.yaml", small_preset(name="busy"))
    assert main(["--db", url, "run", str(path), "--run-dir", str(tmp_path / "run2"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "experiment 'busy' already exists (status running); its controller runs now (`hpo status busy`" in err
    assert "hpo resume" not in err


def test_a_command_that_writes_waits_for_a_locked_file_as_long_as_the_environment_says(tmp_path, capsys, monkeypatch):
    """`HPO_DATABASE_OUTAGE_S=3600 hpo resume NAME` (the docs' example) waits for a database that is away from its
    first write on, not only once the experiment file's bound is read; without it the command fails at once, saying
    what holds the file and what to do."""
    monkeypatch.setattr("hpo.storage.engine.SQLITE_BUSY_TIMEOUT_MS", 50)
    url = held_by(tmp_path, "locked", "gpu-node-3", 4242, beat_age_s=3600)
    holder = sqlite3.connect(tmp_path / "hpo.db", isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    monkeypatch.delenv("HPO_DATABASE_OUTAGE_S", raising=False)
    try:
        assert main(["--db", url, "resume", "locked", "--quiet"]) == 1  # unreachable, not bad input
        err = capsys.readouterr().err
        assert "stayed locked by another writer" in err and "Another process holds a write transaction" in err
        assert "HPO_DATABASE_OUTAGE_S" in err
        monkeypatch.setenv("HPO_DATABASE_OUTAGE_S", "60")
        pauses: list[float] = []
        pause = retry_module._pause

        def release_then_pause(seconds, *args):  # the resume waits: the other process ends its write meanwhile
            if not pauses:
                holder.execute("ROLLBACK")
            pauses.append(seconds)
            pause(seconds, *args)

        monkeypatch.setattr(retry_module, "_pause", release_then_pause)
        assert main(["--db", url, "resume", "locked", "--quiet"]) == 0
        assert pauses  # it waited for the lock instead of failing
    finally:
        holder.close()
    with SqlStorage(url) as storage:
        assert storage.get_experiment_by_name("locked").status.value == "finished"


def test_db_upgrade_waits_for_a_locked_file_as_long_as_the_environment_says(tmp_path, capsys, monkeypatch):
    """`hpo db upgrade` failed at SQLite's busy timeout whatever HPO_DATABASE_OUTAGE_S said, though its error
    named the variable."""
    monkeypatch.setattr("hpo.storage.engine.SQLITE_BUSY_TIMEOUT_MS", 50)
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    upgrade_database(url, "0005_trials_version_filters")  # an older schema, which the upgrade must write to
    holder = sqlite3.connect(tmp_path / "hpo.db", isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    monkeypatch.delenv("HPO_DATABASE_OUTAGE_S", raising=False)
    try:
        assert main(["--db", url, "db", "upgrade"]) == 1
        err = capsys.readouterr().err
        assert "stayed locked by another writer" in err and "HPO_DATABASE_OUTAGE_S" in err
        assert current_revision(url) == "0005_trials_version_filters"
        monkeypatch.setenv("HPO_DATABASE_OUTAGE_S", "60")
        pauses: list[float] = []
        pause = retry_module._pause

        def release_then_pause(seconds, *args):  # the other process ends its write while the upgrade waits
            if not pauses:
                holder.execute("ROLLBACK")
            pauses.append(seconds)
            pause(seconds, *args)

        monkeypatch.setattr(retry_module, "_pause", release_then_pause)
        assert main(["--db", url, "db", "upgrade"]) == 0
        assert len(pauses) == 1
        assert "waiting up to 60 s (HPO_DATABASE_OUTAGE_S) for the database" in capsys.readouterr().err
    finally:
        holder.close()
    assert current_revision(url) == head_revision()


def test_resume_of_a_controller_that_runs_here_and_beats_names_it_as_live(tmp_path, capsys):
    controller = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "hpo", "run", "beating"])
    try:
        time.sleep(0.2)  # its heartbeat, now, comes after its start
        url = held_by(tmp_path, "beating", socket.gethostname(), controller.pid, beat_age_s=0)
        assert main(["--db", url, "resume", "beating", "--quiet"]) == 2
    finally:
        controller.kill()
        controller.wait()
    err = capsys.readouterr().err
    assert f"is driven by a live controller (host {socket.gethostname()}, pid {controller.pid}" in err
    assert "heartbeat is old" not in err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["trials", "e", "--after", str(10**23)], "--after: expected a whole number from 0 to 2,147,483,647"),
        (["trials", "e", "--limit", str(2**31)], "--limit: expected a whole number from 1 to 2,147,483,647"),
        (["best", "e", "--batch-size", str(10**23)], "--batch-size: expected a whole number from 1 to 2,147,483,647"),
        (["export", "e", "--batch-size", "0"], "--batch-size: expected a whole number from 1 to 2,147,483,647, got 0"),
        (["plan", "adam_vs_lamb_simulated", "--slots", str(10**9)], "--slots: expected a whole number of slots from 1"),
        (["plan", "adam_vs_lamb_simulated", "--draws", str(10**12)], "--draws: expected a whole number of draws"),
        (["plan", "adam_vs_lamb_simulated", "--repetitions", str(10**9)], "--repetitions: expected a whole number of"),
    ],
    ids=["trials-after", "trials-limit", "best-batch-size", "export-batch-size-0", "plan-slots", "plan-draws",
         "plan-repetitions"],
)  # fmt: skip
def test_counts_past_what_the_database_or_the_machine_takes_are_bad_input_naming_the_option(
    tmp_path, capsys, args, says
):
    """They ended in tracebacks: an integer too large for SQLite, or a plan allocating 87 TiB or a billion slots."""
    with pytest.raises(SystemExit) as exit_:
        main(["--db", f"sqlite:///{tmp_path / 'hpo.db'}", *args])
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_web_ui_port_for_an_experiment_without_nni_is_refused_before_anything_is_written(tmp_path, capsys):
    """`hpo run FILE --port 9000` on the local engine ran and ignored it, as `--scheduler` without dask is not."""
    path = write(tmp_path / "e.yaml", small_preset(name="local-port"))
    db_file = tmp_path / "hpo.db"
    assert hpo(f"sqlite:///{db_file}", "run", str(path), "--port", "9000", "--run-dir", str(tmp_path / "run")) == 2
    assert "--port applies to engine: nni" in capsys.readouterr().err
    assert experiments(db_file) == [] and not (tmp_path / "run").exists()
    url, storage = stored_experiment(tmp_path, "stopped", tmp_path / "run")  # stored, as a stopped run leaves it
    storage.close()
    assert hpo(url, "resume", "stopped", "--port", "9000") == 2
    assert "--port applies to engine: nni" in capsys.readouterr().err
    with SqlStorage(url) as storage:
        assert storage.get_experiment_by_name("stopped").status.value == "running"  # not claimed, not run


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--db", "", "status"], "--db"),
        (["trials", "e", "--state", " "], "--state"),
        (["export", "e", "-o", ""], "-o/--output"),
        (["report", "e", "-o", ""], "-o/--output"),
        (["run", "adam_vs_lamb_simulated", "--run-dir", ""], "--run-dir"),
        (["plan", "adam_vs_lamb_simulated", "--like", "", "--verdict-only"], "--like"),
        (["table", "e", "-o", ""], "-o/--output"),
        (["table", "", "-o", "t.jsonl"], "name"),
    ],
    ids=["db", "trials-state", "export-output", "report-output", "run-dir", "plan-like", "table-output", "table-name"],
)
def test_an_empty_option_is_refused_not_taken_for_its_default(tmp_path, capsys, monkeypatch, args, option):
    """`--db ""` used the default database, `-o ""` printed or wrote ./NAME.html, `--state ""` listed every trial,
    `--run-dir ""` ran in runs/NAME, `plan --like ""` planned without the pilot (a traceback with --verdict-only) and
    `table -o ""` said "-o .: is a directory": a variable that expanded to nothing would go unnoticed."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HPO_HOME", str(tmp_path / "home"))
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2
    assert f"argument {option}: expected" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_best_per_arm_of_an_experiment_that_compares_no_arms_says_so_and_what_shows_its_best(tmp_path, capsys):
    """It said "no completed trial matches" (exit 1), and `hpo run`'s summary suggested that very command."""
    data = small_preset(name="one-arm", compare=[])
    data["space"] = {k: v for k, v in data["space"].items() if not k.startswith("optimizer.name")}
    path = write(tmp_path / "e.yaml", data)
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    assert hpo(url, "run", str(path), "--run-dir", str(tmp_path / "run")) == 0
    out = capsys.readouterr().out
    assert "best one-arm --per-arm" not in out and "best one-arm            # the best configuration again" in out
    assert hpo(url, "best", "one-arm", "--per-arm") == 2
    assert "experiment one-arm compares no arms (its file has no `compare:`): `hpo best one-arm` shows" in (
        capsys.readouterr().err
    )
    assert hpo(url, "best", "one-arm") == 0


@pytest.mark.parametrize(
    "args", [[], ["--arm", "optimizer.name=lamb"], ["--per-arm"]], ids=["overall", "arm", "per-arm"]
)
def test_best_of_an_experiment_whose_trials_all_failed_names_it_and_what_says_why(tmp_path, capsys, args):
    """It said only "no completed trial matches": no experiment, no arm, nothing to do next (`hpo export` of the same
    experiment names them and `hpo trials`)."""
    from hpo.trials import TrialResult, TrialSpec, TrialState

    db_file = tmp_path / "failed.db"
    write_pilot(db_file, "failed", {})
    with SqlStorage(f"sqlite:///{db_file}") as storage:
        eid = storage.get_experiment_by_name("failed").id
        for optimizer in ("adamw", "lamb"):
            params = {"optimizer.name": optimizer, "optimizer.lr": 1e-3, "schedule.warmup_steps": 0}
            trial_id = storage.create_trial(eid, TrialSpec(None, params, f"optimizer.name={optimizer}", 1.0, (), 32))
            storage.finish_trial(trial_id, TrialResult(TrialState.TIMEOUT, reason="exceeded the trial time limit"))
    capsys.readouterr()
    assert hpo(f"sqlite:///{db_file}", "best", "failed", *args) == 1
    captured = capsys.readouterr()
    of_arm = " of arm optimizer.name=lamb" if "--arm" in args else ""
    assert captured.err == f"experiment failed has no completed trial{of_arm}; `hpo trials failed` says why\n"
    assert captured.out == ""


def test_best_and_export_of_an_experiment_without_any_trial_point_at_its_state_not_its_empty_trial_list(
    tmp_path, capsys
):
    """A run stopped as it started (Ctrl-C while NNI's manager started) leaves an experiment without any trial:
    `hpo trials` there lists nothing, so `best` and `export` point at `hpo status`, which says it is stopped."""
    db_file = tmp_path / "empty.db"
    write_pilot(db_file, "empty", {})
    capsys.readouterr()
    hint = "no trial has run (`hpo status empty` says where the experiment stands)"
    assert hpo(f"sqlite:///{db_file}", "best", "empty") == 1
    assert capsys.readouterr().err == f"experiment empty has no completed trial; {hint}\n"
    assert hpo(f"sqlite:///{db_file}", "export", "empty", "-o", str(tmp_path / "best.yaml")) != 0
    assert f"experiment empty has no completed trial to export; {hint}" in capsys.readouterr().err
    from hpo.engine.local import print_summary  # what `hpo run` prints as it ends
    from hpo.experiment import spec_from_stored

    with SqlStorage(f"sqlite:///{db_file}") as storage:
        record = storage.get_experiment_by_name("empty")
        print_summary(storage, record.id, spec_from_stored(record))
    out = capsys.readouterr().out
    assert "\nexperiment empty: no trial\n" in out and f"\nno trial completed; {hint}\n" in out, out


def test_a_run_directory_on_a_file_system_without_locks_is_used_with_a_note(tmp_path, capsys, monkeypatch):
    """Some network file systems refuse flock (ENOLCK): that is no other experiment holding the run directory, and
    the run goes on, saying that nothing guards the directory (it was refused as in use by "another experiment")."""
    import errno
    import fcntl

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    run_dir = tmp_path / "run"
    path = write(tmp_path / "e.yaml", small_preset(name="nolocks"))
    assert hpo(f"sqlite:///{tmp_path / 'hpo.db'}", "run", str(path), "--run-dir", str(run_dir), "--quiet") == 0
    err = capsys.readouterr().err
    assert f"note: --run-dir: the run directory {run_dir} cannot be locked here (No locks available)" in err
    assert experiments(tmp_path / "hpo.db") == ["nolocks"]


def test_a_scheduler_lost_mid_run_stops_the_experiment_with_exit_1_not_the_refusals_2(tmp_path, capsys, monkeypatch):
    """The Dask runner's loss of its scheduler mid-run (tests/hpo/runners/test_runners.py loses a real one, its
    running trial recorded interrupted) ended `hpo run` with 2, the code of a refusal before anything is written, and
    left the experiment as if its controller had died: it is stopped, exit 1, as other stops in the middle of a run
    (a script tells "resume it" from "fix the command")."""
    from hpo.engine import local as engine
    from hpo.errors import SchedulerLostError

    lost = "runner.scheduler: lost the Dask scheduler at tcp://head:8786 (the connection to it broke); ..."

    def scheduler_lost(study):
        raise SchedulerLostError(lost)

    monkeypatch.setattr(engine.Study, "run", scheduler_lost)
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    path = write(tmp_path / "lost.yaml", small_preset(name="lost"))
    assert hpo(url, "run", str(path), "--run-dir", str(tmp_path / "run"), "--quiet") == 1
    assert f"error: {lost}" in capsys.readouterr().err
    with SqlStorage(url) as storage:
        assert storage.get_experiment_by_name("lost").status.value == "stopped"
