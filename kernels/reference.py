"""Reference semantics in plain torch (runs on CPU): inputs, expert compute, the invariant check.

The test function is f(e, v) = s[e] * v with one scale per expert (default s[e] = e + 1),
so a row delivered to the wrong expert, a token summed into the wrong place, or a weight
applied twice all change the result; the check needs no communication beyond one flag,
because the expected y of a token depends only on that token's own inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from a2a_tune.tuner.runtime.text import one_line

from .base import All2AllBackend, Dispatched, MoEShape, torch_dtype
from .errors import ShapeError
from .quant import dequantize

ROUTINGS = ("uniform", "skewed", "local")

# Per-token relative error allowed: expert outputs are rounded to the payload dtype once and
# summed over up to top-k contributions (bf16 has an 8-bit significand: 2^-8 ~ 0.4% per rounding).
# Quantized payloads add the dequantized row's error (the oracle dequantizes what arrived):
# * fp8_e4m3, mxfp8: e4m3 keeps 3 significand bits, half a step is <= 2^-4 of a value in its
#   normal range; the scales put each block's amax at the top of that range (E8M0: within a
#   factor 2), so the few values below it add < 2^-10 of the amax each.
# * nvfp4: e2m1 keeps 1 significand bit: half a step is <= 1/4 of a value >= 1 unit (the block
#   scale), and <= 1/4 unit below. A block's amax is ~6 units (the e4m3 scale rounds by <= 2^-4),
#   so its squared norm is >= ~32 units^2 and the error's <= 1/16 (norm^2 + 16 units^2): the
#   relative error is <= 1/4 x sqrt(1 + 16/32) ~ 0.31.
TOLERANCE = {"fp32": 1e-5, "fp16": 4e-3, "bf16": 2.5e-2, "fp8_e4m3": 6e-2, "mxfp8": 6.5e-2, "nvfp4": 0.31}

_SKEW_EXPONENT = 1.2  # Zipf exponent of expert popularity for "skewed" routing


def expert_scales(num_experts: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """s[e] = e + 1: the default test function's per-expert scale, fp32 [E]."""
    return torch.arange(1, num_experts + 1, dtype=torch.float32, device=device)


@dataclass
class RankInputs:
    x: torch.Tensor  # [T, H] payload dtype
    topk_ids: torch.Tensor  # [T, k] int32: the dtype engines' routers hand to the all2all
    topk_weights: torch.Tensor  # [T, k] fp32


