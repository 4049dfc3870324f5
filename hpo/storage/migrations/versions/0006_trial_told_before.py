"""Where each trial's result was told to its tuner among the controller's asks: `trials.told_before`, the number of
the first trial created after the tell (NULL: told after the newest trial, or not told), and `trials.told_order`,
its place among the tells made before that trial.

A resume replays the asks and tells in that order. Before this revision it ordered them by their times (asks when
a trial was created, tells when it finished), which is what the upgrade fills in for finished trials: the first
trial, in the order of creation times and numbers, with a higher number than its own, created at or after the
moment it finished (at the same instant the tell came first; a trial that finished the moment it was created was
told after its own creation; and a worker's clock behind the controller's cannot put a tell before its own ask).
`told_order` stays NULL for them: the replay takes the order in which they finished, as before. A temporary index
on the creation times keeps the fill-in one index lookup per trial.

Revision ID: 0006_trial_told_before
Revises: 0005_trials_version_filters
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_trial_told_before"
down_revision = "0005_trials_version_filters"
branch_labels = None
depends_on = None

FINISHED = ("completed", "diverged", "failed", "timeout")  # hpo.trials.TrialState.finished
BY_TIMES = f"""
UPDATE trials SET told_before = (
    SELECT later.number FROM trials AS later
    WHERE later.experiment_id = trials.experiment_id
      AND later.number > trials.number
      AND later.created_at >= trials.finished_at
    ORDER BY later.created_at, later.number
    LIMIT 1)
WHERE trials.finished_at IS NOT NULL AND trials.state IN ({", ".join(f"'{s}'" for s in FINISHED)})
"""
BY_CREATION = "ix_trials_experiment_created_number_tmp"


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column("told_before", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("told_order", sa.Integer(), nullable=True))
    op.create_index(BY_CREATION, "trials", ["experiment_id", "created_at", "number"])
    op.execute(BY_TIMES)
    op.drop_index(BY_CREATION, table_name="trials")


def downgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.drop_column("told_order")
        batch.drop_column("told_before")
