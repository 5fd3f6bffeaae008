"""Triton kernels of `nvlink_low_latency`: expert-major, fixed-capacity slots, one copy per expert.

Layout (DeepEP low-latency semantics): each rank receives into [local expert, source rank,
slot] with slot = the token's index on its source rank, so a grouped GEMM can run over
each local expert's W * cap rows directly; no counts, no compaction, no atomics. A slot is
valid in this round when its tag equals the round's epoch (stale slots keep old tags, so
nothing is cleared between rounds; this relies on the workspace starting zeroed, which
torch's symmetric-memory allocator does, and the CPU emulation's new files). Each token
travels once per selected expert (k rows), and each expert output travels back into the
source's [slot, j] combine row, where the source sums its k rows.

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
    Geometry,
    RankState,
    Workspace,
    copy_scales,
    launch_combine_recv,
    launch_combine_send,
    launch_dispatch_send,
    put_row,
    recv_launch,
    signal_when_last,
    token_routing,
    wait_combine,
    wait_flags,
)
from .quant import scale_blocks

META = 4  # int32 per slot: weight bits, epoch tag, j (top-k position at the source), unused


def workspace(g: Geometry) -> Workspace:
    """x [E_local, W, cap, H] (bytes of the wire dtype when quantized) + xs [E_local, W, cap, S]
    fp32 scales (quantized only), meta [E_local, W, cap, 4] int32, comb [cap, k, H], flags [2, W];
    local: the ids int64 and weights fp32 [E_local * W * cap, k] dispatch_recv writes."""
    e, w, cap, hidden = g.experts_per_rank, g.world, g.capacity, g.hidden
    regions = [("x", g.x_dtype, (e, w, cap, g.x_row))]
    if g.wire is not None:
        regions.append(("xs", torch.float32, (e, w, cap, scale_blocks(hidden))))
    regions += [
        ("meta", torch.int32, (e, w, cap, META)),
        ("comb", g.dtype, (cap, g.topk, hidden)),
        ("flags", torch.int32, (2, w)),
    ]
    local = (("ids_out", torch.int64, (e * w * cap, g.topk)), ("w_out", torch.float32, (e * w * cap, g.topk)))
    return Workspace(tuple(regions), local)


@triton.jit(do_not_specialize=["n_tokens", "me", "cap"])
def _dispatch_send_kernel(
    x_ptr,
    xs_ptr,
    ids_ptr,
    w_ptr,
    n_tokens,
    x_ws,
    xs_ws,
    meta_ws,  # launch_dispatch_send's order
    flags_ws,
    d_elem,
    d_i32,
    epoch_ptr,
    done_ptr,
    me,
    cap,
    hidden,  # _peer_args
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
        ids, wbits = token_routing(ids_ptr, w_ptr, t, ks, K)
        for j in tl.static_range(K):
            e = tl.sum(tl.where(ks == j, ids, 0), axis=0)
            wj = tl.sum(tl.where(ks == j, wbits, 0), axis=0)
            if e >= 0:
                d = e // experts_per_rank
                slot = ((e - d * experts_per_rank) * W + me) * cap + t
                meta = meta_ws + tl.load(d_i32 + d) + slot * 4
                tl.store(meta + cs, tl.where(cs == 0, wj, tl.where(cs == 1, epoch, tl.where(cs == 2, j, 0))))
                put_row(x_ws, d_elem, d, slot, x_ptr, t, hidden, BLOCK_H, N_HB)
                if QUANT:
                    copy_scales(xs_ws + tl.load(d_i32 + d) + slot * n_scales, xs_ptr + t * n_scales, n_scales, BLOCK_S)
    signal_when_last(done_ptr, flags_ws, d_i32, me, epoch, n_prog, epoch_ptr, W, True)


@triton.jit(do_not_specialize=["me"])
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


@triton.jit(do_not_specialize=["me", "cap"])
def _combine_send_kernel(
    out_ptr,
    meta_ptr,
    comb_ws,  # launch_combine_send's order
    flags_ws,
    d_elem,
    d_i32,
    epoch_ptr,
    done_ptr,
    me,
    cap,
    hidden,  # _peer_args
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
        put_row(comb_ws, d_elem, s, t * K + j, out_ptr, r, hidden, BLOCK_H, N_HB)
    signal_when_last(done_ptr + 1, flags_ws + W, d_i32, me, epoch, n_prog, epoch_ptr, W, False)


@triton.jit
def _combine_recv_kernel(
    y_ptr,
    comb_ptr,
    ids_ptr,
    flags_ptr,
    epoch_ptr,
    hidden,  # launch_combine_recv's order
    W: tl.constexpr,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    t, hb = wait_combine(flags_ptr, epoch_ptr, W)
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


def dispatch_send(
    st: RankState,
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    x_scale: torch.Tensor | None = None,
) -> None:
    """x: activations, or quantized rows (any 1-byte dtype) with their fp32 `x_scale` [T, S].
    One CTA per token (one for none: it still raises the flags); returns without waiting."""
    launch_dispatch_send(_dispatch_send_kernel, max(x.shape[0], 1), st, x, topk_ids, topk_weights, x_scale)


def dispatch_recv(st: RankState) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Waits for every source's rows, then -> (x [E_local*W*cap, H] workspace view, ids int64
    [rows, k], weights fp32 [rows, k]: the local outputs, rewritten every round)."""
    g, v = st.geometry, st.views
    rows = g.experts_per_rank * g.world * g.capacity
    block_r = st.launch.recv_block_rows
    _dispatch_recv_kernel[(triton.cdiv(rows, block_r),)](
        v["meta"],
        v["flags"],
        st.epoch,
        v["ids_out"],
        v["w_out"],
        rows,
        g.world * g.capacity,
        st.rank,
        g.experts_per_rank,
        BLOCK_R=block_r,
        **recv_launch(st),
    )
    return v["x"].view(rows, g.x_row), v["ids_out"], v["w_out"]


def combine_send(st: RankState, expert_out: torch.Tensor) -> None:
    """Each valid slot's row back into its source's [token, j] combine row."""
    g = st.geometry
    launch_combine_send(_combine_send_kernel, g.experts_per_rank * g.world * g.capacity, st, expert_out)


def combine_recv(st: RankState, expert_out: torch.Tensor, topk_ids: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """y [T, H]: each token's k returned rows summed in fp32 (all of them came back through
    the combine region, ours too: `expert_out` is not read)."""
    return launch_combine_recv(_combine_recv_kernel, st, y, topk_ids)
