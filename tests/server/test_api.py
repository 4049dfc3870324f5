"""Every endpoint of the API against a real `hpo serve`, over what a real `hpo run` stored; the expected values
are read from the database through the storage, independently of the server."""

from __future__ import annotations

import math
import re
import shlex
from collections import defaultdict

import httpx
import pytest
import yaml

from hpo.experiment import experiment_from_dict, stored_form
from hpo.experiment.arms import trial_config
from hpo.export.production import MLPERF_LOG
from hpo.storage import SqlStorage
from hpo.storage.base import NNI_WEBUI_KEY
from hpo.trials import TrialState
from tests.hpo.nni.conftest import make_nni_spec
from tests.server.conftest import EXPERIMENT, TOKEN, api_in_process


@pytest.fixture(scope="module")
def stored(database_url):
    """(storage, experiment record, trials by number) read straight from the database."""
    storage = SqlStorage(database_url)
    record = storage.get_experiment_by_name(EXPERIMENT)
    yield storage, record, {t.number: t for t in storage.list_trials(record.id)}
    storage.close()


def expected_best(trials, arm=None):
    """The best trial by the storage contract, computed here: lowest objective among completed, ties by number."""
    completed = [t for t in trials.values() if t.state is TrialState.COMPLETED and (arm is None or t.arm == arm)]
    return min(completed, key=lambda t: (t.objective, t.number))


