"""The user-facing docs (README.md, BENCHMARKS.md, docs/) speak to users: no path of a development machine, no
words about how the work was organized. Each rule is checked on a line that breaks it, so the check can fail."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]

MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|root|home/\w+|tmp/pytest-of-\w+)/")
PROCESS_WORDS = re.compile(
    r"\b(?:the issue's|this issue|issue #?\d+|(?:this|first|second|third|fourth|next|previous) session|in this sitting"
    r"|this checkout)\b",
    re.IGNORECASE,
)


def offending(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if MACHINE_PATH.search(line) or PROCESS_WORDS.search(line)]


def test_the_rules_catch_what_they_are_for():
    text = "see /work/main/runs/x\nran in this session\nthe issue's question\nfine /usr/bin/x\n(third session)"
    assert offending(text) == [
        "see /work/main/runs/x",
        "ran in this session",
        "the issue's question",
        "(third session)",
    ]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_machine_path_or_process_word(doc: Path):
    assert offending(doc.read_text()) == []


def test_the_example_experiment_file_is_the_shipped_preset():
    page = (ROOT / "docs" / "experiments.md").read_text()
    example = page.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert example == (ROOT / "search_spaces" / "presets" / "adam_vs_lamb.yaml").read_text()
