"""Knob search: per (backend, shape, token count) an Optuna study finds the fastest correct setting.

A backend declares its launch parameters in `knob_space` (see `a2a_tune.kernels.base`).
For one backend, one model shape and each token count per rank, on every rank together,
the backend built, gated and timed as the sweep does it (`tuner.measure`):

  1. rank 0 asks the study for a trial (the backend's defaults first, enqueued, so the
     study can say what the search gained) and broadcasts its knobs; every rank applies
     them with `set_knobs`;
  2. the invariant gate on fresh inputs: a setting that breaks correctness is a FAILED
     trial, never a winner;
  3. a short first measurement with the sweep's timer (CUDA-graph replay for capturable
     backends on CUDA, eager otherwise), reported as the trial's intermediate value: a
     setting clearly slower than the best completed one (`prune_margin`) is PRUNED there;
  4. otherwise the full measurement; the objective is the median device µs per round trip
     (each sample is already the max over ranks, so every rank holds the same number).

A setting asked for again (the sampler may) reuses the stored outcome instead of running.

Optuna samples and keeps its trials in its own tables in the measurement database (same URL;
our schema keeps its Alembic history in its own version table), so `optuna-dashboard <url>`
shows them; rerunning the command adds trials to the same studies (named by
:mod:`a2a_tune.tuner.studies`). Each point's best setting is stored as a row of ours
(``Store.put_knobs``), which `select` reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist
from optuna.pruners import BasePruner

from a2a_tune.kernels import BackendEnv, MoEShape, availability_of, get_backend

from .cluster import gather_topology
from .launch import RankContext, all_ranks_ok, is_rank_zero, one_line, run_ranks
from .measure import Backends, Result, input_sets, measure, time_agreed, timing_mode
from .progress import progress_bar
from .runtime.measurement import MeasurementKey
from .shapes import ModelShape
from .studies import study_name
from .timing import summarize

DEFAULT_TRIALS = 16
DEFAULT_ITERS = {"cuda": (10, 30, 5), "cpu": (1, 6, 2)}  # (warm-up, timed samples, short first measurement)
PRUNE_MARGIN = 0.25  # a first measurement this much slower than the best so far is hopeless
MAX_ASKS_PER_TRIAL = 4  # the sampler may keep proposing measured settings: stop asking after this many per trial


@dataclass(frozen=True)
class KnobPlan:
    backend: str
    shape: ModelShape
    tokens: tuple[int, ...]
    dtype: str = "bf16"
    routing: str = "uniform"
    trials: int = DEFAULT_TRIALS  # per token count, the default setting included
    warmup: int = 10
    iters: int = 30  # timed samples of a full measurement
    probe_iters: int = 5  # timed samples of the short first measurement (pruning)
    input_sets: int = 3
    seed: int = 0
    prune_margin: float = PRUNE_MARGIN
    capacity: int | None = None  # as SweepPlan.capacity: fixed-capacity backends' size; None: the load's

    def tuned_capacity(self) -> int | None:
        """The capacity this search builds the backend for (None: each load's own, or a backend
        without one): it names the study and is stored with it."""
        return self.capacity if get_backend(self.backend).capacity_bound else None


@dataclass
class KnobResult:
    """One study's outcome (rank 0). `best_*` is the default when nothing beat it."""

    backend: str
    tokens: int
    study_name: str
    timing: str = ""  # "graph" | "eager"
    default_knobs: dict[str, Any] = field(default_factory=dict)
    default_us: float | None = None
    best_knobs: dict[str, Any] = field(default_factory=dict)
    best_us: float | None = None
    trials: int = 0  # run in this invocation (repeats included)
    pruned: int = 0
    failed: int = 0
    repeats: int = 0  # settings asked for again: the stored outcome was reused
    skipped: str = ""  # why this token count was not searched (infeasible, construction failed)
    last_was_repeat: bool = field(default=False, repr=False)

    @property
    def gain(self) -> float | None:
        """default / best - 1 (0.1: the best setting is 10% faster than the default)."""
        if not self.default_us or not self.best_us:
            return None
        return self.default_us / self.best_us - 1


