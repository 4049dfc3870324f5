"""Start-up failures of engine nni through the real command line: NNI's bundled node missing, NNI's manager
exiting at once (a `--require`d script in NODE_OPTIONS, which the manager's node reads, exits it), and the web
UI's port taken on IPv6 only ([::1]). Each names its cause; nothing is left behind that blocks the next `hpo run`.
A port another process takes between its check and the manager's start is left for the next free one."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import nni_node
import pytest
import yaml

from hpo.cli.main import FIXED_HASH_SEED
from hpo.nni.manager import NniEngineError, free_port, load_experiments, rest
from hpo.storage import SqlStorage
from tests.hpo.nni.conftest import nni_experiment_data

PORT = 18700


def hpo(tmp_path: Path, *args: str, pythonpath: str | None = None, **env_vars: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONHASHSEED": FIXED_HASH_SEED, **env_vars}  # `hpo run` need not start itself again
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([pythonpath, env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "hpo", "--db", f"sqlite:///{tmp_path / 'hpo.db'}", *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)  # fmt: skip


def nni_node_without_node(root: Path) -> Path:
    """A copy of the installed `nni_node` package made of links to its files, less the bundled `node`: first on
    PYTHONPATH it is the NNI that `import nni_node` finds (the shared install is left as it is)."""
    real = Path(nni_node.__path__[0])
    shadow = root / "nni_node"
    shadow.mkdir(parents=True)
    for entry in real.iterdir():
        if entry.name not in ("node", "__pycache__"):
            (shadow / entry.name).symlink_to(entry)
    return root


def manager_exits_at_once(tmp_path: Path) -> str:
    """NODE_OPTIONS under which NNI's manager (a node process) exits with code 7 before it listens."""
    script = tmp_path / "exit7.js"
    script.write_text("process.exit(7);\n")
    return f'--require "{script}"'


def assert_manager_exit_named_and_nothing_recorded(tmp_path: Path, failed: subprocess.CompletedProcess) -> None:
    assert failed.returncode == 2
    assert "Traceback" not in failed.stderr
    assert "error: NNI experiment hpo1-arm0 failed before any trial started: NNI's manager exited with code 7 " \
           "before it answered on port" in failed.stderr  # fmt: skip
    kept = tmp_path / "run" / "nni" / "failed-start" / "hpo1-arm0" / "log"
    assert f"(NNI's logs: {kept}, " in failed.stderr and (kept / "nnictl_stderr.log").exists()
    assert "nothing was recorded: `hpo run` starts nniexp afresh once the cause is fixed" in failed.stderr
    assert SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}").list_experiments() == []  # `hpo run` checks this
    assert load_experiments(tmp_path / "run") == []  # a new run counts no earlier NNI experiment of its arm
    assert not (tmp_path / "run" / "nni" / "nni-experiments" / "hpo1-arm0").exists()  # nor meets its files


@pytest.mark.nni
def test_a_manager_that_exits_at_once_is_named_and_leaves_nothing_recorded(tmp_path, monkeypatch, capsys):
    from hpo.cli.main import main

    data = nni_experiment_data(tmp_path, "nni_random", trials=2, parallel=2)
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setenv("NODE_OPTIONS", manager_exits_at_once(tmp_path))  # what NNI's launcher passes its manager
    monkeypatch.chdir(tmp_path)
    # `hpo run` in this process (the slow test below runs it as a command); NNI's launcher is a process of its own
    code = main(["--db", f"sqlite:///{tmp_path / 'hpo.db'}", "run", "exp.yaml", "--run-dir", "run", "--port",
                 str(PORT + 50)])  # fmt: skip
    out, err = capsys.readouterr()
    assert_manager_exit_named_and_nothing_recorded(tmp_path, subprocess.CompletedProcess("hpo run", code, out, err))


