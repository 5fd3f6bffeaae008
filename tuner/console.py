"""Tables that fit the console, at 80 columns as in a log, without splitting a name or a number.

rich lays every table out; this module only says what may not be squeezed and which columns
give way. Each column gets a ``min_width`` from its cells (a ``no_wrap`` column: its widest
cell; another: its longest word), so rich wraps prose at spaces and never cuts an identifier.
A table whose narrowest layout is still wider than the console moves columns, in the order the
caller chose for the reader, into a second table under the first that repeats the key columns
(the columns are stacked, not squeezed). Lines of prose go through :func:`indented`: rich wraps
them at spaces with their indent kept on every line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

__all__ = ["fit", "fits", "indented", "print_fitted"]


def fits(console, renderable) -> bool:
    """Whether rich can lay `renderable` out within the console's width (rich's own measure)."""
    from rich.measure import Measurement

    return Measurement.get(console, console.options.update_width(10_000), renderable).minimum <= console.width


def _table(console, columns, rows, indices, title, pinned: bool, ends=None, **table_kw):
    from rich.measure import Measurement
    from rich.table import Table

    options = console.options.update_width(10_000)
    cols = []
    for i in indices:
        col = replace(columns[i], _cells=[])
        if not col.no_wrap:  # prose: a word wider than the column (a path) is folded, never cut
            col.overflow = "fold"
        if pinned:  # rich never narrows a column below min_width: no word of it is split
            sizes = [Measurement.get(console, options, cell) for cell in (col.header, *(row[i] for row in rows))]
            widest = max((m.maximum if col.no_wrap else m.minimum for m in sizes), default=0)
            col.min_width = max(col.min_width or 0, widest)
        cols.append(col)
    table = Table(*cols, title=title, **table_kw)
    for j, row in enumerate(rows):
        table.add_row(*[row[i] for i in indices], end_section=bool(ends and ends[j]))
    return table


def fit(
    console,
    columns: Sequence,
    rows: Sequence[Sequence],
    *,
    key: int = 1,
    stack: Sequence[int] = (),
    title=None,
    stacked_title=None,
    ends: Sequence[bool] | None = None,
    **table_kw,
) -> list:
    """`columns` (rich ``Column``) and `rows` as rich Tables fitting `console`: one when it fits.

    While a table does not fit, the next column of `stack` (indices, the least needed first)
    moves to the next table, which repeats the first `key` columns and is titled
    `stacked_title`. `ends`: per row, whether a rule follows it. `table_kw` goes to every table."""
    tables = []
    shown = list(range(len(columns)))
    while shown:
        moved: list[int] = []
        while True:
            indices = [i for i in shown if i not in moved]
            t = title if not tables else stacked_title
            table = _table(console, columns, rows, indices, t, True, ends, **table_kw)
            movable = [i for i in stack if i in indices and i >= key]
            if fits(console, table) or not movable or len(indices) <= key + 1:  # a table keeps one of its own
                break
            moved.append(movable[0])
        if not fits(console, table):  # nothing left to move: let rich squeeze what is left
            table = _table(console, columns, rows, indices, t, False, ends, **table_kw)
        tables.append(table)
        if not moved:
            break
        shown = [*range(key), *sorted(moved)]
    return tables


def print_fitted(console, *args, **kwargs) -> None:
    """Print :func:`fit`'s tables."""
    for table in fit(console, *args, **kwargs):
        console.print(table)


def indented(text, indent: int = 2):
    """`text` (str, rich Text or another renderable) wrapped at spaces to the console, every line indented."""
    from rich.padding import Padding
    from rich.text import Text

    return Padding(Text(text) if isinstance(text, str) else text, (0, 0, 0, indent), expand=False)
