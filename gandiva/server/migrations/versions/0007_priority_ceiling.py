"""The priority ceiling: a member's unfinished job above it (set when any owner could give
up to 100) comes down to it, with a ``priority-clamped`` event saying from what, and so does
a member's sweep's priority (its rungs would raise its trials from it again); admins' jobs and
sweeps keep theirs (above the ceiling is the admins' class, decision 0037).

Revision ID: 0007
"""

import json
import time

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

CEILING = 50  # gandiva.shares.CEILING, as it was when this ran


def upgrade() -> None:
    bind = op.get_bind()
    sweeps = bind.execute(sa.text(
        "SELECT sweeps.id, sweeps.spec FROM sweeps JOIN users ON users.id = sweeps.user_id "
        "WHERE NOT users.admin")).all()
    table = sa.table("sweeps", sa.column("id", sa.String), sa.column("spec", sa.JSON))
    for sweep_id, spec in sweeps:
        spec = json.loads(spec) if isinstance(spec, str) else spec
        if spec.get("priority", 0) > CEILING:
            bind.execute(table.update().where(table.c.id == sweep_id).values(
                spec={**spec, "priority": CEILING}))
    over = bind.execute(sa.text(
        "SELECT jobs.id, jobs.priority FROM jobs JOIN users ON users.id = jobs.user_id "
        "WHERE jobs.priority > :ceiling AND NOT users.admin AND jobs.state IN "
        "('queued', 'running', 'suspended', 'held')"), {"ceiling": CEILING}).all()
    if not over:
        return
    events = sa.table("events", sa.column("job_id", sa.String), sa.column("at", sa.Float),
                      sa.column("kind", sa.String), sa.column("data", sa.JSON))
    now = time.time()
    op.bulk_insert(events, [
        {"job_id": job_id, "at": now, "kind": "priority-clamped",
         "data": {"from": priority, "to": CEILING,
                  "why": f"a member's priority goes up to {CEILING} (the ceiling); above it "
                         "is the admins' class"}}
        for job_id, priority in over])
    bind.execute(sa.text("UPDATE jobs SET priority = :ceiling WHERE id = :id"),
                 [{"ceiling": CEILING, "id": job_id} for job_id, _ in over])


def downgrade() -> None:
    pass  # the priorities clamped are in their events; nothing to undo in the schema