def tune_knobs(
    plan: KnobPlan, *, device_type: str, world_size: int, db_url: str | None, progress: bool = True
) -> list[KnobResult] | None:
    """Search `plan.backend`'s knobs at each token count on `world_size` ranks (spawned here,
    or this process's torchrun job). Returns one KnobResult per token count; None on the
    non-zero ranks of a torchrun/srun job; [] when the backend declares no knobs. `db_url`: a
    URL the caller checked (a2a_tune.db.check_url)."""
    from a2a_tune.db import open_store

    if not get_backend(plan.backend).knob_space:
        return []
    if is_rank_zero():
        open_store(db_url).close()  # our schema first: a wrong or outdated database fails here, in one line
    results = run_ranks(_tune_rank, world_size, device_type, plan, db_url, progress)
    return next((r for r in results if r is not None), None)


# --------------------------------------------------------------------------------- ranks


def _tune_rank(ctx: RankContext, plan: KnobPlan, url: str, show_progress: bool) -> list[KnobResult] | None:
    cls = get_backend(plan.backend)
    ok, reason = availability_of(cls, BackendEnv.local(ctx.world_size, ctx.device.type))
    if not ok:
        raise RuntimeError(f"{plan.backend} is unavailable here: {reason}")
    fingerprint = gather_topology(ctx).fingerprint
    owner = _StudyOwner(url, plan) if ctx.rank == 0 else None
    results = []
    with progress_bar(show_progress and owner is not None, "knobs") as bar:
        task = bar.add_task("", total=len(plan.tokens) * plan.trials) if bar else None
        for tokens in plan.tokens:
            result = _tune_point(ctx, plan, fingerprint, tokens, owner, bar, task)
            results.append(result)
    return results if owner is not None else None


def _tune_point(ctx, plan: KnobPlan, fingerprint: str, tokens: int, owner, bar, task) -> KnobResult:
    m = plan.shape
    # built as the sweep builds it: fixed-capacity backends for the load being timed, or for
    # the engine's capacity when one is given
    point = m.at(ctx.world_size, plan.dtype, plan.routing)
    shape = MoEShape.of(point, max(plan.tokens))
    key = MeasurementKey.of(plan.backend, point.at(tokens))
    name = study_name(fingerprint, key, plan.tuned_capacity())
    cls = get_backend(plan.backend)
    result = KnobResult(plan.backend, tokens, name, default_knobs=dict(cls.knob_defaults))

    def advance(n: int, text: str) -> None:
        if bar is not None:
            bar.update(task, advance=n, description=f"{plan.backend} T={tokens}: {text}")

    with Backends(ctx, shape, capacity=plan.capacity) as backends:
        backend = backends.get(plan.backend, tokens)  # every rank has `tokens`: the step's size
        if isinstance(backend, Result):
            result.skipped = f"infeasible: {backend.reason}" if backend.kind == "infeasible" else backend.reason
            advance(plan.trials, result.skipped)
            return result
        inputs = input_sets(ctx, shape, tokens, routing=plan.routing, seed=plan.seed, sets=plan.input_sets)
        result.timing = timing_mode(cls, ctx.device)
        study = owner.study(name, result, fingerprint, ctx.world_size) if owner else None
        # `trials` counts settings measured: a repeat (the sampler asked for a setting that
        # has an outcome) costs nothing and is not counted, up to a bound on asks in all.
        asks = 0
        while result.trials - result.repeats < plan.trials and asks < MAX_ASKS_PER_TRIAL * plan.trials:
            asks += 1
            if not _one_trial(ctx, plan, backend, inputs, study, result):
                break  # every setting of the space has an outcome
            if result.trials - result.repeats <= plan.trials and not result.last_was_repeat:
                advance(1, f"best {result.best_us:.1f} us" if result.best_us else "searching")
        advance(plan.trials - (result.trials - result.repeats), f"done, best {result.best_us or 0:.1f} us")
        if owner is not None:
            owner.finish(study, result, fingerprint, key)
    return result


