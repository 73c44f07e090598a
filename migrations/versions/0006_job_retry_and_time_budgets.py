"""jobs: retry budget and running time kept apart from the attempt counter

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03 09:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Existing jobs start both budgets at zero: their past attempts may have been pauses or
    # handbacks, which must not count as failures after the upgrade either.
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("failed_attempts", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("run_seconds", sa.Float(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("run_seconds")
        batch_op.drop_column("failed_attempts")
