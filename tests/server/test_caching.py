"""HTTP caching of the hot reads (the API in the test's process; tests/server/test_api.py asks a real `hpo serve`
for a 304): every best config and trial list answers with an ETag (the body's hash) and `Cache-Control: no-cache`; an
unchanged answer is a 304 to `If-None-Match`, and a trial that finishes changes the answer, and so its ETag, at once.
Expected bests are computed here from what the test stored."""

from __future__ import annotations

import httpx

from hpo.experiment import experiment_from_dict
from hpo.storage import SqlStorage
from hpo.trials import TrialResult, TrialSpec, TrialState
from tests.server.conftest import api_in_process

NAME = "cached"
LAMB, ADAMW = "optimizer.name=lamb", "optimizer.name=adamw"


def served_spec() -> dict:
    """What `hpo run` stores for an ADAM-vs-LAMB experiment: the server builds configs from it."""
    data = {
        "name": NAME, "base_config": {}, "overrides": {"batch.global_batch_size": 32},
        "space": {"optimizer.name": {"choice": ["adamw", "lamb"]}, "optimizer.lr": {"float": [1e-4, 1e-2]}},
        "compare": ["optimizer.name"], "tuner": {"name": "random"}, "budget": {"trials": 10},
        "resources": {"gpus": "none"},
    }  # fmt: skip
    return {"experiment": experiment_from_dict(data).self_contained(), "run_dir": "runs/cached"}


def add_trial(storage: SqlStorage, experiment_id: int, optimizer: str, objective: float | None = None,
              state: TrialState | None = TrialState.COMPLETED) -> int:  # fmt: skip
    """A trial of `optimizer`, finished in `state` (None: left queued); returns its id."""
    params = {"optimizer.name": optimizer, "optimizer.lr": 1e-3}
    trial_id = storage.create_trial(experiment_id, TrialSpec(None, params, f"optimizer.name={optimizer}",
                                                             global_batch_size=32))  # fmt: skip
    if state is not None:
        storage.mark_trial_running(trial_id)
        storage.finish_trial(trial_id, TrialResult(state, objective=objective, samples_to_target=1024))
    return trial_id


def ask(api: httpx.Client, path: str, etag: str | None = None, **params) -> httpx.Response:
    answer = api.get(path, params=params, headers={"If-None-Match": etag} if etag else {})
    assert answer.headers["Cache-Control"] == "no-cache" and answer.headers["ETag"].startswith('"'), path
    return answer


def test_a_cached_answer_changes_when_a_trial_finishes_and_an_unchanged_one_answers_304(empty_database):
    storage = SqlStorage(empty_database)
    experiment_id = storage.create_experiment(NAME, served_spec(), "minimize")
    objectives = {0: 5.0, 1: 7.0}  # trial number -> objective of the completed trials
    add_trial(storage, experiment_id, "lamb", 5.0)
    add_trial(storage, experiment_id, "adamw", 7.0)
    running = add_trial(storage, experiment_id, "lamb", state=None)
    storage.mark_trial_running(running)
    best, arms, trials = f"/experiments/{NAME}/best", f"/experiments/{NAME}/best/arms", f"/experiments/{NAME}/trials"
    try:
        with api_in_process(empty_database) as api:
            first = ask(api, best)
            assert first.status_code == 200 and first.json()["trial"]["number"] == min(objectives, key=objectives.get)
            etag = first.headers["ETag"]
            unchanged = ask(api, best, etag)
            assert unchanged.status_code == 304 and unchanged.content == b"" and unchanged.headers["ETag"] == etag
            for header in (f"W/{etag}", f'"other", {etag}', "*"):  # weak comparison, a list, any
                assert ask(api, best, header).status_code == 304, header
            assert ask(api, best, '"other"').content == first.content
            lamb, per_arm = ask(api, best, arm=LAMB), ask(api, arms)
            page = ask(api, trials, state="completed")
            assert (
                page.json()["total"] == 2
                and ask(api, trials, page.headers["ETag"], state="completed").status_code == 304
            )

            # Trials that change nothing these answers show: the ETags stay, so clients still get 304s.
            add_trial(storage, experiment_id, "adamw", None, TrialState.FAILED)
            add_trial(storage, experiment_id, "lamb", 9.0)
            objectives[4] = 9.0
            assert storage.trials_version(experiment_id) > 0
            for path, before, params in ((best, first, {}), (best, lamb, {"arm": LAMB}), (arms, per_arm, {})):
                assert ask(api, path, before.headers["ETag"], **params).status_code == 304, (path, params)

            # The running trial finishes with the best objective: every answer changes at once.
            storage.finish_trial(running, TrialResult(TrialState.COMPLETED, objective=1.0, samples_to_target=512))
            objectives[2] = 1.0
            for path, before, params in ((best, first, {}), (best, lamb, {"arm": LAMB}), (arms, per_arm, {}),
                                         (trials, page, {"state": "completed"})):  # fmt: skip
                after = ask(api, path, before.headers["ETag"], **params)
                assert after.status_code == 200 and after.headers["ETag"] != before.headers["ETag"], (path, params)
            assert ask(api, best).json()["trial"]["number"] == min(objectives, key=objectives.get) == 2
            assert ask(api, best, arm=LAMB).json()["trial"]["number"] == 2
            assert {arm: body["trial"]["number"] for arm, body in ask(api, arms).json().items()} == {LAMB: 2, ADAMW: 1}
            assert ask(api, trials, state="completed").json()["total"] == len(objectives) == 4
            for _ in range(2):  # none at that size, asked afresh and kept
                assert api.get(best, params={"global_batch_size": 64}).status_code == 404
    finally:
        storage.close()


