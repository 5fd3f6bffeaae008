"""Triton kernels of `nvlink_one_sided`: senders write straight into peers' buffers.

Every rank owns one symmetric workspace (`workspace()`; shared machinery in
`_nvlink_common`). The kernels of one round trip, and what each waits for:

    dispatch_send   each token -> meta row to every rank, payload row to each rank owning
                    one of its experts (slot = the token's index on its source rank), and
                    -1 metadata into its empty slots; the last CTA to finish raises this
                    rank's dispatch flag on every peer, then waits for every source's flag:
                    when the kernel ends, the rows are there
    dispatch_recv   no kernel: views of the received rows, their ids and weights
    combine_send    each received row with a local expert -> back into its source's
                    combine buffer (slot = the row's index; rows of our own tokens stay in
                    expert_out); the last CTA raises combine flags
    combine_recv    waits for every rank's combine flag, sums the returned rows of the
                    ranks each token went to (and our own from expert_out) in fp32; a rank
                    with no tokens still waits (one CTA), which keeps the ordering below

Flags carry an epoch held on the device (incremented by dispatch_send), so calls need no
host synchronisation and a captured CUDA graph replays correctly. Two hazards are ordered
by the flags themselves: a peer's next dispatch_send can only start after its
combine_recv saw our combine flag (raised after our expert compute read the dispatch
buffer), and a peer's combine_send only after its dispatch_send saw our dispatch flag
(raised after our previous combine_recv read the combine buffer).

The kernels only copy and compare (no bf16 arithmetic), so they run under Triton's
interpreter too (TRITON_INTERPRET=1): tests emulate all ranks in one CPU process.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._nvlink_common import (  # noqa: F401  (dispatch_wait: the emulated ranks' separate wait)
    RankState,
    Workspace,
    block_k,
    combine_wait,
    copy_row,
    copy_scales,
    dispatch_wait,
    payload_args,
    row_blocks,
    signal_when_last,
    wait_flags,
)
from .quant import scale_blocks


def workspace(
    world: int, cap: int, hidden: int, topk: int, dtype: torch.dtype, wire: torch.dtype | None = None
) -> Workspace:
    """One rank's regions:

    x      [W, cap, H]   payload rows received from each source rank (bytes of `wire` when
                         quantized: the kernels copy, never convert)
    xs     [W, cap, S]   fp32 block scales of those rows (quantized payloads only)
    meta   [W, cap, 2k]  int32: topk ids (masked to this rank's experts) | weights bits
    count  [W]           int32: tokens the source sent in this round
    comb   [W, cap, H]   activation rows returned by each destination rank (combine)
    flags  [2, W]        int32 epochs: [0] dispatch flag per source, [1] combine flag per dest
    """
    regions = [("x", torch.uint8 if wire is not None else dtype, (world, cap, hidden))]
    if wire is not None:
        regions.append(("xs", torch.float32, (world, cap, scale_blocks(hidden))))
    regions += [
        ("meta", torch.int32, (world, cap, 2 * topk)),
        ("count", torch.int32, (world,)),
        ("comb", dtype, (world, cap, hidden)),
        ("flags", torch.int32, (2, world)),
    ]
    return Workspace(tuple(regions))


# ----------------------------------------------------------------------------- kernels


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
    count_ws,
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
    FUSED_WAIT: tl.constexpr,
):
    t = tl.program_id(0)  # one slot of this rank's capacity: a token, or an empty slot to mark
    n_prog = tl.num_programs(0)
    epoch = tl.load(epoch_ptr) + 1  # every CTA reads before the last one stores it back
    ks = tl.arange(0, BLOCK_K)
    kmask = ks < K
    if t < n_tokens:
        ids = tl.load(ids_ptr + t * K + ks, mask=kmask, other=-1).to(tl.int32)
        wbits = tl.load(w_ptr + t * K + ks, mask=kmask, other=0.0).to(tl.int32, bitcast=True)
        owner = tl.where(ids >= 0, ids // experts_per_rank, -1)
        row = me * cap + t
        for d in tl.static_range(W):
            mine = (owner == d) & kmask
            meta = meta_ws + tl.load(d_i32 + d) + row * (2 * K)
            tl.store(meta + ks, tl.where(mine, ids, -1), mask=kmask)
            tl.store(meta + K + ks, wbits, mask=kmask)
            if tl.sum(mine.to(tl.int32), axis=0) > 0:
                # workspaces are 256-byte aligned on every rank: the offset keeps 16-byte vectors
                dst = x_ws + tl.multiple_of(tl.load(d_elem + d), 16) + row.to(tl.int64) * hidden
                copy_row(dst, x_ptr + t.to(tl.int64) * hidden, hidden, BLOCK_H, N_HB)
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
    if FUSED_WAIT:
        # The last CTA waits for every source's flag, so when this kernel ends the received
        # rows are there: no receive kernel. Only it spins, and only after the others finished.
        if last:
            wait_flags(flags_ws, epoch, epoch_ptr + 1, W)


@triton.jit
def _combine_send_kernel(
    out_ptr,
    meta_ptr,
    count_ptr,
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
            dst = comb_ws + tl.multiple_of(tl.load(d_elem + s), 16) + (me * cap + i).to(tl.int64) * hidden
            copy_row(dst, out_ptr + r.to(tl.int64) * hidden, hidden, BLOCK_H, N_HB)
    signal_when_last(done_ptr + 1, flags_ws + W, d_i32, me, tl.load(epoch_ptr), n_prog, epoch_ptr, W, False)


@triton.jit
def _combine_recv_kernel(
    y_ptr,
    comb_ptr,
    out_ptr,
    ids_ptr,
    flags_ptr,
    epoch_ptr,
    n_tokens,
    me,
    cap,
    hidden,
    experts_per_rank,
    W: tl.constexpr,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    t = tl.program_id(0)
    hb = tl.program_id(1)
    wait_flags(flags_ptr + W, tl.load(epoch_ptr), epoch_ptr + 1, W)
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


def _geometry(st: RankState) -> tuple[int, int, int, int, torch.dtype]:
    """(W, slots per source this step, H, k, activation dtype) from the workspace's regions.

    The slots are `st.rows` when the backend was told the step's size (`set_step_tokens`),
    else the capacity: rows are addressed source * slots + index, so a smaller step packs
    into the regions' start and every kernel's grid scales with it, not with the capacity."""
    w, cap, hidden = st.views["x"].shape
    return w, st.rows or cap, hidden, st.views["meta"].shape[2] // 2, st.views["comb"].dtype


def dispatch_send(
    st: RankState,
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    experts_per_rank: int,
    x_scale: torch.Tensor | None = None,
    wait: bool = True,
) -> None:
    """x: activations, or quantized rows (any 1-byte dtype) with their fp32 `x_scale` [T, S].

    With `wait` the kernel returns only once every source's rows arrived (the GPU path);
    without, `dispatch_wait` does that separately (one process emulating every rank)."""
    w, cap, hidden, k, _ = _geometry(st)
    v = st.views
    a = payload_args(st, x, x_scale)
    _dispatch_send_kernel[(cap,)](
        a["x"],
        a["xs"],
        topk_ids,
        topk_weights,
        x.shape[0],
        v["x"],
        a["xs_ws"],
        v["meta"],
        v["count"],
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
        FUSED_WAIT=wait,
        **a["constexprs"],
        num_warps=st.launch.send_num_warps,
    )


def dispatch_recv(st: RankState) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Views of what arrived (no kernel: dispatch_send waited): x [W*cap, H] (raw bytes when
    quantized: see `RankState.received_scales`), topk_ids int32 [W*cap, k] (-1 where the
    expert is elsewhere or the slot is empty), weights fp32 [W*cap, k]."""
    w, cap, hidden, k, _ = _geometry(st)
    meta = st.views["meta"].view(-1, 2 * k)[: w * cap]
    return st.views["x"].view(-1, hidden)[: w * cap], meta[:, :k], meta[:, k:].view(torch.float32)


def combine_send(st: RankState, expert_out: torch.Tensor) -> None:
    w, cap, hidden, k, dtype = _geometry(st)
    v = st.views
    _combine_send_kernel[(w * cap,)](
        expert_out,
        v["meta"],
        v["count"],
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
        BLOCK_K=block_k(k),
        **row_blocks(hidden, dtype.itemsize, st.launch.row_block_bytes),
        num_warps=st.launch.send_num_warps,
    )


def combine_recv(
    st: RankState, expert_out: torch.Tensor, topk_ids: torch.Tensor, experts_per_rank: int, y: torch.Tensor
) -> torch.Tensor:
    w, cap, hidden, k, _ = _geometry(st)
    v = st.views
    t = topk_ids.shape[0]
    if t == 0:
        combine_wait(st)
        return y
    block_h = min(triton.next_power_of_2(hidden), st.launch.recv_block_h)
    _combine_recv_kernel[(t, triton.cdiv(hidden, block_h))](
        y,
        v["comb"],
        expert_out,
        topk_ids,
        v["flags"],
        st.epoch,
        t,
        st.rank,
        cap,
        hidden,
        experts_per_rank,
        W=w,
        K=k,
        BLOCK_K=block_k(k),
        BLOCK_H=block_h,
        num_warps=st.launch.recv_num_warps,
    )
    return y
