"""What every command shares: the Typer app, the two consoles, one-line errors and the options
several commands take."""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import json
import math
import os
import sys

import typer
from rich.console import Console
from rich.markup import escape

from ..interrupts import sigterm_as_interrupt

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


class _Invocation:
    """When this invocation of the command line began: set by the app's callback, before the
    imports any command needs (torch costs seconds)."""

    began: _dt.datetime | None = None


_invocation = _Invocation()


def command_began() -> _dt.datetime:
    """When the command being run began (aware UTC; now where no callback ran): a sweep's run
    counts its duration from it, its ranks' start-up included."""
    return _invocation.began or _dt.datetime.now(_dt.timezone.utc)


@app.callback()
def _options(
    ctx: typer.Context,
    _: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Options before the command."""
    _invocation.began = _dt.datetime.now(_dt.timezone.utc)
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
    _json.failure = message
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
    err.print(line, highlight=False, markup=False, soft_wrap=True)


def _help(*paragraphs: str) -> str:
    """A command's --help: paragraphs separated by blank lines (the renderer keeps single
    line breaks inside later paragraphs, so each paragraph is one string)."""
    return "\n\n".join(paragraphs)


# ------------------------------------------------------------------------ --json output


class _JsonState:
    """The one JSON document of this invocation: set by :func:`emit_json`, printed on the way
    out by :func:`json_output`; ``failure``: the last one-line error (:func:`_fail`)."""

    document: dict | None = None
    failure: str | None = None
    printed = False


_json = _JsonState()


def emit_json(data: dict) -> None:
    """Make `data` this command's JSON document (printed once, when the command ends)."""
    _json.document = data


@contextlib.contextmanager
def _stdout_to_stderr():
    """While the command runs, sys.stdout and file descriptor 1 point at stderr: whatever a
    rank (spawned ranks inherit fd 1), an imported module or a library (NCCL_DEBUG) prints
    lands there, not in the document."""
    saved_stream, saved_fd = sys.stdout, None
    with contextlib.suppress(Exception):
        saved_stream.flush()
    with contextlib.suppress(OSError):
        saved_fd = os.dup(1)
        os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        if saved_fd is not None:
            os.dup2(saved_fd, 1)
            os.close(saved_fd)
        sys.stdout = saved_stream


def _print_document(code: int | None) -> None:
    """The command's document, else (a failure or an interrupt before one was made) the error's."""
    if _json.printed:
        return
    data = _json.document
    if data is None and code == 0:  # a rank of a torchrun/srun job that rank 0 speaks for
        return
    if data is None:
        data = {"error": _json.failure or ("interrupted" if code in (130, 143) else f"exit status {code}")}
        data["exit_code"] = code
    try:
        text = json.dumps(data, indent=2, default=str, allow_nan=False)
    except ValueError:  # an inf or nan somewhere: null (JSON has neither; jq refuses "Infinity")
        text = json.dumps(_finite(data), indent=2, default=str)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    _json.printed = True


def _finite(value):
    """`value` with every float that is not finite replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _exit_code(exc: BaseException) -> int:
    if isinstance(exc, (typer.Exit, SystemExit)):
        code = exc.exit_code if isinstance(exc, typer.Exit) else exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    if isinstance(exc, KeyboardInterrupt):
        from ..interrupts import SIGNAL_EXIT

        return SIGNAL_EXIT.get(getattr(exc, "signal_name", "SIGINT"), 130)
    return 1


def json_output(wants_json):
    """Decorate a command whose options may ask for JSON (``wants_json(options)`` says whether):
    then its standard output carries exactly one JSON document -- the one it made with
    :func:`emit_json`, or on a failure or interrupt before that ``{"error": ..., "exit_code": N}``
    -- and everything else it or its ranks print goes to stderr."""

    def decorate(command):
        @functools.wraps(command)
        def wrapper(*args, **kwargs):
            if not wants_json(kwargs):
                return command(*args, **kwargs)
            _json.document, _json.failure, _json.printed = None, None, False
            code = 0
            try:
                with sigterm_as_interrupt(), _stdout_to_stderr():
                    return command(*args, **kwargs)
            except KeyboardInterrupt as exc:  # not the command's to handle: one line, its exit code
                code = _exit_code(exc)
                _json.failure = _json.failure or f"interrupted ({getattr(exc, 'signal_name', 'SIGINT')})"
                err.print(f"error: {_json.failure}", highlight=False, markup=False)
                raise typer.Exit(code) from None
            except BaseException as exc:
                code = _exit_code(exc)
                if _known_error(exc):  # main() says it in one line, exit code 2
                    _json.failure, code = str(exc), 2
                elif _json.failure is None and not isinstance(exc, (typer.Exit, SystemExit)):
                    from a2a_tune.tuner.runtime.text import one_line

                    _json.failure = one_line(f"{type(exc).__name__}: {exc}")
                raise
            finally:
                _print_document(code)

        return wrapper

    return decorate


def _usage_error_document(argv: list[str], code: int) -> None:
    """A command line asking for JSON that failed before its command ran (click refused an
    option, a variable the ranks read was out of range): the error's document."""
    pairs = zip(argv, argv[1:])
    if "--json" in argv or "--format=json" in argv or any(a == "--format" and b == "json" for a, b in pairs):
        _json.failure = _json.failure or "invalid command line (see the message above)"
        _print_document(code)


def _known_error(exc: BaseException) -> bool:
    """An error of ours that reaches :func:`main` as an exception: one line, exit code 2 (e.g. an
    out-of-tree backend module that does not import). Looked up, not imported: importing
    a2a_tune.kernels costs torch (seconds, hundreds of MB), and a command that never imported
    it (probe, lookup, show) cannot have raised its errors."""
    errors = sys.modules.get("a2a_tune.kernels.errors")
    environ = sys.modules.get("a2a_tune.tuner.runtime.environ")  # a variable out of range, before any rank
    known = tuple(e for e in (errors and errors.KernelsError, environ and environ.EnvError) if e)
    return isinstance(exc, known)


def main() -> None:
    try:
        app()
    except SystemExit as exc:
        if exc.code not in (0, None):
            _usage_error_document(sys.argv[1:], _exit_code(exc))
        raise
    except Exception as exc:
        if not _known_error(exc):
            raise
        _fail(str(exc), 2)
        _usage_error_document(sys.argv[1:], 2)
        raise SystemExit(2) from None
