"""`POST /api/v1/plan` and `GET /api/v1/experiments/{name}/plan` against a real `hpo serve`: the forecast equals
`hpo plan FILE --json` with the same options (run here in-process), actions need the token, a bad file is a 422
with `hpo plan`'s error, and the database is not written."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import io
import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from hpo.cli.main import main as hpo_main
from hpo.simulation.table import TABLES
from search_spaces import preset_path
from server.app import create_app
from server.routes.plan import MAX_REPETITIONS, _stop
from server.settings import Settings
from tests.hpo.simulation.test_simulated_runner import experiment_file
from tests.server.conftest import TOKEN, start_server, stop_server
from trainer.config import CONFIGS_DIR, shipped_config

ROOT = Path(__file__).resolve().parents[2]
AUTH = {"Authorization": f"Bearer {TOKEN}"}
YAML = {"Content-Type": "application/yaml"}
FIGURES = ("first_hit", "answer", "idle_fraction", "confirmation_runs", "outcomes", "repetitions", "cluster",
           "trials", "tuner", "confirm_seeds", "simulated", "experiment")  # fmt: skip


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """A small simulated experiment file (8 random trials on 8 slots, its table given by absolute path), an
    empty database with that experiment run once, and `hpo serve` over it."""
    directory = tmp_path_factory.mktemp("plan-api")
    path = experiment_file(directory, "planned", "random", trials=8, slots=8)
    data = yaml.safe_load(path.read_text())
    data["runner"]["simulation"]["table"] = str(directory / "curves.jsonl")
    path.write_text(yaml.safe_dump(data))
    url = f"sqlite:///{directory / 'hpo.db'}"
    assert hpo_main(["--db", url, "run", str(path), "--quiet", "--run-dir", str(directory / "run")]) == 0
    server = start_server(url, directory)
    yield path, directory / "hpo.db", server
    stop_server(server)


def cli_plan(path: Path, *options: str) -> dict:
    """`hpo plan PATH --json OPTIONS`, run in this process."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert hpo_main(["plan", str(path), "--json", *options]) == 0
    return json.loads(out.getvalue())


@pytest.fixture(scope="module")
def planned_here(planned) -> dict:
    """The planned file's `hpo plan --json --repetitions 2 --slots 4`, run in this process: what the API's plans of
    the posted file and of the stored experiment (the file's spec) must answer with the same options."""
    return cli_plan(planned[0], "--repetitions", "2", "--slots", "4")


def test_a_posted_file_is_planned_as_hpo_plan_json_plans_it(planned, planned_here):
    path, _, server = planned
    expected = planned_here
    with server.client() as api:
        answer = api.post("/plan", content=path.read_text(), headers=AUTH | YAML,
                          params={"repetitions": 2, "slots": 4})  # fmt: skip
    assert answer.status_code == 200, answer.text
    got = answer.json()
    assert {k: got[k] for k in FIGURES} == {k: expected[k] for k in FIGURES}
    assert got["simulated"] is True and got["cluster"]["slots"] == 4
    assert sum(o["count"] for o in got["outcomes"].values()) == 2 == got["repetitions"]
    gpu_hours = got["answer"]["gpu_hours"]
    assert gpu_hours["low"] <= gpu_hours["median"] <= gpu_hours["high"]
    assert any("no training happens, every figure is simulated" in line for line in got["lines"])
    # named so, not by its temporary copy, gone by the time the answer is read
    assert got["source"] == "the posted experiment file" and "hpo-api-plan-" not in answer.text
    assert got["lines"][0].startswith("plan of planned (the posted experiment file): "), got["lines"][0]


@pytest.mark.slow  # another plan run; the posted files' plans run by default
def test_a_stated_difference_is_planned_as_hpo_plan_difference_plans_it(planned):
    path, _, server = planned
    expected = cli_plan(path, "--repetitions", "2", "--difference", "10%")
    with server.client() as api:
        answer = api.post("/plan", content=path.read_text(), headers=AUTH | YAML,
                          params={"repetitions": 2, "difference": 0.1})  # fmt: skip
        too_big = api.post("/plan", content=path.read_text(), headers=AUTH | YAML, params={"difference": 1})
    assert answer.status_code == 200, answer.text
    got = answer.json()
    assert {k: got[k] for k in (*FIGURES, "truth", "judged")} == {k: expected[k] for k in (*FIGURES, "truth", "judged")}
    assert got["truth"]["stated"] == 0.1 and abs(got["truth"]["difference"] - 0.1) <= 0.002
    assert sum(o["count"] for o in got["judged"].values()) == 2
    assert too_big.status_code == 422


