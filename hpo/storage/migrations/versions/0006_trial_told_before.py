"""Where each trial's result was told to its tuner among the controller's asks: `trials.told_before`, the number of
the first trial created after the tell (NULL: told after the newest trial, or not told).

A resume replays the asks and tells in that order. Before this revision it ordered them by their times (asks when
a trial was created, tells when it finished), which is also what the upgrade fills in for finished trials: the
first trial created after it finished (at the same instant, the tell first, unless the trial finished the moment
it was created, then after its own creation), so an upgraded experiment resumes as it did before.

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

BY_TIMES = """
UPDATE trials SET told_before = (
    SELECT MIN(later.number) FROM trials AS later
    WHERE later.experiment_id = trials.experiment_id
      AND (later.created_at > trials.finished_at
           OR (later.created_at = trials.finished_at
               AND (trials.finished_at <> trials.created_at OR later.number > trials.number))))
WHERE trials.finished_at IS NOT NULL
"""


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column("told_before", sa.Integer(), nullable=True))
    op.execute(BY_TIMES)


def downgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.drop_column("told_before")
