"""Liveness: a RUNNING experiment is live while its controller heartbeats, interrupted within two heartbeats
of its last one, and only one controller may hold it."""

from __future__ import annotations

from datetime import timedelta

import pytest

from hpo.engine.liveness import Heartbeat, heartbeat_interval_s, liveness, stale_after_s
from hpo.errors import ControllerBusyError
from hpo.storage import SqlStorage
from hpo.storage.base import ExperimentStatus

DELETER = ("deleter-host", 4321)  # the (host, pid) `hpo delete` claims an experiment with


@pytest.fixture
def storage(tmp_path, monkeypatch):
    monkeypatch.setenv("HPO_HEARTBEAT_S", "2")
    with SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}", upgrade=True) as storage:
        yield storage


def test_interrupted_after_one_and_a_half_missed_heartbeats_and_before_two(storage):
    eid = storage.create_experiment("e", {}, "minimize")
    storage.claim_controller(eid, "h", 1, stale_after_s())
    record = storage.get_experiment(eid)
    beat, interval = record.heartbeat_at, heartbeat_interval_s()
    assert liveness(record, beat + timedelta(seconds=interval)) == "live"  # one heartbeat late is still live
    assert liveness(record, beat + timedelta(seconds=1.5 * interval + 0.01)) == "interrupted"
    assert stale_after_s() < 2 * interval  # so a dead controller shows within two heartbeats
    storage.set_experiment_status(eid, ExperimentStatus.FINISHED)
    assert liveness(storage.get_experiment(eid), beat + timedelta(days=1)) == "finished"


def test_a_second_controller_is_refused_by_host_and_pid_until_the_first_is_stale(storage):
    eid = storage.create_experiment("e", {}, "minimize")
    storage.claim_controller(eid, "hostA", 111, stale_after_s())
    with pytest.raises(ControllerBusyError, match="hostA, pid 111") as refused:
        storage.claim_controller(eid, "hostB", 222, stale_after_s())
    assert "POST /api/v1/experiments/e/stop" in str(refused.value)  # the request that stops it, with its name
    storage.claim_controller(eid, "hostA", 111, stale_after_s())  # the holder itself may claim again
    storage.claim_controller(eid, "hostB", 222, stale_after_s=0.0)  # a holder past the stale limit is taken over
    assert not storage.heartbeat(eid, "hostA", 111)  # the old holder learns it lost the experiment
    assert storage.heartbeat(eid, "hostB", 222, note="3 running")
    assert storage.get_experiment(eid).controller_note == "3 running"


def test_heartbeat_thread_claims_beats_and_releases(storage):
    eid = storage.create_experiment("e", {}, "minimize")
    heartbeat = Heartbeat(storage, eid, note=lambda: "busy").start()
    record = storage.get_experiment(eid)
    assert (record.controller_host, record.controller_pid) == (heartbeat.host, heartbeat.pid)
    assert liveness(record) == "live"
    heartbeat.stop()
    record = storage.get_experiment(eid)
    assert record.controller_pid is None and liveness(record) == "interrupted"  # RUNNING without a controller


def test_a_controller_whose_experiment_was_deleted_learns_it_at_its_next_beat(storage):
    """`hpo delete` of an experiment whose controller seemed gone (paused, cut off; on another machine): its next
    beat finds no experiment, and the study loop abandons it as it does a taken-over one (`lost`), saying why."""
    eid = storage.create_experiment("e", {}, "minimize")
    heartbeat = Heartbeat(storage, eid)  # not started: beats by hand
    storage.claim_controller(eid, heartbeat.host, heartbeat.pid, stale_after_s())
    heartbeat.beat()
    assert not heartbeat.lost and not heartbeat.deleted
    assert storage.purge_experiment(eid, *DELETER, stale_after_s=0.0) == (0, 0)
    heartbeat.beat()
    assert heartbeat.lost and heartbeat.deleted
