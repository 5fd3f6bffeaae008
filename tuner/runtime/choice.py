"""The answer of a lookup, and how it is chosen from a table.

:class:`Choice` is what :func:`a2a_tune.tuner.runtime.lookup.lookup` returns. :func:`choose`
picks, in a loaded table, the entry for a request (exact shape, else the nearest with the
same EP size and dtype: :func:`shape_distance`) and the backend with the lowest expected
time there (:mod:`a2a_tune.tuner.runtime.estimate`), among those the engine accepts
(:mod:`a2a_tune.tuner.runtime.engines`) and within the memory budget; :func:`fallback` is
the documented answer when there is none. Standard library only.
"""

from __future__ import annotations

import math
import os
from types import MappingProxyType

from a2a_tune.tuner.runtime import engine_rules, engines, savings
from a2a_tune.tuner.runtime.estimate import US_DECIMALS, bridge_gaps, decide, expected, where_text
from a2a_tune.tuner.runtime.fingerprint import HW_CLUSTER, HW_DEFAULT, HW_SAME_DOMAIN
from a2a_tune.tuner.runtime.point import Shape
from a2a_tune.tuner.runtime.profiles import fallback_message
from a2a_tune.tuner.runtime.request import PHASES
from a2a_tune.tuner.runtime.table import FALLBACK_BACKEND, Profile, ProfileEntry, describe_shape
from a2a_tune.tuner.runtime.text import one_line

__all__ = ["Choice", "choose", "fallback", "shape_distance"]


class Choice:
    """The answer of :func:`lookup`; read-only (answers are cached and shared).

    ``backend``: our name; ``engines``: engine -> its literal for it (from the profile; every
    engine of :data:`~a2a_tune.tuner.runtime.engines.ENGINES`, None where it has none; on a
    fallback vLLM's default and None for the others: keep their own); ``engine_options``: engine -> the options
    that engine needs beside the literal (e.g. SGLang's ``--deepep-mode``); ``match``:
    ``"exact"``, ``"nearest-shape"`` or ``"fallback"`` (the shape rule, or no answer);
    ``hardware_match``: ``"exact"``, ``"cluster"``, ``"same-gpu-domain"``, ``"engine-default"``
    (no table) or ``"unchecked"`` (``profile=`` given without ``fingerprint=``); ``reason``: one line saying which
    profile, shape and token rule produced it (or what went wrong); ``source``: the
    profile path or None; ``profile_fingerprint``: the fingerprint of the table used;
    ``phase``: ``"tokens"``, ``"decode"``, ``"prefill"`` or ``"workload"``;
    ``expected_us``: each compared backend's expected median µs (empty on fallback): the
    competing ones and, over a range of token counts, those not measured at every count in
    it (compared, never chosen: they may have failed there); ``alternatives``: every other
    compared backend -> regret (expected / best expected - 1); ``regret``: the chosen
    backend's own (> 0 only when the tie rule preferred it over the fastest); ``tie``:
    whether the tie rule applied; ``timing``: compared backend -> timing mode of its curve;
    ``entry_shape``: the table shape used, or None; ``knobs``: the chosen backend's tuned
    knob setting at the measured token count nearest the load (empty: its defaults);
    ``over_budget``: backend -> MiB it holds per rank, for those the memory budget skipped;
    ``vs_default``: the engine's own default here (``engine``, ``engine_default``, its
    ``default_us``) and ``saving_us_per_layer`` against it (:mod:`~a2a_tune.tuner.runtime.savings`;
    empty on a fallback or when the default was not measured); ``excluded``: backend -> the
    start-up rule (:mod:`~a2a_tune.tuner.runtime.engine_rules`) by which the engine cannot start
    with it in the deployment asked, "<rule>: <why>" (those never competed).

    A plain class rather than a dataclass: importing dataclasses costs ~10 ms (it imports
    inspect), which every engine would pay at start-up.
    """

    _FIELDS = (
        "backend",
        "engines",
        "match",
        "reason",
        "source",
        "expected_us",
        "entry_shape",
        "hardware_match",
        "profile_fingerprint",
        "phase",
        "alternatives",
        "regret",
        "tie",
        "timing",
        "knobs",
        "engine_options",
        "over_budget",
        "vs_default",
        "excluded",
    )
    _MAPPINGS = (
        "engines",
        "expected_us",
        "alternatives",
        "timing",
        "knobs",
        "engine_options",
        "over_budget",
        "vs_default",
        "excluded",
    )
    __slots__ = _FIELDS

    def __init__(
        self,
        backend: str,
        engines,
        match: str,
        reason: str,
        source=None,
        expected_us=None,
        entry_shape=None,
        hardware_match: str = HW_DEFAULT,
        profile_fingerprint=None,
        phase: str = "tokens",
        alternatives=None,
        regret: float = 0.0,
        tie: bool = False,
        timing=None,
        knobs=None,
        engine_options=None,
        over_budget=None,
        vs_default=None,
        excluded=None,
    ):
        values = dict(locals())
        for name in self._FIELDS:
            value = values[name]
            if name in self._MAPPINGS:
                value = MappingProxyType(dict(value or {}))
            object.__setattr__(self, name, value)

    def __setattr__(self, name, value):
        raise AttributeError(f"Choice is read-only (cannot set {name!r})")

    def __delattr__(self, name):
        raise AttributeError(f"Choice is read-only (cannot delete {name!r})")

    def _key(self) -> tuple:
        return tuple(
            tuple(sorted(getattr(self, n).items())) if n in self._MAPPINGS else getattr(self, n) for n in self._FIELDS
        )

    def __eq__(self, other):
        return self._key() == other._key() if type(other) is Choice else NotImplemented

    def __hash__(self):
        return hash(tuple(getattr(self, n) for n in self._FIELDS if n not in self._MAPPINGS))

    def __repr__(self) -> str:
        return "Choice(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in self._FIELDS) + ")"

    def engine_args(self, engine: str) -> tuple:
        """(literal, options) to tell ``engine`` ("vllm", "sglang", "trtllm") this answer's
        backend; (None, ()) on a fallback or when the engine has no literal for it."""
        if self.match == "fallback":
            return None, ()
        literal = self.engines.get(engine)
        return literal, tuple(self.engine_options.get(engine, ())) if literal else ()

    def to_dict(self) -> dict:
        """Plain JSON-serialisable dict (used by ``a2a-tune lookup --format json``)."""
        out = {n: (dict(getattr(self, n)) if n in self._MAPPINGS else getattr(self, n)) for n in self._FIELDS}
        out["entry_shape"] = dict(self.entry_shape._asdict()) if self.entry_shape else None
        out["engine_options"] = {engine: list(opts) for engine, opts in self.engine_options.items()}
        return out