def test_an_experiment_deleted_before_its_first_trial_and_made_again_is_served_afresh(empty_database):
    """An engine that could not start removes the experiment it had just recorded (no trial yet), and the next `hpo
    run` records it again under the same name (with another id: ids are never given twice). A server that answered
    about the first must answer about the second: its id, its spec, its trials."""
    storage = SqlStorage(empty_database)
    first = served_spec()
    first_id = storage.create_experiment(NAME, first, "minimize")
    best, arms, trials = f"/experiments/{NAME}/best", f"/experiments/{NAME}/best/arms", f"/experiments/{NAME}/trials"
    try:
        with api_in_process(empty_database) as api:
            assert api.get(best, params={"arm": LAMB}).status_code == 404  # no trial yet
            assert api.get(arms).status_code == 404 and ask(api, trials).json()["total"] == 0  # as /best's
            assert sum(api.get(f"/experiments/{NAME}").json()["trials"].values()) == 0
            storage.delete_experiment(first_id)

            second = served_spec()
            second["experiment"]["overrides"]["batch.global_batch_size"] = 64
            second_id = storage.create_experiment(NAME, second, "minimize")
            trial_id = storage.create_trial(second_id, TrialSpec(None, {"optimizer.name": "lamb", "optimizer.lr": 1e-3},
                                                                 LAMB, global_batch_size=64))  # fmt: skip
            storage.mark_trial_running(trial_id)
            storage.finish_trial(trial_id, TrialResult(TrialState.COMPLETED, objective=3.0, samples_to_target=512))

            answer = ask(api, best, arm=LAMB)
            assert answer.status_code == 200, answer.text
            assert answer.json()["config"]["batch"]["global_batch_size"] == 64  # the second spec's
            assert list(ask(api, arms).json()) == [LAMB]
            assert ask(api, trials).json()["total"] == 1
            counts = api.get(f"/experiments/{NAME}").json()["trials"]
            assert counts["completed"] == sum(counts.values()) == 1
            exported = api.get(f"/experiments/{NAME}/export")
            assert exported.status_code == 200 and "global_batch_size: 64" in exported.text, exported.text
    finally:
        storage.close()


def test_an_experiment_deleted_with_its_trials_while_served_is_gone_and_its_name_served_afresh(empty_database, capsys):
    """`hpo delete` of an experiment whose record, spec, best configs and trial entries the server keeps: every route
    answers 404 at once, and the experiment recorded under the name again is served as itself."""
    from hpo.cli.main import main

    storage = SqlStorage(empty_database)
    first_id = storage.create_experiment(NAME, served_spec(), "minimize")
    add_trial(storage, first_id, "lamb", 5.0)
    add_trial(storage, first_id, "adamw", 7.0)
    name = f"/experiments/{NAME}"
    routes = [(f"{name}/best", {}), (f"{name}/best", {"arm": LAMB}), (f"{name}/best/arms", {}), (f"{name}/trials", {}),
              (f"{name}/trials", {"after": 0}), (f"{name}/trials/0", {}), (f"{name}/trials/0/metrics", {}),
              (f"{name}/export", {}), (name, {}), (f"{name}/report", {})]  # fmt: skip
    try:
        with api_in_process(empty_database) as api:
            for path, params in routes * 2:  # the second time from what the server keeps
                assert api.get(path, params=params).status_code == 200, (path, params)
            capsys.readouterr()
            assert main(["--db", empty_database, "delete", NAME, "--yes"]) == 0  # in this process
            deleted = capsys.readouterr()
            assert "deleted experiment 'cached': 2 trials" in deleted.out, deleted
            for path, params in routes:
                answer = api.get(path, params=params)
                assert answer.status_code == 404 and NAME in answer.json()["detail"], (path, params, answer.text)
            assert api.get("/experiments").json()["items"] == []

            second = served_spec()
            second["experiment"]["overrides"]["batch.global_batch_size"] = 64
            second_id = storage.create_experiment(NAME, second, "minimize")
            params = {"optimizer.name": "adamw", "optimizer.lr": 2e-3}
            trial_id = storage.create_trial(second_id, TrialSpec(None, params, ADAMW, global_batch_size=64))
            storage.mark_trial_running(trial_id)
            storage.finish_trial(trial_id, TrialResult(TrialState.COMPLETED, objective=3.0, samples_to_target=512))
            assert second_id > first_id
            answer = ask(api, f"{name}/best")
            assert answer.json()["trial"]["params"]["optimizer.lr"] == 2e-3
            assert answer.json()["config"]["batch"]["global_batch_size"] == 64
            assert list(ask(api, f"{name}/best/arms").json()) == [ADAMW]
            listed = ask(api, f"{name}/trials").json()
            assert listed["total"] == 1 and listed["items"][0]["params"]["optimizer.name"] == "adamw"
            assert api.get(f"{name}/trials/0").json()["params"]["optimizer.lr"] == 2e-3
            assert api.get(f"{name}/trials/1").status_code == 404
    finally:
        storage.close()
