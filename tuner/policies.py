"""The engines' own all2all choices, scored beside the table's on the same measured points.

Each engine picks its backend by a fixed rule when nobody tells it (the versions of
:data:`a2a_tune.tuner.runtime.engines.VERSIONS`):

* **vLLM default**: ``allgather_reducescatter`` everywhere.
* **vLLM PR 54268** (proposed): ``flashinfer_nvlink_one_sided`` on GB200/GB300,
  ``allgather_reducescatter`` elsewhere.
* **TensorRT-LLM**: its priority list (``communication_factory.py``): the first of
  NVLINK_ONE_SIDED, NVLINK_TWO_SIDED, NCCL_EP, DEEPEP, DEEPEPLOWLATENCY that runs on this
  machine at this point -- here: that was measured there without failing -- else ALLGATHER;
  with experts that do not divide over the ranks, NVLINK_ONE_SIDED else ALLGATHER.
* **SGLang default** (``--moe-a2a-backend none``): no all2all kernel; with DP attention
  every rank gathers every token and the partial outputs are reduced -- scored as our
  ``allgather_reducescatter`` backends.

An engine literal can stand for more than one of our backends (vLLM's
``allgather_reducescatter`` is our eager one and the padded, graph-captured one its decode
runs): a policy is given the fastest of them at each point, the engine's best case.

Design notes: docs/architecture.md, "Module notes", `tuner/policies.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from .runtime import engines
from .runtime.savings import default_backends
from .runtime.table import BackendNames

#: GPU models on which vLLM PR 54268 makes the one-sided FlashInfer kernels the default.
ONE_SIDED_SKUS = frozenset({"gb200", "gb300"})
_NO_NAMES = BackendNames.of()


@dataclass(frozen=True)
class Point:
    """One measured point: shape (ep_size, hidden, topk, num_experts, dtype, routing), tokens
    per rank, and each backend's median µs there (backends that failed or were not measured
    are absent)."""

    shape: tuple
    tokens: int
    times: Mapping


@dataclass(frozen=True)
class Policy:
    engine: str
    name: str
    rule: str  # one line: what it runs
    backends: Callable  # (point, names) -> our backends it would run (the fastest measured one counts)


def _with_literal(engine: str, literal: str) -> Callable:
    def pick(point: Point, names: Mapping) -> set:
        return {b for b in point.times if names.get(b, _NO_NAMES).literal(engine) == literal}

    return pick


def _trtllm_priority(point: Point, names: Mapping) -> set:
    """TensorRT-LLM's rule, as the lookup's vs_default applies it (runtime.savings)."""
    return default_backends("trtllm", names, point.times, point.shape[3], point.shape[0])[1]


def default_policies(fingerprint: str) -> list:
    """Each engine's own rule for a machine of ``fingerprint`` (its GPU models decide PR 54268)."""
    skus = set((fingerprint or "").split(".", 1)[0].split("+"))
    one_sided = bool(skus) and skus <= ONE_SIDED_SKUS
    default = engines.DEFAULT["vllm"]
    pr_pick = "flashinfer_nvlink_one_sided" if one_sided else default
    return [
        Policy("vllm", "vLLM default", default, _with_literal("vllm", default)),
        Policy(
            "vllm",
            "vLLM PR 54268",
            f"one-sided on GB200/GB300, else all-gather: here {pr_pick}",
            _with_literal("vllm", pr_pick),
        ),
        Policy(
            "trtllm",
            "TensorRT-LLM priority list",
            "first of " + " > ".join(engines.TRTLLM_PRIORITY) + " that runs here",
            _trtllm_priority,
        ),
        Policy(
            "sglang",
            "SGLang default",
            "none: all-gather, reduce (our allgather_reducescatter)",
            _with_literal("vllm", default),
        ),
    ]


@dataclass
class PolicyScore:
    policy: Policy
    regrets: list = field(default_factory=list)  # the policy's, per scored point
    table_regrets: list = field(default_factory=list)  # the table's for this engine, same points
    ratios: list = field(default_factory=list)  # policy time / table time, same points
    unscored: int = 0  # points where the policy's backend (or the table's) was not measured
    defaulted: int = 0  # scored points where the table names nothing this engine accepts: its default runs

    @property
    def points(self) -> int:
        return len(self.regrets)

    def summary(self) -> dict:
        if not self.regrets:
            return {"points": 0, "unscored": self.unscored}
        return {
            "points": self.points,
            "unscored": self.unscored,
            "mean": sum(self.regrets) / self.points,
            "worst": max(self.regrets),
            "table_mean": sum(self.table_regrets) / self.points,
            "table_worst": max(self.table_regrets),
            "speedup": math.exp(sum(math.log(r) for r in self.ratios) / self.points),
            "table_defaulted": self.defaulted,
        }


def _time(backends: Iterable, point: Point):
    times = [point.times[b] for b in backends if b in point.times]
    return min(times) if times else None