def shape_distance(a: Shape, b: Shape) -> float:
    """The documented nearest-shape distance (only meaningful for equal ep_size and dtype)."""
    d = (
        abs(math.log2(a.hidden / b.hidden))
        + abs(math.log2(a.topk / b.topk))
        + abs(math.log2(a.num_experts / b.num_experts))
    )
    return d + (0.5 if a.routing != b.routing else 0.0)


def _pick_entry(prof: Profile, want: Shape):
    """(entry, match, shape text) or (None, None, problem). An EP size the table lacks is
    answered from the nearest larger one it has (its groups span as much or more), said so."""
    entry = prof.by_shape.get(want)
    if entry is not None:
        return entry, "exact", "exact shape"
    ep_text = ""
    same_dtype = [e.shape for e in prof.entries if e.shape.dtype == want.dtype]
    if not any(s.ep_size == want.ep_size for s in same_dtype):
        larger = [s.ep_size for s in same_dtype if s.ep_size > want.ep_size]
        model = [s.ep_size for s in same_dtype if s.ep_size > want.ep_size and s[1:] == want[1:]]
        if not larger:
            have = ", ".join(sorted({f"ep_size={e.shape.ep_size}/dtype={e.shape.dtype}" for e in prof.entries}))
            return (
                None,
                None,
                f"no entry for ep_size={want.ep_size} dtype={want.dtype} nor a larger EP size (table has {have})",
            )
        at = min(model or larger)
        ep_text = f"ep_size={want.ep_size} not measured, answered from the nearest larger measured ep_size={at}: "
        want = want._replace(ep_size=at)
        entry = prof.by_shape.get(want)
        if entry is not None:
            return entry, "nearest-shape", ep_text + "exact shape there"
    ranked = sorted(
        (round(shape_distance(want, e.shape), 9), -e.shape.hidden, -e.shape.num_experts, -e.shape.topk, i)
        for i, e in enumerate(prof.entries)
        if e.shape.ep_size == want.ep_size and e.shape.dtype == want.dtype
    )
    dist, *_, idx = ranked[0]
    entry = prof.entries[idx]
    text = f"nearest shape {describe_shape(entry.shape)} (distance {dist:.2f}) for requested {describe_shape(want)}"
    return entry, "nearest-shape", ep_text + text


