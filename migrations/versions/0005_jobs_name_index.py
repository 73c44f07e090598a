"""index for listing a project's jobs by name, newest first

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03 12:00:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # `GET /v1/jobs?name=...` scanned the whole table (25 ms warm at 100k jobs); with this index
    # it reads the page in order.
    op.create_index("ix_jobs_project_name", "jobs", ["project_id", "name", "created_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_jobs_project_name", table_name="jobs")