def _one_trial(ctx, plan: KnobPlan, backend, inputs, study, result: KnobResult) -> bool:
    """Ask (rank 0), evaluate (every rank), tell (rank 0). False: the space is exhausted."""
    msg: list[Any] = [None]
    if study is not None:
        msg[0] = study.ask_for(type(backend).knob_space)
    dist.broadcast_object_list(msg, src=0, group=ctx.group)
    params, repeat = msg[0]
    if params is None:
        return False
    result.trials += 1
    result.last_was_repeat = repeat
    if repeat:
        result.repeats += 1
        return True
    error = ""
    try:
        backend.set_knobs(params)
    except Exception as exc:
        error = one_line(exc)
    if not all_ranks_ok(not error, ctx):
        return _tell(study, result, "fail", reason=error or "set_knobs failed on another rank")
    # gate, then a short first measurement: the trial's intermediate value, judged for pruning
    short = measure(ctx, backend, inputs, warmup=plan.warmup, iters=plan.probe_iters, split=False)
    if not short.ok:
        return _tell(study, result, "fail", reason=f"{short.kind}: {short.reason}")
    verdict: list[Any] = [study.report_and_judge(short.stats.median_us) if study is not None else None]
    dist.broadcast_object_list(verdict, src=0, group=ctx.group)
    if verdict[0]:
        return _tell(study, result, "pruned")
    full = time_agreed(ctx, backend, inputs, warmup=plan.warmup, iters=plan.iters, split=False)
    if not full.ok:
        return _tell(study, result, "fail", reason=f"{full.kind}: {full.reason}")
    _tell(study, result, "complete", value=summarize(short.device_us + full.device_us).median_us)
    return True


def _tell(study, result: KnobResult, state: str, *, value: float | None = None, reason: str = "") -> bool:
    result.pruned += state == "pruned"
    result.failed += state == "fail"
    if study is not None:
        study.tell(state, value, reason)
    return True


# ------------------------------------------------------------------------- the studies


def _first_settings(knob_space: dict[str, tuple], defaults: dict[str, Any], plan: KnobPlan) -> list[dict[str, Any]]:
    """The defaults always first (the gain is relative to them); a space the budget covers is
    then searched exhaustively in a seeded random order (the sampler would repeat settings)."""
    import itertools
    import random

    names = list(knob_space)
    grid = [dict(zip(names, values)) for values in itertools.product(*(knob_space[n] for n in names))]
    if len(grid) > plan.trials:
        return [defaults]
    random.Random(plan.seed).shuffle(grid)
    return [defaults] + [g for g in grid if g != defaults]


class _StudyOwner:
    """Rank 0's side: the Optuna storage and one study per token count, and our store, where
    each point's best setting is kept (Optuna samples; the store is what `select` reads)."""

    def __init__(self, url: str, plan: KnobPlan) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)  # the summary says what matters
        self.storage = optuna.storages.RDBStorage(url)
        self.url = url
        self.plan = plan

    def study(self, name: str, result: KnobResult, fingerprint: str, world: int) -> _Study:
        import optuna

        study = optuna.create_study(
            study_name=name,
            storage=self.storage,
            direction="minimize",
            sampler=optuna.samplers.TPESampler(seed=self.plan.seed),
            pruner=SlowerThanBestPruner(self.plan.prune_margin),
            load_if_exists=True,  # a rerun adds trials to the same study
        )
        defaults = result.default_knobs
        for setting in _first_settings(get_backend(self.plan.backend).knob_space, defaults, self.plan):
            if not any(t.params == setting for t in study.trials):
                study.enqueue_trial(setting)
        p = self.plan
        # for people reading the study (optuna-dashboard); a2a-tune reads the store's row
        for key, value in {
            "backend": p.backend,
            **p.shape.at(world, p.dtype, p.routing).at(result.tokens)._asdict(),
            "fingerprint": fingerprint,
            "timing": result.timing,
            "default_knobs": defaults,
            "capacity": p.tuned_capacity(),
            "knob_space": {k: list(v) for k, v in get_backend(p.backend).knob_space.items()},
        }.items():
            study.set_user_attr(key, value)
        return _Study(study, result)

    def finish(self, study: _Study, result: KnobResult, fingerprint: str, key: MeasurementKey) -> None:
        """Keep the point's best setting in the store (the default when nothing beat it)."""
        from a2a_tune.db import KnobsRecord, open_store

        s = study.study
        s.set_user_attr("default_us", result.default_us)
        s.set_user_attr("best_knobs", result.best_knobs)
        s.set_user_attr("best_us", result.best_us)
        if not result.best_knobs:
            return  # nothing completed: no setting to keep
        record = KnobsRecord(
            fingerprint,
            key,
            result.best_knobs,
            capacity=self.plan.tuned_capacity(),
            best_us=result.best_us,
            default=result.default_knobs,
            default_us=result.default_us,
            timing=result.timing or None,
            study=s.study_name,
        )
        with open_store(self.url) as store:
            store.put_knobs(record)


