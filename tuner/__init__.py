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

Glossary -- these words mean one thing everywhere in code, help texts and docs:

shape
    An MoE layer as the all2all sees it: experts E, top-k k, hidden size H, at an EP size W
    (the ranks of the expert-parallel group; rank r owns experts [r*E/W, (r+1)*E/W)).
    ``runtime.point.Shape`` is one (W, H, k, E, payload dtype, routing), a table entry's key;
    ``shapes.ModelShape`` is a model's E, k, H (``at(W, dtype, routing)`` gives its Shape);
    ``kernels.MoEShape`` is what one backend is built for: E, k, H, its capacity and the
    payload dtype (``MoEShape.of(shape, capacity)``).
point
    (shape, payload dtype, routing, tokens per rank): where something is measured, whatever
    the backend. ``runtime.point.Point``: the one type, in one field order, that the plan,
    the ranks, the store's key and lookup's request carry.
case
    One backend at one point: what the sweep gates (the invariant check) and times. It ends
    as a measurement or a failure (incorrect, error, timeout); a backend unavailable on the
    machine is one failure of the run, not of each case.
round trip
    ``combine(dispatch(x))`` of one step's tokens, with no expert compute. Every time is
    microseconds per round trip.
sample
    One timed number: R round trips back to back divided by R, the max over ranks
    (``timing``). A *measurement* is a case's samples with their median, p10/p90 and the
    confidence interval of the median, its timing mode (``graph`` replay or ``eager``) and
    its knobs.
run
    One sweep's record in the store: hardware, versions, plan and status (running,
    completed, interrupted, failed); it holds the measurements and failures. ``--resume``
    continues a run without repeating a case.
grid
    The token counts a sweep measures. A *refinement count* is an extra one between two
    grid counts where the winner changes or the top two race (``adaptive``).
capacity
    The tokens per rank a fixed-size backend is built for (its workspace): by default the
    token count being timed, with ``--capacity N`` an engine's largest step.
step
    The tokens per rank of one engine step (<= capacity); ``set_step_tokens`` tells a
    backend. An engine's largest decode step is its max batch (``--max-batch``, vLLM's
    ``max_num_seqs``).
fingerprint
    The machine's name, ``<sku>.<interconnect>.<nodes>`` (``probe``), e.g.
    ``h200.nvl18x2.node1``. It names the table file.
table
    The JSON file ``select`` writes per fingerprint and ``lookup`` reads. The code and
    options call it a *profile* (``--profile``, ``profiles/``, ``Profile``): the same file.
entry
    One (shape, dtype, routing)'s row in a table: per backend a curve of medians over the
    entry's token counts, the backends that failed there, and the winners. (Its key, all
    six fields, is ``runtime.table.Shape``.)
bucket
    The token range one of an entry's token counts stands for (up to the geometric
    midpoints with its neighbours). A bucket has one *winner*: the fastest, or, when the
    runner-up's median is inside the fastest's p10..p90 and within 3% of it (a *tie*), the
    first of the two in the table's ``tie_preference``.
knobs
    A backend's launch settings that change speed, never results (``knob_space``); the
    knob search runs one Optuna study per case.
phase
    The kind of engine step a lookup is for: ``decode`` (tokens per rank log-uniform over
    1..max batch) or ``prefill`` (the chunk size).
workload
    A histogram of tokens per rank per step (``runtime.workload``); a lookup for it picks
    the backend with the lowest expected time.
load
    What a lookup is asked about: one step's tokens, a phase, or a workload.
"""
