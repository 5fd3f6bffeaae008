"""What the symmetric-memory backends share: the geometry and workspace layout, per-rank state,
the Triton helpers for flag signalling and row copies, and the host launchers their kernels'
common parameters go through.

A workspace is one symmetric allocation per rank (identical layout on every rank); a rank
reaches a peer's copy of a region through the local region's address plus the distance
between the two workspaces (`RankState.delta()`), so kernels take typed pointers to their
own regions and stay vectorised (workspaces are 256-byte aligned relative to each other).

Flags carry an epoch held on the device, so no host synchronisation is needed and captured
CUDA graphs replay correctly; a receiver gives up after `SPIN_LIMIT` polls and sets the
rank's error word instead of hanging the GPU when a peer died.

Kernels take token counts, the rank and the step's slots as plain runtime integers
(`do_not_specialize`): a rank meeting a new count compiles nothing while its peers spin
(Triton would otherwise compile a variant per divisibility of each count).

Virtual ranks (`a2a_tune.kernels.virtual`: W ranks of one process on one device) run in phase
order on one stream: every rank's send, then every rank's wait. `RankState.phased` tells the
kernel modules so: no send may wait for a peer then (the one-sided dispatch's fused wait
becomes a launch of its own in `dispatch_recv`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

_ALIGN = 256  # bytes: every region starts 256-aligned (vector access, and typed views)


@dataclass(frozen=True)
class LaunchKnobs:
    """Launch parameters of the kernels: they change speed, never results (every setting in
    the backends' `knob_space` must pass the invariant). The defaults are the values the
    kernels were launched with before these became knobs, so past measurements compare.

    The grids are not a knob: each send kernel runs one CTA per token slot and its last CTA
    signals (`signal_when_last` counts them), so a smaller grid needs a persistent loop over
    slots first (a dynamic-bound loop, which the CPU interpreter cannot run with NumPy 2)."""

    send_num_warps: int = 4  # dispatch_send / combine_send (Triton's default)
    recv_num_warps: int = 4  # combine_recv, and dispatch_recv of the low-latency kernels
    row_block_bytes: int = 16384  # payload bytes one copy_row step moves (see row_blocks)
    recv_block_h: int = 2048  # combine_recv: elements of H one program sums (its grid's 2nd dim)
    recv_block_rows: int = 64  # low-latency dispatch_recv: slots one program tags


@dataclass(frozen=True)
class Geometry:
    """What a workspace is built for: W ranks, `capacity` token slots per source rank, rows of
    `hidden` activations (`dtype`), top-k routing over `experts_per_rank` experts a rank, and
    the payload's wire dtype (None: rows travel as activations; else 1-byte rows + fp32 scales),
    or `packed`: the bytes of a packed row (MXFP8, NVFP4: values then scales, `quant.wire_rows`)."""

    world: int
    capacity: int
    hidden: int
    topk: int
    experts_per_rank: int
    dtype: torch.dtype
    wire: torch.dtype | None = None
    packed: int = 0

    @property
    def x_row(self) -> int:
        """Elements of one dispatched row in the x region: H, or the bytes of a packed row."""
        return self.packed or self.hidden

    @property
    def x_dtype(self) -> torch.dtype:
        return torch.uint8 if self.wire is not None or self.packed else self.dtype


@dataclass(frozen=True)
class Workspace:
    """Byte layout of one rank's symmetric workspace: named regions of (dtype, shape), in order;
    plus `local` regions that only this rank touches (outputs rewritten every round at fixed
    addresses, so a captured graph replays): ordinary device memory, not symmetric."""

    regions: tuple[tuple[str, torch.dtype, tuple[int, ...]], ...]
    local: tuple[tuple[str, torch.dtype, tuple[int, ...]], ...] = ()

    def offsets(self) -> dict[str, int]:
        out, pos = {}, 0
        for name, dtype, shape in self.regions:
            out[name] = pos
            size = dtype.itemsize
            for n in shape:
                size *= n
            pos += -(-size // _ALIGN) * _ALIGN
        out["total"] = pos
        return out

    def views(self, buf: torch.Tensor) -> dict[str, torch.Tensor]:
        """Typed views of the local workspace `buf` (uint8 [total]), and the local regions."""
        o = self.offsets()
        out = {}
        for name, dtype, shape in self.regions:
            n = dtype.itemsize
            for d in shape:
                n *= d
            out[name] = buf[o[name] : o[name] + n].view(dtype).view(shape)
        for name, dtype, shape in self.local:
            out[name] = torch.empty(shape, dtype=dtype, device=buf.device)
        return out


@dataclass
class RankState:
    """What one rank's kernels need: its workspace views, where the peers' copies are, counters."""

    rank: int
    geometry: Geometry
    buf: torch.Tensor  # uint8 [total], this rank's symmetric workspace
    views: dict[str, torch.Tensor]  # typed regions of `buf`, and the local regions
    delta_bytes: list[int]  # rank d's workspace - ours, in bytes
    epoch: torch.Tensor  # int32 [2], local: [0] round counter the flags carry, [1] error word (1: a wait gave up)
    done: torch.Tensor  # int32 [2], local: CTAs finished in the current send kernel
    _deltas: dict[int, torch.Tensor]
    launch: LaunchKnobs = LaunchKnobs()  # the backend's knobs (set_knobs replaces it)
    # Slots per source rank the kernels use this step (one-sided layout: [W, rows] packed at
    # the region's start); None: the workspace's capacity. Same on every rank in a round.
    rows: int | None = None
    # Virtual ranks in phase order (every rank's send launched before any rank's wait): sends
    # never wait for peers; the waits are the receive calls' own launches.
    phased: bool = False

    @classmethod
    def create(
        cls, rank: int, geometry: Geometry, layout: Workspace, buf: torch.Tensor, peer_bases: list[int]
    ) -> RankState:
        """`peer_bases[d]`: the address of rank d's workspace as mapped in this process."""
        dev = buf.device
        views = layout.views(buf)
        views["flags"].zero_()
        delta = [b - peer_bases[rank] for b in peer_bases]
        if any(d % _ALIGN for d in delta):
            raise ValueError(f"workspaces must be {_ALIGN}-byte aligned relative to each other")
        state = cls(
            rank=rank,
            geometry=geometry,
            buf=buf,
            views=views,
            delta_bytes=delta,
            epoch=torch.zeros(2, dtype=torch.int32, device=dev),
            done=torch.zeros(2, dtype=torch.int32, device=dev),
            _deltas={},
        )
        # Load the wait kernel now (epoch 0: it returns at once): a rank's first round with no
        # tokens would otherwise compile it inside the round, while its peers spin.
        launch_wait(state, 1)
        return state

    @property
    def slots(self) -> int:
        """Token slots per source rank this step: `rows` when the backend was told the step's
        size (`set_step_tokens`), else the capacity. Rows are addressed source * slots + index,
        so a smaller step packs into the regions' start and the grids scale with it."""
        return self.rows or self.geometry.capacity

    def delta(self, itemsize: int) -> torch.Tensor:
        """int64 [W]: the distance to each rank's workspace in elements of `itemsize` bytes."""
        if itemsize not in self._deltas:
            self._deltas[itemsize] = torch.tensor(
                [d // itemsize for d in self.delta_bytes], dtype=torch.int64, device=self.buf.device
            )
        return self._deltas[itemsize]

    def received_scales(self) -> torch.Tensor:
        """fp32 [rows, S]: block scales of the rows dispatch_recv returned (quantized payloads)."""
        xs = self.views["xs"]
        flat = xs.view(-1, xs.shape[-1])
        return flat if self.rows is None else flat[: xs.shape[0] * self.rows]

    def gave_up(self) -> bool:
        """Whether a wait timed out since the workspace was made (host sync: not for hot paths)."""
        return bool(self.epoch[1].item())

    def unsignalled(self, row: int) -> list[int]:
        """Ranks whose flag in `row` (0: dispatch, 1: combine) has not reached this rank's epoch
        yet (host sync). In phase order every rank's send ran before this is asked: a rank it
        names skipped its signal, and a wait for it would only spin until `SPIN_LIMIT`."""
        flags = self.views["flags"][row].tolist()
        epoch = int(self.epoch[0].item())
        return [s for s, seen in enumerate(flags) if seen < epoch]


def row_blocks(hidden: int, itemsize: int, max_bytes: int = LaunchKnobs.row_block_bytes) -> dict[str, int]:
    """BLOCK_H (`max_bytes` of payload per step at most) and N_HB, the unrolled steps per row
    (a constexpr count: dynamic-bound loops don't run under the interpreter with NumPy 2)."""
    block = min(triton.next_power_of_2(hidden), max(1, max_bytes // itemsize))
    return {"BLOCK_H": block, "N_HB": triton.cdiv(hidden, block)}


def block_k(k: int) -> int:
    return triton.next_power_of_2(k)


@triton.jit
def signal_when_last(done_ptr, flags, d_i32, me, epoch, n_prog, epoch_ptr, W: tl.constexpr, BUMP_EPOCH: tl.constexpr):
    """Count this CTA done; the last one raises `epoch` at flags[me] on every rank (`flags` is
    the local flag row; d_i32 the per-rank offsets to its counterparts) and, for dispatch,
    stores the new epoch: every CTA has read the old one by then. Returns whether it was last."""
    tl.debug_barrier()  # every thread's stores of this CTA precede the release below
    finished = tl.atomic_add(done_ptr, 1, sem="acq_rel", scope="sys")
    last = finished == n_prog - 1
    if last:
        tl.store(done_ptr, 0)  # reset for the next round (nobody else touches it now)
        if BUMP_EPOCH:
            tl.store(epoch_ptr, epoch)
        for d in tl.static_range(W):
            tl.atomic_xchg(flags + tl.load(d_i32 + d) + me, epoch, sem="release", scope="sys")
    return last


# Polls of a flag before a receiver gives up (seconds on a GPU): a peer that died must not
# leave this GPU spinning forever. The give-up is recorded in the rank's error word and the
# round's results are garbage, which the invariant check then reports.
SPIN_LIMIT = tl.constexpr(1 << 24)


@triton.jit
def wait_flags(flags, epoch, err_ptr, W: tl.constexpr):
    for s in tl.static_range(W):
        seen = tl.atomic_add(flags + s, 0, sem="acquire", scope="sys")
        polls = 0
        while (seen < epoch) & (polls < SPIN_LIMIT):
            seen = tl.atomic_add(flags + s, 0, sem="acquire", scope="sys")
            polls += 1
        if polls >= SPIN_LIMIT:
            tl.atomic_xchg(err_ptr, 1)


@triton.jit
def copy_scales(dst, src, n, BLOCK_S: tl.constexpr):
    """Copy n 4-byte block scales (as int32 bits: no float conversion)."""
    ss = tl.arange(0, BLOCK_S)
    tl.store(dst + ss, tl.load(src + ss, mask=ss < n), mask=ss < n)


@triton.jit
def copy_row(dst, src, hidden, BLOCK_H: tl.constexpr, N_HB: tl.constexpr):
    for hb in tl.static_range(N_HB):
        hs = hb * BLOCK_H + tl.arange(0, BLOCK_H)
        hm = hs < hidden
        tl.store(dst + hs, tl.load(src + hs, mask=hm), mask=hm)


@triton.jit
def token_routing(ids_ptr, w_ptr, t, ks, K: tl.constexpr):
    """Token t's top-k over the lanes `ks` (BLOCK_K >= K): ids as int32 (-1 past K) and weights
    as int32 bits (0 past K): what the send kernels store into metadata, never converted."""
    ids = tl.load(ids_ptr + t * K + ks, mask=ks < K, other=-1).to(tl.int32)
    wbits = tl.load(w_ptr + t * K + ks, mask=ks < K, other=0.0).to(tl.int32, bitcast=True)
    return ids, wbits


@triton.jit
def put_row(ws, d_elem, d, row, src, i, hidden, BLOCK_H: tl.constexpr, N_HB: tl.constexpr):
    """Row i of `src` (rows of `hidden` elements) into `row` of rank d's copy of the region `ws`
    (d_elem: the distances to each rank's workspace in the region's elements)."""
    # workspaces are 256-byte aligned on every rank: the offset keeps 16-byte vectors
    dst = ws + tl.multiple_of(tl.load(d_elem + d), 16) + row.to(tl.int64) * hidden
    copy_row(dst, src + i.to(tl.int64) * hidden, hidden, BLOCK_H, N_HB)


@triton.jit
def wait_combine(flags_ptr, epoch_ptr, W: tl.constexpr):
    """A combine_recv program (grid: tokens x blocks of H), once every rank's combine flag
    reached the epoch: its token and its block of H."""
    t = tl.program_id(0)
    hb = tl.program_id(1)
    wait_flags(flags_ptr + W, tl.load(epoch_ptr), epoch_ptr + 1, W)
    return t, hb


@triton.jit
def _wait_kernel(flags_ptr, epoch_ptr, W: tl.constexpr):
    wait_flags(flags_ptr, tl.load(epoch_ptr), epoch_ptr + 1, W)


# ------------------------------------------------------------------------ host launchers
# The kernels of both backends take the same leading parameters, in the same order (listed
# per launcher below); each kernel's own further parameters come as keywords (`extra`).


def _peer_args(st: RankState, itemsize: int, hidden: int) -> tuple:
    """The parameters with which every send kernel reaches its peers and signals them:
    (flags_ws, d_elem, d_i32, epoch_ptr, done_ptr, me, cap, hidden); d_elem in `itemsize` units,
    hidden: the elements of the rows it sends."""
    return (
        st.views["flags"],
        st.delta(itemsize),
        st.delta(4),
        st.epoch,
        st.done,
        st.rank,
        st.slots,
        hidden,
    )


def launch_dispatch_send(
    kernel,
    grid: int,
    st: RankState,
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    x_scale: torch.Tensor | None,
    **extra,
) -> None:
    """`kernel(x_ptr, xs_ptr, ids_ptr, w_ptr, n_tokens, x_ws, xs_ws, meta_ws, flags_ws, d_elem,
    d_i32, epoch_ptr, done_ptr, me, cap, hidden, n_scales, experts_per_rank, ...)` over `grid`
    programs, with constexprs W, K, BLOCK_K, BLOCK_H, N_HB, QUANT and BLOCK_S.

    Quantized rows travel as bytes and their fp32 scales as int32 bits (the kernels copy,
    never convert); without scales the scale pointers are unused placeholders. Packed rows
    (`Geometry.packed`) are plain byte rows of that length, scales inside."""
    g, v = st.geometry, st.views
    quant = x_scale is not None
    n_scales = x_scale.shape[1] if quant else 1
    itemsize = v["x"].element_size()
    kernel[(grid,)](
        x.view(torch.uint8) if quant else x,
        x_scale.view(torch.int32) if quant else st.epoch,
        topk_ids,
        topk_weights,
        x.shape[0],
        v["x"],
        v["xs"].view(torch.int32) if quant else st.epoch,
        v["meta"],
        *_peer_args(st, itemsize, g.x_row),
        n_scales,
        g.experts_per_rank,
        W=g.world,
        K=g.topk,
        BLOCK_K=block_k(g.topk),
        QUANT=quant,
        BLOCK_S=block_k(n_scales),
        **row_blocks(g.x_row, itemsize, st.launch.row_block_bytes),
        num_warps=st.launch.send_num_warps,
        **extra,
    )


def launch_combine_send(kernel, grid: int, st: RankState, expert_out: torch.Tensor, **extra) -> None:
    """`kernel(out_ptr, meta_ptr, comb_ws, flags_ws, d_elem, d_i32, epoch_ptr, done_ptr, me,
    cap, hidden, ...)` over `grid` programs, with constexprs W, K, BLOCK_H and N_HB."""
    g, v = st.geometry, st.views
    kernel[(grid,)](
        expert_out,
        v["meta"],
        v["comb"],
        *_peer_args(st, g.dtype.itemsize, g.hidden),
        W=g.world,
        K=g.topk,
        **row_blocks(g.hidden, g.dtype.itemsize, st.launch.row_block_bytes),
        num_warps=st.launch.send_num_warps,
        **extra,
    )


def recv_launch(st: RankState) -> dict:
    """The constexprs and warps every receive kernel is launched with."""
    g = st.geometry
    return {"W": g.world, "K": g.topk, "BLOCK_K": block_k(g.topk), "num_warps": st.launch.recv_num_warps}


def launch_wait(st: RankState, row: int) -> None:
    """One CTA that waits for every rank's flag in `row` (0: dispatch, 1: combine) to reach the
    epoch: the wait as a launch of its own (a rank with no tokens; phase order)."""
    _wait_kernel[(1,)](st.views["flags"][row], st.epoch, W=st.geometry.world)


def launch_combine_recv(kernel, st: RankState, y: torch.Tensor, topk_ids: torch.Tensor, **extra) -> torch.Tensor:
    """`kernel(y_ptr, comb_ptr, ids_ptr, flags_ptr, epoch_ptr, hidden, ...)` over (tokens, H
    blocks), with constexprs W, K, BLOCK_K and BLOCK_H; returns y. A rank with no tokens still
    waits (one CTA) for the combine flags: its next dispatch must not write into peers'
    buffers before they finished this round's combine."""
    g, v = st.geometry, st.views
    t = topk_ids.shape[0]
    if t == 0:
        launch_wait(st, 1)
        return y
    block_h = min(triton.next_power_of_2(g.hidden), st.launch.recv_block_h)
    kernel[(t, triton.cdiv(g.hidden, block_h))](
        y,
        v["comb"],
        topk_ids,
        v["flags"],
        st.epoch,
        g.hidden,
        BLOCK_H=block_h,
        **recv_launch(st),
        **extra,
    )
    return y
