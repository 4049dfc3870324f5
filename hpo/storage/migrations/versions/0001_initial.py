"""Initial schema: experiments, trials, trial_metrics, with the indices the queries need.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

UtcDateTime = sa.DateTime(timezone=True)


def upgrade() -> None:
    _create_experiments()
    _create_trials()
    _create_trial_metrics()


def downgrade() -> None:
    # Dropping a table drops its indices.
    op.drop_table("trial_metrics")
    op.drop_table("trials")
    op.drop_table("experiments")


def _create_experiments() -> None:
    op.create_table(
        "experiments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("direction", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("stop_requested", sa.Boolean(), nullable=False),
        sa.Column("created_at", UtcDateTime, nullable=False),
        sa.Column("ended_at", UtcDateTime, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_experiments")),
        sa.UniqueConstraint("name", name=op.f("uq_experiments_name")),
    )
    op.create_index(op.f("ix_experiments_status"), "experiments", ["status"])


def _create_trials() -> None:
    op.create_table(
        "trials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("arm", sa.String(length=255), nullable=True),
        sa.Column("budget", sa.Float(), nullable=False),
        sa.Column("gpus", sa.JSON(), nullable=False),
        sa.Column("global_batch_size", sa.Integer(), nullable=True),
        sa.Column("objective", sa.Float(), nullable=True),
        sa.Column("samples_to_target", sa.BigInteger(), nullable=True),
        sa.Column("time_to_target_s", sa.Float(), nullable=True),
        sa.Column("best_mlm_accuracy", sa.Float(), nullable=True),
        sa.Column("duration_s", sa.Float(), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("created_at", UtcDateTime, nullable=False),
        sa.Column("started_at", UtcDateTime, nullable=True),
        sa.Column("finished_at", UtcDateTime, nullable=True),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_trials_experiment_id_experiments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_trials")),
        sa.UniqueConstraint("experiment_id", "number", name=op.f("uq_trials_experiment_id_number")),
    )
    objective_tail = ["state", "objective", "number"]
    op.create_index("ix_trials_experiment_state_objective", "trials", ["experiment_id", *objective_tail])
    op.create_index("ix_trials_experiment_arm_state_objective", "trials", ["experiment_id", "arm", *objective_tail])
    op.create_index(
        "ix_trials_experiment_batch_state_objective", "trials", ["experiment_id", "global_batch_size", *objective_tail]
    )


def _create_trial_metrics() -> None:
    op.create_table(
        "trial_metrics",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("samples", sa.BigInteger(), nullable=True),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("created_at", UtcDateTime, nullable=False),
        sa.ForeignKeyConstraint(
            ["trial_id"], ["trials.id"], name=op.f("fk_trial_metrics_trial_id_trials"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_trial_metrics")),
    )
    op.create_index("ix_trial_metrics_trial_name_step", "trial_metrics", ["trial_id", "name", "step"])
