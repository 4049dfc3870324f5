"""The late-training noise scale kept on each trial when it finishes; an index on trials by kind, state and arm
(the confirmation trials, and the counts of `Storage.tally_trials` from the index alone).

Trials finished before this revision keep NULL in both columns: readers compute their noise scale from the stored
metric records, as before (hpo/report/data.py), so an upgraded database reports the same numbers.

Revision ID: 0004_trial_noise_kind_index
Revises: 0003_unique_metric_rows
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_trial_noise_kind_index"
down_revision = "0003_unique_metric_rows"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column("late_noise_scale", sa.Float(), nullable=True))
        batch.add_column(sa.Column("late_noise_undefined", sa.Float(), nullable=True))
    op.create_index("ix_trials_experiment_kind_state_arm_target", "trials",
                    ["experiment_id", "kind", "state", "arm", "samples_to_target"])  # fmt: skip


def downgrade() -> None:
    op.drop_index("ix_trials_experiment_kind_state_arm_target", table_name="trials")
    with op.batch_alter_table("trials") as batch:
        batch.drop_column("late_noise_undefined")
        batch.drop_column("late_noise_scale")
