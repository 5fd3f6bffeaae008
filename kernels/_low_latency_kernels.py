"""Triton kernels of `nvlink_low_latency`: expert-major, fixed-capacity slots, one copy per expert.

Layout (DeepEP low-latency semantics): each rank receives into [local expert, source rank,
slot] with slot = the token's index on its source rank, so a grouped GEMM can run over
each local expert's W * cap rows directly; no counts, no compaction, no atomics. A slot is
valid in this round when its tag equals the round's epoch (stale slots keep old tags, so
nothing is cleared between rounds; this relies on the workspace starting zeroed, which
torch's symmetric-memory allocator does and the CPU emulation does with torch.zeros). Each token travels once per selected expert (k rows),
and each expert output travels back into the source's [slot, j] combine row, where the
source sums its k rows.

    dispatch_send   per token, per top-k slot j: payload row + (weight, epoch, j) into
                    rank(e)'s [e_local, me, t]; the last CTA raises dispatch flags
    dispatch_recv   waits for every source's flag; valid rows get ids [e, -1, ...] and
                    weights [w, 0, ...], stale rows all -1
    combine_send    each valid row -> the source's combine row [t, j]; last CTA raises flags
    combine_recv    waits for the combine flags; y[t] = sum over j of combine[t, j] (fp32)

Flag/epoch discipline and hazards are those of `_one_sided_kernels` (see `_nvlink_common`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._nvlink_common import (
    RankState,
    Workspace,
    block_k,
    combine_wait,
    copy_row,
    copy_scales,
    payload_args,
    row_blocks,
    signal_when_last,
    wait_flags,
)
from .quant import scale_blocks

META = 4  # int32 per slot: weight bits, epoch tag, j (top-k position at the source), unused


def workspace(
    world: int,
    cap: int,
    hidden: int,
    topk: int,
    local_experts: int,
    dtype: torch.dtype,
    wire: torch.dtype | None = None,
) -> Workspace:
    """x [E_local, W, cap, H] (bytes of `wire` when quantized) + xs [E_local, W, cap, S] fp32
    scales (quantized only), meta [E_local, W, cap, 4] int32, comb [cap, k, H], flags [2, W]."""
    regions = [("x", torch.uint8 if wire is not None else dtype, (local_experts, world, cap, hidden))]
    if wire is not None:
        regions.append(("xs", torch.float32, (local_experts, world, cap, scale_blocks(hidden))))
    regions += [
        ("meta", torch.int32, (local_experts, world, cap, META)),
        ("comb", dtype, (cap, topk, hidden)),
        ("flags", torch.int32, (2, world)),
    ]
    return Workspace(tuple(regions))


class Outputs:
    """Dispatch outputs reused every round (fixed addresses: graph-capturable)."""

    def __init__(self, rows: int, topk: int, device: torch.device | str):
        self.ids = torch.empty(rows, topk, dtype=torch.int64, device=device)
        self.weights = torch.empty(rows, topk, dtype=torch.float32, device=device)


@triton.jit
def _dispatch_send_kernel(
    x_ptr,
    xs_ptr,
    ids_ptr,
    w_ptr,
    n_tokens,
    x_ws,
    xs_ws,
    meta_ws,
    flags_ws,
    d_elem,
    d_i32,
    epoch_ptr,
    done_ptr,
    me,
    cap,
    hidden,
    n_scales,
    experts_per_rank,
    W: tl.constexpr,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
    N_HB: tl.constexpr,
    QUANT: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    t = tl.program_id(0)
    n_prog = tl.num_programs(0)
    epoch = tl.load(epoch_ptr) + 1
    ks = tl.arange(0, BLOCK_K)
    cs = tl.arange(0, 4)
    if t < n_tokens:
        ids = tl.load(ids_ptr + t * K + ks, mask=ks < K, other=-1).to(tl.int32)
        wbits = tl.load(w_ptr + t * K + ks, mask=ks < K, other=0.0).to(tl.int32, bitcast=True)
        for j in tl.static_range(K):
            e = tl.sum(tl.where(ks == j, ids, 0), axis=0)
            wj = tl.sum(tl.where(ks == j, wbits, 0), axis=0)
            if e >= 0:
                d = e // experts_per_rank
                slot = ((e - d * experts_per_rank) * W + me) * cap + t
                meta = meta_ws + tl.load(d_i32 + d) + slot * 4
                tl.store(meta + cs, tl.where(cs == 0, wj, tl.where(cs == 1, epoch, tl.where(cs == 2, j, 0))))
                dst = x_ws + tl.multiple_of(tl.load(d_elem + d), 16) + slot.to(tl.int64) * hidden
                copy_row(dst, x_ptr + t.to(tl.int64) * hidden, hidden, BLOCK_H, N_HB)
                if QUANT:
                    copy_scales(xs_ws + tl.load(d_i32 + d) + slot * n_scales, xs_ptr + t * n_scales, n_scales, BLOCK_S)
    signal_when_last(done_ptr, flags_ws, d_i32, me, epoch, n_prog, epoch_ptr, W, True)


@triton.jit
def _dispatch_recv_kernel(
    meta_ptr,
    flags_ptr,
    epoch_ptr,
    ids_out,
    w_out,
    n_rows,
    rows_per_expert,
    me,
    experts_per_rank,
    W: tl.constexpr,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    pid = tl.program_id(0)
    epoch = tl.load(epoch_ptr)
    wait_flags(flags_ptr, epoch, epoch_ptr + 1, W)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < n_rows
    tag = tl.load(meta_ptr + rows * 4 + 1, mask=rmask, other=-1)
    wbits = tl.load(meta_ptr + rows * 4, mask=rmask, other=0)
    valid = tag == epoch
    expert = me * experts_per_rank + rows // rows_per_expert
    ks = tl.arange(0, BLOCK_K)
    first = (ks == 0)[None, :]
    ids = tl.where(first & valid[:, None], expert[:, None], -1)
    wts = tl.where(first & valid[:, None], wbits.to(tl.float32, bitcast=True)[:, None], 0.0)
    m2 = rmask[:, None] & (ks < K)[None, :]
    tl.store(ids_out + rows[:, None] * K + ks[None, :], ids.to(tl.int64), mask=m2)
    tl.store(w_out + rows[:, None] * K + ks[None, :], wts, mask=m2)


@triton.jit
def _combine_send_kernel(
    out_ptr,
    meta_ptr,
    comb_ws,
    flags_ws,
    d_elem,
    d_i32,
    epoch_ptr,
    done_ptr,
    me,
    cap,
    hidden,
    W: tl.constexpr,
    K: tl.constexpr,
    BLOCK_H: tl.constexpr,
    N_HB: tl.constexpr,
):
    r = tl.program_id(0)  # one received slot: (local expert, source s, token slot t)
    n_prog = tl.num_programs(0)
    epoch = tl.load(epoch_ptr)
    if tl.load(meta_ptr + r * 4 + 1) == epoch:
        t = r % cap
        s = (r // cap) % W
        j = tl.load(meta_ptr + r * 4 + 2)
        dst = comb_ws + tl.multiple_of(tl.load(d_elem + s), 16) + (t * K + j).to(tl.int64) * hidden
        copy_row(dst, out_ptr + r.to(tl.int64) * hidden, hidden, BLOCK_H, N_HB)
    signal_when_last(done_ptr + 1, flags_ws + W, d_i32, me, epoch, n_prog, epoch_ptr, W, False)


@triton.jit
def _combine_recv_kernel(
    y_ptr,
    comb_ptr,
    ids_ptr,
    flags_ptr,
    epoch_ptr,
    hidden,
    W: tl.constexpr,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    t = tl.program_id(0)
    hb = tl.program_id(1)
    wait_flags(flags_ptr + W, tl.load(epoch_ptr), epoch_ptr + 1, W)
    ks = tl.arange(0, BLOCK_K)
    ids = tl.load(ids_ptr + t * K + ks, mask=ks < K, other=-1)
    hs = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hm = hs < hidden
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(K):
        if tl.sum(tl.where(ks == j, ids, 0), axis=0) >= 0:  # ids[j] (the other lanes add 0)
            acc += tl.load(comb_ptr + (t * K + j).to(tl.int64) * hidden + hs, mask=hm, other=0.0).to(tl.float32)
    tl.store(y_ptr + t.to(tl.int64) * hidden + hs, acc.to(y_ptr.dtype.element_ty), mask=hm)


# ------------------------------------------------------------------------ host wrappers


def _geometry(st: RankState) -> tuple[int, int, int, int, int, torch.dtype]:
    """(E_local, W, cap, H, k, activation dtype) from the workspace's own regions."""
    local_experts, w, cap, hidden = st.views["x"].shape
    return local_experts, w, cap, hidden, st.views["comb"].shape[1], st.views["comb"].dtype