def _workspace_need(entry: ProfileEntry, backend: str, dist):
    """MiB `backend` holds per rank to serve `dist`: the most at the measured token counts up to
    the first covering the load's largest step; None where the table does not hold it."""
    values = entry.figures.get(backend, {}).get("workspace_mib")
    if not values:
        return None
    kind = dist[0]
    top = dist[1] if kind == "point" else dist[2] if kind == "log-uniform" else max(t for t, _ in dist[1])
    covering = next((j for j, t in enumerate(entry.tokens) if t >= top), len(entry.tokens) - 1)
    known = [v for v in values[: covering + 1] if v is not None] or [v for v in values if v is not None]
    return max(known) if known else None


def _within_budget(entry: ProfileEntry, curves: dict, dist, budget) -> tuple:
    """(the curves within `budget`, {backend: MiB} of those skipped, the words saying so)."""
    if budget is None:
        return curves, {}, ""
    need = {b: _workspace_need(entry, b, dist) for b in curves}
    over = {b: mib for b, mib in need.items() if mib is not None and mib > budget}
    unknown = sorted(b for b, mib in need.items() if mib is None)
    text = f"; workspace budget {budget:g} MiB: "
    text += (
        "skipped " + ", ".join(f"{b} ({mib:g} MiB)" for b, mib in sorted(over.items())) if over else "nothing skipped"
    )
    if unknown:
        text += f" (memory not in the table: {', '.join(unknown)}, kept)"
    return {b: c for b, c in curves.items() if b not in over}, over, text