def score_policies(points: Iterable, names: Mapping, policies: list, table_pick: Callable) -> list:
    """Score ``policies`` and the table on ``points`` (:class:`Point`).

    ``names``: backend -> :class:`~a2a_tune.tuner.runtime.table.BackendNames`;
    ``table_pick(point, engine)`` -> the table's backend for that engine there, or None
    where the table cannot answer (the engine then keeps its default: the engine's first
    policy)."""
    scores = [PolicyScore(p) for p in policies]
    default_of = {}
    for p in policies:
        default_of.setdefault(p.engine, p)
    for point in points:
        if not point.times:
            continue
        best = min(point.times.values())
        for s in scores:
            mine = _time(s.policy.backends(point, names), point)
            pick = table_pick(point, s.policy.engine)
            table = point.times.get(pick) if pick else _time(default_of[s.policy.engine].backends(point, names), point)
            if mine is None or table is None:
                s.unscored += 1
                continue
            s.defaulted += not pick
            s.regrets.append(mine / best - 1)
            s.table_regrets.append(table / best - 1)
            s.ratios.append(mine / table)
    return scores


def table_points(profile) -> list:
    """The measured points a table carries: each entry's token counts with every backend's
    median there (failed backends and missing values left out)."""
    out = []
    for e in profile.entries:
        for j, t in enumerate(e.tokens):
            times = {b: c[j] for b, c in e.median_us.items() if b not in e.failed and c[j] is not None}
            out.append(Point(tuple(e.shape), t, times))
    return out


def lookup_pick(profile_path: str) -> Callable:
    """``table_pick`` for :func:`score_policies`: the lookup's answer for the engine at the
    point (None where it falls back)."""
    from .runtime.lookup import lookup
    from .runtime.table import SHAPE_KEYS

    def pick(point: Point, engine: str):
        # quiet: the lookup's fallback warning is for an engine starting up; the scores count them
        choice = lookup(
            **dict(zip(SHAPE_KEYS, point.shape)), tokens=point.tokens, profile=profile_path, engine=engine, quiet=True
        )
        return None if choice.match == "fallback" else choice.backend

    return pick


def registry_names() -> dict:
    """backend -> :class:`BackendNames` of every registered backend (what the kernels declare)."""
    from a2a_tune.kernels.registry import engine_names

    return {b: BackendNames.of(n["engines"], n["closest"], n["engine_options"]) for b, n in engine_names().items()}


def score_table(profile_path: str, points: Iterable | None = None, names: Mapping | None = None) -> list:
    """The engines' policies and the table at ``points`` (default: the table's own measured
    points), for the machine the table was measured on. ``names`` adds engine names for
    backends the table does not declare (a run may hold more)."""
    from .runtime.lookup import load_profile

    profile = load_profile(profile_path)
    all_names = {**(names or {}), **profile.backends}
    pts = table_points(profile) if points is None else points
    return score_policies(pts, all_names, default_policies(profile.fingerprint), lookup_pick(profile_path))


def render_scores(scores: list, console, title: str) -> None:
    """The policies and the table for each engine, one row each (rich tables fitted to the
    console: the worst cases move to a second table when narrow), each policy's rule below
    it, and per engine one line where the table leaves the engine its default."""
    from rich import box
    from rich.table import Column
    from rich.text import Text

    from .console import indented, print_fitted

    columns = [
        Column("engine", no_wrap=True),
        Column("its own choice", no_wrap=True),
        Column("its regret", justify="right", no_wrap=True),
        Column("its worst", justify="right", no_wrap=True),
        Column("table's regret", justify="right", no_wrap=True),
        Column("table's worst", justify="right", no_wrap=True),
        Column("speedup", justify="right", no_wrap=True),
        Column("points", justify="right", no_wrap=True),
        Column("unscored", justify="right", no_wrap=True),
    ]
    rows = []
    for s in scores:
        r = s.summary()
        label = engines.NAMES[s.policy.engine]
        choice = s.policy.name.removeprefix(f"{label} ")  # the engine column says whose
        if not r["points"]:
            rows.append((label, choice, *["-"] * 5, "0", str(r["unscored"])))
            continue
        rows.append(
            (
                label,
                choice,
                f"{100 * r['mean']:.1f}%",
                f"{100 * r['worst']:.1f}%",
                f"{100 * r['table_mean']:.1f}%",
                f"{100 * r['table_worst']:.1f}%",
                f"{r['speedup']:.2f}x",
                str(r["points"]),
                str(r["unscored"]),
            )
        )
    print_fitted(
        console,
        columns,
        rows,
        key=2,
        stack=(3, 5, 8),
        title=f"{title}: each engine's default vs the table (regret vs the fastest backend)",
        stacked_title="the worst points of each, and the points not scored",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
    )
    for s in scores:
        console.print(indented(Text(f"{s.policy.name}: {s.policy.rule}")))
    said = set()
    for s in scores:  # once per engine: every policy of an engine shares the table's answers
        if s.defaulted and s.policy.engine not in said:
            said.add(s.policy.engine)
            label = engines.NAMES[s.policy.engine]
            console.print(
                indented(
                    Text(
                        f"{label}: at {s.defaulted} of {s.points} point(s) the table names no backend {label} "
                        f"accepts; there {label} keeps its default, and the table is scored as that default",
                        style="yellow",
                    )
                )
            )


def scores_data(scores: list) -> list:
    """JSON-ready rows of :func:`render_scores`."""
    return [{"engine": s.policy.engine, "policy": s.policy.name, "rule": s.policy.rule, **s.summary()} for s in scores]
