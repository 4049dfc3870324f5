"""Query strings held to what each route declares (server.query): an unknown key or a repeated single-valued one is
a 422 naming it, where FastAPI alone would ignore the first and keep the last value of the second. Against the
finished tiny experiment, the API on a real uvicorn server in this process."""

from __future__ import annotations

import pytest

from tests.server.conftest import EXPERIMENT, api_in_process

ARM = "optimizer.name=lamb"


@pytest.fixture(scope="module")
def api(database_url):
    with api_in_process(database_url) as client:
        yield client


def issues(answer) -> list[tuple[str, str]]:
    assert answer.status_code == 422, answer.text
    return [(issue["loc"][1], issue["type"]) for issue in answer.json()["detail"]]


def test_a_mistyped_filter_is_a_422_naming_it_and_the_keys_the_endpoint_takes(api):
    answer = api.get("/experiments", params={"status": "live"})  # the list takes no status filter
    assert issues(answer) == [("status", "unknown")]
    assert answer.json()["detail"][0]["msg"] == "unknown query parameter 'status': this endpoint takes offset, limit"
    assert issues(api.get(f"/experiments/{EXPERIMENT}/trials", params={"stat": "failed"})) == [("stat", "unknown")]
    message = api.get("/health", params={"verbose": "1"}).json()["detail"][0]["msg"]
    assert message == "unknown query parameter 'verbose': this endpoint takes no query parameters"
    assert api.head("/experiments", params={"status": "live"}).status_code == 422  # HEAD answers as GET


def test_a_single_valued_key_given_twice_is_a_422_not_its_last_value(api):
    answer = api.get(f"/experiments/{EXPERIMENT}/export", params=[("arm", "optimizer.name=adamw"), ("arm", ARM)])
    assert answer.json()["detail"] == [{
        "loc": ["query", "arm"], "type": "repeated",
        "msg": f"arm is given 2 times (arm=optimizer.name=adamw&arm={ARM}): it takes one value; ask each with a "
               "request of its own",
    }]  # fmt: skip
    assert issues(api.get("/experiments", params=[("limit", 1), ("limit", 2)])) == [("limit", "repeated")]
    both = api.get("/experiments", params=[("limit", 1), ("limit", 2), ("sort", "name")])
    assert issues(both) == [("limit", "repeated"), ("sort", "unknown")]  # every key at once, in the query's order


def test_keys_the_endpoint_takes_still_answer_and_lists_may_repeat(api):
    assert api.get("/experiments", params={"offset": 0, "limit": 1}).status_code == 200
    states = api.get(f"/experiments/{EXPERIMENT}/trials", params=[("state", "completed"), ("state", "diverged")])
    assert states.status_code == 200, states.text
    assert {trial["state"] for trial in states.json()["items"]} <= {"completed", "diverged"}
    assert api.get(f"/experiments/{EXPERIMENT}/export", params={"arm": ARM, "format": "json"}).status_code == 200
    compare = api.get("/reports/compare", params=[("name", EXPERIMENT), ("name", EXPERIMENT)])
    assert compare.status_code != 422, compare.text  # `name` repeats by design (whatever the page says of twins)


def test_on_every_read_exactly_the_list_parameters_may_repeat(api):
    """Every GET of the OpenAPI document, each of its query keys given twice: a 422 naming the key where the document
    says it takes one value, and none about repeating where it takes a list (the state filter, the compared
    experiments); a key no endpoint takes is refused on each."""
    schema = api.get("/openapi.json").json()
    seen = set()
    for path, operations in schema["paths"].items():
        if "get" not in operations:
            continue
        url = path.removeprefix("/api/v1").replace("{name}", EXPERIMENT).replace("{number}", "0") or "/"
        base = "" if path.startswith("/api/v1") else str(api.base_url).removesuffix("/api/v1")
        for param in operations["get"].get("parameters", []):
            if param["in"] != "query":
                continue
            key, many = param["name"], "array" in str(param["schema"])
            answer = api.get(base + url, params=[(key, "1"), (key, "1")])
            said = issues(answer) if answer.status_code == 422 and isinstance(answer.json()["detail"], list) else []
            said = [issue for issue in said if issue[1] in ("repeated", "unknown")]
            assert said == ([] if many else [(key, "repeated")]), (path, key, answer.text)
            seen.add((path, key, many))
        assert issues(api.get(base + url, params={"zzz": "1"})) == [("zzz", "unknown")], path
    assert {(path, key) for path, key, many in seen if many} == {
        ("/api/v1/experiments/{name}/trials", "state"),
        ("/api/v1/reports/compare", "name"),
    }
    assert len(seen) > 25  # every read's keys were tried
