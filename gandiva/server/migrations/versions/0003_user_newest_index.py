"""A user's jobs, newest first, from an index.

Listing a user's newest jobs (``GET /v1/jobs``, what a dashboard polls) read every job of
the user and sorted them: at 5,000 jobs a user, the page's cost grew with the user's history.
With this index a page reads its own rows only.

Revision ID: 0003
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("jobs_user_newest", "jobs", ["user_id", "submitted_at", "id"])


def downgrade() -> None:
    op.drop_index("jobs_user_newest", "jobs")