class _Study:
    """One study during the search: the trial being run, and the result it updates."""

    def __init__(self, study, result: KnobResult) -> None:
        self.study = study
        self.result = result
        self.trial = None
        self._refresh()

    def ask_for(self, knob_space: dict[str, tuple]) -> tuple[dict[str, Any], bool]:
        """(knobs of the next trial, whether that setting already has an outcome: reused);
        (None, True) once every setting of the space has one."""
        from optuna.distributions import CategoricalDistribution
        from optuna.trial import TrialState

        finished = {}
        for t in self.study.get_trials(deepcopy=False):
            if t.state.is_finished():
                finished.setdefault(tuple(sorted(t.params.items())), t)
        if len(finished) >= math.prod(len(v) for v in knob_space.values()):
            return None, True
        space = {k: CategoricalDistribution(list(v)) for k, v in knob_space.items()}
        self.trial = self.study.ask(space)
        params = dict(self.trial.params)
        earlier = finished.get(tuple(sorted(params.items())))
        if earlier is None:
            return params, False
        self.trial.set_user_attr("repeat_of", earlier.number)
        value = earlier.value if earlier.state == TrialState.COMPLETE else None  # pruned trials keep a value too
        self.study.tell(self.trial, value, state=earlier.state)
        return params, True

    def report_and_judge(self, short_us: float) -> bool:
        self.trial.report(short_us, step=0)
        return self.trial.should_prune()

    def tell(self, state: str, value: float | None, reason: str) -> None:
        from optuna.trial import TrialState

        if reason:
            self.trial.set_user_attr("failure", reason[:500])
        states = {"complete": TrialState.COMPLETE, "pruned": TrialState.PRUNED, "fail": TrialState.FAIL}
        self.study.tell(self.trial, value, state=states[state])
        self._refresh()

    def _refresh(self) -> None:
        """Default and best so far, from the whole study (earlier invocations too)."""
        from optuna.trial import TrialState

        done = self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        default = self.result.default_knobs
        at_default = [t.value for t in done if t.params == default]
        if at_default:
            self.result.default_us = min(at_default)
        if done:
            best = min(done, key=lambda t: t.value)
            self.result.best_knobs, self.result.best_us = dict(best.params), best.value


class SlowerThanBestPruner(BasePruner):
    """Prune a trial whose short first measurement is more than `margin` slower than the best
    completed trial: the full measurement could not make it the winner. Relative to the
    best, not a percentile of the others: a few trials per study are the norm here."""

    def __init__(self, margin: float = PRUNE_MARGIN) -> None:
        self.margin = margin

    def prune(self, study, trial) -> bool:
        step = trial.last_step
        if step is None:
            return False
        try:
            best = study.best_value
        except ValueError:  # nothing completed yet: nothing to compare with
            return False
        return trial.intermediate_values[step] > best * (1 + self.margin)