def test_a_stored_experiment_is_planned_from_its_stored_spec_and_nothing_is_written(planned, planned_here):
    path, database, server = planned
    before = database.read_bytes()
    with server.client() as api:
        answer = api.get("/experiments/planned/plan", headers=AUTH, params={"repetitions": 2, "slots": 4})
        missing = api.get("/experiments/nope/plan", headers=AUTH)
    assert answer.status_code == 200, answer.text
    expected = planned_here  # the stored spec is the file's
    assert {k: answer.json()[k] for k in FIGURES} == {k: expected[k] for k in FIGURES}
    assert answer.json()["cluster"]["slots"] == 4 and answer.json()["repetitions"] == 2
    assert answer.json()["source"] == "the stored experiment planned" and "hpo-api-plan-" not in answer.text
    assert missing.status_code == 404
    assert database.read_bytes() == before


def test_a_posted_file_naming_a_shipped_table_and_config_is_planned_on_them(planned, tmp_path):
    """`table: curves` and `base_config: bert_large` name the table and the trainer config shipped with hpo, in a
    posted file as in a file on disk (not paths in the server's working directory): planned as `hpo plan` (here, in
    this process) plans the same file giving their paths."""
    _, _, server = planned
    preset = preset_path("adam_vs_lamb_simulated")
    data = yaml.safe_load(preset.read_text())
    assert data["runner"]["simulation"]["table"] == "curves"
    data["base_config"] = "bert_large"
    data["budget"].update(trials=6, max_parallel=3)  # smaller, so that it plans in seconds
    data["tuner"] = {"name": "random", "seed": 0}  # the names are under test, not SMAC (the slower tuner to start)
    by_path = copy.deepcopy(data)
    by_path["runner"]["simulation"]["table"] = str(TABLES / "curves.jsonl")
    by_path["base_config"] = str(CONFIGS_DIR / "bert_large.yaml")
    with server.client() as api:
        named = api.post("/plan", content=yaml.safe_dump(data), headers=AUTH | YAML, params={"repetitions": 1})
    assert named.status_code == 200, named.text
    (tmp_path / "pathed.yaml").write_text(yaml.safe_dump(by_path))
    pathed = cli_plan(tmp_path / "pathed.yaml", "--repetitions", "1")
    assert {k: named.json()[k] for k in FIGURES} == {k: pathed[k] for k in FIGURES}


@pytest.mark.slow  # another plan run; the posted files' plans run by default
def test_a_posted_file_read_from_two_shipped_tables_names_each_batch_sizes_table(planned):
    """batch_scaling_demo_cpu trains batch 32 and 128 to budgets no one shipped table has both to: each batch size is
    read from the table that has it, and the answer names those tables (the combination is a temporary file)."""
    _, _, server = planned
    data = yaml.safe_load(preset_path("batch_scaling_demo_cpu").read_text())
    data["base_config"] = "demo_cpu"  # the shipped config, by name (a relative path is the server's)
    with server.client() as api:
        answer = api.post("/plan", content=yaml.safe_dump(data), headers=AUTH | YAML, params={"repetitions": 1})
    assert answer.status_code == 200, answer.text
    assert answer.json()["table"] is None
    assert answer.json()["tables_by_batch"] == {"32": str(TABLES / "curves.jsonl"),
                                                "128": str(TABLES / "large_batch.jsonl")}  # fmt: skip


