"""The progress bar of long collective work (sweep, knob search): rank 0 draws, others don't."""

from __future__ import annotations

from contextlib import nullcontext


def progress_bar(enabled: bool, label: str):
    """A rich Progress (context manager) labelled `label`, or a null context when disabled.

    The count and the ETA keep their width; the description (a point: EP size, model, payload,
    tokens) takes what is left, about 50 columns at 80, and wraps at its spaces, never cutting a
    name. No elapsed time: the command's last line says it. It draws on stderr."""
    if not enabled:
        return nullcontext(None)
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )
    from rich.table import Column

    return Progress(
        TextColumn(f"[bold]{label}[/bold] {{task.description}}", table_column=Column(ratio=1, overflow="fold")),
        BarColumn(bar_width=12),
        MofNCompleteColumn(table_column=Column(no_wrap=True)),
        TimeRemainingColumn(table_column=Column(no_wrap=True)),
        expand=True,
        console=Console(stderr=True),  # standard output carries results (--json) alone
    )
