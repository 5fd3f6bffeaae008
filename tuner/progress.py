"""The progress bar of long collective work (sweep, knob search): rank 0 draws, others don't."""

from __future__ import annotations

from contextlib import nullcontext


def progress_bar(enabled: bool, label: str):
    """A rich Progress (context manager) labelled `label`, or a null context when disabled."""
    if not enabled:
        return nullcontext(None)
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn(f"[bold]{label}[/bold] {{task.description}}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
