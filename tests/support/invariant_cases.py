"""The invariant over a list of cases, one backend instance a case: what the gloo tests, the GPU
tests and the NVLink emulation run on every rank (`run_ranks(run_cases, W, device, cases)`).

Which backends get the CPU conformance cases is the registry's answer, not a list kept here:
every backend a2a_tune.kernels registers that can run on two CPU ranks (:func:`cpu_conformance`),
so a new backend gets them by being registered."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from a2a_tune.kernels import BackendEnv, MoEShape, ShapeError, get_backend, list_backends
from a2a_tune.kernels.reference import check_invariant, make_inputs

#: Where the CPU conformance cases run: two gloo ranks.
CPU_ENV = BackendEnv(world_size=2, device_type="cpu", dist_backend="gloo")


def cpu_conformance() -> dict[str, str | None]:
    """Every backend the package registers (a2a_tune.kernels.*, in registry order; not those
    tests or plugins add) -> None where it runs on two CPU ranks, else why not (its
    availability() reason)."""
    shipped = [n for n in list_backends() if get_backend(n).__module__.startswith("a2a_tune.kernels.")]
    return {n: None if (a := get_backend(n).availability(CPU_ENV)).ok else a.reason for n in shipped}


#: The backends the CPU conformance cases run on: every registered one that runs on CPU ranks.
REAL_BACKENDS = [n for n, why in cpu_conformance().items() if why is None]


@dataclass(frozen=True)
class Case:
    id: str
    backend: str
    tokens: tuple[int, ...]  # per rank
    experts: int = 16
    topk: int = 4
    hidden: int = 64
    dtype: str = "fp32"
    routing: str = "uniform"
    repeats: int = 1  # calls on one backend instance, fresh inputs each time
    scales: str = "index"  # "index": s[e] = e + 1; "random": a seeded random scale per expert
    capacity: int | None = None  # max_tokens_per_rank [default: the most tokens]
    step: int | None = None  # set_step_tokens: an engine's step max over ranks, below the capacity
    knobs: dict = field(default_factory=dict, hash=False)  # set_knobs


def cases_w2(backends: list[str] = REAL_BACKENDS) -> list[Case]:
    cases = []
    for b in backends:
        cases += [
            Case(f"{b}-uniform", b, (5, 7)),
            Case(f"{b}-bf16", b, (6, 3), dtype="bf16"),
            Case(f"{b}-fp16", b, (4, 4), dtype="fp16"),
            Case(f"{b}-zero-tokens-rank0", b, (0, 9)),
            Case(f"{b}-zero-tokens-all", b, (0, 0)),
            Case(f"{b}-skewed", b, (32, 17), experts=32, topk=6, routing="skewed"),
            Case(f"{b}-odd-hidden", b, (5, 6), hidden=33, dtype="bf16"),
            # quantized payloads as packed rows (values + scales), the NCCL baselines' too
            Case(f"{b}-nvfp4", b, (5, 3), hidden=64, dtype="nvfp4"),
            Case(f"{b}-mxfp8", b, (0, 4), hidden=96, dtype="mxfp8"),
            Case(f"{b}-fp8-odd-hidden", b, (3, 4), hidden=136, dtype="fp8_e4m3"),
            Case(f"{b}-all-local", b, (8, 8), routing="local"),
            Case(f"{b}-topk-equals-experts", b, (3, 2), experts=4, topk=4),
            Case(f"{b}-repeated-calls", b, (7, 5), repeats=4),
            Case(f"{b}-random-scales", b, (9, 9), scales="random"),
            # a workspace for an engine's largest batch, a smaller step (set_step_tokens)
            Case(f"{b}-step-below-capacity", b, (5, 3), capacity=32, step=6, repeats=2),
            Case(f"{b}-more-tokens-than-the-step", b, (5, 5), capacity=32, step=4),
        ]
    if backends is not REAL_BACKENDS:
        return cases
    cases += [
        Case("planted_off_by_one", "planted_off_by_one", (6, 6)),
        Case("planted_double_weights", "planted_double_weights", (6, 6)),
        Case("planted_crash", "planted_crash", (3, 3)),
    ]
    return cases


def _shape(case: Case) -> MoEShape:
    return MoEShape(case.experts, case.topk, case.hidden, case.capacity or max(max(case.tokens), 1), case.dtype)


def _not_built(exc: Exception) -> tuple[bool, float, str, bool]:
    return False, float("inf"), f"construction: {type(exc).__name__}: {exc}".splitlines()[0], True


def _scales(case: Case) -> torch.Tensor | None:
    if case.scales == "random":
        return torch.rand(case.experts, generator=torch.Generator().manual_seed(7)) * 4 - 2
    return None


def _summary(verdicts) -> tuple[bool, float, str, bool]:
    """The case's result: every call passed?, and the worst call's error, reason, crash."""
    worst = max(verdicts, key=lambda v: (not v.ok, v.max_rel_error))
    return all(v.ok for v in verdicts), worst.max_rel_error, worst.reason, worst.crashed


def _run(cases: list[Case], build, one_round, *, stop_at_failure: bool = False) -> dict:
    """The loop every runner shares: each case's backend built (a backend that cannot even be
    built fails its case, not the whole launch), `repeats` rounds on fresh inputs, closed."""
    results = {}
    for i, case in enumerate(cases):
        shape = _shape(case)
        try:
            built = build(case, shape)
            if case.knobs:
                built.set_knobs(case.knobs)
        except Exception as exc:  # noqa: BLE001
            results[case.id] = _not_built(exc)
            continue
        scales = _scales(case)
        verdicts = []
        try:
            for rep in range(case.repeats):
                verdicts.append(one_round(built, case, shape, 1000 * i + rep, scales))
                if stop_at_failure and not verdicts[-1].ok:
                    break
        except ShapeError as exc:  # the caller's mistake, raised before any collective (every rank)
            results[case.id] = (False, float("inf"), str(exc), True)
            continue
        finally:
            built.close()
        results[case.id] = _summary(verdicts)
    return results


def run_cases(ctx, cases: list[Case]) -> dict[str, tuple[bool, float, str, bool]]:
    """Each case on this rank of `ctx`'s process group (every rank runs it)."""

    def build(case: Case, shape: MoEShape):
        backend = get_backend(case.backend)(ctx.group, shape, ctx.device)
        backend.set_step_tokens(case.step)
        return backend

    def one_round(backend, case: Case, shape: MoEShape, seed: int, scales):
        inputs = make_inputs(
            shape,
            case.tokens[ctx.rank],
            rank=ctx.rank,
            world_size=ctx.world_size,
            routing=case.routing,
            seed=seed,
            device=ctx.device,
        )
        return check_invariant(backend, inputs, scales=scales)

    return _run(cases, build, one_round)