def dispatch_send(
    st: RankState,
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    experts_per_rank: int,
    x_scale: torch.Tensor | None = None,
) -> None:
    """x: activations, or quantized rows (any 1-byte dtype) with their fp32 `x_scale` [T, S]."""
    _, w, cap, hidden, k, _ = _geometry(st)
    v = st.views
    t = x.shape[0]
    a = payload_args(st, x, x_scale)
    _dispatch_send_kernel[(max(t, 1),)](
        a["x"],
        a["xs"],
        topk_ids,
        topk_weights,
        t,
        v["x"],
        a["xs_ws"],
        v["meta"],
        v["flags"],
        a["d_x"],
        st.delta(4),
        st.epoch,
        st.done,
        st.rank,
        cap,
        hidden,
        a["n_scales"],
        experts_per_rank,
        W=w,
        K=k,
        BLOCK_K=block_k(k),
        **a["constexprs"],
        num_warps=st.launch.send_num_warps,
    )


def dispatch_recv(
    st: RankState, out: Outputs, experts_per_rank: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (x [E_local*W*cap, H] workspace view, ids int64 [rows, k], weights fp32 [rows, k])."""
    local_experts, w, cap, hidden, k, _ = _geometry(st)
    v = st.views
    rows = local_experts * w * cap
    block_r = st.launch.recv_block_rows
    _dispatch_recv_kernel[(triton.cdiv(rows, block_r),)](
        v["meta"],
        v["flags"],
        st.epoch,
        out.ids,
        out.weights,
        rows,
        w * cap,
        st.rank,
        experts_per_rank,
        W=w,
        K=k,
        BLOCK_K=block_k(k),
        BLOCK_R=block_r,
        num_warps=st.launch.recv_num_warps,
    )
    return v["x"].view(rows, hidden), out.ids, out.weights


def combine_send(st: RankState, expert_out: torch.Tensor) -> None:
    local_experts, w, cap, hidden, k, dtype = _geometry(st)
    v = st.views
    _combine_send_kernel[(local_experts * w * cap,)](
        expert_out,
        v["meta"],
        v["comb"],
        v["flags"],
        st.delta(dtype.itemsize),
        st.delta(4),
        st.epoch,
        st.done,
        st.rank,
        cap,
        hidden,
        W=w,
        K=k,
        **row_blocks(hidden, dtype.itemsize, st.launch.row_block_bytes),
        num_warps=st.launch.send_num_warps,
    )


def combine_recv(st: RankState, topk_ids: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    _, w, _, hidden, k, _ = _geometry(st)
    t = topk_ids.shape[0]
    if t == 0:
        combine_wait(st)
        return y
    block_h = min(triton.next_power_of_2(hidden), st.launch.recv_block_h)
    _combine_recv_kernel[(t, triton.cdiv(hidden, block_h))](
        y,
        st.views["comb"],
        topk_ids,
        st.views["flags"],
        st.epoch,
        hidden,
        W=w,
        K=k,
        BLOCK_K=block_k(k),
        BLOCK_H=block_h,
        num_warps=st.launch.recv_num_warps,
    )
    return y
