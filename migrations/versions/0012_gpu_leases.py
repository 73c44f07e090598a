"""gpu_leases: the GPUs of a machine held by training jobs and serving hosts, one holder each

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04 16:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "gpu_leases",
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("gpu_id", sa.String(length=32), nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("holder", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("host", "gpu_id"),
    )
    op.create_index("ix_gpu_leases_owner", "gpu_leases", ["owner"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_gpu_leases_owner", table_name="gpu_leases")
    op.drop_table("gpu_leases")