# [a/b] is slow: [../../victim] and [/abs/victim] are names with a slash too (the 300-character one, a slug but for
# its length, is the only check of the slug's length bound: a file name that long was a 500)
@pytest.mark.parametrize(
    "name", ["../../victim", "/abs/victim", pytest.param("a/b", marks=pytest.mark.slow), "n" * 300]
)
def test_a_posted_name_that_is_not_a_slug_is_a_422_and_writes_no_file_outside_the_plans_folder(planned, tmp_path,
                                                                                                 name):  # fmt: skip
    """The experiment's name once named the plan's temporary copy: a path in it wrote (or overwrote) a YAML file
    anywhere the server could write, or failed as a 500."""
    path, _, server = planned
    victim = tmp_path / "victim.yaml"
    victim.write_text("important: true\n")
    data = yaml.safe_load(path.read_text())
    data["name"] = str(tmp_path / "victim") if name.startswith("/abs") else name
    if name.startswith("../"):  # from the server's temporary folder up to the root, then down to the victim
        data["name"] = "../" * 12 + str(tmp_path / "victim").lstrip("/")
    with server.client() as api:
        answer = api.post("/plan", content=yaml.safe_dump(data), headers=AUTH | YAML, params={"repetitions": 1})
    assert answer.status_code == 422 and "name" in answer.json()["detail"], answer.text
    assert victim.read_text() == "important: true\n"


def test_plans_are_actions_and_a_bad_file_gets_hpo_plans_error(planned):
    path, _, server = planned
    data = yaml.safe_load(path.read_text())
    data["budget"]["trials"] = "many"
    with server.client() as api:
        anonymous = api.post("/plan", content=path.read_text(), headers=YAML)
        wrong = api.post("/plan", content=path.read_text(), headers=YAML | {"Authorization": "Bearer nope"})
        bad = api.post("/plan", content=yaml.safe_dump(data), headers=AUTH | YAML)
        not_yaml = api.post("/plan", content="[1, 2", headers=AUTH | YAML)
        not_text = api.post("/plan", content=b"name: \xff\xfe", headers=AUTH | YAML)  # not UTF-8
        too_many = api.post("/plan", content=path.read_text(), headers=AUTH | YAML, params={"repetitions": 51})
        no_body = api.post("/plan", headers=AUTH)
        as_json = api.post("/plan", json=yaml.safe_load(path.read_text()), headers=AUTH)  # the wrong content type
        not_json = api.post("/plan", content=path.read_text(), headers=AUTH | {"Content-Type": "application/json"})
        schema = api.get("/openapi.json").json()
    assert (anonymous.status_code, wrong.status_code) == (401, 401)
    assert bad.status_code == 422 and "budget.trials" in bad.json()["detail"], bad.text
    assert "the posted experiment file (planned.yaml)" in bad.json()["detail"] and "/tmp" not in bad.json()["detail"]
    assert not bad.json()["detail"].startswith("error:")
    assert not_yaml.status_code == 422 and "not YAML" in not_yaml.json()["detail"]
    assert too_many.status_code == 422
    assert not_text.status_code == 422 and not_text.json()["detail"][0]["loc"] == ["body"], not_text.text
    for refused in (no_body, as_json, not_json, not_text):  # each says what the body is and how to send it
        assert refused.status_code == 422 and refused.json()["detail"][0]["loc"][0] == "body", refused.text
        assert "experiment file as YAML" in refused.json()["detail"][0]["msg"], refused.text
        assert "Content-Type: application/yaml" in refused.json()["detail"][0]["msg"], refused.text
    assert schema["paths"]["/api/v1/plan"]["post"]["responses"]["422"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/InvalidRequestPublic"  # a list of parameters, or hpo plan's message
    }
    post = schema["paths"]["/api/v1/plan"]["post"]
    assert "application/yaml" in post["requestBody"]["content"]
    assert {"401", "403", "422", "504"} <= set(post["responses"])
    assert "get" in schema["paths"]["/api/v1/experiments/{name}/plan"]


def test_the_documented_example_file_names_a_shipped_config_that_an_installed_server_finds(tmp_path):
    """The body's example in the API docs names its base config as an installed server reads it from any working
    directory (a shipped config's name), not by a path that only a checkout of the project holds."""
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'hpo.db'}"))
    body = app.openapi()["paths"]["/api/v1/plan"]["post"]["requestBody"]["content"]["application/yaml"]["schema"]
    (example,) = body["examples"]
    base = yaml.safe_load(example)["base_config"]
    assert shipped_config(base, folder=tmp_path) is not None, f"{base!r} is not a shipped trainer config's name"


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_difference_that_is_not_a_finite_number_is_named_so(planned, value):
    """nan was refused as "Input should be less than 1"."""
    path, _, server = planned
    with server.client() as api:
        answer = api.post("/plan", content=path.read_text(), headers=AUTH | YAML, params={"difference": value})
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"][0]["msg"] == "Input should be a finite number", answer.text


