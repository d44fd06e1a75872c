"""Learning curves and sweeps: every metric point a job reports, and hyper-parameter sweeps
with their trials and the rungs each trial passed.

Revision ID: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "metric_points",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(40), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("value", sa.Float, nullable=False),
        sa.Column("at", sa.Float, nullable=False),
    )
    # a curve is read by job and metric, in step order, from a step on
    op.create_index("metric_points_curve", "metric_points", ["job_id", "name", "step"])
    op.create_table(
        "sweeps",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("user_id", sa.Integer, sa.ForeignKey("users.id"), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_index("sweeps_user", "sweeps", ["user_id", "created_at"])
    op.create_table(
        "sweep_trials",
        sa.Column("sweep_id", sa.String(40), sa.ForeignKey("sweeps.id"), primary_key=True),
        sa.Column("trial", sa.Integer, primary_key=True),
        sa.Column("job_id", sa.String(40), sa.ForeignKey("jobs.id"), nullable=False,
                  unique=True),
        sa.Column("params", sa.JSON, nullable=False),
        sa.Column("rungs", sa.JSON, nullable=False),  # rung (mini-batches) -> value there
        sa.Column("decision", sa.String(16), nullable=False),  # running, promoted, stopped
    )


def downgrade() -> None:
    op.drop_table("sweep_trials")
    op.drop_index("sweeps_user", "sweeps")
    op.drop_table("sweeps")
    op.drop_index("metric_points_curve", "metric_points")
    op.drop_table("metric_points")
