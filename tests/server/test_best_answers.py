"""What the best-config endpoints say besides the config (the API in the test's process): a simulated experiment's
best (nothing was trained) says so as its export does (`simulated: true` and the X-HPO-Warning header), the best across
experiments leaves simulated experiments out unless asked, and an experiment without a completed trial is a 404
with the same message on `/best`, `/best/arms` and `/export`."""

from __future__ import annotations

from hpo.experiment import experiment_from_dict
from hpo.export.production import SIMULATED
from hpo.storage import SqlStorage
from hpo.trials import TrialState
from tests.server.conftest import api_in_process
from tests.server.test_caching import add_trial

LAMB = "optimizer.name=lamb"


def create(storage: SqlStorage, name: str, runner: dict | None = None) -> int:
    """An ADAM-vs-LAMB experiment at global batch size 32 (on `runner`), stored as `hpo run` stores it; its id."""
    data = {
        "name": name, "base_config": {}, "overrides": {"batch.global_batch_size": 32},
        "space": {"optimizer.name": {"choice": ["adamw", "lamb"]}, "optimizer.lr": {"float": [1e-4, 1e-2]}},
        "compare": ["optimizer.name"], "tuner": {"name": "random"}, "budget": {"trials": 10},
        "resources": {"gpus": "none"}, **({"runner": runner} if runner else {}),
    }  # fmt: skip
    spec = experiment_from_dict(data)
    return storage.create_experiment(name, {"experiment": spec.self_contained(), "run_dir": f"runs/{name}"},
                                     spec.direction)  # fmt: skip


def test_a_simulated_best_says_so_and_the_best_across_experiments_leaves_it_out_unless_asked(tmp_path):
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    with SqlStorage(url, upgrade=True) as storage:
        sim = create(storage, "sim", {"name": "simulated", "simulation": {"table": "curves"}})
        add_trial(storage, sim, "lamb", 500.0)  # better than the trained experiment's: it would win if ranked
        add_trial(storage, sim, "adamw", 600.0)  # no trained experiment has an adamw trial
        add_trial(storage, create(storage, "real"), "lamb", 900.0)
    warning = SIMULATED.format(experiment="sim")
    with api_in_process(url) as api:
        best = api.get("/experiments/sim/best")
        assert best.status_code == 200 and best.json()["simulated"] is True
        assert best.headers.get_list("X-HPO-Warning") == [warning]
        assert warning in api.get("/experiments/sim/export").headers.get_list("X-HPO-Warning")  # the same words
        again = api.get("/experiments/sim/best", headers={"If-None-Match": best.headers["ETag"]})
        assert again.status_code == 304 and again.headers.get_list("X-HPO-Warning") == [warning]
        arms = api.get("/experiments/sim/best/arms")
        assert arms.headers.get_list("X-HPO-Warning") == [warning]
        assert {arm: b["simulated"] for arm, b in arms.json().items()} == {"optimizer.name=adamw": True, LAMB: True}
        assert api.get("/experiments/sim").json()["best"]["simulated"] is True
        trained = api.get("/experiments/real/best")
        assert trained.json()["simulated"] is False and "X-HPO-Warning" not in trained.headers
        assert "X-HPO-Warning" not in api.get("/experiments/real/best/arms").headers

        across = api.get("/best", params={"global_batch_size": 32, "optimizer": "lamb"})
        body = across.json()
        assert (body["best"]["experiment"], body["best"]["simulated"], body["include_simulated"]) == (
            "real", False, False)  # fmt: skip
        assert [c["experiment"] for c in body["candidates"]] == ["real"]
        assert "X-HPO-Warning" not in across.headers
        asked = api.get("/best", params={"global_batch_size": 32, "optimizer": "lamb", "include_simulated": True})
        body = asked.json()
        assert [(c["experiment"], c["simulated"]) for c in body["candidates"]] == [("sim", True), ("real", False)]
        assert body["include_simulated"] is True and asked.headers.get_list("X-HPO-Warning") == [warning]
        only = api.get("/best", params={"global_batch_size": 32, "optimizer": "adamw"})
        assert only.status_code == 404
        assert only.json()["detail"] == (
            "no experiment with objective samples_to_target has a completed adamw trial at global batch size 32, "
            "but the simulated experiment sim has one, left out (nothing was trained there): ask "
            "include_simulated=true to rank simulated experiments too"
        )


def test_without_a_completed_trial_the_best_per_arm_is_a_404_as_the_best_and_the_export(tmp_path):
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    with SqlStorage(url, upgrade=True) as storage:
        eid = create(storage, "none-yet")
        add_trial(storage, eid, "lamb", None, state=TrialState.FAILED)
        add_trial(storage, eid, "adamw", None, state=None)  # queued
    with api_in_process(url) as api:
        answers = [api.get(f"/experiments/none-yet/{path}") for path in ("best/arms", "best", "export")]
        assert api.head("/experiments/none-yet/best/arms").status_code == 404
    assert [a.status_code for a in answers] == [404, 404, 404], [a.text for a in answers]
    message = "experiment none-yet has no completed trial yet; its trial list says why"
    assert [a.json()["detail"] for a in answers] == [message] * 3
    with SqlStorage(url) as storage:
        create(storage, "no-trial")  # stopped before its first trial, say: a trial list to look at would be empty
    with api_in_process(url) as api:
        answers = [api.get(f"/experiments/no-trial/{path}") for path in ("best/arms", "best", "export")]
        assert api.get("/experiments/no-trial/trials").json()["items"] == []
    message = (
        "experiment no-trial has no trial yet, so no best one; its status (/experiments/no-trial) says where it stands"
    )
    assert [(a.status_code, a.json()["detail"]) for a in answers] == [(404, message)] * 3
