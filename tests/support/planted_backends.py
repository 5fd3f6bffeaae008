"""Deliberately broken backends: the invariant check and the sweep must catch each of them.

Imported in every rank through A2A_TUNE_BACKEND_MODULES=planted_backends (tests/support on
the path), the same way an out-of-tree backend would be.
"""

from __future__ import annotations

import torch
from planting import planted_backend

from a2a_tune.kernels import Availability, register_backend
from a2a_tune.kernels.nccl_all2allv import NcclAll2Allv


@register_backend
class OffByOneDestination(NcclAll2Allv):
    """Writes every received row one slot further on (the classic destination-offset bug)."""

    name = "planted_off_by_one"

    def dispatch(self, x, topk_ids, topk_weights):
        d = super().dispatch(x, topk_ids, topk_weights)
        if d.x.shape[0] > 1:
            d.x = torch.roll(d.x, shifts=1, dims=0)
        return d


@register_backend
class WeightsAppliedTwice(NcclAll2Allv):
    """Applies the router weights in combine although the expert side already did."""

    name = "planted_double_weights"

    def combine(self, expert_out, dispatched):
        return super().combine(expert_out * 0.5, dispatched)


@register_backend
class CrashesInDispatch(NcclAll2Allv):
    """Raises on every rank, as a backend with a missing kernel would."""

    name = "planted_crash"

    def dispatch(self, x, topk_ids, topk_weights):
        raise RuntimeError("planted failure: kernel image not found")


planted_backend(
    "planted_unavailable",
    "Unavailable everywhere, like an optional backend whose package is not installed.",
    availability=classmethod(lambda cls, env: Availability(False, "package planted_ext not installed")),
)


@register_backend
class HangsOnOneRank(NcclAll2Allv):
    """Rank 1 never returns from dispatch, so rank 0 waits in a collective: a hung backend."""

    name = "planted_hang"

    def dispatch(self, x, topk_ids, topk_weights):
        if self.rank == 1:
            import time

            time.sleep(3600)
        return super().dispatch(x, topk_ids, topk_weights)


@register_backend
class WaitsAtAGate(NcclAll2Allv):
    """Every rank waits in dispatch while the file $A2A_TUNE_TEST_GATE exists (at most 10
    minutes): a sweep that is alive and holding its run for as long as a test needs."""

    name = "planted_gate"

    def dispatch(self, x, topk_ids, topk_weights):
        import os
        import time

        gate = os.environ.get("A2A_TUNE_TEST_GATE")
        deadline = time.monotonic() + 600
        while gate and os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.1)
        return super().dispatch(x, topk_ids, topk_weights)


@register_backend
class DiskFullOnRankZero(NcclAll2Allv):
    """Correct, but the disk under the store fills up once its first measurement is written:
    rank 0, the store's writer, fails in the store's write (where only it runs) while rank 1
    goes on into the next collective and finds its peer gone."""

    name = "planted_disk_full"

    def __init__(self, group, shape, device):
        super().__init__(group, shape, device)
        if self.rank == 0:
            _fill_the_disk_after(writes=1)


