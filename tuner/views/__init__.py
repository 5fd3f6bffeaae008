"""What operators read: ``show``, ``diff``, ``plot`` and ``report`` over a selection table
or a stored run. Read-only. A table is judged as the lookup judges it: what the lookup
refuses, a view refuses (one line, exit 2); what it tolerates is shown and noted.

Layering (never back up the list)::

    report.py   one self-contained HTML file        -> plot.py, show.py, model.py
    plot.py     one PNG per shape (matplotlib)       -> show.py, model.py
    diff.py     compare two tables or runs           -> model.py
    show.py     winner ranges, provenance, failures  -> model.py
    load.py     a table file or a stored run -> TableView (through runtime.table and select)
    model.py    TableView and the formatting rules every view shares
"""