def test_a_plan_past_its_deadline_is_stopped_so_that_it_deletes_its_temporary_files(planned, tmp_path):
    """The API stops a plan past its deadline (the 504) with SIGTERM, SIGKILL only if it has not ended a while
    later: SIGKILL at once left the plan's temporary directories behind."""
    path, _, _ = planned
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "0", "TMPDIR": str(tmp_path)}

    async def plan_then_stop() -> tuple[int, list[Path], str]:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "hpo", "plan", str(path), "--repetitions", "10000", env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            first = (await child.stderr.readline()).decode()  # a repetition done: the plan's directories are there
            assert first.startswith("plan: 1/10000 repetitions"), first
            made = [*tmp_path.glob(f"hpo-plan-{child.pid}-*"), *Path("/dev/shm").glob(f"hpo-plan-{child.pid}-*")]
            await _stop(child)
        finally:
            if child.returncode is None:
                child.kill()
                await child.wait()
        return child.returncode, made, first

    code, made, first = asyncio.run(plan_then_stop())
    assert made, first
    assert code == 143
    assert not [directory for directory in made if directory.exists()]


def plan_children(server_pid: int) -> list[int]:
    """The `hpo plan` processes the server started (its children running `-m hpo plan`)."""
    found = []
    for status in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(status.read_text().rsplit(")", 1)[1].split()[1])
            command = (status.parent / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile
        if parent == server_pid and command[1:4] == [b"-m", b"hpo", b"plan"]:
            found.append(int(status.parent.name))
    return found


def test_a_plan_whose_client_disconnected_is_stopped(planned):
    """A client that goes away (a closed connection: a timeout, Ctrl-C) leaves no plan running on the server's CPU:
    the server stops it as it stops one past its deadline (it ran on to the end, up to 10 minutes, for no one)."""
    import socket
    import time

    path, _, server = planned
    body = path.read_bytes()
    host, port = server.url.removeprefix("http://").split("/", 1)[0].split(":")
    log = server.run_dir / f"server-{port}.log"
    request = (
        f"POST /api/v1/plan?repetitions={MAX_REPETITIONS} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer "
        f"{TOKEN}\r\nContent-Type: application/yaml\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    with socket.create_connection((host, int(port))) as connection:
        connection.sendall(request)
        deadline = time.monotonic() + 30
        while not (children := plan_children(server.process.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert children, "the server started no plan"
    stopped = f"plan of {path.name} stopped: its client disconnected"  # logged once the stopped plan is reaped
    deadline = time.monotonic() + 60  # a plan not stopped ends by itself, unlogged: the assertion below fails
    while (plan_children(server.process.pid) or stopped not in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not plan_children(server.process.pid)
    assert stopped in log.read_text()


def test_a_plan_whose_request_is_cancelled_is_stopped_and_its_process_ended(planned, monkeypatch):
    """Starlette runs a handler under anyio, whose cancellation (a server shutting down) cancels every later await
    in the cancelled scope too: the stop's wait for the plan's end must be shielded, or the plan is left unreaped
    and past SIGTERM without its SIGKILL. A plan of 50 repetitions (seconds of work) cancelled half a second after
    its process started: once the cancellation has gone through, that process has ended by SIGTERM (-15) and been
    waited for."""
    import anyio
    from starlette.requests import Request

    from server.routes.plan import _plan

    path, _, _ = planned
    data = yaml.safe_load(path.read_text())
    started: list[asyncio.subprocess.Process] = []
    spawn = asyncio.create_subprocess_exec

    async def recording(*args, **kwargs):
        started.append(await spawn(*args, **kwargs))
        return started[-1]

    async def never_disconnects():
        await anyio.sleep_forever()

    async def cancel_a_plan() -> int | None:
        request = Request({"type": "http", "method": "POST", "path": "/plan", "headers": []}, never_disconnects)
        async with anyio.create_task_group() as group:

            async def cancel_once_started():
                while not started:
                    await anyio.sleep(0.05)
                await anyio.sleep(0.5)
                group.cancel_scope.cancel()

            group.start_soon(cancel_once_started)
            await _plan(request, data, MAX_REPETITIONS, None, None, None)
        return started[0].returncode

    monkeypatch.setattr(asyncio, "create_subprocess_exec", recording)
    assert anyio.run(cancel_a_plan) == -15
