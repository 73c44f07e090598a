"""serving_hosts: the inference hosts the API server relays generation requests to

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04 09:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "serving_hosts",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("engine", sa.String(length=32), nullable=False),
        sa.Column("loaded", sa.JSON(), nullable=False),
        sa.Column("loaded_bytes", sa.BigInteger(), nullable=False),
        sa.Column("memory_bytes", sa.BigInteger(), nullable=False),
        sa.Column("slots", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_serving_hosts_heartbeat_at", "serving_hosts", ["heartbeat_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_serving_hosts_heartbeat_at", table_name="serving_hosts")
    op.drop_table("serving_hosts")
