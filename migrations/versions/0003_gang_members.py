"""gang members of multi-node jobs

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 16:05:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "gang_members",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("node_rank", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.String(length=64), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("address", sa.String(length=255), nullable=True),
        sa.Column("port", sa.Integer(), nullable=True),
        sa.Column("gpu_ids", sa.JSON(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("joined_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("job_id", "attempt", "node_rank", name="uq_gang_members_rank"),
        sa.UniqueConstraint("job_id", "attempt", "host", name="uq_gang_members_host"),
    )
    with op.batch_alter_table("gang_members", schema=None) as batch_op:
        batch_op.create_index("ix_gang_members_worker", ["worker_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("gang_members", schema=None) as batch_op:
        batch_op.drop_index("ix_gang_members_worker")
    op.drop_table("gang_members")
