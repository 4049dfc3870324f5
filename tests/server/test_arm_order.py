"""The API lists a compare experiment's arms in the order its file declares them, as the commands do
(tests/hpo/cli/test_arm_order.py, whose experiment this reads: three clipping strategies declared neither
alphabetically nor in the order their trials were made): the experiment view (its arms, best trial per arm and
verdict), the best trial per arm and the report page."""

from __future__ import annotations

from fastapi.testclient import TestClient

from server.app import create_app
from server.settings import Settings
from tests.hpo.cli.test_arm_order import LABELS, NAME, html_arms, in_lines, named, store_experiment


def test_every_route_lists_the_arms_in_the_order_the_file_declares_them(tmp_path):
    url = store_experiment(tmp_path)
    with TestClient(create_app(Settings(database_url=url))) as client:
        view = client.get(f"/api/v1/experiments/{NAME}").json()
        per_arm = client.get(f"/api/v1/experiments/{NAME}/best/arms").json()
        page = client.get(f"/api/v1/experiments/{NAME}/report").text
    verdict = view["verdict"]
    assert view["arms"] == LABELS and list(view["best_per_arm"]) == LABELS
    assert [arm["label"] for arm in verdict["arms"]] == LABELS and list(verdict["runs_per_arm"]) == LABELS
    assert in_lines(verdict["lines"]) == LABELS and named(verdict["round"]) == LABELS, verdict
    assert list(per_arm) == LABELS
    fields = html_arms(page)
    assert fields and all(arms == LABELS for arms in fields.values()), fields
