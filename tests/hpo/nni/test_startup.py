"""Start-up failures of engine nni through the real command line: NNI's bundled node missing, and the web UI's
port taken on IPv6 only ([::1]). Each names its cause; nothing is left behind that blocks the next `hpo run`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import nni_node
import pytest
import yaml

from hpo.nni.manager import load_experiments
from hpo.storage import SqlStorage
from tests.hpo.nni.conftest import nni_experiment_data

PORT = 18700


def hpo(tmp_path: Path, *args: str, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
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


def listen_on_ipv6_loopback_only(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET6)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s.bind(("::1", port))
    s.listen()
    return s


@pytest.mark.nni
@pytest.mark.slow
def test_missing_node_is_named_and_writes_nothing_then_a_port_taken_on_ipv6_is_skipped(tmp_path):
    data = nni_experiment_data(tmp_path, "nni_random", trials=2, parallel=2)
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(data))
    shadow = nni_node_without_node(tmp_path / "shadow")

    failed = hpo(tmp_path, "run", "exp.yaml", "--run-dir", "run", "--port", str(PORT), pythonpath=str(shadow))
    assert failed.returncode != 0
    assert f"NNI's bundled node ({shadow / 'nni_node' / 'node'}) is missing" in failed.stderr
    assert "Traceback" not in failed.stderr
    assert not (tmp_path / "run").exists()
    assert not (tmp_path / "hpo.db").exists() or not SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}").list_experiments()

    with listen_on_ipv6_loopback_only(PORT):  # NNI's clients reach the manager at localhost: [::1] first
        run = hpo(tmp_path, "run", "exp.yaml", "--run-dir", "run", "--port", str(PORT))
    assert run.returncode == 0, run.stderr
    assert f"port {PORT}: something listens on [::1]; the NNI web UI takes port {PORT + 1}" in run.stdout
    assert load_experiments(tmp_path / "run")[0].port == PORT + 1
    storage = SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}")
    rows = storage.list_trials(storage.get_experiment_by_name("nniexp").id)
    assert [t.state.value for t in rows] == ["completed", "completed"]


def test_resume_takes_port_like_run(tmp_path):
    from hpo.cli import build_parser

    args = build_parser().parse_args(["resume", "nniexp", "--port", "18123"])
    assert args.port == 18123
    assert build_parser().parse_args(["resume", "nniexp"]).port == 8080
