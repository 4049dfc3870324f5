"""A per-experiment version of its trial records; indices for trial lists filtered by state and arm, paged by key.

`experiments.trials_version` grows by one with every change of one of the experiment's trial records, in the
same transaction (existing experiments start at 0). The three indices end in the trial number after the filter's
columns, so a filtered page is one index range.

Revision ID: 0005_trials_version_filters
Revises: 0004_trial_noise_kind_index
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_trials_version_filters"
down_revision = "0004_trial_noise_kind_index"
branch_labels = None
depends_on = None

INDICES = {
    "ix_trials_experiment_state_number": ["experiment_id", "state", "number"],
    "ix_trials_experiment_arm_number": ["experiment_id", "arm", "number"],
    "ix_trials_experiment_arm_state_number": ["experiment_id", "arm", "state", "number"],
}


def upgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.add_column(sa.Column("trials_version", sa.Integer(), nullable=False, server_default="0"))
    for name, columns in INDICES.items():
        op.create_index(name, "trials", columns)


def downgrade() -> None:
    for name in INDICES:
        op.drop_index(name, table_name="trials")
    with op.batch_alter_table("experiments") as batch:
        batch.drop_column("trials_version")
