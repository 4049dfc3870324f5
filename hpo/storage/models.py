"""All SQLAlchemy models of the storage, in one module. Alembic migrations must produce exactly this schema.

Indices exist from day one for every foreign key, every state/status filter, and the best-trial queries:
the best trial is the first objective in an index whose prefix is the filter
(experiment, [arm | batch size,] state), then the lowest trial number with that objective, so both steps are
index lookups however many trials an experiment has. A trial list filtered by state, arm or both pages by key
through an index whose prefix is that filter followed by the trial number (experiment, [arm,] [state,] number),
so a page is one index range however many trials the experiment has and however few of them match.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Deterministic constraint names, so later migrations can refer to (and drop) them on every backend.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# SQLite only auto-increments an INTEGER primary key; PostgreSQL gets 64 bits for the big metrics table.
BigIntId = BigInteger().with_variant(Integer(), "sqlite")
UtcDateTime = DateTime(timezone=True)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class ExperimentModel(Base):
    __tablename__ = "experiments"
    # An id is never given twice, also on SQLite (which otherwise reuses the highest id once its row is deleted):
    # `hpo delete` removes experiments with their trials, and what a server keeps is keyed by their ids (migration
    # 0008). The same for trials, below.
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    direction: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    stop_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    # Liveness: the controller driving the experiment, and when it last said so (see hpo/engine/liveness.py).
    controller_host: Mapped[str | None] = mapped_column(String(255))
    controller_pid: Mapped[int | None] = mapped_column(Integer)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    controller_note: Mapped[str | None] = mapped_column(Text)  # what the controller sees: why trials wait
    # One more on every change of one of its trial records (created, started, finished, interrupted, re-queued),
    # in the transaction that makes it: readers that kept an answer know with one primary-key read that it holds.
    trials_version: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class TrialModel(Base):
    __tablename__ = "trials"
    __table_args__ = (
        # Also the index on the foreign key: experiment_id is its first column.
        UniqueConstraint("experiment_id", "number"),
        Index("ix_trials_experiment_state_objective", "experiment_id", "state", "objective", "number"),
        Index("ix_trials_experiment_arm_state_objective", "experiment_id", "arm", "state", "objective", "number"),
        Index(
            "ix_trials_experiment_batch_state_objective",
            "experiment_id",
            "global_batch_size",
            "state",
            "objective",
            "number",
        ),
        # A kind's trials (the confirmation runs the verdict reads) without reading the others, and the counts by
        # kind, state and arm with how many reached the target from the index alone (`tally_trials`).
        Index(
            "ix_trials_experiment_kind_state_arm_target", "experiment_id", "kind", "state", "arm", "samples_to_target"
        ),
        # Filtered trial lists paged by key (number order within the filter).
        Index("ix_trials_experiment_state_number", "experiment_id", "state", "number"),
        Index("ix_trials_experiment_arm_number", "experiment_id", "arm", "number"),
        Index("ix_trials_experiment_arm_state_number", "experiment_id", "arm", "state", "number"),
        {"sqlite_autoincrement": True},  # ids never given twice (see ExperimentModel)
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    arm: Mapped[str | None] = mapped_column(String(255))
    budget: Mapped[float] = mapped_column(Float)
    gpus: Mapped[list[int]] = mapped_column(JSON)
    global_batch_size: Mapped[int | None] = mapped_column(Integer)
    objective: Mapped[float | None] = mapped_column(Float)
    samples_to_target: Mapped[int | None] = mapped_column(BigInteger)
    time_to_target_s: Mapped[float | None] = mapped_column(Float)
    best_mlm_accuracy: Mapped[float | None] = mapped_column(Float)
    duration_s: Mapped[float | None] = mapped_column(Float)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)
    host: Mapped[str | None] = mapped_column(String(255))
    pid: Mapped[int | None] = mapped_column(Integer)  # the trial's process group on `host`
    worker: Mapped[str | None] = mapped_column(String(255))  # the runner's worker (a Dask address, a slot)
    attempt: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # +1 on every re-queue
    kind: Mapped[str] = mapped_column(String(16), default="tuning", server_default="tuning")
    seed: Mapped[int | None] = mapped_column(Integer)  # the training seed when it differs from the config's
    # Its late-training noise scale, kept when it finishes (hpo/storage/noise.py); the share is NULL until then.
    late_noise_scale: Mapped[float | None] = mapped_column(Float)
    late_noise_undefined: Mapped[float | None] = mapped_column(Float)
    # The number of the first trial the controller created after it told this one's result to its tuner (NULL: told
    # after the newest trial, or not yet), and its place among the tells before that trial: a resume replays the
    # tuners' asks and tells in the order they happened.
    told_before: Mapped[int | None] = mapped_column(Integer)
    told_order: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime)


# What identifies a stored metric value: a trial reports one value of a name at a step (and sample count), so the
# same value written twice (a write retried after its commit landed, a trial's kept records written again) is
# stored once. A value without `samples` (NULL) is never equal to another, so only those can repeat.
METRIC_KEY = ("trial_id", "name", "step", "samples")


class TrialMetricModel(Base):
    """One named value of one intermediate report (long format: a report of 3 values is 3 rows)."""

    __tablename__ = "trial_metrics"
    __table_args__ = (
        # The foreign-key index, which also serves "the curve of one metric" in step order; unique on METRIC_KEY
        # (migration 0003_unique_metric_rows).
        Index("ix_trial_metrics_trial_name_step", *METRIC_KEY, unique=True),
    )

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(BigInteger)
    samples: Mapped[int | None] = mapped_column(BigInteger)
    name: Mapped[str] = mapped_column(String(255))
    value: Mapped[float | None] = mapped_column(Float)  # NULL stands for NaN
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