def _fill_the_disk_after(writes: int) -> None:
    """In this (rank) process, the store's measurement writes after the first `writes` raise
    ENOSPC, as a full disk makes them."""
    import errno
    import os

    from a2a_tune.db.store import Store

    real = Store.add_measurement
    if getattr(real, "planted", False):  # built again (another shape): the disk is still full
        return
    left = [writes]

    def add_measurement(self, *args, **kwargs):
        if left[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        left[0] -= 1
        return real(self, *args, **kwargs)

    add_measurement.planted = True
    Store.add_measurement = add_measurement


@register_backend
class FailsToBuildOnOneRank(NcclAll2Allv):
    """Rank 1's constructor raises (a workspace that does not fit on one GPU): the other ranks
    must learn of it rather than wait for rank 1 in the first collective."""

    name = "planted_build_fails"

    def __init__(self, group, shape, device):
        super().__init__(group, shape, device)
        if self.rank == 1:
            raise RuntimeError("planted failure: out of memory for the workspace")


class _DiesOnRankOne(NcclAll2Allv):
    """Rank 1's process ends inside dispatch without a word (`die`), as a segfaulting kernel,
    a failed assertion or the OOM killer ends it; rank 0 is left in a collective."""

    def dispatch(self, x, topk_ids, topk_weights):
        if self.rank == 1:
            self.die()
        return super().dispatch(x, topk_ids, topk_weights)

    def die(self) -> None:
        raise NotImplementedError


@register_backend
class ExitsOnOneRank(_DiesOnRankOne):
    name = "planted_exit"

    def die(self) -> None:
        import os

        os._exit(3)


@register_backend
class AbortsOnOneRank(_DiesOnRankOne):
    """abort(): what an uncaught std::bad_alloc or a failed C assertion ends in."""

    name = "planted_abort"

    def die(self) -> None:
        import os
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file left behind
        os.abort()


@register_backend
class KilledOnOneRank(_DiesOnRankOne):
    """SIGKILL, the OOM killer's signal."""

    name = "planted_sigkill"

    def die(self) -> None:
        import os
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


@register_backend
class KillsRankZeroBetweenCases(NcclAll2Allv):
    """With $A2A_TUNE_TEST_KILL_RANK0 set, rank 0's process is SIGKILLed while the sweep asks
    which backends are available: after the run is opened, outside any case."""

    name = "planted_kill_rank0"

    @classmethod
    def availability(cls, env):
        import os
        import signal

        import torch.distributed as dist

        if os.environ.get("A2A_TUNE_TEST_KILL_RANK0") and dist.is_initialized() and dist.get_rank() == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().availability(env)


@register_backend
class TakesTheStoreAway(NcclAll2Allv):
    """At rank 0's first dispatch, deletes the file $A2A_TUNE_TEST_VANISH (the sweep's SQLite
    store), or puts $A2A_TUNE_TEST_VANISH_WITH in its place when that is set: an operator who
    removes or replaces the database under a running sweep."""

    name = "planted_store_vanishes"

    def dispatch(self, x, topk_ids, topk_weights):
        import os
        import shutil

        path = os.environ.get("A2A_TUNE_TEST_VANISH")
        if self.rank == 0 and path and not os.path.exists(path + ".taken"):
            open(path + ".taken", "w").close()  # once per sweep
            replacement = os.environ.get("A2A_TUNE_TEST_VANISH_WITH")
            if replacement:
                shutil.copyfile(replacement, path + ".new")
                os.replace(path + ".new", path)
            else:
                os.remove(path)
        return super().dispatch(x, topk_ids, topk_weights)


@register_backend
class CarriesBf16Only(NcclAll2Allv):
    """Correct, but carries bf16 only (as DeepEP carries no NVFP4): other payloads are "does not
    carry", skipped, never failed."""

    name = "planted_bf16_only"
    payloads = frozenset({"bf16"})


@register_backend
class SlowOnOneRank(NcclAll2Allv):
    """Correct, but the job's rank $A2A_TUNE_TEST_SLOW_RANK spends 100 ms more in each dispatch:
    a slow GPU, link or NIC. Its EP group, and only its, must come out the slowest."""

    name = "planted_slow_rank"

    def dispatch(self, x, topk_ids, topk_weights):
        import os
        import time

        import torch.distributed as dist

        if str(dist.get_rank()) == os.environ.get("A2A_TUNE_TEST_SLOW_RANK"):
            time.sleep(0.1)
        return super().dispatch(x, topk_ids, topk_weights)


@register_backend
class WaitsAtAGateAtOneSize(NcclAll2Allv):
    """Like planted_gate, but only on EP groups of $A2A_TUNE_TEST_GATE_SIZE ranks: a multi-size
    sweep that stores the smaller sizes, then holds on until it is killed."""

    name = "planted_gate_at_size"

    def dispatch(self, x, topk_ids, topk_weights):
        import os
        import time

        gate = os.environ.get("A2A_TUNE_TEST_GATE")
        wait = str(self.world_size) == os.environ.get("A2A_TUNE_TEST_GATE_SIZE")
        deadline = time.monotonic() + 600
        while wait and gate and os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.1)
        return super().dispatch(x, topk_ids, topk_weights)


@register_backend
class WrongOnTheLastTwoRanks(NcclAll2Allv):
    """planted_off_by_one on the job's last two ranks only: at every EP size, only the last
    group is wrong, so only a gate run in every group catches it."""

    name = "planted_wrong_last_ranks"

    def dispatch(self, x, topk_ids, topk_weights):
        import torch.distributed as dist

        d = super().dispatch(x, topk_ids, topk_weights)
        if dist.get_rank() >= dist.get_world_size() - 2 and d.x.shape[0] > 1:
            d.x = torch.roll(d.x, shifts=1, dims=0)
        return d
