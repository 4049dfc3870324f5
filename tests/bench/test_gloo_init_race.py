"""bench.gloo_init_race: torchrun starts of two gloo ranks, rank 0 leaving right after it connected."""

from __future__ import annotations

import pytest

from bench import gloo_init_race


@pytest.mark.slow  # 50 gloo starts (make test-all); every distributed test starts the trainer's ranks this way
def test_the_trainers_ranks_all_connect_and_the_count_is_said(capsys):
    gloo_init_race.main(["--starts", "2", "--busy", "0", "--variants", "trainer"])
    assert capsys.readouterr().out == "trainer: a rank failed to connect in 0 of 2 starts\n"


def test_an_unknown_variant_is_refused_before_any_start(capsys):
    with pytest.raises(SystemExit) as stop:
        gloo_init_race.main(["--variants", "trainer,nccl", "--busy", "0"])
    assert stop.value.code == 2 and "--variants: 'nccl' is not one of bare, trainer" in capsys.readouterr().err
