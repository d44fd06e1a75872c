"""Alembic environment: run by ``store.migrate`` on the store's own connection."""

from alembic import context

from gandiva.server.store import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata,
                  render_as_batch=True)  # SQLite alters tables by copying them
with context.begin_transaction():
    context.run_migrations()
