"""The report pages from the running API (on a real uvicorn server in the test's process: tests/server/conftest.py's
api_in_process) over the tiny experiment of tests/hpo/report/test_report.py, and the same page in headless Chromium:
it renders, every image loads, and no request leaves the machine (requests to other hosts are recorded and failed
unsent by scripts/report_screenshot.py). The experiment's JSON carries the same verdict, and the API docs page
renders offline.
"""

from __future__ import annotations

import html
import re
import shlex
import shutil
import statistics
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from hpo.cli.main import main as hpo_main
from hpo.storage import SqlStorage
from tests.hpo.evidence.independent import arm_evidence
from tests.hpo.report.test_report import EXPERIMENT, TARGET, Page, expected_evidence, make_report_experiment
from tests.server.conftest import api_in_process

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import report_screenshot  # noqa: E402

NO_CHROMIUM = "headless Chromium is not installed (/usr/bin/chromium); `make system-deps` installs it"


@dataclass
class Served:
    url: str  # http://127.0.0.1:PORT/api/v1
    database_url: str

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30)


@pytest.fixture(scope="module")
def report_server(tmp_path_factory) -> Iterator[Served]:
    database_url = make_report_experiment(tmp_path_factory)
    with api_in_process(database_url) as api:
        yield Served(str(api.base_url).rstrip("/"), database_url)


def root(server: Served) -> str:
    return server.url.removesuffix("/api/v1")


def test_index_links_every_experiment_to_its_report(report_server):
    page = httpx.get(root(report_server) + "/", timeout=30)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    link = f"/api/v1/experiments/{EXPERIMENT}/report"
    assert f"href='{link}'" in page.text
    report = httpx.get(root(report_server) + link, timeout=60)
    assert report.status_code == 200 and report.headers["content-type"].startswith("text/html")
    cells = Page(report.text).cells
    assert cells[("optimizer.name=lamb", "tuning")] == "1"
    assert 'href="/"' in report.text  # back to the list


def test_report_endpoints_answer_404_and_422_for_bad_names(report_server):
    with report_server.client() as api:
        assert api.get("/experiments/nope/report").status_code == 404
        assert api.get("/reports/compare", params={"name": ["nope"]}).status_code == 404
        nothing = api.get("/reports/compare")  # the index page's form sent with nothing ticked: a page, not JSON
        assert nothing.status_code == 422 and nothing.headers["content-type"].startswith("text/html")
        assert "<h1>Nothing to compare</h1>" in nothing.text and "href='/'" in nothing.text
        assert api.get("/reports/compare", params={"name": ["Bad Name!"]}).status_code == 422
        compare = api.get("/reports/compare", params={"name": [EXPERIMENT]}, timeout=60)
        assert compare.status_code == 200
        assert f"href='/api/v1/experiments/{EXPERIMENT}/report'" in compare.text
        assert "<h1>Batch sizes of one experiment</h1>" in compare.text  # not "Comparing 1 experiments"


def test_trial_curve_from_the_api_carries_the_noise_scale(report_server):
    with report_server.client() as api:
        curves = [api.get(f"/experiments/{EXPERIMENT}/trials/{n}/metrics").json() for n in range(6)]
    names = {name for curve in curves for point in curve["points"] for name in point["values"]}
    assert {"noise_scale", "grad_sq_norm_small", "grad_sq_norm_big", "mlm_accuracy"} <= names


@pytest.mark.skipif(shutil.which("chromium") is None, reason=NO_CHROMIUM)
def test_report_renders_in_headless_chromium_with_every_image_and_no_request_leaving(report_server, tmp_path):
    shot = tmp_path / "report.png"
    page = report_screenshot.render(f"{root(report_server)}/api/v1/experiments/{EXPERIMENT}/report", shot)
    assert page.title == f"{EXPERIMENT}: comparison report"
    assert len(page.images) == 5 and page.broken_images == []
    assert page.requests and page.external_requests == []
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and page.width == 1300  # nothing runs past the window


