"""The README's demo block is what `make demo` prints today: the demo experiment runs as `make demo` runs it (the
preset, the generated demo corpus, its own SQLite database) and every line of the README's block is in its output.
About 7 minutes on an idle 2-core machine, so it is slow; the demo is deterministic (trials are bounded by samples),
so a busy machine gives the same lines later."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PRESET = ROOT / "search_spaces" / "presets" / "adam_vs_lamb_demo_cpu.yaml"


def readme_demo_block() -> list[str]:
    """The lines of the README's first plain code block after "## The demo, end to end"."""
    section = (ROOT / "README.md").read_text().split("## The demo, end to end", 1)[1]
    block = re.search(r"\n```\n(.*?)\n```", section, re.DOTALL)
    assert block, "README: no output block in the demo section"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_the_readme_has_the_demos_verdict_block():
    lines = readme_demo_block()
    assert any(line.startswith("verdict") for line in lines) and len(lines) >= 3


@pytest.mark.slow
def test_a_fresh_demo_prints_the_readmes_block(tmp_path):
    data = tmp_path / "demo"
    subprocess.run([sys.executable, "-m", "trainer.data.demo_corpus", "--out", str(data)], check=True,
                   capture_output=True, timeout=600)  # fmt: skip
    spec = yaml.safe_load(PRESET.read_text())
    spec["base_config"] = str((PRESET.parent / spec["base_config"]).resolve())
    data_paths = {"data.train": str(data / "train"), "data.eval": str(data / "eval")}
    spec["overrides"] = {**spec.get("overrides", {}), **data_paths}
    experiment = tmp_path / PRESET.name
    experiment.write_text(yaml.safe_dump(spec, sort_keys=False))
    hpo = [sys.executable, "-m", "hpo", "--db", f"sqlite:///{tmp_path / 'hpo.db'}"]
    run_dir = ["--run-dir", str(tmp_path / "run")]
    run = subprocess.run(
        [*hpo, "run", str(experiment), *run_dir], capture_output=True, text=True, timeout=3600, cwd=ROOT
    )
    assert run.returncode == 0, run.stderr[-3000:]
    printed = {line.strip() for line in run.stdout.splitlines()}
    missing = [line for line in readme_demo_block() if line.strip() not in printed]
    assert missing == [], "README's demo block lines not printed by today's demo:\n" + "\n".join(missing)