def choose(
    prof: Profile,
    path: str,
    want: Shape,
    dist,
    phase: str,
    engine: str | None,
    hw: str,
    machine_fp: str | None,
    budget=None,
    deployment: engine_rules.Deployment | None = None,
) -> Choice:
    """The answer in the loaded table ``prof`` (read from ``path``) for shape ``want`` over the
    load ``dist`` (an estimate distribution; ``phase`` its label), among the backends
    ``engine`` accepts (None: any) and within ``budget`` MiB per rank; ``hw`` is the hardware
    match and ``machine_fp`` this machine's fingerprint, for the reason's words."""
    fname = os.path.basename(path)
    common = dict(hardware_match=hw, profile_fingerprint=prof.fingerprint, phase=phase)
    entry, match, shape_text = _pick_entry(prof, want)
    if entry is None:
        return fallback(f"{path}: {shape_text}", path, **common)
    if entry.source != "measured":
        shape_text += f" [{entry.source}]"
    unfinished = [f"run {p['run']} {p['status']}" for p in entry.provenance if p["status"] != "completed"]
    if unfinished:
        shape_text += f" [partial table: {', '.join(unfinished)}]"
    where = where_text(entry.tokens, dist)
    if phase in PHASES:
        where = f"{phase}: {where}"

    curves = {b: c for b, c in entry.median_us.items() if b not in entry.failed}
    excluded, rules_text = {}, ""
    if engine is not None:
        curves = {b: c for b, c in curves.items() if _expressible(engine, prof.backends[b], want)}
        if deployment not in (None, engine_rules.NO_FACTS):  # no facts: only the shape rule, applied above
            excluded = _refused(engine, prof, curves, deployment, want)
            curves = {b: c for b, c in curves.items() if b not in excluded}
            if excluded:
                rules_text = "; excluded by start-up rules: " + ", ".join(
                    f"{b} ({why})" for b, why in sorted(excluded.items())
                )
    common["excluded"] = excluded
    curves, over, budget_text = _within_budget(entry, curves, dist, budget)
    budget_text = rules_text + budget_text
    medians = {b: round(v, US_DECIMALS) for b, v in expected(entry.tokens, curves, dist).items()}
    if not medians:
        return fallback(
            f"{path}: {shape_text}, {where}: {_unusable(entry, prof, engine, want)}{budget_text}",
            path,
            over_budget=over,
            **common,
        )
    spread_of = lambda curves_by_b: expected(entry.tokens, {b: curves_by_b[b] for b in medians}, dist)  # noqa: E731
    chosen, fastest, tied = decide(medians, spread_of(entry.p10_us), spread_of(entry.p90_us), prof.tie_preference)
    best = medians[fastest]
    verb = "expected " if phase != "tokens" else ""
    if chosen != fastest:
        vs = (
            f"{chosen} {verb}{medians[chosen]:.3f} us (+{(medians[chosen] / best - 1) * 100:.1f}%), "
            f"fastest {fastest} {best:.3f} us; tie: {', '.join(tied[1:])} within {fastest}'s p10..p90, "
            f"preferring {chosen} (tie preference)"
        )
    else:
        others = sorted((v, b) for b, v in medians.items() if b != chosen)
        if others:
            ru_us, ru = others[0]
            vs = f"{chosen} {verb}{best:.3f} us, runner-up {ru} {ru_us:.3f} us (+{(ru_us / best - 1) * 100:.1f}%)"
        else:
            vs = f"{chosen} {verb}{best:.3f} us, no other backend competes"
        if len(tied) > 1:
            vs += f"; tie: {', '.join(tied[1:])} within {fastest}'s p10..p90, {chosen} preferred anyway"
    # Over a range, a backend not measured at some count inside it (a refinement count timed
    # only for the contenders, or a count where it failed) is compared on its own measured
    # counts but never chosen.
    compared = dict(medians)
    gapped = {}
    if dist[0] == "discrete" or (dist[0] == "log-uniform" and dist[1] < dist[2]):
        bridged = {b: bridge_gaps(entry.tokens, c) for b, c in curves.items() if b not in medians}
        bridged = {b: c for b, c in bridged.items() if c is not None}
        gapped = {b: round(v, US_DECIMALS) for b, v in expected(entry.tokens, bridged, dist).items()}
        compared.update(gapped)
    if gapped:
        vs += "; not measured at every token count in range, so compared but not chosen: " + ", ".join(
            f"{b} {(v / best - 1) * 100:+.1f}%" for v, b in sorted((v, b) for b, v in gapped.items())
        )
    modes = {b: entry.timing.get(b, "eager") for b in compared}
    if len(set(modes.values())) > 1:
        vs += " [timing: " + ", ".join(f"{b} {m}" for b, m in sorted(modes.items())) + "]"
    hw_text = {
        HW_SAME_DOMAIN: f" (measured on {prof.fingerprint}: same GPUs and NVLink domain as {machine_fp})",
        HW_CLUSTER: f" (measured by a job over the nodes of {prof.fingerprint}, this node among them)",
    }.get(hw, "")
    names = prof.backends[chosen]
    return Choice(
        vs_default=_vs_default(entry, prof, want, dist, engine, medians[chosen]),
        backend=chosen,
        engines={**dict.fromkeys(engines.ENGINES), **names.literals},
        engine_options=names.engine_options,
        match=match,
        reason=one_line(f"profile {fname}{hw_text}, {shape_text}, {where}: {vs}{budget_text}"),
        source=path,
        expected_us=compared,
        entry_shape=entry.shape,
        alternatives={b: round(v / best - 1, 4) for b, v in compared.items() if b != chosen},
        regret=round(medians[chosen] / best - 1, 4),
        tie=len(tied) > 1,
        timing=modes,
        knobs=_knobs_at(entry, chosen, dist),
        over_budget=over,
        **common,
    )


# How a failure's kind (:class:`~a2a_tune.tuner.runtime.table.Failed`) reads in a list.
_FAILURE_KINDS = {
    "unavailable": "unavailable",
    "not_applicable": "not applicable",
    "incorrect": "incorrect",
    "error": "failed",
    "timeout": "timed out",
}


