"""EP groups: the consecutive ranks one EP size is measured on, every group of a size at once.

Engines place an EP group on consecutive ranks and launchers number ranks node by node, so EP
size s on a world of W ranks is W/s groups: ranks 0..s-1, s..2s-1, ... Every group of a size
runs each case at the same time, as a deployment's replicas do while they share NICs, switches
and NVLink domains. Each group is its own process group (`torch.distributed.new_subgroups`;
the world itself when s = W), its backends are built on it and gated on it. The groups then
agree over the world (`EPGroups.agree`): the case's samples are the maximum over the ranks of
every group, per sample (the slowest group's figure, as the maximum over ranks is taken within
a group), and each group's own median is kept (`Result.group_us`, in group order); views flag
a group far slower than the median group (`slow_groups`).

Standard library at import (the plan and the views use the arithmetic); torch where groups run.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch.distributed as dist

    from .launch import RankContext
    from .measure import Result

#: A group this much slower than the median group (its median round trip) is flagged.
SLOW_GROUP_RATIO = 1.10


def default_ep_sizes(world: int, experts: Iterable[int] = ()) -> tuple[int, ...]:
    """The powers of two from 2 that divide the world, and the world itself; with `experts`
    (each model's expert count), only the sizes at least one of those counts divides (a model
    is measured at the sizes its own experts divide)."""
    sizes = {2**i for i in range(1, world.bit_length()) if world % 2**i == 0} | {world}
    counts = set(experts)
    return tuple(s for s in sorted(sizes) if not counts or any(e % s == 0 for e in counts))


def group_ranks(ep_size: int, index: int) -> range:
    """The ranks of group `index` of EP size `ep_size` (consecutive)."""
    return range(index * ep_size, (index + 1) * ep_size)


def ranks_text(ranks: range) -> str:
    return f"ranks {ranks.start}-{ranks.stop - 1}"


def slow_groups(group_us: list[float], ratio: float = SLOW_GROUP_RATIO) -> list[int]:
    """The groups whose median is more than `ratio` times the median group's (suspect GPU,
    link or NIC); none with fewer than 2 groups."""
    if len(group_us) < 2:
        return []
    middle = statistics.median(group_us)
    return [g for g, us in enumerate(group_us) if us > ratio * middle]


@dataclass
class EPGroups:
    """This rank's view of one EP size: its group's context (rank and size within the group,
    the group's process group) and the world's, for agreeing across groups."""

    ep_size: int
    world: RankContext
    ctx: RankContext  # this rank's group
    index: int  # which group this rank is in
    _group: dist.ProcessGroup | None = None  # None: the group is the world

    @classmethod
    def of(cls, world: RankContext, ep_size: int) -> EPGroups:
        """Collective over the world: the groups of `ep_size`, which divides the world size (the
        plan's edge, tuner.plans.parse_ep_sizes, made sure)."""
        import torch.distributed as dist

        from .launch import RankContext

        index = world.rank // ep_size
        if ep_size == world.world_size:
            return cls(ep_size, world, world, 0)
        group, _ = dist.new_subgroups(group_size=ep_size, group=world.group)
        ctx = RankContext(world.rank % ep_size, ep_size, world.local_rank, world.device, group)
        return cls(ep_size, world, ctx, index, group)

    @property
    def count(self) -> int:
        return self.world.world_size // self.ep_size

    @property
    def ranks(self) -> range:
        return group_ranks(self.ep_size, self.index)

    def start_together(self) -> None:
        """Collective over the world: every group starts the next case at the same time."""
        if self.count > 1:
            import torch.distributed as dist

            dist.barrier(group=self.world.group)

    def agree(self, result: Result) -> Result:
        """Collective over the world: one Result from each group's (the same on every rank of a
        group). Measured everywhere: samples the maximum over every group per sample,
        `group_us` each group's median. Otherwise the first group's that was not measured,
        its reason naming the group's ranks."""
        if self.count == 1:
            if result.kind == "measured":
                return dataclasses.replace(result, group_us=[result.stats.median_us])
            return result
        import torch.distributed as dist

        gathered: list[Result | None] = [None] * self.world.world_size
        dist.all_gather_object(gathered, result, group=self.world.group)
        per_group: list[Result] = [r for r in gathered[:: self.ep_size] if r is not None]
        for g, r in enumerate(per_group):
            if r.kind != "measured":
                where = ranks_text(group_ranks(self.ep_size, g))
                reason = r.reason if r.kind == "infeasible" else f"group {g} ({where}): {r.reason}"
                return dataclasses.replace(r, reason=reason)
        return _slowest(per_group)

    def close(self) -> None:
        if self._group is not None:
            import torch.distributed as dist

            dist.destroy_process_group(self._group)
            self._group = None


def _slowest(results: list[Result]) -> Result:
    """Every group's measured Result as one: per sample the maximum over the groups."""
    from .figures import Traffic

    def worst(samples: list[list[float]]) -> list[float]:
        if not all(samples):
            return []
        return [max(values) for values in zip(*samples)]

    first = results[0]
    traffic = None
    if all(r.traffic is not None for r in results):
        traffic = Traffic(*(statistics.fmean(values) for values in zip(*(r.traffic for r in results))))
    held = [r.workspace_bytes for r in results]
    errors = [r.max_rel_error for r in results if r.max_rel_error is not None]
    return dataclasses.replace(
        first,
        device_us=worst([r.device_us for r in results]),
        host_us=worst([r.host_us for r in results]),
        dispatch_us=worst([r.dispatch_us for r in results]),
        combine_us=worst([r.combine_us for r in results]),
        traffic=traffic,
        workspace_bytes=None if None in held else max(held),
        max_rel_error=max(errors) if errors else None,
        group_us=[r.stats.median_us for r in results],
    )
