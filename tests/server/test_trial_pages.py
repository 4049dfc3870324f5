"""Paging the trial list by key (`after`, `next`): over the finished tiny experiment against a real `hpo serve`, and
over an experiment that grows between page requests (the API in the test's process). Expected values are read
through the storage."""

from __future__ import annotations

import pytest

from hpo.storage import SqlStorage
from hpo.trials import TrialResult, TrialSpec, TrialState
from tests.server.conftest import EXPERIMENT, api_in_process

URL = f"/experiments/{EXPERIMENT}/trials"


@pytest.fixture(scope="module")
def numbers(database_url) -> list[int]:
    """The finished tiny experiment's trial numbers, read straight from the database."""
    with SqlStorage(database_url) as storage:
        return [trial.number for trial in storage.list_trials(storage.get_experiment_by_name(EXPERIMENT).id)]


def page_numbers(page: dict) -> list[int]:
    return [trial["number"] for trial in page["items"]]


def test_next_leads_from_the_first_page_to_the_last(api, numbers):
    assert len(numbers) == 4
    first = api.get(URL, params={"limit": 3}).json()
    assert page_numbers(first) == numbers[:3] and first["total"] == 4 and first["next"] == numbers[2]
    last = api.get(URL, params={"limit": 3, "after": first["next"]}).json()
    assert page_numbers(last) == numbers[3:] and last["next"] is None
    assert last["total"] is None  # no count over the experiment on pages asked with after

    halves = api.get(URL, params={"limit": 2}).json(), api.get(URL, params={"limit": 2, "after": numbers[1]}).json()
    assert [page["next"] for page in halves] == [numbers[1], None]  # null exactly at the end: no empty page to ask
    assert page_numbers(halves[0]) + page_numbers(halves[1]) == numbers
    assert api.get(URL, params={"after": numbers[-1]}).json() == {"items": [], "total": None, "offset": 0,
                                                                   "limit": 50, "next": None}  # fmt: skip


def test_offset_pages_still_work_and_carry_next_in_number_order(api, numbers):
    first, second = api.get(URL, params={"limit": 3}).json(), api.get(URL, params={"offset": 3, "limit": 3}).json()
    assert page_numbers(first) + page_numbers(second) == numbers
    assert first["total"] == second["total"] == 4 and (first["next"], second["next"]) == (numbers[2], None)
    # a client may switch from offset to cursor at any page
    assert page_numbers(api.get(URL, params={"after": first["next"]}).json()) == numbers[3:]
    ranked = api.get(URL, params={"order_by": "objective", "limit": 2}).json()
    assert ranked["total"] == 4 and ranked["next"] is None  # objective order pages with offset only


def test_the_cursor_keeps_the_filters(api, database_url, numbers):
    with SqlStorage(database_url) as storage:
        trials = storage.list_trials(storage.get_experiment_by_name(EXPERIMENT).id)
    lamb = [t.number for t in trials if t.arm == "optimizer.name=lamb"]
    first = api.get(URL, params={"arm": "optimizer.name=lamb", "limit": 1}).json()
    assert first["total"] == len(lamb) and page_numbers(first) == lamb[:1]
    rest = api.get(URL, params={"arm": "optimizer.name=lamb", "after": first["next"]}).json()
    assert page_numbers(rest) == lamb[1:] and rest["next"] is None
    finished = [t.number for t in trials if t.state in (TrialState.COMPLETED, TrialState.DIVERGED)]
    after = api.get(URL, params=[("state", "completed"), ("state", "diverged"), ("after", numbers[0])]).json()
    assert page_numbers(after) == [n for n in finished if n > numbers[0]]


def test_a_repeated_arm_is_a_422_naming_it_not_its_last_value(api):
    """`state` may repeat (the union); `arm` names one arm, and a second was silently dropped (the last one kept)."""
    both = [("arm", "optimizer.name=adamw"), ("arm", "optimizer.name=lamb")]
    answer = api.get(URL, params=both)
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"] == [{
        "loc": ["query", "arm"], "type": "repeated",
        "msg": "arm is given 2 times (arm=optimizer.name=adamw&arm=optimizer.name=lamb): it takes one value; ask each "
               "with a request of its own",
    }]  # fmt: skip
    assert api.get(URL, params=both[:1]).status_code == 200