@pytest.mark.nni
@pytest.mark.slow
def test_a_tuner_that_fails_is_named_and_leaves_nothing_recorded(tmp_path):
    """nni_smac builds SMAC at its first suggestion; when that raises, NNI 3.0 logs it in the tuner's log and
    stays RUNNING without starting a trial: the engine reads the log, stops NNI and names the error."""
    data = nni_experiment_data(tmp_path, "nni_smac", trials=2, parallel=2)
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(data))
    broken = tmp_path / "broken" / "smac"  # first on the tuner's PYTHONPATH (the controller never imports smac)
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('smac is broken on this machine')\n")
    failed = hpo(tmp_path, "run", "exp.yaml", "--run-dir", "run", "--port", str(PORT + 60),
                 pythonpath=str(broken.parent))  # fmt: skip
    assert failed.returncode == 2 and "Traceback" not in failed.stderr, failed.stderr
    assert "error: NNI experiment hpo1-arm0 failed before any trial started: ImportError: smac is broken on this " \
           "machine" in failed.stderr  # fmt: skip
    assert "nothing was recorded: `hpo run` starts nniexp afresh" in failed.stderr
    assert SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}").list_experiments() == []
    assert load_experiments(tmp_path / "run") == []
    assert (tmp_path / "run" / "nni" / "failed-start" / "hpo1-arm0" / "log" / "dispatcher.log").exists()
    with pytest.raises(NniEngineError):  # its manager was stopped
        rest(PORT + 60, "check-status", timeout=2)


def listen_on_ipv6_loopback_only(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET6)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s.bind(("::1", port))
    s.listen()
    return s


@pytest.mark.nni
@pytest.mark.slow
def test_missing_node_then_a_manager_exit_are_named_then_a_port_taken_on_ipv6_is_skipped(tmp_path):
    data = nni_experiment_data(tmp_path, "nni_random", trials=2, parallel=2)
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(data))
    shadow = nni_node_without_node(tmp_path / "shadow")

    failed = hpo(tmp_path, "run", "exp.yaml", "--run-dir", "run", "--port", str(PORT), pythonpath=str(shadow))
    assert failed.returncode != 0
    assert f"NNI's bundled node ({shadow / 'nni_node' / 'node'}) is missing" in failed.stderr
    assert "Traceback" not in failed.stderr
    assert not (tmp_path / "run").exists()
    assert not (tmp_path / "hpo.db").exists() or not SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}").list_experiments()

    exits = hpo(tmp_path, "run", "exp.yaml", "--run-dir", "run", "--port", str(PORT),
                NODE_OPTIONS=manager_exits_at_once(tmp_path))  # fmt: skip
    assert_manager_exit_named_and_nothing_recorded(tmp_path, exits)

    with listen_on_ipv6_loopback_only(PORT):  # NNI's clients reach the manager at localhost: [::1] first
        run = hpo(tmp_path, "run", "exp.yaml", "--run-dir", "run", "--port", str(PORT))
    assert run.returncode == 0, run.stderr
    assert f"port {PORT}: something listens on [::1]; the NNI web UI takes port {PORT + 1}" in run.stdout
    assert load_experiments(tmp_path / "run")[0].port == PORT + 1
    storage = SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}")
    rows = storage.list_trials(storage.get_experiment_by_name("nniexp").id)
    assert [t.state.value for t in rows] == ["completed", "completed"]


def test_every_port_passed_over_is_named_with_why():
    """Two ports taken (one on 127.0.0.1, one on [::1] only): the web UI takes the third, and both are named with
    their reason (only the first one tried was)."""
    from hpo.nni.manager import passed_over, taken_from

    first = free_port(PORT + 40)
    with socket.socket(socket.AF_INET) as ipv4:
        ipv4.bind(("127.0.0.1", first))
        ipv4.listen()
        with listen_on_ipv6_loopback_only(first + 1):
            taken = taken_from(first)
            assert [port for port, _ in taken] == [first, first + 1] and free_port(first) == first + 2
            assert passed_over(taken, first + 2) == (
                f"port {first}: {taken[0][1]}; port {first + 1}: something listens on [::1]; "
                f"the NNI web UI takes port {first + 2}"
            )
    assert taken[0][1].startswith("in use on 127.0.0.1")
    assert passed_over([], first) == ""  # the port asked for was free


def test_nni_statuses_are_said_in_words():
    """NNI's NO_MORE_TRIAL, shown as it is while its last trials ran, read as "nothing runs"."""
    from hpo.nni.jobs import nni_status_words

    assert nni_status_words("NO_MORE_TRIAL") == "running its last trials (none left to submit)"
    assert nni_status_words("RUNNING") == "running"
    assert nni_status_words("SOMETHING_NEW") == "something_new"  # as NNI says it


def test_resume_takes_port_like_run(tmp_path):
    from hpo.cli.main import build_parser

    args = build_parser().parse_args(["resume", "nniexp", "--port", "18123"])
    assert args.port == 18123
    assert build_parser().parse_args(["resume", "nniexp"]).port is None  # NNI_PORT where the engine is nni


