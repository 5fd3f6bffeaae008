"""Triton kernels of `nvlink_one_sided`: senders write straight into peers' buffers.

Every rank owns one symmetric workspace (`workspace()`; shared machinery in
`_nvlink_common`). The kernels of one round trip, and what each waits for:

    dispatch_send   each token -> meta row to every rank, payload row to each rank owning
                    one of its experts (slot = the token's index on its source rank), and
                    -1 metadata into its empty slots; the last CTA to finish raises this
                    rank's dispatch flag on every peer, then waits for every source's flag:
                    when the kernel ends, the rows are there (virtual ranks in phase order:
                    FUSED_WAIT off, and dispatch_recv launches the wait on its own)
    dispatch_recv   no kernel: views of the received rows, their ids and weights
    combine_send    each received row with a local expert -> back into its source's
                    combine buffer (slot = the row's index; rows of our own tokens stay in
                    expert_out); the last CTA raises combine flags
    combine_recv    waits for every rank's combine flag, sums the returned rows of the
                    ranks each token went to (and our own from expert_out) in fp32; a rank
                    with no tokens still waits (one CTA), which keeps the ordering below

The kernels only copy and compare (no bf16 arithmetic), so they run under Triton's
interpreter too (TRITON_INTERPRET=1): the tests run the backends on CPU processes whose
workspaces are shared files (tests/support/emulate_nvlink.py).

Design notes: docs/architecture.md, "Module notes", `kernels/_one_sided_kernels.py`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._nvlink_common import (
    Geometry,
    RankState,
    Workspace,
    block_k,
    copy_scales,
    launch_combine_recv,
    launch_combine_send,
    launch_dispatch_send,
    launch_wait,
    put_row,
    signal_when_last,
    token_routing,
    wait_combine,
    wait_flags,
)
from .quant import scale_blocks


def workspace(g: Geometry) -> Workspace:
    """One rank's regions (cap: the capacity, S: scale blocks per row):

    x      [W, cap, H]   payload rows received from each source rank (bytes of `wire` when
                         quantized: the kernels copy, never convert; packed rows: their bytes)
    xs     [W, cap, S]   fp32 block scales of those rows (quantized payloads only)
    meta   [W, cap, 2k]  int32: topk ids (masked to this rank's experts) | weights bits
    count  [W]           int32: tokens the source sent in this round
    comb   [W, cap, H]   activation rows returned by each destination rank (combine)
    flags  [2, W]        int32 epochs: [0] dispatch flag per source, [1] combine flag per dest
    """
    w, cap, hidden = g.world, g.capacity, g.hidden
    regions = [("x", g.x_dtype, (w, cap, g.x_row))]
    if g.wire is not None:
        regions.append(("xs", torch.float32, (w, cap, scale_blocks(hidden))))
    regions += [
        ("meta", torch.int32, (w, cap, 2 * g.topk)),
        ("count", torch.int32, (w,)),
        ("comb", g.dtype, (w, cap, hidden)),
        ("flags", torch.int32, (2, w)),
    ]
    return Workspace(tuple(regions))


# ----------------------------------------------------------------------------- kernels


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
    count_ws,
    W: tl.constexpr,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
    N_HB: tl.constexpr,
    QUANT: tl.constexpr,
    BLOCK_S: tl.constexpr,
    FUSED_WAIT: tl.constexpr = True,  # False: virtual ranks in phase order (the sweep: True)
):
    t = tl.program_id(0)  # one slot of this rank's capacity: a token, or an empty slot to mark
    n_prog = tl.num_programs(0)
    epoch = tl.load(epoch_ptr) + 1  # every CTA reads before the last one stores it back
    ks = tl.arange(0, BLOCK_K)
    kmask = ks < K
    if t < n_tokens:
        ids, wbits = token_routing(ids_ptr, w_ptr, t, ks, K)
        owner = tl.where(ids >= 0, ids // experts_per_rank, -1)
        row = me * cap + t
        for d in tl.static_range(W):
            mine = (owner == d) & kmask
            meta = meta_ws + tl.load(d_i32 + d) + row * (2 * K)
            tl.store(meta + ks, tl.where(mine, ids, -1), mask=kmask)
            tl.store(meta + K + ks, wbits, mask=kmask)
            if tl.sum(mine.to(tl.int32), axis=0) > 0:
                put_row(x_ws, d_elem, d, row, x_ptr, t, hidden, BLOCK_H, N_HB)
                if QUANT:
                    copy_scales(xs_ws + tl.load(d_i32 + d) + row * n_scales, xs_ptr + t * n_scales, n_scales, BLOCK_S)
    else:  # an empty slot: every rank sees ids of -1 there, so its rows need no count to mask
        for d in tl.static_range(W):
            meta = meta_ws + tl.load(d_i32 + d) + (me * cap + t) * (2 * K)
            tl.store(meta + ks, tl.full([BLOCK_K], -1, tl.int32), mask=kmask)
            tl.store(meta + K + ks, tl.zeros([BLOCK_K], tl.int32), mask=kmask)
    if t == 0:
        for d in tl.static_range(W):
            tl.store(count_ws + tl.load(d_i32 + d) + me, n_tokens)
    last = signal_when_last(done_ptr, flags_ws, d_i32, me, epoch, n_prog, epoch_ptr, W, True)
    # The last CTA waits for every source's flag, so when this kernel ends the received rows
    # are there: no receive kernel. Only it spins, and only after the others finished.
    if FUSED_WAIT:
        if last:
            wait_flags(flags_ws, epoch, epoch_ptr + 1, W)


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
    count_ptr,
    W: tl.constexpr,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
    N_HB: tl.constexpr,
):
    r = tl.program_id(0)  # one received row: source s, slot i
    n_prog = tl.num_programs(0)
    s = r // cap
    i = r - s * cap
    ks = tl.arange(0, BLOCK_K)
    # Our own tokens' rows stay where they are: combine_recv reads them from expert_out.
    if (i < tl.load(count_ptr + s)) & (s != me):
        ids = tl.load(meta_ptr + r * (2 * K) + ks, mask=ks < K, other=-1)
        if tl.max(ids, axis=0) >= 0:  # the row had an expert here: its partial sum goes back
            put_row(comb_ws, d_elem, s, me * cap + i, out_ptr, r, hidden, BLOCK_H, N_HB)
    signal_when_last(done_ptr + 1, flags_ws + W, d_i32, me, tl.load(epoch_ptr), n_prog, epoch_ptr, W, False)


@triton.jit(do_not_specialize=["me", "cap"])
def _combine_recv_kernel(
    y_ptr,
    comb_ptr,
    ids_ptr,
    flags_ptr,
    epoch_ptr,
    hidden,  # launch_combine_recv's order
    out_ptr,
    me,
    cap,
    experts_per_rank,
    W: tl.constexpr,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    t, hb = wait_combine(flags_ptr, epoch_ptr, W)
    ks = tl.arange(0, BLOCK_K)
    ids = tl.load(ids_ptr + t * K + ks, mask=ks < K, other=-1).to(tl.int32)
    owner = tl.where(ids >= 0, ids // experts_per_rank, -1)
    hs = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hm = hs < hidden
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for d in tl.static_range(W):
        if tl.sum((owner == d).to(tl.int32), axis=0) > 0:
            if d == me:  # our own partial sum: still in expert_out, at this token's slot
                row = out_ptr + (me * cap + t).to(tl.int64) * hidden
            else:
                row = comb_ptr + (d * cap + t).to(tl.int64) * hidden
            acc += tl.load(row + hs, mask=hm, other=0.0).to(tl.float32)
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
    One CTA per slot of this step (empty slots get -1 metadata); returns once every source's
    rows arrived (in phase order: without waiting, see `dispatch_recv`)."""
    fused = {"FUSED_WAIT": False} if st.phased else {}  # the sweep launches it as before the switch
    launch_dispatch_send(
        _dispatch_send_kernel, st.slots, st, x, topk_ids, topk_weights, x_scale, count_ws=st.views["count"], **fused
    )


def dispatch_recv(st: RankState) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Views of what arrived (no kernel: dispatch_send waited): x [W*slots, H] (raw bytes when
    quantized: see `RankState.received_scales`), topk_ids int32 [W*slots, k] (-1 where the
    expert is elsewhere or the slot is empty), weights fp32 [W*slots, k]. In phase order it first
    launches the dispatch wait that dispatch_send did not do."""
    if st.phased:
        launch_wait(st, 0)
    g, rows = st.geometry, st.geometry.world * st.slots
    meta = st.views["meta"].view(-1, 2 * g.topk)[:rows]
    return st.views["x"].view(-1, g.x_row)[:rows], meta[:, : g.topk], meta[:, g.topk :].view(torch.float32)


def combine_send(st: RankState, expert_out: torch.Tensor) -> None:
    """Each received row with a local expert back into its source's combine slot."""
    launch_combine_send(
        _combine_send_kernel,
        st.geometry.world * st.slots,
        st,
        expert_out,
        count_ptr=st.views["count"],
        BLOCK_K=block_k(st.geometry.topk),
    )


def combine_recv(st: RankState, expert_out: torch.Tensor, topk_ids: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """y [T, H]: each token's returned rows summed in fp32, ours read from `expert_out`."""
    return launch_combine_recv(
        _combine_recv_kernel,
        st,
        y,
        topk_ids,
        out_ptr=expert_out,
        me=st.rank,
        cap=st.slots,
        experts_per_rank=st.geometry.experts_per_rank,
    )