@pytest.mark.skipif(shutil.which("chromium") is None, reason=NO_CHROMIUM)
def test_a_table_of_long_arm_labels_fits_the_window_and_a_wider_one_scrolls_inside_the_page(tmp_path):
    """Arm labels are one long word (`optimizer.name=adamw,batch.global_batch_size=32`): the batch-size table ran
    past a 1,300-pixel window, cut off in a screenshot. A line breaks after each comma of a label, and a table that
    is wider still scrolls in its own box, so the page keeps the window's width."""
    from hpo.report.markup import html_table, page, tagged

    labels = [f"optimizer.name={o},batch.global_batch_size={b},clipping.strategy=bucketwise"
              for o in ("adamw", "lamb") for b in (32, 128)]  # fmt: skip
    rows = [tagged(label, label, [(f"f{i}", f"{1234567 * (i + 1):,}") for i in range(6)]) for label in labels]
    labelled = html_table(["arm", *(f"field {i}" for i in range(6))], rows)
    wide = html_table([f"field {i}" for i in range(40)], ["<td>1,234,567</td>" * 40])  # no break helps 40 numbers
    path = tmp_path / "tables.html"
    path.write_text(page("tables", labelled + wide))
    assert report_screenshot.render(path.as_uri(), width=900).width == 900


@pytest.mark.skipif(shutil.which("chromium") is None, reason=NO_CHROMIUM)
def test_the_chromium_check_catches_a_broken_image_and_an_outside_request(tmp_path):
    page_file = tmp_path / "bad.html"
    page_file.write_text("<title>bad</title><img alt=outside src='http://203.0.113.9/x.png'>")
    page = report_screenshot.render(page_file.as_uri())
    assert page.broken_images == ["outside"]
    assert page.external_requests == ["http://203.0.113.9/x.png"]


def stored_evidence(url: str, trials, label: str) -> tuple[int, list[float]]:
    """(runs, samples to target of the hits) of one arm, computed here from the stored trials and curves
    (tests/hpo/evidence/independent.py): the confirmation runs of its best tuning trial."""
    with SqlStorage(url) as storage:
        _, runs, hits = arm_evidence(storage, trials, label, TARGET)
    return len(runs), hits


def test_experiment_json_carries_the_verdict_the_cli_prints(report_server, capsys):
    with SqlStorage(report_server.database_url) as storage:
        trials = storage.list_trials(storage.get_experiment_by_name(EXPERIMENT).id)
    verdict = httpx.get(f"{report_server.url}/experiments/{EXPERIMENT}", timeout=30).json()["verdict"]
    assert [a["label"] for a in verdict["arms"]] == ["optimizer.name=adamw", "optimizer.name=lamb"]
    assert verdict["confirm_seeds"] == 3
    for arm in verdict["arms"]:
        runs, hits = stored_evidence(report_server.database_url, trials, arm["label"])
        assert (arm["runs"], arm["reached_target"]) == (runs, len(hits))
        assert arm["hit_rate"] == (pytest.approx(len(hits) / runs) if runs else None)
        assert arm["samples_to_target_mean"] == (pytest.approx(statistics.fmean(hits)) if hits else None)
        if len(hits) >= 2:  # the report test's interval (a spread of at least one evaluation interval's resolution
            # where the evaluations did not tell the runs apart)
            interval = expected_evidence(trials, arm["label"], report_server.database_url)[4]
            assert arm["interval_95"] == pytest.approx(list(interval), rel=1e-9)
        else:
            assert arm["interval_95"] is None
    assert any(a["interval_95"] for a in verdict["arms"])  # the data has an interval to check, not only empty arms

    capsys.readouterr()
    assert hpo_main(["--db", report_server.database_url, "best", EXPERIMENT, "--per-arm"]) == 0  # in this process
    cli = capsys.readouterr()
    printed = yaml.safe_load(cli.out)
    assert f"# verdict: {verdict['line']}" in cli.out.splitlines()  # the same Verdict as the CLI's
    assert verdict["lines"][-1] == f"verdict: {verdict['line']}" and (verdict["winner"] is None) == (
        verdict["outcome"] != "winner"
    )
    assert printed["verdict"] == {k: verdict[k] for k in printed["verdict"]}  # the same fields in the YAML
    for arm in verdict["arms"]:
        if arm["label"] in printed:
            evidence = printed[arm["label"]]["evidence"]
            assert evidence["runs"] == arm["runs"] and evidence["reached_target"] == arm["reached_target"]
            assert evidence["interval_95"] == arm["interval_95"]


