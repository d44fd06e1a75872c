"""Job labels, client-chosen submission ids, newest-first listing, revocable tokens.

Revision ID: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("submission_id", sa.String(64)))
    # a retried submission finds its job; NULLs never clash (SQLite and PostgreSQL alike)
    op.create_index("jobs_user_submission", "jobs", ["user_id", "submission_id"], unique=True)
    op.create_index("jobs_newest", "jobs", ["submitted_at", "id"])
    op.create_table(
        "job_labels",
        sa.Column("job_id", sa.String(40), sa.ForeignKey("jobs.id"), primary_key=True),
        sa.Column("key", sa.String(63), primary_key=True),
        sa.Column("value", sa.String(63), nullable=False),
    )
    op.create_index("job_labels_key_value", "job_labels", ["key", "value"])
    with op.batch_alter_table("users") as batch:
        batch.add_column(sa.Column("revoked_at", sa.Float))


def downgrade() -> None:
    with op.batch_alter_table("users") as batch:
        batch.drop_column("revoked_at")
    op.drop_index("job_labels_key_value", "job_labels")
    op.drop_table("job_labels")
    op.drop_index("jobs_newest", "jobs")
    op.drop_index("jobs_user_submission", "jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("submission_id")
