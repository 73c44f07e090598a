"""idempotency keys on file uploads

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("files", schema=None) as batch_op:
        batch_op.add_column(sa.Column("idempotency_key", sa.String(length=256), nullable=True))
        batch_op.add_column(sa.Column("request_hash", sa.String(length=64), nullable=True))
        batch_op.create_unique_constraint("uq_files_idempotency", ["project_id", "idempotency_key"])


def downgrade() -> None:
    with op.batch_alter_table("files", schema=None) as batch_op:
        batch_op.drop_constraint("uq_files_idempotency", type_="unique")
        batch_op.drop_column("request_hash")
        batch_op.drop_column("idempotency_key")
