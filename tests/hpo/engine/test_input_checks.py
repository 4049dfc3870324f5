"""Inputs of a run refused with an error naming where they came from, before anything is written: HPO_HEARTBEAT_S
that is not a number of seconds, GPUs asked for on a machine without any (naming the experiment file), and the
output directories of `hpo report` (checked before any page is written)."""

from __future__ import annotations

import pytest

from hpo.cli.main import main
from hpo.engine.liveness import check_heartbeat_env, heartbeat_interval_s
from hpo.errors import HpoError, ResourceError
from hpo.experiment import load_experiment
from hpo.runners import build_runner
from tests.hpo.experiment.test_experiment import make_experiment, write_experiment
from tests.hpo.report.test_report_edges import ADAMW, LAMB, add_trial
from tests.hpo.report.test_report_edges import make_experiment as recorded_experiment


# ------------------------------------------------------------------------------------------------ HPO_HEARTBEAT_S
@pytest.mark.parametrize("value", ["abc", "0", "-2", "inf", "nan"])
def test_a_heartbeat_interval_that_is_not_seconds_is_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv("HPO_HEARTBEAT_S", value)
    expected = (f"HPO_HEARTBEAT_S={value!r}: expected the seconds between the controller's heartbeats, a number > 0 "
                "(default 5); unset it for the default")  # fmt: skip
    with pytest.raises(HpoError) as err:
        check_heartbeat_env()
    assert str(err.value) == expected


@pytest.mark.parametrize(("value", "seconds"), [(None, 5.0), ("", 5.0), ("2", 2.0), (" 0.5 ", 0.5), ("0.01", 0.1)])
def test_a_heartbeat_interval_of_seconds_is_taken(monkeypatch, value, seconds):
    if value is None:
        monkeypatch.delenv("HPO_HEARTBEAT_S", raising=False)
    else:
        monkeypatch.setenv("HPO_HEARTBEAT_S", value)
    check_heartbeat_env()
    assert heartbeat_interval_s() == seconds


# ------------------------------------------------------------------------------------------------ resources.gpus
def test_gpus_asked_for_on_a_machine_without_any_names_the_experiment_file(tmp_path, monkeypatch):
    monkeypatch.setattr("hpo.runners.local.discover_gpus", lambda: [])
    path = write_experiment(tmp_path, make_experiment(resources={"gpus": "all"}))
    spec = load_experiment(path)
    with pytest.raises(ResourceError) as err:
        build_runner(spec)
    assert str(err.value).startswith(f"{path}: resources.gpus is 'all' but this machine has no GPU (NVML sees none")


# ------------------------------------------------------------------------------------------------ hpo report
def test_report_refuses_a_page_name_given_as_its_output_directory_and_makes_nothing(tmp_path, capsys):
    """`hpo report NAME -o r.html` made a directory r.html holding NAME.html: -o names the directory, and a name
    ending as a page's is refused before anything is written (an existing directory of that name is taken)."""
    storage, eid, url = recorded_experiment(tmp_path)
    add_trial(storage, eid, ADAMW, "reached")
    assert main(["--db", url, "report", "edge", "-o", str(tmp_path / "r.html")]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: hpo report -o {tmp_path / 'r.html'}: names a file, but -o is the directory the "
                            f"pages are written in (NAME.html), made where missing; give a directory (e.g. -o "
                            f"{tmp_path / 'reports'})")  # fmt: skip
    assert not (tmp_path / "r.html").exists()
    (tmp_path / "r.html").mkdir()
    assert main(["--db", url, "report", "edge", "-o", str(tmp_path / "r.html")]) == 0
    assert (tmp_path / "r.html" / "edge.html").is_file()


@pytest.mark.parametrize(
    ("png", "why"),
    [
        ("afile", "is a file, not a directory"),
        ("afile/sub", "cannot be created (Not a directory)"),
        ("html/edge.html", "is where the page edge.html is written"),
    ],
)
def test_report_refuses_a_png_directory_it_cannot_use_before_writing_any_page(tmp_path, capsys, png, why):
    storage, eid, url = recorded_experiment(tmp_path)
    add_trial(storage, eid, ADAMW, "reached")
    add_trial(storage, eid, LAMB, "reached")
    (tmp_path / "afile").write_text("kept")
    assert main(["--db", url, "report", "edge", "-o", str(tmp_path / "html"), "--png", str(tmp_path / png)]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: hpo report --png {tmp_path / png}: {why}; give a directory that is not a file")
    assert not (tmp_path / "html").exists() and (tmp_path / "afile").read_text() == "kept"  # nothing written
