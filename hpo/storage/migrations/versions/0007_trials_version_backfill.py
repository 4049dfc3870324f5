"""`experiments.trials_version` of experiments recorded before 0005: as many as their trials, not 0.

Revision 0005 started every existing experiment at 0, trials or not. The server keeps an experiment's record and
spec only once its version shows a trial (an experiment is removed only before its first), so an experiment with
trials from before 0005 that wrote no trial since (a finished one) had its spec parsed again on every request that
needs it: a best config cost 1.5 ms of server CPU instead of 0.25 ms. The version only has to change with every
change of a trial record, so any count above 0 serves; the number of trials is the least a real history reaches.

Revision ID: 0007_trials_version_backfill
Revises: 0006_trial_told_before
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

revision = "0007_trials_version_backfill"
down_revision = "0006_trial_told_before"
branch_labels = None
depends_on = None

BACKFILL = """
UPDATE experiments SET trials_version = (SELECT count(*) FROM trials WHERE trials.experiment_id = experiments.id)
WHERE trials_version = 0 AND EXISTS (SELECT 1 FROM trials WHERE trials.experiment_id = experiments.id)
"""


def upgrade() -> None:
    op.execute(BACKFILL)


def downgrade() -> None:
    pass  # a version above 0 is as valid before this revision as after it
