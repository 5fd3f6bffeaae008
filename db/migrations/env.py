"""Alembic environment of the a2a-tune store; runs inside the package, no alembic.ini.

The Alembic ``Config`` is built in code by ``a2a_tune.db.engine.alembic_config(url)``
(script location = this folder). The store runs migrations on a connection it opened
itself and hands over in ``config.attributes["connection"]``, inside its transaction; the
plain Alembic command line is not needed. To write a new revision (developers)::

    from alembic import command
    from a2a_tune.db.engine import alembic_config
    command.revision(alembic_config("sqlite:///scratch.db"), "add foo",
                     rev_id="0002_add_foo", autogenerate=True)

against a scratch database at the current head, then edit the file by hand.
The revision history lives in Alembic's version table under our own name
(models.VERSION_TABLE), so a database shared with Optuna keeps both histories apart.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from a2a_tune.db.models import VERSION_TABLE, Base

config = context.config
target_metadata = Base.metadata


def _configure_and_run(**kwargs) -> None:
    context.configure(
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        compare_type=True,
        **kwargs,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    """Emit SQL (``alembic upgrade --sql``) for a DBA instead of running it."""
    url = config.get_main_option("sqlalchemy.url")
    _configure_and_run(
        url=url,
        literal_binds=True,
        render_as_batch=url is not None and url.startswith("sqlite"),
    )


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        # SQLite cannot ALTER most things: batch mode copies the table instead.
        _configure_and_run(
            connection=connection,
            render_as_batch=connection.dialect.name == "sqlite",
        )
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url"), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            _configure_and_run(
                connection=connection,
                render_as_batch=connection.dialect.name == "sqlite",
            )
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
