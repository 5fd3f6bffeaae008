"""What every command shares: the Typer app, the two consoles, one-line errors and the options
several commands take."""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.markup import escape

app = typer.Typer(
    help=(
        "Measure the MoE all2all backends on this machine and emit the table serving engines "
        "consult at start-up.\n\nThe flow: probe -> sweep -> select -> lookup. "
        "`a2a-tune run` does the first three with good defaults."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help texts show "[default: ...]" literally
    add_completion=False,
)
db_app = typer.Typer(help="Database maintenance.", no_args_is_help=True)
app.add_typer(db_app, name="db")


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"a2a-tune {version('a2a-tune')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            print("a2a-tune (not installed: version unknown)")
        raise typer.Exit(0)


# The commands that start ranks: the variables the ranks read are checked before any starts.
RANK_COMMANDS = frozenset({"sweep", "run", "check", "evaluate", "tune-knobs"})


@app.callback()
def _options(
    ctx: typer.Context,
    _: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Options before the command."""
    if ctx.invoked_subcommand in RANK_COMMANDS:
        from a2a_tune.kernels.errors import KernelsError
        from a2a_tune.kernels.registry import call_timeout, import_timeout
        from a2a_tune.tuner.runtime.environ import EnvError

        from ..launch import collective_timeout, rendezvous_timeout

        try:  # the variables the ranks read: one line naming the variable, before any rank starts
            for read in (collective_timeout, rendezvous_timeout, import_timeout, call_timeout):
                read()
        except (EnvError, KernelsError) as exc:
            raise _fail(str(exc), 2) from None


out = Console()
err = Console(stderr=True)
# One-line messages print with soft_wrap=True: rich never breaks them (a terminal wraps them,
# a captured log keeps each whole); tables and views fit the width by their own rules.

DB_HELP = "SQLAlchemy URL or SQLite file path [env: A2A_TUNE_DB; default: sqlite:///a2a_tune.db]."


def _fail(message: str, code: int = 1) -> typer.Exit:
    # messages quote user input and file names: never rich markup; URLs never show a password
    if "://" in message or "=" in message:  # a URL, or a connection string's password=...
        from a2a_tune.db import mask_secrets

        message = mask_secrets(message)
    err.print(f"[bold red]error:[/bold red] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def _store_url(db: str | None) -> str:
    """--db for a command that stores, checked before any rank starts: it parses, and it is
    not an in-memory database (what a sweep stored there would vanish with it)."""
    from a2a_tune.db import StoreError, check_url

    try:
        url = check_url(db, persistent=True)
    except StoreError as exc:
        raise _fail(str(exc), 2) from None
    if problem := _unusable_sqlite_file(url):  # found now, not by the ranks seconds later
        raise _fail(problem, 2)
    return url


def _unusable_sqlite_file(url: str) -> str | None:
    """Why the SQLite file of `url` cannot hold a store (a directory, a file that is not an
    SQLite database, a folder that does not exist), in one line; None when it can, or when
    `url` is no SQLite file (a server is reached only by the ranks). A missing or empty file
    is fine: the store creates it."""
    import os
    from pathlib import Path

    from a2a_tune.db.engine import _sqlite_file

    from ..runtime.files import FileRefused, read_head
    from ..runtime.text import one_line
    from ..views.load import SQLITE_MAGIC

    path = _sqlite_file(url)
    if path is None:
        return None
    p = Path(path)
    try:
        if p.is_dir():
            return f"{p}: is a directory, not a database"
        if not p.exists():
            parent = p.parent
            if not parent.is_dir():
                return f"{p}: no directory {parent} to create the database in"
            if not os.access(parent, os.W_OK | os.X_OK):
                return f"{p}: cannot create the database: {parent} is not writable"
            return None
        head = read_head(p, len(SQLITE_MAGIC))
    except FileRefused as exc:
        return one_line(f"{p}: {exc}")
    except OSError as exc:
        return one_line(f"{p}: cannot open ({exc.strerror or exc})")
    if head and head != SQLITE_MAGIC[: len(head)]:
        return f"{p}: not an SQLite database"
    return None


def _planned(step, *args, **kwargs):
    """`step` of tuner.plans (options -> plan); its PlanError is a one-line error, exit code 2."""
    from ..plans import PlanError

    try:
        return step(*args, **kwargs)
    except PlanError as exc:
        raise _fail(str(exc), 2) from None


def _plans():
    from .. import plans

    return plans


def _note(line: str) -> None:
    """A note the plan's rules say on the way (one line on stderr; not an error)."""
    err.print(line, highlight=False, markup=False)


def _help(*paragraphs: str) -> str:
    """A command's --help: paragraphs separated by blank lines (the renderer keeps single
    line breaks inside later paragraphs, so each paragraph is one string)."""
    return "\n\n".join(paragraphs)


def main() -> None:
    try:
        app()
    except Exception as exc:
        # e.g. an out-of-tree backend module that does not import. Looked up, not imported:
        # importing a2a_tune.kernels costs torch (seconds, hundreds of MB), and a command that
        # never imported it (probe, lookup, show) cannot have raised its errors.
        errors = sys.modules.get("a2a_tune.kernels.errors")
        environ = sys.modules.get("a2a_tune.tuner.runtime.environ")  # a variable out of range, before any rank
        known = tuple(e for e in (errors and errors.KernelsError, environ and environ.EnvError) if e)
        if not isinstance(exc, known):
            raise
        _fail(str(exc), 2)
        raise SystemExit(2) from None