@pytest.mark.nni
def test_a_port_beyond_65535_is_named_and_leaves_nothing_recorded(tmp_path):
    data = nni_experiment_data(tmp_path, "nni_random", trials=2, parallel=2)
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(data))
    failed = hpo(tmp_path, "run", "exp.yaml", "--run-dir", "run", "--port", "70000")
    assert failed.returncode == 2 and "Traceback" not in failed.stderr, failed.stderr
    assert "argument --port: expected a TCP port (1 to 65535), got 70000" in failed.stderr
    assert not (tmp_path / "hpo.db").exists() and not (tmp_path / "run").exists()  # refused before anything
    with pytest.raises(NniEngineError, match="--port 70000 is not a TCP port"):  # as `hpo webui --port` gives it
        free_port(70000)


# Loaded by NNI's manager (a node process) before it listens: the first manager to load it starts another process
# that takes the manager's port and keeps it, as an experiment started in the same moment would between our check
# of the port and the manager's start (it drops every connection: NNI's launcher does not wait on it for an answer).
# The marker file holds that process's pid.
TAKE_PORT_JS = """
const fs = require("fs");
const marker = process.env.HPO_TEST_TAKE_PORT;
const at = process.argv.indexOf("--port");
if (marker && at > 0 && !fs.existsSync(marker)) {
  fs.writeFileSync(marker, "");
  const env = {...process.env};
  delete env.NODE_OPTIONS;
  const listen = `require("net").createServer((c) => c.destroy()).listen(${process.argv[at + 1]}, "127.0.0.1", () => ` +
    `require("fs").writeFileSync(${JSON.stringify(marker)}, String(process.pid))); setTimeout(() => {}, 600000);`;
  require("child_process").spawn(process.execPath, ["-e", listen], {detached: true, stdio: "ignore", env}).unref();
  const start = Date.now();
  while (fs.readFileSync(marker, "utf8") === "" && Date.now() - start < 20000) {}
}
"""


@pytest.mark.nni
@pytest.mark.slow  # four NNI managers started; the default suite's start-up failures are the manager exit above
def test_a_port_taken_between_its_check_and_the_managers_start_is_left_for_the_next_free_one(tmp_path):
    data = nni_experiment_data(tmp_path, "nni_random", trials=1, parallel=1)
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(data))
    (tmp_path / "take_port.js").write_text(TAKE_PORT_JS)
    marker = tmp_path / "taker.pid"
    port = free_port(PORT + 70)
    takers: list[int] = []
    taking = f'--require "{tmp_path / "take_port.js"}"'
    try:
        run = hpo(tmp_path, "run", "exp.yaml", "--run-dir", "run", "--port", str(port), NODE_OPTIONS=taking,
                  HPO_TEST_TAKE_PORT=str(marker))  # fmt: skip
        takers.append(int(marker.read_text()))  # the port was taken as the first manager started
        assert run.returncode == 0, run.stderr
        assert f"port {port} was taken by another process as NNI's manager started (address already in use " \
               f"127.0.0.1:{port}); starting the arm's NNI experiment once more" in run.stdout  # fmt: skip
        assert f"port {port}: in use on 127.0.0.1 (Address already in use); the NNI web UI takes port {port + 1}" \
               in run.stdout  # fmt: skip
        assert [e.port for e in load_experiments(tmp_path / "run")] == [port + 1]
        storage = SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}")
        rows = storage.list_trials(storage.get_experiment_by_name("nniexp").id)
        assert [t.state.value for t in rows] == ["completed"]

        viewer = tmp_path / "viewer-taker.pid"  # its web UI reopened: the port the view chose is taken as well
        webui = hpo(tmp_path, "webui", "nniexp", "--port", str(port), NODE_OPTIONS=taking,
                    HPO_TEST_TAKE_PORT=str(viewer))  # fmt: skip
        takers.append(int(viewer.read_text()))
        assert webui.returncode == 0, webui.stderr
        assert f"nniexp: NNI web UI at http://127.0.0.1:{port + 2} (NNI experiment hpo1-arm0)" in webui.stdout
        assert rest(port + 2, "experiment")["id"] == "hpo1-arm0"
        assert hpo(tmp_path, "webui", "nniexp", "--stop").returncode == 0
    finally:
        for pid in takers:
            os.kill(pid, 9)
