"""Teams: a name, tickets (its weight in the cluster's fair shares) and an optional
guaranteed quota of GPUs; each user in at most one team, with tickets of their own (their
weight inside the team).

Revision ID: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "teams",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("tickets", sa.Integer(), nullable=False, server_default="1"),
        sa.Column("quota_gpus", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    with op.batch_alter_table("users") as batch:
        batch.add_column(sa.Column("team_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("tickets", sa.Integer(), nullable=False,
                                   server_default="1"))
        batch.create_foreign_key("users_team", "teams", ["team_id"], ["id"])


def downgrade() -> None:
    with op.batch_alter_table("users") as batch:
        batch.drop_constraint("users_team", type_="foreignkey")
        batch.drop_column("tickets")
        batch.drop_column("team_id")
    op.drop_table("teams")
