"""Bugs planted in copies of the shipped NVLink kernel modules, each registered as an
out-of-tree backend on the same kernel-module host API (A2A_TUNE_BACKEND_MODULES=planted_kernels):
what the virtual-rank check (`a2a-tune check --virtual`, tests/kernels/test_virtual.py) and the
GPU tests must fail.

    planted_kernel_drops_row     one-sided dispatch never sends token 1's payload row
    planted_kernel_wrong_slot    low-latency dispatch writes each row into the next local
                                 expert's slot (a destination bug)
    planted_kernel_skips_flag    one-sided combine: the last rank never raises its combine flags
"""

from __future__ import annotations

from kernel_copies import copy_module

from a2a_tune.kernels import _low_latency_kernels, _one_sided_kernels, register_backend
from a2a_tune.kernels.nvlink_low_latency import NvlinkLowLatency
from a2a_tune.kernels.nvlink_one_sided import NvlinkOneSided

DROPS_ROW = copy_module(
    _one_sided_kernels,
    "planted_kernels_drops_row",
    [
        (
            "            if tl.sum(mine.to(tl.int32), axis=0) > 0:",
            "            if (tl.sum(mine.to(tl.int32), axis=0) > 0) & (t != 1):  # planted: row 1 stays home",
        )
    ],
)
WRONG_SLOT = copy_module(
    _low_latency_kernels,
    "planted_kernels_wrong_slot",
    [
        (
            "                slot = ((e - d * experts_per_rank) * W + me) * cap + t",
            "                slot = (((e + 1 - d * experts_per_rank) % experts_per_rank) * W + me) * cap + t  # planted",
        )
    ],
)
SKIPS_FLAG = copy_module(
    _one_sided_kernels,
    "planted_kernels_skips_flag",
    [
        (
            "    signal_when_last(done_ptr + 1, flags_ws + W, d_i32, me, tl.load(epoch_ptr), n_prog, epoch_ptr, W, False)",
            "    if me != W - 1:  # planted: the last rank never signals its combine\n"
            "        signal_when_last(done_ptr + 1, flags_ws + W, d_i32, me, tl.load(epoch_ptr), n_prog, epoch_ptr, W, False)",
        )
    ],
)


@register_backend
class DropsRow(NvlinkOneSided):
    name = "planted_kernel_drops_row"
    kernels = DROPS_ROW


@register_backend
class WrongSlot(NvlinkLowLatency):
    name = "planted_kernel_wrong_slot"
    kernels = WRONG_SLOT


@register_backend
class SkipsFlag(NvlinkOneSided):
    name = "planted_kernel_skips_flag"
    kernels = SKIPS_FLAG


PLANTED = ("planted_kernel_drops_row", "planted_kernel_wrong_slot", "planted_kernel_skips_flag")
