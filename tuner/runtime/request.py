"""Lookup's request rules, in one place: what may be asked, checked into a :class:`LookupRequest`.

:func:`request` takes lookup's arguments (a shape, a load -- one step's tokens, a phase or a
workload -- and optionally an engine, a table, a fingerprint and a memory budget) and returns
the checked request, or raises :class:`RequestError`. The error is structured (the rule
broken, the argument at fault, the value given and the rule's bound), so that each caller
words it in its own names: ``str()`` uses lookup's keywords (``tokens=``), and ``a2a-tune
lookup`` words the same error in its option names (``--tokens``). Standard library only.
"""

from __future__ import annotations

import math
import operator
import os
from typing import NamedTuple

from a2a_tune.tuner.runtime import engine_rules, engines
from a2a_tune.tuner.runtime.point import PointError, Shape, check_tokens
from a2a_tune.tuner.runtime.text import one_line

__all__ = ["PHASES", "WORKSPACE_ENV", "LookupRequest", "RequestError", "request", "shown"]

PHASES = ("decode", "prefill")
#: A workspace budget in MiB for every request that gives none (README, "Memory budget").
WORKSPACE_ENV = "A2A_TUNE_MAX_WORKSPACE_MIB"
#: What ``max_tokens`` is for each phase (the words of a request that lacks it).
_SIZE_MEANING = {"decode": "max batch per rank", "prefill": "tokens per rank per prefill step"}


class LookupRequest(NamedTuple):
    """A checked request (build it with :func:`request`): ``shape``; ``phase`` -- ``"tokens"``,
    ``"decode"``, ``"prefill"`` or ``"workload"``; ``load``, what the answer averages over: an
    :mod:`~a2a_tune.tuner.runtime.estimate` distribution (``("point", t)``,
    ``("log-uniform", 1, B)``, ``("discrete", ((t, w), ...))``) or ``("workload-file", path)``,
    read when answered; ``engine`` or None; ``fingerprint`` as given (None: this machine's);
    ``profile``: a table's path, or None to search for it; ``max_workspace_mib``: the memory
    budget per rank (None: none).

    A named tuple, frozen and hashable like a frozen dataclass; ``dataclasses`` would add
    ~7 ms (it imports ``inspect``) to every engine's start-up.
    """

    shape: Shape
    phase: str
    load: tuple
    engine: str | None = None
    fingerprint: str | None = None
    profile: str | None = None
    max_workspace_mib: float | None = None
    deployment: engine_rules.Deployment = engine_rules.NO_FACTS


def shown(value) -> str:
    """A bounded ``repr`` for a message."""
    try:
        return one_line(repr(value), 80)
    except Exception:  # a huge int (beyond Python's digit limit) or a broken __repr__
        return f"<{type(value).__name__}>"


class RequestError(ValueError):
    """A request :func:`request` refuses. ``str()`` is one line in lookup's keywords; the
    fields let a caller word it in its own names:

    - ``rule``: which rule the request broke (the ``bound`` it carries):
      ``"integer"`` (the least integer allowed), ``"choice"`` (the names allowed),
      ``"type"`` (what is expected, in words, e.g. ``"a string"``), ``"tokens"`` (the
      point's words for a bad token count), ``"shape"`` (the point's words for an impossible
      shape; ``field`` None), ``"one_load"`` (``value``: the load arguments given, not one),
      ``"stray_size"`` (``max_tokens`` given beside ``value``, "tokens" or "workload"),
      ``"needs_size"`` (``value``: the phase that lacks ``max_tokens``), ``"budget"`` (what a
      budget must be, in words; ``field`` may be :data:`WORKSPACE_ENV`),
      ``"workload"`` (the workload's words for a bad histogram);
    - ``field``: the argument at fault, as lookup names it (``"num_experts"``), or None;
    - ``value``: what was given; ``bound``: as above;
    - ``phase``: the phase label the fallback answer carries.
    """

    def __init__(self, rule: str, field: str | None, value=None, bound=None, phase: str = "tokens"):
        self.rule, self.field, self.value, self.bound, self.phase = rule, field, value, bound, phase
        super().__init__(one_line(self._keyword_words()))

    def _keyword_words(self) -> str:
        rule, field, value, bound = self.rule, self.field, self.value, self.bound
        if rule == "shape":
            return f"invalid lookup shape: {bound}"
        if rule == "workload":
            return f"workload: {bound}"
        if rule == "one_load":
            got = ", ".join(value) or "none"
            return f"give exactly one of tokens=, phase= (with max_tokens=) or workload= (got {got})"
        if rule == "stray_size":
            return f"max_tokens= goes with phase=, not with {value}="
        if rule == "needs_size":
            return f"phase={value!r} needs max_tokens= ({_SIZE_MEANING[value]})"
        if rule == "budget":
            return f"invalid {field}={shown(value)} (expected {bound})"
        if rule == "tokens":
            return f"invalid lookup argument {field}={shown(value)} ({bound})"
        if rule == "integer":
            expected = f"an integer >= {bound}"
        elif rule == "choice":
            names = ", ".join(map(repr, bound))
            expected = f"None or one of {names}" if field == "engine" else " or ".join(map(repr, bound))
        else:
            expected = bound
        return f"invalid lookup argument {field}={shown(value)} (expected {expected})"


