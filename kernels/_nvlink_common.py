"""What the symmetric-memory backends share: workspace layout, per-rank state, and the Triton
helpers for flag signalling and row copies.

A workspace is one symmetric allocation per rank (identical layout on every rank); a rank
reaches a peer's copy of a region through the local region's address plus the distance
between the two workspaces (`RankState.delta()`), so kernels take typed pointers to their
own regions and stay vectorised (workspaces are 256-byte aligned relative to each other).

Flags carry an epoch held on the device, so no host synchronisation is needed and captured
CUDA graphs replay correctly; a receiver gives up after `SPIN_LIMIT` polls and sets the
rank's error word instead of hanging the GPU when a peer died.
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
class Workspace:
    """Byte layout of one rank's workspace: named regions of (dtype, shape), in order."""

    regions: tuple[tuple[str, torch.dtype, tuple[int, ...]], ...]

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
        """Typed views of the local workspace `buf` (uint8 [total])."""
        o = self.offsets()
        out = {}
        for name, dtype, shape in self.regions:
            n = dtype.itemsize
            for d in shape:
                n *= d
            out[name] = buf[o[name] : o[name] + n].view(dtype).view(shape)
        return out


@dataclass
class RankState:
    """What one rank's kernels need: its workspace views, where the peers' copies are, counters."""

    rank: int
    buf: torch.Tensor  # uint8 [total], this rank's symmetric workspace
    views: dict[str, torch.Tensor]  # typed regions of `buf`
    delta_bytes: list[int]  # rank d's workspace - ours, in bytes
    epoch: torch.Tensor  # int32 [2], local: [0] round counter the flags carry, [1] error word (1: a wait gave up)
    done: torch.Tensor  # int32 [2], local: CTAs finished in the current send kernel
    _deltas: dict[int, torch.Tensor]
    launch: LaunchKnobs = LaunchKnobs()  # the backend's knobs (set_knobs replaces it)
    # Slots per source rank the kernels use this step (one-sided layout: [W, rows] packed at
    # the region's start); None: the workspace's capacity. Same on every rank in a round.
    rows: int | None = None

    @classmethod
    def create(cls, rank: int, layout: Workspace, buf: torch.Tensor, peer_bases: list[int]) -> RankState:
        """`peer_bases[d]`: the address of rank d's workspace as mapped in this process."""
        dev = buf.device
        views = layout.views(buf)
        views["flags"].zero_()
        delta = [b - peer_bases[rank] for b in peer_bases]
        if any(d % _ALIGN for d in delta):
            raise ValueError(f"workspaces must be {_ALIGN}-byte aligned relative to each other")
        return cls(
            rank=rank,
            buf=buf,
            views=views,
            delta_bytes=delta,
            epoch=torch.zeros(2, dtype=torch.int32, device=dev),
            done=torch.zeros(2, dtype=torch.int32, device=dev),
            _deltas={},
        )

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
def _wait_kernel(flags_ptr, epoch_ptr, W: tl.constexpr):
    wait_flags(flags_ptr, tl.load(epoch_ptr), epoch_ptr + 1, W)


def dispatch_wait(st: RankState) -> None:
    """Wait (one CTA) for every source's dispatch flag of the current round."""
    flags = st.views["flags"]
    _wait_kernel[(1,)](flags[0], st.epoch, W=flags.shape[1])


def combine_wait(st: RankState) -> None:
    """A rank with no tokens still waits for the combine flags: its next dispatch must not
    write into peers' buffers before they finished this round's combine."""
    flags = st.views["flags"]
    _wait_kernel[(1,)](flags[1], st.epoch, W=flags.shape[1])


def payload_args(st: RankState, x: torch.Tensor, x_scale: torch.Tensor | None) -> dict:
    """The dispatch-send arguments both backends derive the same way from the payload.

    Quantized rows travel as bytes and their fp32 scales as int32 bits (the kernels copy,
    never convert); without scales the scale pointers are unused placeholders."""
    quant = x_scale is not None
    n_scales = x_scale.shape[1] if quant else 1
    x_region = st.views["x"]
    return {
        "x": x.view(torch.uint8) if quant else x,
        "xs": x_scale.view(torch.int32) if quant else st.epoch,
        "xs_ws": st.views["xs"].view(torch.int32) if quant else st.epoch,
        "n_scales": n_scales,
        "d_x": st.delta(x_region.element_size()),
        "constexprs": {
            "QUANT": quant,
            "BLOCK_S": block_k(n_scales),
            **row_blocks(x_region.shape[-1], x_region.element_size(), st.launch.row_block_bytes),
        },
    }
