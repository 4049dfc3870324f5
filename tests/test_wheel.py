"""The package runs outside the checkout: a wheel built from the source, installed into a fresh virtual environment,
runs `hpo --help`, `hpo presets`, `hpo plan` and `hpo run` on its installed simulated preset (by its name) from an
empty directory.

The fresh environment gets the project's dependencies from the environment running the tests (a `.pth` line, so
nothing is downloaded) but not the project itself: the editable install's finder lives in a `.pth` file there,
which a path added by a `.pth` line does not run, so `hpo` can only come from the wheel (checked below).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# What a checkout holds beside the source (at its top: `data/` there is generated, `trainer/data/` is code)
NOT_SOURCE = {".git", ".venv", "runs", "data", "site", "build", "reports", ".hpo", "gpu_checks", ".pytest_cache",
              ".ruff_cache"}  # fmt: skip


def _not_source(directory: str, names: list[str]) -> set[str]:
    top = Path(directory) == ROOT
    return {n for n in names if (top and n in NOT_SOURCE) or n == "__pycache__" or n.endswith(".egg-info")}


PRESET = "adam_vs_lamb_simulated"


def build_wheel(out: Path) -> Path:
    source = out / "source"
    shutil.copytree(ROOT, source, ignore=_not_source)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(source)], check=True, capture_output=True, text=True, timeout=300)  # fmt: skip
    (wheel,) = out.glob("bert_hpo-*.whl")
    return wheel


def fresh_environment(where: Path, wheel: Path) -> Path:
    venv.EnvBuilder(with_pip=False).create(where)
    python = where / "bin" / "python"
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    dependencies = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *sys.path[1:]}
    lines = [p for p in dependencies if p.endswith("site-packages") and Path(p).is_dir()]
    Path(purelib, "dependencies.pth").write_text("\n".join(sorted(lines)) + "\n")
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--ignore-installed"]
    subprocess.run([*install, str(wheel)], check=True, capture_output=True, text=True, timeout=300)
    return where / "bin"


@pytest.mark.slow  # builds and installs a wheel, then plans and runs a simulated experiment: about a minute
def test_the_installed_wheel_runs_plan_and_run_without_a_checkout(tmp_path):
    bin_dir = fresh_environment(tmp_path / "venv", build_wheel(tmp_path / "wheel"))
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HPO_DATABASE_URL")}

    def run(*args: str) -> str:
        done = subprocess.run(args, cwd=empty, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
        return done.stdout + done.stderr

    where = run(str(bin_dir / "python"), "-c", "import hpo, search_spaces; print(hpo.__file__, search_spaces.__file__)")
    assert str(ROOT) not in where and str(tmp_path / "venv") in where  # the wheel's copy, not the checkout's
    assert "plan" in run(str(bin_dir / "hpo"), "--help")
    assert PRESET in run(str(bin_dir / "hpo"), "presets")
    plan = run(str(bin_dir / "hpo"), "plan", PRESET, "--repetitions", "2")  # the shipped preset, by its name
    assert "GPU-hours" in plan and "hpo/simulation/tables/curves.jsonl" in plan  # the shipped table
    out = run(str(bin_dir / "hpo"), "--db", "sqlite:///hpo.db", "run", PRESET, "--quiet")
    status = run(str(bin_dir / "hpo"), "--db", "sqlite:///hpo.db", "status", PRESET)
    assert "verdict now" in status, out
    assert sorted(p.name for p in empty.iterdir()) == ["hpo.db", "runs"]  # everything it wrote is where it ran


def test_the_sdist_holds_the_packages_and_their_data_and_no_tests(tmp_path):
    """A source distribution built from the source: the packages with their data files (presets, configs, tables,
    migrations) and no file of tests/ (setuptools' default would add the top of tests/, whose files import the rest)."""
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=_not_source)
    build = "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
    name = subprocess.run([sys.executable, "-c", build, str(tmp_path / "dist")], cwd=source, check=True,
                          capture_output=True, text=True, timeout=300).stdout.strip().splitlines()[-1]  # fmt: skip
    with tarfile.open(tmp_path / "dist" / name) as sdist:
        members = {m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name}
    assert not [m for m in members if m.startswith("tests/")]
    for path in ("trainer/model.py", "hpo/cli/main.py", "server/app.py", "search_spaces/presets/adam_vs_lamb.yaml",
                 "trainer/configs/demo_cpu.yaml", "hpo/simulation/tables/curves.jsonl", "pyproject.toml"):  # fmt: skip
        assert path in members, path
    assert any(m.startswith("hpo/storage/migrations/versions/") and m.endswith(".py") for m in members)
