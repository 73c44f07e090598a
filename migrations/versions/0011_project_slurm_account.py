"""projects: the Slurm account their launcher='slurm' jobs are charged to

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04 15:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable: existing projects keep the worker's default account (TWINKLE_SLURM_ACCOUNT).
    with op.batch_alter_table("projects", schema=None) as batch_op:
        batch_op.add_column(sa.Column("slurm_account", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("projects", schema=None) as batch_op:
        batch_op.drop_column("slurm_account")