def _unusable(entry: ProfileEntry, prof: Profile, engine, want: Shape) -> str:
    """Why no backend competes: "no usable backend [that <engine> accepts]", and of those the
    engine could run, which the table lists as unavailable, incorrect, ... there."""
    kinds: dict = {}
    for b, failed in sorted(entry.failed.items()):
        if engine is None or _expressible(engine, prof.backends[b], want):
            kinds.setdefault(_FAILURE_KINDS.get(failed.kind, "failed"), []).append(b)
    text = f"no usable backend{f' that {engines.NAMES[engine]} accepts' if engine else ''}"
    if kinds:
        text += " (" + "; ".join(f"{kind}: {', '.join(bs)}" for kind, bs in kinds.items()) + ")"
    return text


def _refused(engine: str, prof: Profile, curves: dict, deployment, want: Shape) -> dict:
    """backend -> "<rule>: <why>" for the backends ``engine`` cannot start with in ``deployment``."""
    out = {}
    for b in curves:
        literal = prof.backends[b].literal(engine)
        rule = engine_rules.refused(engine, literal, deployment, want)
        if rule is not None:
            out[b] = engine_rules.reason(rule, engine, literal)
    return out


def _expressible(engine: str, names, want: Shape) -> bool:
    """Whether ``engine`` can be told to run the backend with these names at ``want``."""
    return engines.accepts(
        engine,
        names.literal(engine),
        names.engine_options.get(engine, ()),
        num_experts=want.num_experts,
        ep_size=want.ep_size,
    )


def _knobs_at(entry: ProfileEntry, backend: str, dist) -> dict:
    """The backend's knob setting at the measured token count nearest the load (in log space,
    the larger on a tie): the point; the decode range's log-midpoint; a workload's weighted
    log-mean. {} when the table has none there."""
    settings = entry.knobs.get(backend)
    if not settings:
        return {}
    kind = dist[0]
    if kind == "point":
        log_t = math.log(max(dist[1], 1))
    elif kind == "log-uniform":
        log_t = (math.log(max(dist[1], 1)) + math.log(max(dist[2], 1))) / 2
    else:  # discrete: ((tokens, weight), ...), weights summing to 1
        log_t = sum(w * math.log(max(t, 1)) for t, w in dist[1])
    j = min(range(len(entry.tokens)), key=lambda i: (abs(math.log(entry.tokens[i]) - log_t), -entry.tokens[i]))
    return dict(settings[j] or {})


def fallback(
    problem: str,
    source: str | None = None,
    *,
    hardware_match: str = HW_DEFAULT,
    profile_fingerprint: str | None = None,
    phase: str = "tokens",
    over_budget=None,
    excluded=None,
) -> Choice:
    """The documented fallback answer for ``problem`` (the reason says it and the fallback)."""
    return Choice(
        backend=FALLBACK_BACKEND,
        # vLLM's default; SGLang and TensorRT-LLM keep their own (None: tell them nothing).
        engines={**dict.fromkeys(engines.ENGINES), "vllm": FALLBACK_BACKEND},
        match="fallback",
        reason=fallback_message(problem),
        source=source,
        hardware_match=hardware_match,
        profile_fingerprint=profile_fingerprint,
        phase=phase,
        over_budget=over_budget,
        excluded=excluded,
    )


def _vs_default(entry: ProfileEntry, prof: Profile, want: Shape, dist, engine, chosen_us: float) -> dict:
    """The engine's default on this entry and the choice's saving against it (savings.py)."""
    eng = engine or savings.DEFAULT_ENGINE
    measured = [b for b in entry.median_us if b not in entry.failed]
    label, pool = savings.default_backends(eng, prof.backends, measured, want.num_experts, want.ep_size)
    # a count the default was not measured at (a refinement count) is bridged, as for "compared"
    pool_curves = {b: bridge_gaps(entry.tokens, entry.median_us[b]) or entry.median_us[b] for b in pool}
    times = expected(entry.tokens, pool_curves, dist)
    if not times:
        return {}
    default_us = round(min(times.values()), US_DECIMALS)
    return {
        "engine": eng,
        "engine_default": label,
        "default_us": default_us,
        "saving_us_per_layer": round(default_us - chosen_us, US_DECIMALS),
    }