def test_health_openapi_and_docs(api):
    health = api.get("/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    schema = api.get("/openapi.json").json()
    assert schema["info"]["title"] and all(path.startswith("/api/v1/") for path in schema["paths"])
    assert "/api/v1/experiments/{name}/export" in schema["paths"]
    docs = api.get("/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()


def test_docs_page_loads_only_assets_this_server_serves(api, server):
    page = api.get("/docs").text
    urls = re.findall(r"""(?:src|href)=["']([^"']+)["']|url: *'([^']+)'""", page)
    urls = [a or b for a, b in urls]
    assert len(urls) == 4 and all(u.startswith("/api/v1/") for u in urls), urls  # js, css, icon, openapi.json
    root = server.url.removesuffix("/api/v1")
    for url in urls:
        answer = httpx.get(root + url, timeout=30)
        assert answer.status_code == 200 and len(answer.content) > 1000, url
    script = httpx.get(root + next(u for u in urls if u.endswith(".js")), timeout=30).text
    assert "SwaggerUIBundle" in script  # the real bundle, which reads OpenAPI 3.1
    assert api.get("/openapi.json").json()["openapi"].startswith("3.1")


def test_openapi_documents_the_error_bodies_of_every_route(api):
    schema = api.get("/openapi.json").json()
    components = schema["components"]["schemas"]

    def body(response: dict) -> dict:
        ref = response["content"]["application/json"]["schema"]["$ref"]
        return components[ref.rsplit("/", 1)[1]]

    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            codes = {"503"} if path.endswith("/health") else {"404", "422", "503"}
            assert codes <= set(operation["responses"]), (method, path)
            for code in codes:
                assert "detail" in body(operation["responses"][code])["properties"], (method, path, code)
    assert body(schema["paths"]["/api/v1/experiments/{name}"]["get"]["responses"]["404"])["required"] == ["detail"]
    invalid = body(schema["paths"]["/api/v1/experiments"]["get"]["responses"]["422"])["properties"]["detail"]
    assert {"type": "string"} in invalid["anyOf"]  # our own message, or FastAPI's list of invalid parameters
    # What the server answers fits: a 422 from a bad parameter and one from the export, a 404.
    assert isinstance(api.get("/experiments", params={"limit": 0}).json()["detail"], list)
    assert isinstance(api.get(f"/experiments/{EXPERIMENT}/export", params={"gpus_per_node": 3}).json()["detail"], str)
    assert isinstance(api.get("/experiments/nope").json()["detail"], str)


def test_experiment_list_is_paged(api):
    page = api.get("/experiments").json()
    assert page["total"] == 1 and [e["name"] for e in page["items"]] == [EXPERIMENT]
    assert page["items"][0]["status"] == "finished" and page["items"][0]["trials_budget"] == 4
    assert api.get("/experiments", params={"offset": 1}).json()["items"] == []
    assert api.get("/experiments", params={"limit": 0}).status_code == 422
    assert api.get("/experiments", params={"offset": -1}).status_code == 422


def test_experiment_shows_status_counts_arms_and_best(api, stored):
    storage, record, trials = stored
    body = api.get(f"/experiments/{EXPERIMENT}").json()
    assert body["status"] == "finished" and body["stop_requested"] is False
    counts = defaultdict(int)
    for t in trials.values():
        counts[t.state.value] += 1
    assert {k: v for k, v in body["trials"].items() if v} == dict(counts)
    assert sum(body["trials"].values()) == 4 and counts["diverged"] >= 1  # the 1e4 learning rate diverges
    assert body["arms"] == ["optimizer.name=adamw", "optimizer.name=lamb"]
    assert body["best"]["trial"]["number"] == expected_best(trials).number
    for arm in body["arms"]:
        assert body["best_per_arm"][arm]["trial"]["number"] == expected_best(trials, arm).number
    assert body["nni_webui"] == []  # engine: local


def test_an_nni_experiment_links_its_web_ui_in_the_json_and_the_report(tmp_path):
    """The addresses the NNI engine stored (`hpo.nni.engine.record_webui`), as the API and its report page give
    them; documented in the OpenAPI schema (the API in the test's process)."""
    spec = make_nni_spec(tmp_path, "nni_tpe", trials=4, parallel=2)
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    storage = SqlStorage(url, upgrade=True)
    eid = storage.create_experiment(spec.name, stored_form(spec, tmp_path / "run"), spec.direction)
    links = [{"arm": None, "nni_experiment": "hpo1-arm0", "url": "http://127.0.0.1:18080"},
             {"arm": None, "nni_experiment": "hpo1-arm0-r1", "url": "http://127.0.0.1:18081"}]  # fmt: skip
    storage.annotate_experiment(eid, NNI_WEBUI_KEY, links)
    storage.set_experiment_status(eid, "finished")
    with api_in_process(url) as api:
        assert api.get(f"/experiments/{spec.name}").json()["nni_webui"] == links
        page = api.get(f"/experiments/{spec.name}/report").text
        schema = api.get("/openapi.json").json()["components"]["schemas"]
    for link in links:
        assert f'<a data-field=nni_webui href="{link["url"]}">' in page
    field = schema["ExperimentPublic"]["properties"]["nni_webui"]
    assert "NNI web UI" in field["description"] and field["items"]["$ref"].endswith("/NniWebUiPublic")
    assert set(schema["NniWebUiPublic"]["properties"]) == {"arm", "nni_experiment", "url"}
    assert "hpo webui" in schema["NniWebUiPublic"]["properties"]["url"]["description"]


def test_trials_paging_filters_and_ordering(api, stored):
    _, _, trials = stored
    url = f"/experiments/{EXPERIMENT}/trials"
    first, second = api.get(url, params={"limit": 3}).json(), api.get(url, params={"offset": 3, "limit": 3}).json()
    assert first["total"] == second["total"] == 4
    assert [t["number"] for t in first["items"] + second["items"]] == sorted(trials)

    diverged = [n for n, t in trials.items() if t.state is TrialState.DIVERGED]
    page = api.get(url, params={"state": "diverged"}).json()
    assert [t["number"] for t in page["items"]] == diverged and page["total"] == len(diverged)
    both = api.get(url, params=[("state", "diverged"), ("state", "completed")]).json()
    assert both["total"] == 4
    lamb = api.get(url, params={"arm": "optimizer.name=lamb"}).json()
    assert [t["number"] for t in lamb["items"]] == [n for n, t in trials.items() if t.arm == "optimizer.name=lamb"]
    unknown = api.get(url, params={"arm": "optimizer.name=sgd"})  # as `hpo trials --arm`: not an empty list
    assert unknown.status_code == 422 and "optimizer.name=sgd" in unknown.json()["detail"]
    assert "optimizer.name=adamw, optimizer.name=lamb" in unknown.json()["detail"]

    ranked = api.get(url, params={"order_by": "objective"}).json()["items"]
    expected = sorted(trials.values(), key=lambda t: (t.objective is None, t.objective or 0.0, t.number))
    assert [t["number"] for t in ranked] == [t.number for t in expected]

    assert api.get(url, params={"state": "sleeping"}).status_code == 422
    assert api.get(url, params={"order_by": "lr"}).status_code == 422
    assert api.get(url, params={"limit": 100_000}).status_code == 422


def test_one_trial(api, stored):
    _, _, trials = stored
    for number, record in trials.items():
        body = api.get(f"/experiments/{EXPERIMENT}/trials/{number}").json()
        assert body["params"] == record.params and body["arm"] == record.arm
        assert body["state"] == record.state.value and body["reason"] == record.reason
        assert body["gpus"] == list(record.gpus) == [] and body["host"] == record.host and body["pid"] == record.pid
        assert body["global_batch_size"] == 8
        assert body["result"]["objective"] == pytest.approx(record.objective)
        assert body["result"]["best_mlm_accuracy"] == pytest.approx(record.best_mlm_accuracy)
    missing = api.get(f"/experiments/{EXPERIMENT}/trials/99")
    assert missing.status_code == 404 and f"experiment {EXPERIMENT} has no trial number 99" in missing.json()["detail"]
    assert api.get(f"/experiments/{EXPERIMENT}/trials/-1").status_code == 422
    assert api.get(f"/experiments/{EXPERIMENT}/trials/x").status_code == 422
    assert api.get("/experiments/nope/trials/0").status_code == 404


def test_trial_metrics_are_the_learning_curve(api, stored):
    storage, _, trials = stored
    curves = {n: storage.get_metrics(t.id) for n, t in trials.items()}
    number = max(curves, key=lambda n: len({r.step for r in curves[n]}))  # the longest curve
    rows = curves[number]
    curve = api.get(f"/experiments/{EXPERIMENT}/trials/{number}/metrics").json()
    assert len(curve["points"]) == len({r.step for r in rows}) >= 2
    for point in curve["points"]:
        mine = {r.name: None if math.isnan(r.value) else r.value for r in rows if r.step == point["step"]}
        assert point["values"] == pytest.approx(mine)
        assert point["loss"] == pytest.approx(mine.get("loss")) and point["time_s"] == mine.get("time_s")
        assert point["samples"] == next(r.samples for r in rows if r.step == point["step"])
    assert [p["samples"] for p in curve["points"]] == sorted(p["samples"] for p in curve["points"])
    assert any(p["mlm_accuracy"] is not None for p in curve["points"])  # evaluations are part of the curve
    assert api.get(f"/experiments/{EXPERIMENT}/trials/99/metrics").status_code == 404


def test_best_config_overall_per_arm_and_batch_size(api, stored):
    _, record, trials = stored
    spec = experiment_from_dict(record.spec["experiment"])
    best = api.get(f"/experiments/{EXPERIMENT}/best").json()
    winner = expected_best(trials)
    assert best["trial"]["number"] == winner.number and best["reached_target"] is True
    assert best["config"] == trial_config(spec, winner.params).model_dump(mode="json")
    lamb = api.get(f"/experiments/{EXPERIMENT}/best", params={"arm": "optimizer.name=lamb"}).json()
    assert lamb["trial"]["number"] == expected_best(trials, "optimizer.name=lamb").number
    assert lamb["config"]["optimizer"]["name"] == "lamb"
    same = api.get(f"/experiments/{EXPERIMENT}/best", params={"global_batch_size": 8}).json()
    assert same["trial"]["number"] == winner.number
    missing = api.get(f"/experiments/{EXPERIMENT}/best", params={"global_batch_size": 16})
    assert missing.status_code == 404 and "global batch size 16" in missing.json()["detail"]
    # It names the sizes the experiment has a best at, and how to ask for one, as the export does.
    sizes = sorted({t.global_batch_size for t in trials.values() if t.state is TrialState.COMPLETED})
    assert sizes == [8] and missing.json()["detail"].endswith("have global batch size 8: ask global_batch_size=8")
    exported = api.get(f"/experiments/{EXPERIMENT}/export", params={"global_batch_size": 16}).json()["detail"]
    assert missing.json()["detail"] == exported.replace(" to export;", " to show;")
    unknown = api.get(f"/experiments/{EXPERIMENT}/best", params={"arm": "optimizer.name=sgd"})
    assert unknown.status_code == 422 and "optimizer.name=lamb" in unknown.json()["detail"]

    per_arm = api.get(f"/experiments/{EXPERIMENT}/best/arms").json()
    assert {arm: b["trial"]["number"] for arm, b in per_arm.items()} == {
        arm: expected_best(trials, arm).number for arm in ("optimizer.name=adamw", "optimizer.name=lamb")
    }


def test_best_config_across_experiments(api, stored):
    _, _, trials = stored
    for optimizer in ("adamw", "lamb"):
        body = api.get("/best", params={"global_batch_size": 8, "optimizer": optimizer}).json()
        assert body["best"]["trial"]["number"] == expected_best(trials, f"optimizer.name={optimizer}").number
        assert body["best"]["config"]["optimizer"]["name"] == optimizer
        assert [c["experiment"] for c in body["candidates"]] == [EXPERIMENT]
    assert api.get("/best", params={"global_batch_size": 16, "optimizer": "lamb"}).status_code == 404
    assert api.get("/best", params={"global_batch_size": 8, "optimizer": "lamb", "metric": "best_mlm_accuracy"}
                   ).status_code == 404  # fmt: skip
    assert api.get("/best", params={"global_batch_size": 8}).status_code == 422
    assert api.get("/best", params={"global_batch_size": 8, "optimizer": "sgd"}).status_code == 422


def test_export_formats(api, stored):
    _, record, trials = stored
    spec = experiment_from_dict(record.spec["experiment"])
    winner = expected_best(trials)
    url = f"/experiments/{EXPERIMENT}/export"
    exported = api.get(url)
    assert exported.status_code == 200 and exported.headers["content-type"].startswith("application/yaml")
    expected = trial_config(spec, winner.params).model_dump(mode="json")
    expected["log"]["mlperf"] = MLPERF_LOG  # every export writes an MLPerf log
    assert yaml.safe_load(exported.text) == expected
    assert f"experiment {EXPERIMENT}" in exported.text and f"# trial {winner.number}, arm {winner.arm}" in exported.text
    as_json = api.get(url, params={"format": "json", "arm": "optimizer.name=lamb"}).json()
    assert as_json["provenance"]["trial"] == expected_best(trials, "optimizer.name=lamb").number
    assert as_json["config"]["optimizer"]["name"] == "lamb"
    command = api.get(url, params={"format": "torchrun", "nodes": 2, "gpus_per_node": 4, "config_path": "b.yaml"})
    line = command.text.strip().splitlines()[-1]
    assert line.startswith("torchrun --nnodes 2 --nproc_per_node 4 --rdzv_backend c10d")
    assert line.endswith("-m trainer --config b.yaml")
    assert api.get(url, params={"format": "xml"}).status_code == 422
    assert api.get(url, params={"nodes": 0}).status_code == 422
    uneven = api.get(url, params={"gpus_per_node": 3})  # 8 sequences do not split over 3 ranks
    assert uneven.status_code == 422  # named by the API's parameters, not only by hpo export's flags
    assert "the API's nodes and gpus_per_node" in uneven.json()["detail"]
    assert api.get(url, params={"arm": "optimizer.name=sgd"}).status_code == 422
    for bad in ("b\x85.yaml", "b\x96.yaml", "b\u2028.yaml", "b\u2029.yaml", "b\n.yaml", "b\x00.yaml", "b\x7f.yaml"):
        refused = api.get(url, params={"config_path": bad})
        assert refused.status_code == 422 and "config_path" in str(refused.json()["detail"]), bad
    not_utf8 = api.get(f"{url}?format=torchrun&config_path=b%C3.yaml")  # it ended `--config 'b\ufffd.yaml'`
    assert not_utf8.status_code == 422 and "config_path" in str(not_utf8.json()["detail"])
    quoted = api.get(url, params={"config_path": "my 'best' \"ü\".yaml"})
    assert quoted.status_code == 200 and yaml.safe_load(quoted.text) == yaml.safe_load(exported.text)
    run = next(line for line in quoted.text.splitlines() if line.startswith("# run: "))
    assert shlex.split(run.removeprefix("# run: "))[-1] == "my 'best' \"ü\".yaml"
    assert api.get("/experiments/nope/export").status_code == 404


def test_bad_names_are_404_or_422(api):
    assert api.get("/experiments/nope").status_code == 404
    assert "nope" in api.get("/experiments/nope").json()["detail"]
    assert api.get("/experiments/Not%20A%20Slug").status_code == 422
    nowhere = api.get("/nowhere")
    assert nowhere.status_code == 404
    assert nowhere.json()["detail"] == ("no endpoint at /api/v1/nowhere: the API's endpoints are listed at /api/v1/docs"
                                        " (an experiment's name never holds '/')")  # fmt: skip
    assert api.get("/experiments/a%2Fb").json()["detail"].startswith("no endpoint at /api/v1/experiments/a/b: ")


def test_head_answers_as_get_without_a_body(api):
    """HEAD, which every HTTP server must answer (RFC 9110: monitors and proxies send it), is GET's status and
    headers without the body."""
    paths = ("/health", "/experiments", f"/experiments/{EXPERIMENT}", f"/experiments/{EXPERIMENT}/trials",
             f"/experiments/{EXPERIMENT}/trials/0/metrics", f"/experiments/{EXPERIMENT}/best",
             f"/experiments/{EXPERIMENT}/export?format=torchrun", "/experiments/nope", "/openapi.json")  # fmt: skip
    for path in paths:
        got, head = api.get(path), api.head(path)
        assert head.status_code == got.status_code and head.content == b"", path
        for header in ("content-type", "content-length", "etag"):
            assert head.headers.get(header) == got.headers.get(header), (path, header)
    etag = api.get(f"/experiments/{EXPERIMENT}/best").headers["etag"]
    assert api.head(f"/experiments/{EXPERIMENT}/best", headers={"If-None-Match": etag}).status_code == 304
    refused = api.head(f"/experiments/{EXPERIMENT}/stop")  # POST only: still refused, and says what it allows
    assert refused.status_code == 405 and refused.headers["allow"] == "POST"


def test_stop_needs_the_token(api, server):
    url = f"/experiments/{EXPERIMENT}/stop"
    missing = api.post(url)
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    assert api.post(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert api.post(url, headers={"Authorization": f"Basic {TOKEN}"}).status_code == 401
    finished = api.post(url, headers={"Authorization": f"Bearer {TOKEN}"})
    assert finished.status_code == 409 and "finished" in finished.json()["detail"]
    assert api.post("/experiments/nope/stop", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 404
    log = (server.run_dir / f"server-{server.url.split(':')[2].split('/')[0]}.log").read_text()
    assert TOKEN not in log and "wrong" not in log  # neither the token nor what was offered is logged
