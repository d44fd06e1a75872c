"""Who a user's jobs run as: an OS account mapped by name (``os_user``), else the user's
dynamic uid (``uid``), stable and stored: ``gandiva.node.accounts.DYNAMIC_UIDS`` from its
start, by the user's id.

Revision ID: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

FIRST_UID = 61184  # accounts.DYNAMIC_UIDS.start, as it was when this ran


def upgrade() -> None:
    with op.batch_alter_table("users") as batch:
        batch.add_column(sa.Column("os_user", sa.String(32), nullable=True))
        batch.add_column(sa.Column("uid", sa.Integer(), nullable=True))
    op.execute(f"UPDATE users SET uid = {FIRST_UID - 1} + id")
    op.create_index("users_uid", "users", ["uid"], unique=True)


def downgrade() -> None:
    op.drop_index("users_uid", "users")
    with op.batch_alter_table("users") as batch:
        batch.drop_column("uid")
        batch.drop_column("os_user")