def run_cases_virtual(device, cases: list[Case]) -> dict[str, tuple[bool, float, str, bool]]:
    """`run_cases` on virtual ranks (a2a_tune.kernels.virtual): each case's W = len(tokens) ranks
    in this process on `device`, one VirtualRanks a case, the same inputs as W real ranks get."""
    from a2a_tune.kernels.virtual import VirtualWorld

    def build(case: Case, shape: MoEShape):
        return VirtualWorld(len(case.tokens), device).build(get_backend(case.backend), shape, step=case.step)

    def one_round(ranks, case: Case, shape: MoEShape, seed: int, scales):
        return ranks.check(ranks.inputs(case.tokens, routing=case.routing, seed=seed), scales=scales)

    # the instances' state is garbage after a failed round: stop there
    return _run(cases, build, one_round, stop_at_failure=True)


def with_planted_backends(fn, world: int, device: str, cases: list[Case]):
    """Rank 0's result of `fn(ctx, cases)` on `world` ranks, each rank loading the planted
    bugs (tests/support/planted_backends.py) as a plugin, the way out-of-tree backends load."""
    import pytest

    from a2a_tune.tuner.launch import run_ranks

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("A2A_TUNE_BACKEND_MODULES", "planted_backends")
        return run_ranks(fn, world, device, cases)[0]


def conformance_cases(cases: list[Case]) -> list[Case]:
    """The cases the invariant must hold on: not the planted bugs, not the refused step."""
    return [c for c in cases if not c.id.startswith("planted") and "than-the-step" not in c.id]
