"""bench.checkpoint_check on the small model: one line with the checkpoint's size and the two times (the check it
times refuses a changed checkpoint: tests/trainer/test_bad_input.py)."""

from __future__ import annotations

import re
import sys

from bench import checkpoint_check


def test_the_line_names_the_sizes_and_times_of_a_real_checkpoint(monkeypatch, capsys):
    """`python -m bench.checkpoint_check --size cpu --repeat 1` as its `main` in this process."""
    monkeypatch.setattr(sys, "argv", ["bench.checkpoint_check", "--size", "cpu", "--repeat", "1"])
    checkpoint_check.main()
    out = capsys.readouterr().out
    line = re.fullmatch(r"size=cpu checkpoint ([\d.]+) GB: torch.load ([\d.]+) s, check_intact ([\d.]+) s "
                        r"\(([\d.]+) s a GB\), the check ([\d.]+)x the load\n", out)  # fmt: skip
    assert line is not None, out
    gb = float(line[1])
    assert 0.01 < gb < 1  # 4 layers of width 256, BERT's vocabulary, with AdamW's two moments: about 0.15 GB
