"""A metric value is stored once: the metrics index becomes unique on (trial, name, step, samples).

A write retried after its commit landed (the database went away before it answered), or a trial's kept records
written again, must not add a second row. Rows that already repeat are removed first (the first one is kept).

Revision ID: 0003_unique_metric_rows
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0003_unique_metric_rows"
down_revision = "0002"
branch_labels = None
depends_on = None

INDEX = "ix_trial_metrics_trial_name_step"


def upgrade() -> None:
    # A value without samples (NULL) never equals another, as in the unique index.
    op.execute(
        "DELETE FROM trial_metrics WHERE samples IS NOT NULL AND id NOT IN ("
        "SELECT MIN(id) FROM trial_metrics WHERE samples IS NOT NULL GROUP BY trial_id, name, step, samples)"
    )
    op.drop_index(INDEX, table_name="trial_metrics")
    op.create_index(INDEX, "trial_metrics", ["trial_id", "name", "step", "samples"], unique=True)


def downgrade() -> None:
    op.drop_index(INDEX, table_name="trial_metrics")
    op.create_index(INDEX, "trial_metrics", ["trial_id", "name", "step"])