def make_inputs(
    shape: MoEShape,
    tokens: int,
    *,
    rank: int,
    world_size: int,
    routing: str = "uniform",
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> RankInputs:
    """Random inputs of one rank; distinct experts per row; reproducible from (seed, rank).

    routing: "uniform" (every expert equally likely), "skewed" (Zipf popularity over a
    seed-fixed permutation of experts, the same on every rank), "local" (only this rank's
    own experts: nothing needs to leave the rank).
    """
    e, k, h = shape.num_experts, shape.topk, shape.hidden
    gen = torch.Generator(device="cpu").manual_seed(seed * 100_003 + rank)
    if routing == "uniform":
        scores = torch.rand(tokens, e, generator=gen)
    elif routing == "skewed":
        perm = torch.randperm(e, generator=torch.Generator().manual_seed(seed))
        logp = -_SKEW_EXPONENT * torch.log(torch.arange(1, e + 1, dtype=torch.float32))[perm]
        gumbel = -torch.log(-torch.log(torch.rand(tokens, e, generator=gen).clamp_min(1e-20)))
        scores = logp + gumbel  # Gumbel-top-k: k distinct experts drawn by popularity
    elif routing == "local":
        per_rank = e // world_size
        if k > per_rank:
            raise ShapeError(f"'local' routing needs topk {k} <= experts per rank {per_rank}")
        scores = torch.full((tokens, e), -1.0)
        scores[:, rank * per_rank : (rank + 1) * per_rank] = torch.rand(tokens, per_rank, generator=gen)
    else:
        raise ShapeError(f"unknown routing {routing!r}; choose one of {', '.join(ROUTINGS)}")
    ids = (scores.topk(k, dim=1).indices if tokens else torch.empty(0, k, dtype=torch.int64)).to(torch.int32)
    weights = torch.softmax(torch.randn(tokens, k, generator=gen), dim=1)
    x = torch.randn(tokens, h, generator=gen).to(torch_dtype(shape.dtype))
    return RankInputs(x.to(device), ids.to(device), weights.to(device))


def expert_compute(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    scales: torch.Tensor,
    x_scale: torch.Tensor | None = None,
    payload: str = "fp8_e4m3",
) -> torch.Tensor:
    """out[n] = sum_{j: ids[n,j] >= 0} w[n,j] * s[ids[n,j]] * x[n], computed in fp32, cast to the
    activation dtype (bf16 for quantized rows, which are dequantized with `x_scale` first as
    `payload`, the quantized payload's name)."""
    valid = topk_ids >= 0
    coef = torch.where(valid, topk_weights * scales[topk_ids.clamp_min(0)], torch.zeros_like(topk_weights))
    if x_scale is not None:
        return (coef.sum(dim=1, keepdim=True) * dequantize(payload, x, x_scale)).to(torch.bfloat16)
    return (coef.sum(dim=1, keepdim=True) * x.float()).to(x.dtype)


def expected_output(inputs: RankInputs, scales: torch.Tensor) -> torch.Tensor:
    """y[t] = sum_j w[t,j] * s[ids[t,j]] * x[t], fp32 [T, H]: what combine must return."""
    coef = (inputs.topk_weights * scales[inputs.topk_ids]).sum(dim=1, keepdim=True)
    return coef * inputs.x.float()


WROTE_INPUTS = "wrote into its inputs"


def snapshot(inputs: RankInputs) -> RankInputs:
    """A copy of `inputs` taken before dispatch: the gate judges a backend against it, never
    against what the backend left in the caller's tensors (one that zeroes the weights and
    returns zeros would otherwise judge itself right)."""
    return RankInputs(inputs.x.clone(), inputs.topk_ids.clone(), inputs.topk_weights.clone())


def input_writes(inputs: RankInputs, original: RankInputs) -> str:
    """ "wrote into its inputs (x, ...)" when `inputs` no longer equal `original`, their copy
    taken before dispatch (`snapshot`), or "": the caller's inputs are read-only to a backend."""
    changed = [
        n for n in ("x", "topk_ids", "topk_weights") if not torch.equal(getattr(inputs, n), getattr(original, n))
    ]
    return f"{WROTE_INPUTS} ({', '.join(changed)})" if changed else ""


@dataclass
class CheckResult:
    ok: bool
    max_rel_error: float  # worst per-token relative error over all ranks
    reason: str = ""  # one line when not ok (the first problem seen on this rank, or "failed on rank r")
    crashed: bool = False  # the backend raised (rather than returning wrong values)


def check_invariant(
    backend: All2AllBackend, inputs: RankInputs, *, scales: torch.Tensor | None = None, tolerance: float | None = None
) -> CheckResult:
    """Run dispatch -> reference expert compute -> combine on every rank and check the invariant.

    Collective: every rank of the backend's group must call it. All ranks return the same
    verdict (any rank's failure fails all), so the sweep can decide together. The expected
    output comes from a copy of the inputs taken before dispatch; a backend that changed them
    fails with WROTE_INPUTS, whatever it returned.
    """
    shape = backend.shape
    scales = expert_scales(shape.num_experts, backend.device) if scales is None else scales.to(backend.device)
    tol = TOLERANCE[shape.dtype] if tolerance is None else tolerance
    err, crashed = float("inf"), False
    original = snapshot(inputs)
    try:
        d = backend.dispatch(inputs.x, inputs.topk_ids, inputs.topk_weights)
        reason = dispatch_problem(backend, d)
        if not reason:
            y = backend.combine(expert_outputs(backend, d, scales), d)
            err, reason = combine_error(y, original, scales, tol)
    except ShapeError:
        raise
    except Exception as exc:  # a crashing backend is a failed check, reported in one line
        reason, crashed = one_line(exc), True
    if wrote := input_writes(inputs, original):
        reason, crashed = wrote, False
    return _agree(backend, CheckResult(not reason, err, reason, crashed))


def dispatch_problem(backend: All2AllBackend, d: Dispatched) -> str:
    """Why what `dispatch` returned breaks the contract before any expert runs, or ""."""
    ids = d.topk_ids
    lo, hi = backend.local_expert_range()
    if ids.shape[0] != d.x.shape[0] or d.topk_weights.shape != ids.shape:
        return f"dispatch returned {d.x.shape[0]} rows but ids {list(ids.shape)}, weights {list(d.topk_weights.shape)}"
    if bool(((ids != -1) & ((ids < lo) | (ids >= hi))).any()):
        return f"dispatch returned expert ids outside this rank's [{lo}, {hi}) that are not -1"
    return ""


def expert_outputs(backend: All2AllBackend, d: Dispatched, scales: torch.Tensor) -> torch.Tensor:
    """The reference expert compute on what `d` holds, in the backend's combine buffer when it
    has one (the zero-copy path is the one timed: check it)."""
    out = expert_compute(d.x, d.topk_ids, d.topk_weights, scales, d.x_scale, backend.shape.dtype)
    buffer = backend.combine_buffer(d)
    return out if buffer is None else buffer.copy_(out)


def combine_error(y: torch.Tensor, inputs: RankInputs, scales: torch.Tensor, tol: float) -> tuple[float, str]:
    """(worst per-token relative error, why y breaks the invariant or "") for combine's `y`."""
    ref = expected_output(inputs, scales)
    if tuple(y.shape) != tuple(ref.shape):
        return float("inf"), f"combine returned {list(y.shape)}, expected {list(ref.shape)}"
    if y.numel() == 0:
        return 0.0, ""
    yf = y.float()
    if not bool(torch.isfinite(yf).all()):
        return float("inf"), "combine returned non-finite values"
    per_token = _per_token_error(yf, ref)
    err = float(per_token.max())
    if err > tol:
        return err, f"token {int(per_token.argmax())}: relative error {err:.3g} > tolerance {tol:g}"
    return err, ""


def _per_token_error(y: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    return (y.float() - ref).norm(dim=1) / ref.norm(dim=1).clamp_min(1e-30)


def relative_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    """The worst per-token relative error of y [T, H] against the expected fp32 ref (T > 0)."""
    return float(_per_token_error(y, ref).max())


def _agree(backend: All2AllBackend, mine: CheckResult) -> CheckResult:
    """All ranks adopt the worst verdict: (failed?, max error) reduced with MAX."""
    flags = [0.0 if mine.ok else 1.0, mine.max_rel_error, 1.0 if mine.crashed else 0.0]
    t = torch.tensor(flags, dtype=torch.float64, device=backend.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=backend.group)  # inf survives MAX
    any_failed, worst, any_crashed = bool(t[0].item()), float(t[1].item()), bool(t[2].item())
    if not any_failed:
        return CheckResult(True, worst)
    if mine.ok:
        return CheckResult(False, worst, "failed on another rank", any_crashed)
    return CheckResult(False, worst, f"rank {backend.rank}: {mine.reason}", any_crashed)


def graph_replay_error(backend: All2AllBackend, tokens: int, replays: int) -> float:
    """Capture dispatch -> expert compute -> combine once in a CUDA graph, replay it `replays`
    times with fresh inputs copied into the captured ones (no host barrier in between: device
    state must order the rounds), and return the worst per-token relative error.

    Collective (every rank calls it); CUDA only; graph-capturable backends only."""
    shape, rank, world = backend.shape, backend.rank, backend.world_size
    scales = expert_scales(shape.num_experts, backend.device)
    static = make_inputs(shape, tokens, rank=rank, world_size=world, seed=0, device=backend.device)

    def step() -> torch.Tensor:
        d = backend.dispatch(static.x, static.topk_ids, static.topk_weights)
        return backend.combine(expert_compute(d.x, d.topk_ids, d.topk_weights, scales), d)

    graph, y = capture_graph(step)
    worst = 0.0
    for rep in range(replays):
        fresh = make_inputs(shape, tokens, rank=rank, world_size=world, seed=100 + rep, device=backend.device)
        refill(static, fresh)
        graph.replay()
        ref = expected_output(fresh, scales)
        worst = max(worst, relative_error(y, ref))
    torch.cuda.synchronize()
    return worst


def capture_graph(step, warmup=None):
    """Run `warmup` (default: `step`) once on a side stream (allocations, compilation), then
    capture `step()` in a CUDA graph: (the graph, what `step` returned under capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        (warmup or step)()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    return graph, out


def refill(static: RankInputs, fresh: RankInputs) -> None:
    """Copy `fresh` inputs into the captured `static` ones (same shapes): a replay's new round."""
    static.x.copy_(fresh.x)
    static.topk_ids.copy_(fresh.topk_ids)
    static.topk_weights.copy_(fresh.topk_weights)