def test_the_export_command_on_the_report_page_reads_the_servers_database(report_server, tmp_path, monkeypatch,
                                                                          capsys):  # fmt: skip
    page = httpx.get(f"{report_server.url}/experiments/{EXPERIMENT}/report", timeout=60).text
    commands = [html.unescape(c) for c in re.findall(r"<pre data-field=export[^>]*>([^<]*)</pre>", page)]
    assert len(commands) == 2, commands  # one per arm
    # Run as written (`hpo` in this process) from a directory with no database of its own and no HPO_DATABASE_URL.
    monkeypatch.delenv("HPO_DATABASE_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    for command in commands:
        words = shlex.split(command)
        assert words[:3] == ["hpo", "--db", report_server.database_url] and words[3] == "export", command
        assert hpo_main(words[1:]) == 0, capsys.readouterr().err
        assert (tmp_path / words[-1]).exists()


@pytest.mark.skipif(shutil.which("chromium") is None, reason=NO_CHROMIUM)
def test_api_docs_render_in_headless_chromium_with_no_request_leaving(report_server):
    page = report_screenshot.render(f"{root(report_server)}/api/v1/docs")
    assert page.title == "BERT optimizer HPO - API documentation"
    assert page.external_requests == []
    assert any(url.endswith("/api/v1/openapi.json") for url in page.requests), page.requests  # Swagger UI ran


def test_each_arms_export_command_of_a_batch_size_study_writes_a_file_of_its_own(tmp_path, monkeypatch, capsys):
    """The report of a study comparing optimizer and batch size showed `-o best-8.yaml` for both optimizers at batch
    8 (the file name took the last compare value only): run one after the other, the second replaced the first.
    Each command, run as the page shows it, now leaves a file holding its own arm's optimizer and batch size."""
    from hpo.experiment import stored_form
    from hpo.trials import TrialResult, TrialSpec, TrialState
    from tests.hpo.engine.test_study import make_spec

    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    spec = make_spec(tmp_path, name="batch-study", trials=4, compare=("optimizer.name", "batch.global_batch_size"),
                     space={"optimizer.name": {"choice": ["adamw", "lamb"]},
                            "batch.global_batch_size": {"choice": [8, 16]}})  # fmt: skip
    with SqlStorage(url, upgrade=True) as storage:
        eid = storage.create_experiment(spec.name, stored_form(spec, tmp_path / "run"), spec.direction)
        for optimizer in ("adamw", "lamb"):
            for batch in (8, 16):
                params = {"optimizer.name": optimizer, "batch.global_batch_size": batch}
                arm = f"optimizer.name={optimizer},batch.global_batch_size={batch}"
                trial = storage.create_trial(eid, TrialSpec(None, params, arm=arm, global_batch_size=batch))
                storage.mark_trial_running(trial)
                storage.finish_trial(trial, TrialResult(TrialState.COMPLETED, objective=32.0, samples_to_target=32,
                                                        best_mlm_accuracy=0.03))  # fmt: skip
    with api_in_process(url) as api:  # the page the server renders
        page = api.get("/experiments/batch-study/report").text
    shown = re.findall(r"<pre data-field=export data-arm='([^']*)'>([^<]*)</pre>", page)
    commands = {html.unescape(arm): shlex.split(html.unescape(command)) for arm, command in shown}
    assert len(commands) == 4 and len({words[-1] for words in commands.values()}) == 4, commands
    runs = tmp_path / "exports"
    runs.mkdir()
    monkeypatch.chdir(runs)
    for words in commands.values():  # one after another, as a reader copies them (`hpo` in this process)
        assert hpo_main(words[1:]) == 0, capsys.readouterr().err
    for arm, words in commands.items():
        config = yaml.safe_load((runs / words[-1]).read_text())
        values = dict(part.split("=") for part in arm.split(","))
        assert config["optimizer"]["name"] == values["optimizer.name"], (arm, words[-1])
        assert config["batch"]["global_batch_size"] == int(values["batch.global_batch_size"]), (arm, words[-1])
