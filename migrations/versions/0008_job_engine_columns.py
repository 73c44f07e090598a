"""jobs: the external engine (Ray, Slurm) a job was handed to, its id there and its state there

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04 09:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # All nullable: a job run by our own workers (torchrun, a gang) has no engine.
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("engine", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("engine_job_id", sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column("engine_state", sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("engine_state")
        batch_op.drop_column("engine_job_id")
        batch_op.drop_column("engine")
