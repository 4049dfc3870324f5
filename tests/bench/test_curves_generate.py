"""The curve generator's table file: a grid grown by learning rates or batch sizes keeps its runs; any other change
is refused."""

from __future__ import annotations

import copy
import json
import re

import pytest

from bench.curves import generate


def _table(tmp_path, meta, runs):
    path = tmp_path / "table.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in [meta, *runs]) + "\n")
    return path


def test_a_grid_grown_by_learning_rates_keeps_its_runs_and_takes_the_new_meta(tmp_path):
    expected = generate.meta("f" * 64, large_batch=True)
    older = copy.deepcopy(expected)
    older["grid"]["batches"]["512"]["lr"]["adamw"] = [5.62e-4, 1e-3]
    run = {"kind": "run", "optimizer": "adamw", "lr": 1e-3, "warmup_steps": 20, "global_batch_size": 512, "seed": 0}
    path = _table(tmp_path, older, [run])

    assert generate.load(path, expected) == {("adamw", 1e-3, 20, 512, 0)}
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == expected and json.loads(lines[1]) == run
    assert generate.load(path, expected) == {("adamw", 1e-3, 20, 512, 0)}  # and stays readable


def test_a_grid_grown_by_a_batch_size_keeps_its_runs(tmp_path):
    expected = generate.meta("f" * 64, large_batch=True)
    older = copy.deepcopy(expected)
    del older["grid"]["batches"]["2048"]
    run = {"kind": "run", "optimizer": "lamb", "lr": 1e-2, "warmup_steps": 20, "global_batch_size": 1024, "seed": 1}
    path = _table(tmp_path, older, [run])

    assert generate.load(path, expected) == {("lamb", 1e-2, 20, 1024, 1)}
    assert json.loads(path.read_text().splitlines()[0]) == expected
    todo = [r for r in generate.large_grid() if generate.key(r) not in {generate.key(run)}]
    assert [r["seed"] for r in todo] == sorted(r["seed"] for r in todo)  # whole seeds first, the new batch in each
    assert {r["global_batch_size"] for r in todo if r["seed"] == 0} == {128, 512, 1024, 2048}


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m["grid"]["batches"]["512"]["lr"]["adamw"].append(9.9),  # the table has a rate the grid dropped
        lambda m: m["grid"]["batches"]["512"].update(max_samples=1),  # another budget
        lambda m: m.update(data_sha256="0" * 64),  # other data
        lambda m: m["grid"]["batches"].update({"4096": {}}),  # the table has a batch size the grid dropped
        lambda m: m.pop("trainer_revision"),  # made before the trainer's curves changed (revision 1)
    ],
    ids=["rate dropped", "budget", "data", "batch dropped", "trainer revision"],
)
def test_any_other_change_of_the_grid_is_refused_and_the_table_is_untouched(tmp_path, change):
    expected = generate.meta("f" * 64, large_batch=True)
    older = copy.deepcopy(expected)
    change(older)
    path = _table(tmp_path, older, [{"kind": "run"}])
    before = path.read_bytes()
    with pytest.raises(
        SystemExit,
        match=r"table.jsonl was made for another grid, other data or by another revision of the trainer \(differs in: ",
    ):
        generate.load(path, expected)
    assert path.read_bytes() == before


def test_batches_pick_one_batch_size_on_every_seed():
    runs = generate.large_grid([2048])
    assert {r["global_batch_size"] for r in runs} == {2048}
    assert {r["seed"] for r in runs} == set(generate.SEEDS)
    assert len(runs) == len(generate.SEEDS) * sum(len(lrs) for lrs in generate.LARGE_BATCHES[2048]["lr"].values())
    assert [r for r in generate.large_grid() if r["global_batch_size"] == 2048] == runs


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--large-batch", "--batches", "2048", "4096"], r"no batch size \[4096\] in the large-batch grid"),
        (["--batches", "2048"], r"add --large-batch"),
    ],
)
def test_batches_the_grid_lacks_are_refused_by_name_before_any_work(tmp_path, capsys, argv, message):
    path = _table(tmp_path, {"kind": "meta"}, [])
    before = path.read_bytes()
    with pytest.raises(SystemExit) as exit_:
        generate.main([*argv, "--table", str(path)])
    assert exit_.value.code == 2
    assert re.search(message, capsys.readouterr().err)
    assert path.read_bytes() == before
