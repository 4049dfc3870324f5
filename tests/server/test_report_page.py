"""The report pages from the running API (`hpo serve` in a subprocess) over the tiny experiment of
tests/hpo/test_report.py, and the same page in headless Chromium: it renders, every image loads, and no request
leaves the machine (requests to other hosts are recorded and failed unsent by scripts/report_screenshot.py).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.hpo.test_report import EXPERIMENT, Page, make_report_experiment
from tests.server.conftest import Server, start_server, stop_server

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import report_screenshot  # noqa: E402

NO_CHROMIUM = "headless Chromium is not installed (/usr/bin/chromium); `make system-deps` installs it"


@pytest.fixture(scope="module")
def report_server(tmp_path_factory) -> Iterator[Server]:
    running = start_server(make_report_experiment(tmp_path_factory), tmp_path_factory.mktemp("report-server"))
    yield running
    stop_server(running)


def root(server: Server) -> str:
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
        assert api.get("/reports/compare").status_code == 422
        assert api.get("/reports/compare", params={"name": ["Bad Name!"]}).status_code == 422
        compare = api.get("/reports/compare", params={"name": [EXPERIMENT]}, timeout=60)
        assert compare.status_code == 200
        assert f"href='/api/v1/experiments/{EXPERIMENT}/report'" in compare.text


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
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(shutil.which("chromium") is None, reason=NO_CHROMIUM)
def test_the_chromium_check_catches_a_broken_image_and_an_outside_request(tmp_path):
    page_file = tmp_path / "bad.html"
    page_file.write_text("<title>bad</title><img alt=outside src='http://203.0.113.9/x.png'>")
    page = report_screenshot.render(page_file.as_uri())
    assert page.broken_images == ["outside"]
    assert page.external_requests == ["http://203.0.113.9/x.png"]
