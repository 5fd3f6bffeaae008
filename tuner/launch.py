"""Start the ranks: spawn one process per GPU (or per CPU rank over gloo), or join torchrun/srun.

`run_ranks(fn, world_size, device_type, *args)` calls `fn(ctx, *args)` on every rank and
returns the list of per-rank results (index = rank). A rank that raises makes `run_ranks`
raise `RankFailed` with that rank's one-line error, after the other ranks are stopped.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# Collectives that wait longer than this fail instead of hanging the sweep forever.
COLLECTIVE_TIMEOUT = _dt.timedelta(seconds=float(os.environ.get("A2A_TUNE_COLLECTIVE_TIMEOUT_S", "300")))

# NVLink multicast stays off: on shared hosts it can take the GPUs out of service.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


class RankFailed(RuntimeError):
    """A rank raised; the message is that rank's error in one line."""


class RanksStalled(RankFailed):
    """The `stalled` watchdog of `run_ranks` fired: every rank was stopped."""


@dataclass(frozen=True)
class RankContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    group: dist.ProcessGroup | None  # None = the default (world) group


def all_ranks_ok(ok: bool, ctx: RankContext) -> bool:
    """Collective: True only when `ok` on every rank, so all ranks take the same branch."""
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=ctx.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=ctx.group)
    return bool(flag.item())


def one_line(exc: BaseException) -> str:
    """`Type: first line of the message`: how a failure is recorded and reported."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def launched_externally() -> bool:
    """True when torchrun/srun started this process as one rank of a job."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _init(rank: int, world_size: int, local_rank: int, device_type: str) -> RankContext:
    for key, value in SAFE_ENV.items():
        os.environ.setdefault(key, value)
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", rank=rank, world_size=world_size, timeout=COLLECTIVE_TIMEOUT, device_id=device)
    else:
        device = torch.device("cpu")
        if "OMP_NUM_THREADS" not in os.environ:
            # CPU ranks share the host's cores, and idle OpenMP workers spin-wait: with torch's
            # default of a thread per core each rank starves the others (and a busy host starves
            # each rank), so round trips over gloo vary by orders of magnitude from one to the next.
            torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=COLLECTIVE_TIMEOUT)
    return RankContext(rank, world_size, local_rank, device, None)


def _rank_main(rank: int, world_size: int, device_type: str, port: int, fn: Callable, args: tuple, results) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    try:
        ctx = _init(rank, world_size, rank, device_type)
        try:
            results.put((rank, True, fn(ctx, *args)))
        finally:
            dist.destroy_process_group()
    except BaseException as exc:  # report, then let the parent stop the others
        last = f"{type(exc).__name__}: {exc}".splitlines()[0]
        results.put((rank, False, (last, traceback.format_exc())))


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    device_type: str,
    *args: Any,
    stalled: Callable[[], str | None] | None = None,
) -> list[Any]:
    """Run `fn(ctx, *args)` on `world_size` ranks and return their results by rank.

    Under torchrun/srun (RANK and WORLD_SIZE set) this process is one rank: it joins the job
    through env:// and returns a list holding only its own result at its own index.
    Spawned ranks only: `stalled()` is polled every second; when it returns a reason, every
    rank is killed (a hung collective or kernel leaves nothing to recover in-process) and
    `RanksStalled` is raised with that reason.
    """
    if launched_externally():
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0")))
        ctx = _init(rank, world, local, device_type)
        try:
            out: list[Any] = [None] * world
            out[rank] = fn(ctx, *args)
            return out
        finally:
            dist.destroy_process_group()

    mpctx = mp.get_context("spawn")
    results = mpctx.Queue()
    port = _free_port()
    procs = [
        mpctx.Process(target=_rank_main, args=(r, world_size, device_type, port, fn, args, results), daemon=False)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    out = [None] * world_size
    failure: tuple[int, str, str] | None = None
    pending = world_size
    try:
        while pending and failure is None:
            try:
                rank, ok, value = results.get(timeout=1.0)
            except queue.Empty:
                # A rank that died without reporting (segfault, OOM kill) would otherwise hang us.
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and out[r] is None]
                if dead:
                    failure = (dead[0], f"process exited with code {procs[dead[0]].exitcode}", "")
                elif stalled is not None and (reason := stalled()):
                    failure = (-1, reason, "stalled")
                continue
            pending -= 1
            if ok:
                out[rank] = value
            else:
                failure = (rank, *value)
    except KeyboardInterrupt:
        failure = (-1, "interrupted", "")
        raise
    finally:
        if failure is not None:
            for p in procs:
                if p.is_alive():
                    p.terminate()
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():  # stuck in a driver call: SIGTERM is not enough
                    p.kill()
        for p in procs:
            p.join()
    if failure is not None:
        rank, line, tb = failure
        if tb == "stalled":
            raise RanksStalled(line)
        raise RankFailed(f"rank {rank}: {line}") from RuntimeError(tb)
    return out


class Heartbeat:
    """A file in which rank 0 says what it is doing, for the spawning parent's watchdog:
    `run_ranks(..., stalled=heartbeat.stalled_after(s))` stops every rank once one item of
    work has run for `s` seconds, and `last()` then names that item."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)

    def beat(self, doing: dict[str, Any] | None) -> None:
        """Rank 0: `doing` starts now (JSON-able; None: between items)."""
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"doing": doing, "since": time.time()}, f)
        os.replace(tmp, self.path)

    def _read(self) -> dict[str, Any]:
        try:
            return json.loads(Path(self.path).read_text())
        except (OSError, ValueError):
            return {}

    def last(self) -> dict[str, Any] | None:
        """What rank 0 said it was doing last (None: nothing, or between items)."""
        return self._read().get("doing")

    def clear(self) -> None:
        Path(self.path).unlink(missing_ok=True)

    def stalled_after(self, seconds: float) -> Callable[[], str | None]:
        def stalled() -> str | None:
            state = self._read()
            if state.get("doing") and time.time() - state["since"] > seconds:
                return f"{state['doing']} made no progress for {seconds:.0f} s"
            return None

        return stalled
