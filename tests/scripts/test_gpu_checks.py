"""scripts/gpu_checks.sh on the CPU: a GPU machine is lent for minutes, so a check whose command line its program
refuses would cost a lease. Every benchmark the script runs parses the script's arguments with its own parser,
every file it names exists, and its time limits, with its set-up, fit in its 8-minute deadline; run with an
interpreter whose checks never end, the script cuts the check at the deadline, skips the rest and still writes its
summary and archive."""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_checks.sh"
DEADLINE_S = 480  # the GPU checks, the experiment among them, in at most 8 minutes of device time
SETUP_S = 25  # before the first check: the wheels' install and import check, nvidia-smi, a torch import (13-25 s)


def checks() -> list[tuple[str, int, list[str]]]:
    """(name, seconds, argv) of every `run NAME SECONDS CMD...` line, with the script's variables put in."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    variables = dict(re.findall(r'^(\w+)="([^"]*)"$', text, re.MULTILINE))
    out = []
    for line in text.splitlines():
        if not line.startswith("run "):
            continue
        line = line.replace("$PY", "python").replace("\\$", "$")
        for name, value in variables.items():
            line = line.replace(f"${name}", value)
        _, name, seconds, *argv = shlex.split(line)
        out.append((name, int(seconds), argv))
    return out


def bench_commands() -> list[tuple[str, str, list[str]]]:
    """(check, module, arguments) of each `python -m bench.X ...`, also inside a `sh -c` loop."""
    found = []
    for name, _, argv in checks():
        words = shlex.split(argv[-1]) if argv[:2] == ["sh", "-c"] else argv
        for i, word in enumerate(words[:-1]):
            if word == "-m" and words[i + 1].startswith("bench."):
                rest = words[i + 2 :]
                end = next((j for j, w in enumerate(rest) if w in (";", "done", "do")), len(rest))
                found.append((name, words[i + 1], [w.rstrip(";") for w in rest[:end]]))
    return found


def test_the_script_runs_its_checks_within_its_deadline():
    names = [name for name, _, _ in checks()]
    assert names[0] == "experiment"
    assert {"throughput_128", "throughput_chained", "tests", "clipping", "noise_scale"} <= set(names)
    assert f"DEADLINE_S=${{DEADLINE_S:-{DEADLINE_S}}}" in SCRIPT.read_text()
    keep = int(re.search(r"^KEEP_S=\$\{KEEP_S:-(\d+)\}", SCRIPT.read_text(), re.MULTILINE).group(1))
    assert SETUP_S + sum(seconds for _, seconds, _ in checks()) + keep <= DEADLINE_S


@pytest.mark.slow  # waits out a 15 s deadline: run `pytest -m slow tests/scripts` before a GPU lease; the limits
# fit the deadline by default (test_the_script_runs_its_checks_within_its_deadline)
def test_a_check_past_the_deadline_is_cut_the_rest_skipped_and_the_summary_and_archive_still_written(tmp_path):
    """An interpreter that runs Python as usual but never ends a module (`-m`), in a session of its own as a trial
    is: the experiment's `hpo run`, every benchmark and pytest hang as a stuck GPU would (the machine's line gets a
    stand-in for torch's, and wheels in .whl/ do not install). With a deadline of 15 s, 1 of them kept for the
    summary, the experiment gets what the set-up left of 14 s and is cut (6 s were too few for a set-up on a busy
    machine, whose every check was then skipped), and its process left in a session of its
    own is found by the script's mark and ended (another user's launcher is not); no time is left for the other
    checks, which are named as skipped."""
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n"
                      'case "$*" in *"import torch"*) echo "torch (none)"; exit 0;; *"-m pip"*) exit 1;;\n'
                      '  -) cat > /dev/null; echo "torch (none)"; exit 0;; esac\n'
                      'for a in "$@"; do [ "$a" = -m ] && exec setsid -w sleep 300 >/dev/null 2>&1; done\n'
                      f'exec {sys.executable} "$@"\n')  # fmt: skip
    python.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": str(python), "PACK": "1",
           "DEADLINE_S": "15", "KEEP_S": "1", "MIN_S": "1",
           "EXPERIMENT_OUT": str(tmp_path / "experiment"), "DATA": str(tmp_path / "data")}  # fmt: skip
    env.pop("PYTHONPATH", None)
    # Another user's trial launcher on the machine: not the script's to end (a pattern on command lines killed it)
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "-m", "hpo.runners.preload"])
    try:
        done = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert decoy.poll() is None
    finally:
        decoy.kill()
        decoy.wait()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = (out / "summary.txt").read_text()
    # the experiment's `hpo run` (a sleep here) outlived its cut: found by the mark in its environment, and ended
    assert re.search(r"^=== experiment: [1-9]\d* leftover trial process\(es\) ended before the next check$", summary,
                     re.MULTILINE), summary  # fmt: skip
    exits = re.findall(r"^=== (\w+) exit (\d+) after \d+ s \(limit (\d+) s\)$", summary, re.MULTILINE)
    assert len(exits) == 1 and exits[0][0] == "experiment" and exits[0][1] == "124" and int(exits[0][2]) <= 14
    skipped = re.findall(r"^=== (\w+) skipped: -?\d+ s left of the script's 15 s$", summary, re.MULTILINE)
    assert sorted(skipped) == sorted(name for name, _, _ in checks()[1:])
    assert sorted(p.name for p in out.iterdir()) == ["gpu_checks.tar.gz", "summary.txt"]
    with tarfile.open(out / "gpu_checks.tar.gz") as archive:
        packed = set(archive.getnames())
    assert {f"{name}.txt" for name, _, _ in checks()} | {"machine.txt"} <= packed


def torch_sees_a_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


class Parsed(Exception):
    """Raised in place of running the benchmark once its parser has accepted the arguments."""


@pytest.mark.parametrize(("check", "module", "arguments"), bench_commands(), ids=[c[0] for c in bench_commands()])
def test_every_benchmark_accepts_the_scripts_arguments(monkeypatch, check, module, arguments):
    original = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, args=None, namespace=None):
        raise Parsed(original(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
    monkeypatch.setattr(sys, "argv", [module, *arguments])
    with pytest.raises(Parsed) as parsed:
        importlib.import_module(module).main()
    args = parsed.value.args[0]
    assert args.device == "cuda", f"{check}: a GPU check that would run on the CPU"
    if module == "bench.trainer_throughput":
        from bench.trainer_throughput import parse_variant

        for variant in args.variants.split(","):
            parse_variant(variant)


def test_the_files_the_checks_run_exist():
    for name, _, argv in checks():
        for word in argv:
            if word.startswith(("scripts/", "tests/")):
                assert (ROOT / word).exists(), f"{name}: {word} does not exist"


def test_without_a_gpu_the_script_says_so_at_once_and_writes_nothing(tmp_path):
    """An interpreter whose torch sees no GPU (a stand-in: its check exits 1 as torch's does on a CPU machine, without
    the seconds of importing torch). The project's interpreter, whose torch is asked for real on this CPU:
    test_without_python_named_the_script_runs_the_projects_environment."""
    python = tmp_path / "python"
    python.write_text('#!/bin/sh\ncase "$*" in *"torch.cuda.is_available()"*) exit 1;; esac\nexit 99\n')
    python.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": str(python)}
    done = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert f"scripts/gpu_checks.sh: {python} sees no CUDA GPU" in done.stderr
    assert "`make test`" in done.stderr and not out.exists()


def test_without_the_projects_packages_the_script_stops_at_once_and_says_to_bring_the_wheels(tmp_path):
    """A GPU image without pydantic (the wheels left behind): every check would fail on its imports, one after the
    other, for the whole lease; the script says so in its summary and stops."""
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n"
                      'case "$*" in *"import torch"*) exit 0;;\n'
                      '  *"import pydantic"*) echo "No module named pydantic" >&2; exit 1;;\n'
                      'esac\nexit 99\n')  # fmt: skip
    python.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": str(python)}
    done = subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    said = "the project's packages do not import here (No module named pydantic): make the wheels with"
    assert said in done.stderr and said in (out / "summary.txt").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["summary.txt"]  # no check ran


@pytest.mark.skipif(torch_sees_a_gpu(), reason="this machine has a CUDA GPU")
def test_without_python_named_the_script_runs_the_projects_environment():
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    done = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    expected = ".venv/bin/python" if (ROOT / ".venv" / "bin" / "python").exists() else "python3"
    assert done.returncode == 2 and f"scripts/gpu_checks.sh: {expected} sees no CUDA GPU" in done.stderr


def test_the_tests_check_runs_every_file_with_gpu_marked_tests():
    (argv,) = [argv for name, _, argv in checks() if name == "tests"]
    files = {word.replace("$T", "tests/trainer") for word in argv if word.endswith(".py")}
    marked = {str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("test_*.py")
              if path != Path(__file__) and "pytest.mark.gpu" in path.read_text()}  # fmt: skip
    assert files == marked and argv[argv.index("pytest") + 1 : argv.index("pytest") + 3] == ["-m", "gpu"]


def test_the_summary_finds_pytests_last_line_quiet_or_verbose():
    """The tests check runs pytest with -v, whose last line is framed by '='; -q's is not."""
    pattern = re.search(r'grep -hE "(\^\(=\+ \)\?\[0-9\][^"]*)" "\$OUT/tests.txt"', SCRIPT.read_text()).group(1)
    lines = "collected 14 items\n==== 13 passed, 1 skipped in 44.21s ====\n13 passed, 1 skipped in 44.21s\nother\n"
    found = subprocess.run(["grep", "-hE", pattern], input=lines, capture_output=True, text=True).stdout.splitlines()
    assert found == ["==== 13 passed, 1 skipped in 44.21s ====", "13 passed, 1 skipped in 44.21s"]
