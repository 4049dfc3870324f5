"""docs/gpu.md runs as written: every command of its code blocks parses with the command line it calls (the
subcommand, each flag and its value), its copy of a preset, edited as the page edits it, loads from where the page
puts it, and its data step runs end to end on a small corpus (prepare the shards with the page's own flags, then
`python -m trainer` trains on them: both programs' `main`, in this process)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from hpo.cli.main import build_parser
from hpo.experiment import load_experiment
from trainer.__main__ import main as trainer_main
from trainer.data.demo_corpus import generate_documents, write_text
from trainer.data.prepare import main as prepare_main
from trainer.data.prepare import parse_args as prepare_args

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "gpu.md"


def page_commands() -> list[list[str]]:
    """Each command line of the page's ```bash blocks, its trailing comment removed."""
    blocks = re.findall(r"```bash\n(.*?)```", PAGE.read_text(), re.DOTALL)
    lines = [line.split("  #")[0].strip() for block in blocks for line in block.splitlines()]
    return [shlex.split(line) for line in lines if line]


def check(argv: list[str]) -> None:
    """Parse `argv` as its program would (argparse exits on an unknown flag, subcommand or value)."""
    if argv[0] == "hpo":
        build_parser().parse_args(argv[1:])
    elif argv[:3] == ["python", "-m", "trainer.data.prepare"]:
        prepare_args(argv[3:])
    elif argv[0] == "cp":
        assert (ROOT / argv[1]).is_file(), argv
    elif argv[:2] == ["sed", "-i"] and len(argv) == 4:
        assert argv[3] in {a[2] for a in page_commands() if a[0] == "cp"}, argv  # edits the page's own copy
    elif argv[0] == "bash" and len(argv) == 2:
        assert (ROOT / argv[1]).is_file() and argv[1].startswith("scripts/"), argv
    else:
        raise AssertionError(f"docs/gpu.md: a command this test does not know how to check: {shlex.join(argv)}")


def test_the_page_has_the_walkthrough_commands():
    programs = {" ".join(argv[:2]) for argv in page_commands()}
    assert {"hpo run", "hpo plan", "hpo status", "hpo best", "hpo export", "python -m", "cp search_spaces/presets/"
            "adam_vs_lamb.yaml"} <= programs | {" ".join(a[:2]) for a in page_commands() if a[0] == "cp"}  # fmt: skip


@pytest.mark.parametrize("argv", page_commands(), ids=lambda argv: " ".join(argv[:3]))
def test_every_command_parses_as_written(argv: list[str]):
    check(argv)


def test_the_copied_preset_loads_from_where_the_page_puts_it(tmp_path):
    """The page's cp and sed lines run in a checkout's root (its trainer/ and search_spaces/ linked in); the copy
    then loads as `hpo plan` and `hpo run` load it."""
    for folder in ("trainer", "search_spaces"):
        (tmp_path / folder).symlink_to(ROOT / folder)
    files = [argv for argv in page_commands() if argv[0] in ("cp", "sed")]
    assert [argv[0] for argv in files] == ["cp", "sed", "sed"]
    for argv in files:
        subprocess.run(argv, cwd=tmp_path, check=True, timeout=30)
    copy_of = tmp_path / files[0][2]
    spec = load_experiment(copy_of)
    assert spec.resolved_base()["model"]["hidden_size"] == 1024  # bert_large.yaml
    assert "../" not in copy_of.read_text().split("base_config:")[1].splitlines()[0]
    # the commands that follow name the experiment the copy defines (they named one the copy did not)
    named = {argv[argv.index(command) + 1] for argv in page_commands() if argv[0] == "hpo"
             for command in ("status", "trials", "best", "export", "report", "resume") if command in argv}  # fmt: skip
    assert named == {spec.name} == {"my_adam_vs_lamb"}, named


def test_a_broken_command_is_caught():
    with pytest.raises(SystemExit):
        check(["hpo", "export", "x", "--gpus-per-nodes", "8"])


def test_the_data_step_runs_end_to_end(tmp_path, monkeypatch, capsys):
    """`python -m trainer.data.prepare` and `python -m trainer` as their `main`s in this process (their processes
    would start Python and import torch again: seconds), the trainer in the directory the page runs it from."""
    (prepare,) = [argv for argv in page_commands() if argv[:3] == ["python", "-m", "trainer.data.prepare"]]
    corpus, out = tmp_path / "corpus.txt", tmp_path / "mine"
    write_text(generate_documents(200, seed=3), corpus)
    argv = [str(corpus) if a == "corpus.txt" else str(out) if a == "data/mine" else a for a in prepare[3:]]
    prepare_main(argv)  # a refusal raises SystemExit(2)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["max_seq_length"] == 512 and meta["train_samples"] > 0 and meta["eval_samples"] > 0
    overrides = [f"data.train={out / 'train'}", f"data.eval={out / 'eval'}", f"model.vocab_size={meta['vocab_size']}",
                 "model.max_position_embeddings=512", "balance.bins=[128,256,384,511,512]", "budget.max_samples=32",
                 "budget.max_time_s=null", "eval.every_samples=32", "eval.max_samples=16", "eval.batch_size=16",
                 f"log.jsonl={tmp_path / 'train.jsonl'}"]  # fmt: skip
    monkeypatch.chdir(tmp_path)
    code = trainer_main(["--config", str(ROOT / "trainer/configs/demo_cpu.yaml"), *overrides])
    assert code == 0, capsys.readouterr().err[-3000:]
    records = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert max(r.get("samples", 0) for r in records) == 32  # trained the whole budget on the prepared shards
