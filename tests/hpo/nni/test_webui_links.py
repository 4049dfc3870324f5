"""The NNI web UI's addresses are stored with an `engine: nni` experiment (per arm, and per resume of an arm), its
report links to them and `hpo status` names them by arm; no NNI manager runs here (the run directory's list of NNI
experiments is written as the engine writes it)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from hpo.experiment import experiment_from_dict, stored_form
from hpo.nni.config import nni_home
from hpo.nni.jobs import record_webui
from hpo.nni.manager import NniExperiment, load_experiments
from hpo.report.html import experiment_report
from hpo.storage import SqlStorage
from tests.hpo.nni.conftest import make_nni_spec, nni_experiment_data

SPACE = {"optimizer.name": {"choice": ["adamw", "lamb"]}, "optimizer.lr": {"float": [1e-4, 1e-2], "log": True}}
ADAMW, LAMB = "optimizer.name=adamw", "optimizer.name=lamb"


def write_nni_experiments(run_dir: Path, experiments: list[NniExperiment]) -> None:
    """`<run dir>/nni/experiments.json` as `hpo.nni.manager` keeps it."""
    nni_home(run_dir).mkdir(parents=True)
    (nni_home(run_dir) / "experiments.json").write_text(json.dumps([asdict(e) for e in experiments]))


def test_each_nni_experiments_web_ui_is_stored_and_linked_from_the_report(tmp_path):
    spec = make_nni_spec(tmp_path, "nni_tpe", trials=4, parallel=2, space=SPACE, compare=["optimizer.name"])
    storage = SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}", upgrade=True)
    run_dir = tmp_path / "run"
    eid = storage.create_experiment(spec.name, stored_form(spec, run_dir), spec.direction)
    write_nni_experiments(run_dir, [  # by arm, as the engine keeps them
        NniExperiment(0, ADAMW, "hpo1-arm0", port=18080),
        NniExperiment(0, ADAMW, "hpo1-arm0-r1", port=18082),  # the arm, resumed
        NniExperiment(1, LAMB, "hpo1-arm1", port=18081, host=None),  # every interface: the machine's name
        NniExperiment(1, LAMB, "hpo1-arm1-r1"),  # never served (no port): no link
    ])  # fmt: skip
    lamb_url = load_experiments(run_dir)[2].url
    assert lamb_url.endswith(":18081") and "127.0.0.1" not in lamb_url

    links = record_webui(storage, eid, run_dir)
    assert links == [
        {"arm": ADAMW, "nni_experiment": "hpo1-arm0", "url": "http://127.0.0.1:18080"},
        {"arm": ADAMW, "nni_experiment": "hpo1-arm0-r1", "url": "http://127.0.0.1:18082"},
        {"arm": LAMB, "nni_experiment": "hpo1-arm1", "url": lamb_url},
    ]
    record = storage.get_experiment(eid)
    assert record.nni_webui == links
    assert record.spec["experiment"] == spec.self_contained()  # the definition stays as created

    page = experiment_report(storage, spec.name)
    for link in links:
        assert f'<a data-field=nni_webui href="{link["url"]}">{link["url"]}</a> (NNI experiment ' in page
    assert f"{ADAMW}: <a data-field=nni_webui" in page and f"{LAMB}: <a data-field=nni_webui" in page
    assert "hpo1-arm1-r1" not in page
    assert "<code>hpo webui nniexp</code>" in page

    # `hpo webui` reopens the web UI elsewhere: storing again replaces the links
    write_nni_experiments(tmp_path / "elsewhere", [NniExperiment(0, ADAMW, "hpo1-arm0", port=18090)])
    record_webui(storage, eid, tmp_path / "elsewhere")
    assert [link["url"] for link in storage.get_experiment(eid).nni_webui] == ["http://127.0.0.1:18090"]
    assert "http://127.0.0.1:18080" not in experiment_report(storage, spec.name)


def test_an_experiment_of_the_local_engine_has_no_web_ui_link(tmp_path):
    data = nni_experiment_data(tmp_path, "random", trials=2, parallel=1, options={})
    data["engine"] = "local"
    spec = experiment_from_dict(data, "exp.yaml", base_dir=tmp_path)
    storage = SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}", upgrade=True)
    eid = storage.create_experiment(spec.name, stored_form(spec, tmp_path / "run"), spec.direction)
    assert storage.get_experiment(eid).nni_webui == []
    assert "NNI web UI" not in experiment_report(storage, spec.name)


def test_an_nni_experiment_whose_start_was_stopped_before_nni_made_it_is_left_out_of_the_web_ui(tmp_path):
    """Ctrl-C as an arm's NNI experiment started left it in experiments.json without NNI's own record: `hpo webui`
    then failed on it ("Experiment hpo17-arm0 does not exist thus cannot be viewed") and opened none of the others,
    even after a resume had run the experiment to its end. It is left out; the made ones are viewed."""
    from hpo.nni.manager import created, view

    run_dir = tmp_path / "run"
    write_nni_experiments(run_dir, [NniExperiment(0, ADAMW, "hpo17-arm0")])  # never made: no NNI directory
    assert not created(run_dir, "hpo17-arm0")
    assert view(run_dir, 18090) == []  # nothing launched: NNI would refuse it
    (nni_home(run_dir) / "nni-experiments" / "hpo17-arm0").mkdir(parents=True)
    assert created(run_dir, "hpo17-arm0")


def test_status_names_each_arm_once_with_its_latest_nni_experiment_and_its_earlier_ones(tmp_path, capsys):
    """`hpo status` listed one `arm: URL` per NNI experiment the arm ever started (its first start, the one a resume
    started in its place, its confirmation rounds), without their NNI ids: after a stop during the second arm's
    tuning and `hpo resume`, "optimizer.name=lamb: http://127.0.0.1:18100" three times, as each arm's NNI
    experiments took the first port in turn. Each arm is named once, with its latest NNI experiment's address and
    id and its earlier ones' ids, as `hpo webui` names them; their own addresses once `hpo webui` serves each."""
    from hpo.cli.main import main
    from hpo.nni.jobs import new_nni_id
    from hpo.nni.manager import _save

    spec = make_nni_spec(tmp_path, "nni_random", trials=4, parallel=2, space=SPACE, compare=["optimizer.name"])
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    storage = SqlStorage(url, upgrade=True)
    run_dir = tmp_path / "run"
    eid = storage.create_experiment(spec.name, stored_form(spec, run_dir), spec.direction)
    nni_home(run_dir).mkdir(parents=True)
    # the starts in the order the engine made them: `hpo run` (stopped during lamb's tuning), then `hpo resume`;
    # each manager was stopped before the next started, so every one took the first port
    for arm, label, confirmation in [(0, ADAMW, False), (1, LAMB, False),  # hpo run
                                     (1, LAMB, False), (0, ADAMW, True), (1, LAMB, True)]:  # fmt: skip
        started = NniExperiment(arm, label, new_nni_id(run_dir, eid, arm, confirmation), confirmation=confirmation)
        started.port = 18100
        _save(run_dir, started)  # as `start_experiment` records it
        record_webui(storage, eid, run_dir)

    def webui_lines() -> list[str]:
        assert main(["--db", url, "status", spec.name]) == 0
        lines = capsys.readouterr().out.splitlines()
        return [line for line in lines if "NNI" in line or line.startswith("  ")]

    assert webui_lines() == [
        "NNI web UI, where last served (each answers while the experiment runs it; `hpo webui nniexp` reopens them "
        "all):",
        f"  {ADAMW}: http://127.0.0.1:18100 (NNI experiment hpo1-arm0-confirm1; earlier: hpo1-arm0)",
        f"  {LAMB}: http://127.0.0.1:18100 (NNI experiment hpo1-arm1-confirm1; earlier: hpo1-arm1, hpo1-arm1-r1)",
    ]

    # `hpo webui` serves every one of them on a port of its own (`view`), in the list's order
    for port, reopened in enumerate(load_experiments(run_dir), start=18100):
        reopened.port = port
        _save(run_dir, reopened)
    record_webui(storage, eid, run_dir)
    assert webui_lines()[1:] == [
        f"  {ADAMW}: http://127.0.0.1:18101 (NNI experiment hpo1-arm0-confirm1; earlier: hpo1-arm0 at :18100)",
        f"  {LAMB}: http://127.0.0.1:18104 (NNI experiment hpo1-arm1-confirm1; earlier: hpo1-arm1 at :18102, "
        "hpo1-arm1-r1 at :18103)",
    ]