def test_a_bad_cursor_is_a_422_naming_after(api):
    for bad in ("-1", "x", "1.5", "", "0x10", str(2**31)):
        answer = api.get(URL, params={"after": bad})
        assert answer.status_code == 422, bad
        [issue] = answer.json()["detail"]
        assert issue["loc"] == ["query", "after"] and issue["msg"], bad
    for combined in ({"after": 0, "order_by": "objective"}, {"after": 0, "offset": 1}):
        answer = api.get(URL, params=combined)
        assert answer.status_code == 422, combined
        assert answer.json()["detail"].startswith("after=0 cannot be combined with order_by=objective or an offset")
    assert api.get("/experiments/nope/trials", params={"after": 0}).status_code == 404


def test_openapi_documents_the_cursor(api):
    schema = api.get("/openapi.json").json()
    operation = schema["paths"]["/api/v1/experiments/{name}/trials"]["get"]
    [after] = [p for p in operation["parameters"] if p["name"] == "after"]
    assert after["in"] == "query" and "next" in after["description"] and "422" in after["description"]
    assert {"type": "integer", "minimum": 0, "maximum": 2**31 - 1} in after["schema"]["anyOf"]
    ref = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    page = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]["properties"]
    assert set(page) == {"items", "total", "offset", "limit", "next"}
    assert {"type": "null"} in page["next"]["anyOf"] and "`after`" in page["next"]["description"]
    assert {"type": "null"} in page["total"]["anyOf"] and "without `after`" in page["total"]["description"]


def test_cursor_pages_cover_every_trial_once_while_trials_are_added(empty_database):
    """A client pages with `next` while a controller creates trials (the next numbers, as `hpo run` does) and
    finishes others between its requests: the pages hold every trial exactly once, in number order."""
    storage = SqlStorage(empty_database)
    experiment_id = storage.create_experiment("growing", {}, "minimize")

    def create_next() -> int:
        return storage.create_trial(experiment_id, TrialSpec(number=None, params={"optimizer.lr": 1e-3}))

    created = [create_next() for _ in range(5)]
    try:
        with api_in_process(empty_database) as api:
            pages, params = [], {"limit": 2}
            while True:
                page = api.get("/experiments/growing/trials", params=params).json()
                pages.append(page)
                if page["next"] is None:
                    break
                params = {"limit": 2, "after": page["next"]}
                if len(pages) <= 4:  # between requests: two new trials, and an older one finishes
                    created += [create_next(), create_next()]
                    storage.mark_trial_running(created[len(pages)])
                    storage.finish_trial(created[len(pages)], TrialResult(TrialState.COMPLETED, objective=1.0))
            recount = api.get("/experiments/growing/trials", params={"limit": 1}).json()
            completed = api.get("/experiments/growing/trials", params={"state": "completed"}).json()
        everything = [trial.number for trial in storage.list_trials(experiment_id)]
    finally:
        storage.close()
    seen = [number for page in pages for number in page_numbers(page)]
    assert len(everything) == 5 + 2 * 4 and seen == everything  # every trial once, in number order
    assert len(pages) == 7  # ceil(13 / 2): no empty last page
    assert pages[0]["total"] == 5 and all(page["total"] is None for page in pages[1:])
    assert recount["total"] == 13 and completed["total"] == 4 == len(completed["items"])


