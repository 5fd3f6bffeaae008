"""db upgrade: database maintenance."""

from __future__ import annotations

from . import options as opt
from .common import _fail, db_app, out


@db_app.command("upgrade")
def db_upgrade(db: str | None = opt.db) -> None:
    """Migrate a database made by an older a2a-tune to the current schema."""
    from a2a_tune.db import EmptyStoreError, StoreError, display_url, resolve_url, upgrade

    try:
        before, after = upgrade(db)
    except EmptyStoreError as exc:  # no such file: upgrading nothing is a mistake (a typo in --db?)
        raise _fail(str(exc), 2) from None
    except StoreError as exc:
        raise _fail(str(exc)) from None
    shown = display_url(resolve_url(db))
    if before == after:
        out.print(f"{shown} is at the current schema ({after})", highlight=False, markup=False, soft_wrap=True)
    else:
        line = f"{shown} upgraded from {before or 'an empty database'} to {after}"
        out.print(line, highlight=False, markup=False, soft_wrap=True)  # one line in a captured log