def request(
    *,
    ep_size: int,
    hidden: int,
    topk: int,
    num_experts: int,
    tokens: int | None = None,
    dtype: str = "bf16",
    routing: str = "uniform",
    fingerprint: str | None = None,
    profile: str | os.PathLike | None = None,
    engine: str | None = None,
    phase: str | None = None,
    max_tokens: int | None = None,
    workload=None,
    max_workspace_mib: float | None = None,
    lora: bool | None = None,
    pipeline_size: int | None = None,
    moe_tp_size: int | None = None,
    quantization: str | None = None,
    moe_runner: str | None = None,
    platform: str | None = None,
    missing_packages=None,
) -> LookupRequest:
    """The checked :class:`LookupRequest`, or :class:`RequestError` saying what is wrong.

    Give exactly one of ``tokens`` (tokens per rank per step), ``phase`` ("decode" /
    "prefill", with ``max_tokens``) or ``workload`` (a JSON / CSV histogram file, or a
    ``{tokens: weight}`` mapping); see the README. ``profile`` names a file directly (its
    fingerprint is then only checked when ``fingerprint`` is given too); otherwise the
    profile of ``fingerprint`` (or ``$A2A_TUNE_FINGERPRINT``, or the probed one) is searched
    for. ``engine`` (``"vllm"``, ``"sglang"`` or ``"trtllm"``) lets only backends that
    engine accepts a literal for compete. ``max_workspace_mib`` (default
    ``$A2A_TUNE_MAX_WORKSPACE_MIB``): skip backends holding more device memory per rank. A
    workload file is read when answered, not here (a missing or broken one is the fallback,
    not a refused request).

    The deployment's facts (each None: not known) let only backends the engine can start
    with compete (:mod:`~a2a_tune.tuner.runtime.engine_rules`): ``lora``, ``pipeline_size``,
    ``moe_tp_size``, ``quantization`` (one of :data:`~a2a_tune.tuner.runtime.engine_rules.QUANTIZATIONS`),
    ``moe_runner``, ``platform`` ("cuda", "cuda:8.9", "rocm", "cpu") and ``missing_packages``
    (those the engine's process cannot import)."""
    if Shape.plain(ep_size, hidden, topk, num_experts, dtype, routing):  # the common case, fast
        shape = Shape(ep_size, hidden, topk, num_experts, dtype, routing)
    else:
        given = (("ep_size", ep_size), ("hidden", hidden), ("topk", topk), ("num_experts", num_experts))
        sizes = [_count(n, v) for n, v in given]
        for n, v in (("dtype", dtype), ("routing", routing)):
            if not isinstance(v, str):
                raise RequestError("type", n, v, "a string")
        shape = Shape(*sizes, dtype, routing)
        problem = shape.problem()  # the point's bounds, top-k <= experts (uneven experts are fine)
        if problem:
            raise RequestError("shape", None, shape, problem)
    if engine is not None and engine not in engines.ENGINES:
        raise RequestError("choice", "engine", engine, tuple(engines.ENGINES))
    if profile is not None:
        try:
            profile = os.fspath(profile)
        except TypeError:
            raise RequestError("type", "profile", profile, "a file path") from None
    phase, load = _load(tokens, phase, max_tokens, workload)
    facts = (lora, pipeline_size, moe_tp_size, quantization, moe_runner, platform, missing_packages)
    deployment = engine_rules.NO_FACTS if facts == (None,) * 7 else _deployment(*facts)
    return LookupRequest(shape, phase, load, engine, fingerprint, profile, _budget(max_workspace_mib), deployment)