def test_every_entry_is_the_trial_as_stored_now_though_finished_ones_are_kept(empty_database):
    """The list keeps the entries of finished trials (by id, state and attempt): each page, asked again after
    trials started, finished and were re-queued, is byte for byte the page built from the storage's records then
    (`TrialPage` of `TrialPublic`s, this test's own computation), on the first ask and on repeats."""
    from server.schemas import TrialPage, TrialPublic

    storage = SqlStorage(empty_database)
    experiment_id = storage.create_experiment("kept", {}, "minimize")
    ids = [storage.create_trial(experiment_id, TrialSpec(number=None, params={"optimizer.lr": 1e-3 * (i + 1)}))
           for i in range(5)]  # fmt: skip

    def expected(params: dict) -> bytes:
        limit = params.get("limit", 50)
        after = params.get("after")
        trials = storage.list_trials(experiment_id, limit=limit + 1, after=after)
        items = [TrialPublic.from_record(t) for t in trials[:limit]]
        total = None if after is not None else storage.count_trials(experiment_id)
        more = items[-1].number if len(trials) > limit else None
        return TrialPage(items=items, total=total, offset=0, limit=limit, next=more).model_dump_json().encode()

    try:
        with api_in_process(empty_database) as api:
            asks = [{"limit": 3}, {"limit": 3, "after": 0}, {}]

            def check() -> None:
                for params in asks:
                    for _ in range(2):  # the second ask reads kept entries
                        answer = api.get("/experiments/kept/trials", params=params)
                        assert answer.content == expected(params), params

            check()
            storage.mark_trial_running(ids[1], host="h", pid=1)
            storage.finish_trial(ids[0], TrialResult(TrialState.COMPLETED, objective=2.0, samples_to_target=512))
            check()
            storage.finish_trial(ids[1], TrialResult(TrialState.FAILED, reason="crashed"))
            storage.mark_trial_running(ids[2], host="h", pid=2)
            storage.interrupt_trial(ids[2], "stopped")
            check()
            storage.requeue_trial(ids[2], attempt=0, reason="resumed")  # a kept entry of an older attempt
            storage.mark_trial_running(ids[2], host="h", pid=3)
            storage.finish_trial(ids[2], TrialResult(TrialState.COMPLETED, objective=1.0, samples_to_target=256))
            check()
            assert [t["attempt"] for t in api.get("/experiments/kept/trials").json()["items"]][:3] == [0, 0, 1]
    finally:
        storage.close()


def test_filtered_cursor_pages_cover_the_matching_trials_once_while_trials_are_added(empty_database):
    """A dashboard pages the completed trials of one arm with `next` while a controller creates trials and finishes
    them between its requests (some completed, some failed, in both arms): the pages hold exactly the trials that
    match, each once, in number order (this test's own record of what it made), and `total` is counted anew on
    a first page asked after trials finished."""
    storage = SqlStorage(empty_database)
    experiment_id = storage.create_experiment("filtered", {}, "minimize")
    made: dict[int, tuple[str, TrialState]] = {}  # number -> (arm, state), as this test set them

    def add() -> None:
        number = len(made)
        arm, state = ("lamb", "adam")[number % 2], (TrialState.COMPLETED, TrialState.FAILED)[number % 3 == 2]
        trial_id = storage.create_trial(experiment_id, TrialSpec(None, {"optimizer.lr": 1e-3}, arm))
        storage.mark_trial_running(trial_id)
        storage.finish_trial(trial_id, TrialResult(state, objective=float(number)))
        made[number] = (arm, state)

    def matching() -> list[int]:
        return [n for n, (arm, state) in sorted(made.items()) if arm == "lamb" and state is TrialState.COMPLETED]

    for _ in range(8):
        add()
    url, filters = "/experiments/filtered/trials", {"state": "completed", "arm": "lamb", "limit": 2}
    try:
        with api_in_process(empty_database) as api:
            first = api.get(url, params=filters).json()
            assert first["total"] == len(matching()) == 3
            pages, page = [first], first
            while page["next"] is not None:
                if len(pages) <= 3:
                    for _ in range(6):  # between requests: six more trials, all finished, two of them matching
                        add()
                page = api.get(url, params={**filters, "after": page["next"]}).json()
                pages.append(page)
            again = api.get(url, params=filters).json()
    finally:
        storage.close()
    seen = [number for page in pages for number in page_numbers(page)]
    assert len(made) == 26 and len(pages) == 5  # the walk lasted through the three rounds of new trials
    assert seen == matching()  # every matching trial once, in number order, none other
    assert again["total"] == len(matching()) > first["total"]
