"""docker-compose.yml, validated by a real Compose implementation (Debian's docker-compose, `config`), then
its structure: the start order, the healthchecks, the GPU reservations, the ports and the settings."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict:
    """The file as `docker-compose config` resolves it (variables substituted, anchors merged)."""
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.skip("docker-compose is not installed: `make system-deps` installs Debian's docker-compose")
    env = {"PATH": "/usr/bin:/bin", "HPO_API_TOKEN": "t0k3n"}  # nothing else from this machine's environment
    result = subprocess.run([binary, "-f", str(ROOT / "docker-compose.yml"), "config"], capture_output=True,
                            text=True, timeout=60, cwd=ROOT, env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_postgres_then_migration_then_api(compose):
    services = compose["services"]
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])
    assert services["migrate"]["command"] == ["hpo", "db", "upgrade"]
    assert services["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert services["migrate"]["restart"] == "no"
    api = services["api"]
    assert api["command"][:4] == ["hpo", "serve", "--host", "0.0.0.0"]
    assert api["depends_on"] == {"migrate": {"condition": "service_completed_successfully"}}
    assert "/api/v1/health" in " ".join(api["healthcheck"]["test"])
    assert api["environment"]["HPO_API_TOKEN"] == "t0k3n"
    assert api["ports"] == ["127.0.0.1:8000:8000/tcp"]  # published on this machine only by default
    user, password, db = (services["postgres"]["environment"][k] for k in ("POSTGRES_USER", "POSTGRES_PASSWORD",
                                                                           "POSTGRES_DB"))  # fmt: skip
    for name in ("migrate", "api", "controller", "dask-worker"):
        url = services[name]["environment"]["HPO_DATABASE_URL"]
        assert url == f"postgresql+psycopg://{user}:{password}@postgres:5432/{db}", name


def test_controller_and_dask_worker_reserve_gpus(compose):
    services = compose["services"]
    for name in ("controller", "dask-worker"):
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}], name
    controller = services["controller"]
    assert controller["command"][:2] == ["hpo", "run"]
    assert "127.0.0.1:8080:8080/tcp" in controller["ports"]  # the NNI web UI
    assert controller["depends_on"] == {"migrate": {"condition": "service_completed_successfully"}}
    assert services["dask-scheduler"]["command"][:2] == ["dask", "scheduler"]
    worker = services["dask-worker"]["command"]
    assert worker[:3] == ["dask", "worker", "tcp://dask-scheduler:8786"]
    assert worker[worker.index("--resources") + 1] == "GPU=8"


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Whether a .dockerignore with `patterns` keeps `path` out of the build context: a pattern matches the path or
    a folder above it (`**/` at any depth), a `!` pattern lets it back in, the last matching pattern decides."""
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    ignored = False
    for pattern in patterns:
        keep = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        if pattern.startswith("**/"):  # at any depth: the name of the path or of a folder above it
            matched = any(fnmatch.fnmatchcase(c.rsplit("/", 1)[-1], pattern[3:]) for c in candidates)
        else:
            matched = any(fnmatch.fnmatchcase(c, pattern) for c in candidates)
        if matched:
            ignored = not keep
    return ignored


def test_dockerignored_reads_patterns_as_docker_does():
    assert dockerignored("README.md", ["*.md"]) and not dockerignored("README.md", ["*.md", "!README.md"])
    assert dockerignored("docs/api.md", ["docs"]) and dockerignored("hpo/x/__pycache__", ["**/__pycache__"])
    assert not dockerignored("hpo", ["**/__pycache__", "docs", "*.h5"]) and not dockerignored("hpo.md", ["hpo"])


def test_the_image_copies_what_exists_and_dockerignore_keeps_it():
    dockerfile = (ROOT / "Dockerfile").read_text()
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and line.strip()[0] != "#"]  # fmt: skip
    copies = [line.split()[1:-1] for line in dockerfile.splitlines() if line.startswith("COPY ")]
    assert ["pyproject.toml", "README.md"] in copies  # every source of a COPY, not only its first (the readme)
    for source in (source for sources in copies for source in sources):  # a pattern such as *.md too, not only a name
        assert (ROOT / source).exists() and not dockerignored(source, patterns), source
    assert {"trainer", "hpo", "search_spaces", "server"} <= set(re.findall(r"^COPY (\w+) ", dockerfile, re.M))


def test_the_image_patches_nni_after_installing_it_as_the_set_up_does():
    """The controller service runs `engine: nni`, which refuses an unpatched NNI manager; the image patches it, as
    `make setup` does, once the project (and NNI with it) is installed."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert "-m hpo.nni.patch" in makefile
    runs = re.findall(r"^RUN (.+?)(?<!\\)$", dockerfile, re.MULTILINE | re.DOTALL)
    install = next(i for i, run in enumerate(runs) if "pip install --no-deps ." in run)
    assert "python -m hpo.nni.patch" in runs[install].split("pip install --no-deps .", 1)[1], runs[install]
