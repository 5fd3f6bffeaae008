"""a2a-tune: probe -> sweep -> store -> select -> lookup.

The offline tuner, read top-down: ``probe`` names the machine; ``plans`` turns the command
line's options into the sweep plan, refused whole before any rank starts; ``sweep`` checks and times
every backend (ranks started by ``launch``; each case built, gated and timed by ``measure``
with ``timing``; token counts chosen by ``adaptive``), ``knobs`` searches launch settings and
``check`` runs the conformance cases through the same path; ``db`` stores the results;
``select`` writes the table; ``evaluate`` scores a table on held-out token counts; ``cli`` is
the command line.
``runtime/`` is what engines import at start-up (standard library only) and ``views/`` what
operators read.

The words of the glossary (shape, point, case, round trip, sample, run, grid, capacity, step,
fingerprint, table, entry, bucket, knobs, phase, workload, load) mean one thing everywhere in
code, help texts and docs: docs/architecture.md, "Glossary".
"""
