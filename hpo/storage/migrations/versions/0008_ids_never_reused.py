"""Experiment and trial ids are never given twice: SQLite's `experiments` and `trials` tables get AUTOINCREMENT.

Without it SQLite gives a new row the highest id plus one, so after the experiment with the highest id is deleted
with its trials (`hpo delete`) the next ones would take their ids: a server that kept what it read of the first
under those ids would answer for the second with it, and a trial process of the deleted experiment still running
would write into another experiment's trial. PostgreSQL's sequences never go back: nothing changes there. Each
table is copied into one declared with AUTOINCREMENT (its indexes made again); SQLite's counter starts at the
highest id copied.

Revision ID: 0008_ids_never_reused
Revises: 0007_trials_version_backfill
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0008_ids_never_reused"
down_revision = "0007_trials_version_backfill"
branch_labels = None
depends_on = None


TABLES = ("experiments", "trials")


def _rebuild(autoincrement: bool) -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for table in TABLES:
        with op.batch_alter_table(table, recreate="always", table_kwargs={"sqlite_autoincrement": autoincrement}):
            pass


def upgrade() -> None:
    _rebuild(True)


def downgrade() -> None:
    _rebuild(False)