def _deployment(
    lora, pipeline_size, moe_tp_size, quantization, moe_runner, platform, missing
) -> engine_rules.Deployment:
    """The checked deployment facts, or RequestError (each None: not known)."""
    if lora is not None and not isinstance(lora, bool):
        raise RequestError("type", "lora", lora, "True, False or None")
    sizes = [
        None if v is None else _count(n, v) for n, v in (("pipeline_size", pipeline_size), ("moe_tp_size", moe_tp_size))
    ]
    for field, value, names in (
        ("quantization", quantization, engine_rules.QUANTIZATIONS),
        ("moe_runner", moe_runner, engine_rules.MOE_RUNNERS),
    ):
        if value is not None and value not in names:
            raise RequestError("choice", field, value, names)
    if platform is not None:
        try:
            kind, cap = engine_rules.platform_parts(platform)
        except (AttributeError, TypeError, ValueError):
            kind, cap = None, None
        if kind not in engine_rules.PLATFORMS or (cap is not None and (kind != "cuda" or not 1 <= cap[0] <= 99)):
            raise RequestError("choice", "platform", platform, ("cuda", "cuda:MAJOR.MINOR", "rocm", "cpu"))
    packages = frozenset()
    if missing is not None:
        try:
            packages = frozenset(missing) if not isinstance(missing, str) else None
        except TypeError:
            packages = None
        if packages is None or not all(isinstance(p, str) for p in packages):
            raise RequestError("type", "missing_packages", missing, "a list of package names")
    return engine_rules.Deployment(lora, *sizes, quantization, moe_runner, platform, packages)


def _count(field: str, value, low: int = 1) -> int:
    """``value`` as an int >= ``low`` (integer-like objects such as numpy ints included)."""
    if not isinstance(value, bool):
        try:
            i = operator.index(value)
            if i >= low:
                return i
        except TypeError:
            pass
    raise RequestError("integer", field, value, low)


def _tokens(field: str, value, phase: str) -> int:
    """``value`` as a token count per rank: the point's one bound (1..2^20), which the CLI,
    the store and the table hold too."""
    try:
        number = value if isinstance(value, bool) else operator.index(value)  # numpy ints too
    except TypeError:
        number = value  # not integer-like: check_tokens says so
    try:
        return check_tokens(number)
    except PointError as exc:
        raise RequestError("tokens", field, value, str(exc), phase) from None


def _budget(value) -> float | None:
    """The memory budget in MiB: the argument, else $A2A_TUNE_MAX_WORKSPACE_MIB; RequestError
    for one that is not a number >= 0."""
    field = "max_workspace_mib"
    if value is None:
        value = os.environ.get(WORKSPACE_ENV, "").strip() or None
        if value is None:
            return None
        field = WORKSPACE_ENV
        try:
            value = float(value)
        except ValueError:
            raise RequestError("budget", field, value, "a number of MiB") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise RequestError("budget", field, value, "a number of MiB >= 0")
    return float(value)


def _load(tokens, phase, max_tokens, workload) -> tuple:
    """(phase label, load) of a request (see :class:`LookupRequest`), or RequestError."""
    if tokens is not None and phase is None and max_tokens is None and workload is None:
        return "tokens", ("point", _tokens("tokens", tokens, "tokens"))  # the common case, fast
    given = tuple(n for n, v in (("tokens", tokens), ("phase", phase), ("workload", workload)) if v is not None)
    if len(given) != 1:
        raise RequestError("one_load", None, given)
    if tokens is not None:
        if max_tokens is not None:
            raise RequestError("stray_size", "max_tokens", "tokens")
        return "tokens", ("point", _tokens("tokens", tokens, "tokens"))
    if phase is not None:
        if phase not in PHASES:
            raise RequestError("choice", "phase", phase, PHASES)
        if max_tokens is None:
            raise RequestError("needs_size", "max_tokens", phase, phase=phase)
        n = _tokens("max_tokens", max_tokens, phase)
        return phase, ("log-uniform", 1, n) if phase == "decode" else ("point", n)
    if max_tokens is not None:
        raise RequestError("stray_size", "max_tokens", "workload", phase="workload")
    from collections.abc import Mapping

    if isinstance(workload, Mapping):
        from a2a_tune.tuner.runtime import workload as wl

        try:
            return "workload", ("discrete", wl.parse_workload(workload))
        except wl.WorkloadError as exc:
            raise RequestError("workload", "workload", workload, str(exc), "workload") from None
    try:
        return "workload", ("workload-file", os.fspath(workload))
    except TypeError:
        raise RequestError("type", "workload", workload, "a file path or a mapping", "workload") from None
