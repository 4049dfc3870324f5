"""Controller liveness on experiments; attempt, worker, kind and seed on trials.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

UtcDateTime = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.add_column(sa.Column("controller_host", sa.String(length=255), nullable=True))
        batch.add_column(sa.Column("controller_pid", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("heartbeat_at", UtcDateTime, nullable=True))
        batch.add_column(sa.Column("controller_note", sa.Text(), nullable=True))
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column("worker", sa.String(length=255), nullable=True))
        batch.add_column(sa.Column("attempt", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("kind", sa.String(length=16), nullable=False, server_default="tuning"))
        batch.add_column(sa.Column("seed", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        for column in ("seed", "kind", "attempt", "worker"):
            batch.drop_column(column)
    with op.batch_alter_table("experiments") as batch:
        for column in ("controller_note", "heartbeat_at", "controller_pid", "controller_host"):
            batch.drop_column(column)
