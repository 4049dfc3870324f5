"""scripts/gpu_checks.sh, read on the CPU: a GPU machine is lent for minutes, so a check whose command line its
program refuses would cost a lease. Every benchmark the script runs parses the script's arguments with its own
parser, every file it names exists, and its time limits, with its set-up, fit in one command of the device machine
(600 s)."""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_checks.sh"
DEVICE_COMMAND_LIMIT_S = 600
SETUP_S = 20  # before the first check: the wheels' install, nvidia-smi and a torch import for the machine's line


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


def test_the_script_runs_its_checks_within_one_device_command():
    names = [name for name, _, _ in checks()]
    assert {"experiment", "throughput", "micro_batch", "tests", "clipping", "noise_scale"} <= set(names)
    assert SETUP_S + sum(seconds for _, seconds, _ in checks()) <= DEVICE_COMMAND_LIMIT_S


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
