"""Start the ranks: spawn one process per GPU (or per CPU rank over gloo), or join torchrun/srun.

`run_ranks(fn, world_size, device_type, *args)` calls `fn(ctx, *args)` on every rank and
returns the list of per-rank results (index = rank). A rank that raises makes `run_ranks`
raise `RankFailed` with the first real error in one line, after the other ranks are stopped.

Spawned ranks are supervised by the process that spawned them (the operator's `a2a-tune`):
- they never outlive it: on Linux each rank asks the kernel for SIGKILL when its parent dies
  (prctl PR_SET_PDEATHSIG), elsewhere a thread watches the parent pid; so `kill -9` of the
  sweep (the OOM killer's signal) takes its ranks, their GPUs and communicators with it;
- they ignore SIGINT: Ctrl-C (and SIGTERM, turned into `Terminated`) reaches the supervisor,
  which stops every rank and raises `KeyboardInterrupt` for the caller to record;
- the error reported is the cause, not its echo: once a rank fails, the others' reports are
  collected for a moment and a peer's "connection closed" (or a `PeerFailed`) is reported
  only when no rank said anything better.

Design notes: docs/architecture.md, "Module notes", `tuner/launch.py`.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import queue
import re
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .interrupts import SIGNAL_EXIT, Terminated  # noqa: F401 - re-exported: the commands and tests name them here
from .interrupts import sigterm_as_interrupt as _sigterm_as_interrupt
from .runtime.environ import EnvError, env_seconds

# one_line: how a failure is recorded and reported; the rank modules import it from here
from .runtime.text import one_line, quoted

COLLECTIVE_TIMEOUT_ENV = "A2A_TUNE_COLLECTIVE_TIMEOUT_S"
RENDEZVOUS_TIMEOUT_ENV = "A2A_TUNE_RENDEZVOUS_TIMEOUT_S"


def collective_timeout() -> _dt.timedelta:
    """Collectives that wait longer than this fail instead of hanging the sweep forever
    ($A2A_TUNE_COLLECTIVE_TIMEOUT_S, default 300 s; EnvError, one line, out of range)."""
    return _dt.timedelta(seconds=env_seconds(COLLECTIVE_TIMEOUT_ENV, 300.0))


def rendezvous_timeout() -> _dt.timedelta:
    """A launched rank that cannot meet every other rank at the rendezvous gives up after this
    ($A2A_TUNE_RENDEZVOUS_TIMEOUT_S, default 180 s)."""
    return _dt.timedelta(seconds=env_seconds(RENDEZVOUS_TIMEOUT_ENV, 180.0))


# NVLink multicast stays off: on shared hosts it can take the GPUs out of service.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


class RankFailed(RuntimeError):
    """A rank raised; the message is that rank's error in one line."""


class RanksLost(RankFailed):
    """Every rank was stopped in the middle of some work, through no error any rank reported:
    the work hung (:class:`RanksStalled`) or a rank's process died (:class:`RankCrashed`). The
    caller can blame the work each rank said it was doing (:class:`Heartbeat`) and go on
    without it."""

    rank: int | None = None  # the rank whose death stopped them (None: a stall)


class RanksStalled(RanksLost):
    """The `stalled` watchdog of `run_ranks` fired: every rank was stopped."""


class RankCrashed(RanksLost):
    """A rank's process ended without reporting (a segfault, ``abort()``, ``os._exit``, the OOM
    killer's SIGKILL): the others were stopped. `how` says how it ended, in a few words."""

    def __init__(self, rank: int, exitcode: int) -> None:
        self.rank, self.exitcode, self.how = rank, exitcode, exit_text(exitcode)
        super().__init__(f"rank {rank}: process {self.how}")


def exit_text(exitcode: int) -> str:
    """A process's exit status in words: "exited with code 3", "was killed by SIGKILL (out of
    memory?)" (multiprocessing's exitcode: -N for signal N)."""
    if exitcode >= 0:
        return f"exited with code {exitcode}" + (" without a result" if exitcode == 0 else "")
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        name = f"signal {-exitcode}"
    hint = {"SIGKILL": " (out of memory?)", "SIGABRT": " (abort: a failed assertion or std::bad_alloc?)"}
    return f"was killed by {name}{hint.get(name, '')}"


class PeerFailed(RuntimeError):
    """Raised by a rank that cannot go on because another rank failed (and said why)."""


class PeerLost(RankFailed):
    """A launched rank lost contact with the job: another rank or its node went away."""


# How long the supervisor keeps listening, after a first failure, for a better cause.
FIRST_ERROR_GRACE_S = 3.0
# A rank's error that only echoes a peer's death: gloo / NCCL / sockets noticing it left.
_ECHO = re.compile(
    r"connection (closed|reset|refused) by peer|broken pipe|remote process exited|"
    r"connection (was )?(closed|reset)|socket (closed|timeout)|peer (closed|disconnected)",
    re.IGNORECASE,
)


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


def one_gpu_refusal(gpus: int, gpu_name: str | None, *, virtual_hint: bool = False) -> str:
    """What a host with fewer than 2 GPUs is told when it asks for GPU ranks, in one line: what
    it is, and what it can do instead (a job across nodes; a CPU rehearsal; virtual ranks)."""
    name = f" ({gpu_name})" if gpu_name else ""
    line = (
        f"expert parallelism needs at least 2 GPUs; this machine has {gpus}{name}: use 2 or more here, or "
        "launch one rank per GPU across nodes with torchrun/srun; --device cpu is a rehearsal on CPU ranks "
        "(gloo), not this machine's table"
    )
    if virtual_hint:
        line += "; --virtual --world N checks backends' kernels on N virtual ranks of this GPU"
    return line


def cpu_rehearsal_note(gpus: int) -> str:
    """Said when CPU ranks run on a host with GPUs: nothing they measure is that host's figures."""
    return (
        f"note: --device cpu on a host with {gpus} GPU(s): a rehearsal on CPU ranks over gloo; "
        "what it measures is not this machine's table"
    )


# CPU ranks (gloo) per core before the machine only thrashes, and what one rank costs in
# memory (torch, gloo, a sweep's buffers at small shapes): the ceiling `cpu_rank_limit` puts
# on --world for spawned CPU ranks.
CPU_RANKS_PER_CORE = 8
CPU_RANK_MEMORY_BYTES = 256 * 1024 * 1024


def host_memory_available() -> int | None:
    """Bytes this host can still give its processes: /proc/meminfo's MemAvailable, or less
    where a cgroup v2 limit (a container's, a Slurm job's) leaves less; None when unknown."""
    available = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit != "max":
            left = max(int(limit) - used, 0)
            available = left if available is None else min(available, left)
    except (OSError, ValueError):
        pass
    return available


def cpu_rank_limit() -> tuple[int, str]:
    """How many CPU ranks this machine can hold, and why that many (one line)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    by_cores = CPU_RANKS_PER_CORE * cores
    available = host_memory_available()
    if available is None:
        return by_cores, f"{cores} core(s) x {CPU_RANKS_PER_CORE}"
    by_memory = available // CPU_RANK_MEMORY_BYTES
    why = (
        f"{cores} core(s) x {CPU_RANKS_PER_CORE} = {by_cores}; {available / 2**30:.1f} GiB available / "
        f"~{CPU_RANK_MEMORY_BYTES / 2**30:.2f} GiB per rank = {by_memory}"
    )
    return max(min(by_cores, by_memory), 2), why


@dataclass(frozen=True)
class JobRank:
    """This process's place in a job a launcher started."""

    rank: int
    world_size: int
    local_rank: int
    launcher: str  # "torchrun" | "srun"


def _env_int(name: str) -> int:
    value = os.environ[name]
    try:
        return int(value)
    except ValueError:
        raise RankFailed(f"{name}={quoted(value)} is not an integer (set by the launcher?)") from None


def job_rank() -> JobRank | None:
    """This process's rank in a torchrun job (RANK, WORLD_SIZE) or an srun step of several
    tasks (SLURM_PROCID, SLURM_NTASKS); None when a2a-tune is to spawn its own ranks."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        local = "LOCAL_RANK" if "LOCAL_RANK" in env else "SLURM_LOCALID" if "SLURM_LOCALID" in env else None
        return JobRank(_env_int("RANK"), _env_int("WORLD_SIZE"), _env_int(local) if local else 0, "torchrun")
    tasks = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
    if "SLURM_PROCID" in env and tasks in env and _env_int(tasks) > 1:
        local = _env_int("SLURM_LOCALID") if "SLURM_LOCALID" in env else 0
        return JobRank(_env_int("SLURM_PROCID"), _env_int(tasks), local, "srun")
    return None


def is_rank_zero() -> bool:
    """False only on a non-zero rank of a torchrun/srun job (`job_rank`): the process that
    reports. EnvError (one line, exit 2) where the launcher's variables are no integers."""
    try:
        job = job_rank()
    except RankFailed as exc:
        raise EnvError(str(exc)) from None
    return job is None or job.rank == 0


def launched_externally() -> bool:
    """True when torchrun/srun started this process as one rank of a job."""
    return job_rank() is not None


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: "gpu[07-09,12],login1" -> "gpu07"."""
    head = nodelist.strip()
    bracket, comma = head.find("["), head.find(",")
    if bracket < 0 or 0 <= comma < bracket:
        return head.split(",")[0]
    close = head.index("]", bracket)
    first = head[bracket + 1 : close].split(",")[0].split("-")[0]
    suffix = head[close + 1 :].split(",")[0]
    return head[:bracket] + first + suffix


def rendezvous_address() -> tuple[str, int]:
    """MASTER_ADDR:MASTER_PORT; under srun without them, the first node of the step and a
    port derived from the job id (the same in every task)."""
    env = os.environ
    addr = env.get("MASTER_ADDR")
    if not addr:
        nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if not nodes:
            raise RankFailed("MASTER_ADDR is not set (and no SLURM_JOB_NODELIST to take the first node from)")
        addr = first_host(nodes)
    if "MASTER_PORT" in env:
        port = _env_int("MASTER_PORT")
    elif "SLURM_JOB_ID" in env:
        port = 20000 + _env_int("SLURM_JOB_ID") % 10000
    else:
        raise RankFailed("MASTER_PORT is not set (and no SLURM_JOB_ID to derive one from)")
    return addr, port


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _init(
    rank: int, world_size: int, local_rank: int, device_type: str, store: dist.Store | None = None
) -> RankContext:
    for key, value in SAFE_ENV.items():
        os.environ.setdefault(key, value)
    if device_type == "cuda":
        # One GPU per task (srun --gpus-per-task, CUDA_VISIBLE_DEVICES bound per rank): it is cuda:0.
        index = 0 if torch.cuda.device_count() == 1 else local_rank
        torch.cuda.set_device(index)
        device = torch.device("cuda", index)
        dist.init_process_group(
            "nccl", rank=rank, world_size=world_size, timeout=collective_timeout(), device_id=device, store=store
        )
    else:
        device = torch.device("cpu")
        if "OMP_NUM_THREADS" not in os.environ:
            # CPU ranks share the host's cores, and idle OpenMP workers spin-wait: with torch's
            # default of a thread per core each rank starves the others (and a busy host starves
            # each rank), so round trips over gloo vary by orders of magnitude from one to the next.
            torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=collective_timeout(), store=store)
    return RankContext(rank, world_size, local_rank, device, None)


def _die_with_parent(parent: int) -> None:
    """End this rank when the process that spawned it ends, however it ends."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    else:

        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(1.0)
            os._exit(1)

        threading.Thread(target=watch, name="a2a-tune parent watch", daemon=True).start()
    if os.getppid() != parent:  # it died before the kernel was told
        os._exit(1)


def _is_echo(exc: BaseException, text: str) -> bool:
    return isinstance(exc, PeerFailed) or bool(_ECHO.search(text))


def _wait_for_listener(addr: str, port: int, deadline: float) -> bool:
    """Whether something accepts connections at addr:port before `deadline` (time.monotonic):
    asked with plain sockets, so an absent rendezvous costs one line, not the store's retries."""
    while True:
        try:
            with socket.create_connection((addr, port), timeout=max(0.1, min(2.0, deadline - time.monotonic()))):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)


def _join(job: JobRank, device_type: str) -> RankContext:
    """Meet the job's other ranks (bounded by rendezvous_timeout()), then make the process group."""
    _die_with_parent(os.getppid())  # torchrun's agent or slurmstepd: this rank ends with it
    addr, port = rendezvous_address()
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, str(port)
    seconds = rendezvous_timeout().total_seconds()
    where = f"rank {job.rank} of {job.world_size} ({job.launcher}): rendezvous at {addr}:{port}"
    hint = "(A2A_TUNE_RENDEZVOUS_TIMEOUT_S): is every rank started, and MASTER_ADDR/MASTER_PORT right and reachable?"
    # The store is served by rank 0, or by torchrun's agent on its first node; the others connect.
    client = job.rank != 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    if client and not _wait_for_listener(addr, port, time.monotonic() + seconds):
        raise RankFailed(f"{where}: nothing answers after {seconds:.0f} s {hint}")
    try:
        store, _, _ = next(
            dist.rendezvous("env://", rank=job.rank, world_size=job.world_size, timeout=rendezvous_timeout())
        )
        return _init(job.rank, job.world_size, job.local_rank, device_type, store)
    except Exception as exc:
        raise RankFailed(f"{where}: not every rank arrived within {seconds:.0f} s {hint} ({one_line(exc)})") from None


def _peer_lost(exc: BaseException) -> str | None:
    """What `exc` says when it means another rank of the job went away (its connection closed
    or a collective timed out), in a few words; None for any other error."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = re.sub(r"^\[[^\]]*\]\s*", "", text)  # gloo's "[.../pair.cc:553] " source location
    text = text.split(". ")[0].rstrip(".")
    if isinstance(exc, dist.DistError) or _is_echo(exc, text) or "timed out" in text.lower():
        return text or type(exc).__name__
    return None


def _rank_main(
    rank: int, world_size: int, device_type: str, port: int, fn: Callable, args: tuple, results, parent: int
) -> None:
    _die_with_parent(parent)
    os.dup2(2, 1)  # what a rank or a library it loads prints is a log line: stdout is the command's output
    sys.stdout = sys.stderr
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor handles Ctrl-C for every rank
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # and a closed terminal: the ranks die with it
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    try:
        ctx = _init(rank, world_size, rank, device_type)
    except BaseException as exc:
        results.put((rank, False, (one_line(exc), traceback.format_exc(), _is_echo(exc, str(exc)))))
        return
    try:
        value = fn(ctx, *args)
    except BaseException as exc:  # report first: peers learn of it when the group goes away
        results.put((rank, False, (one_line(exc), traceback.format_exc(), _is_echo(exc, str(exc)))))
    else:
        results.put((rank, True, value))
    finally:
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - the outcome is already reported
            pass


def _first_cause(failures: list[tuple[int, str, str, bool]]) -> tuple[int, str, str]:
    """The failure to report: the first that is not an echo of a peer's, else the first."""
    rank, line, tb, _ = next((f for f in failures if not f[3]), failures[0])
    return rank, line, tb


def _stop(procs: list) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():  # stuck in a driver call: SIGTERM is not enough
            p.kill()
    for p in procs:
        p.join()


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    device_type: str,
    *args: Any,
    stalled: Callable[[], str | None] | None = None,
) -> list[Any]:
    """Run `fn(ctx, *args)` on `world_size` ranks and return their results by rank.

    Under torchrun/srun (:func:`job_rank`) this process is one rank: it joins the job through
    the rendezvous and returns a list holding only its own result at its own index.
    Spawned ranks only: `stalled()` is polled every second; when it returns a reason, every
    rank is killed (a hung collective or kernel leaves nothing to recover in-process) and
    `RanksStalled` is raised with that reason. The timeouts the ranks read are checked here
    first (EnvError: one line naming the variable, before any rank starts).
    """
    collective_timeout(), rendezvous_timeout()
    job = job_rank()
    if job is not None:
        ctx = _join(job, device_type)
        out: list[Any] = [None] * job.world_size
        try:
            with _sigterm_as_interrupt():  # torchrun stopping the survivors: recorded as interrupted
                out[job.rank] = fn(ctx, *args)
        except Exception as exc:  # one line for the operator; the cause stays chained
            if lost := _peer_lost(exc):
                raise PeerLost(f"rank {job.rank}: lost contact with the job (a node or rank stopped?): {lost}") from exc
            raise RankFailed(f"rank {job.rank}: {one_line(exc)}") from exc
        finally:
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - a group whose peer is gone may not tear down cleanly
                pass
        return out

    _start_resource_tracker()
    mpctx = mp.get_context("spawn")
    results = mpctx.Queue()
    port = _free_port()
    parent = os.getpid()
    procs = [
        mpctx.Process(
            target=_rank_main, args=(r, world_size, device_type, port, fn, args, results, parent), daemon=False
        )
        for r in range(world_size)
    ]
    out = [None] * world_size
    failures: list[tuple[int, str, str, bool]] = []  # (rank, line, traceback, echo) in arrival order
    dead: dict[int, int] = {}  # rank -> exit code, of ranks whose process ended without reporting
    stall: str | None = None
    pending = set(range(world_size))

    def take(rank: int, ok: bool, value: Any) -> None:
        pending.discard(rank)
        if ok:
            out[rank] = value
        else:
            failures.append((rank, *value))

    with _sigterm_as_interrupt():
        try:
            for p in procs:
                p.start()
            grace_end = 0.0
            while pending and stall is None:
                if dead or failures and (any(not f[3] for f in failures) or time.monotonic() >= grace_end):
                    break  # the cause is known, or no rank had more to say than an echo
                try:
                    take(*results.get(timeout=0.2 if failures else 1.0))
                except queue.Empty:
                    # A rank that died without reporting (segfault, OOM kill) would otherwise hang us.
                    _find_dead(procs, pending, results, take, dead)
                    if not failures and not dead and stalled is not None:
                        stall = stalled()
                if failures and not grace_end:
                    grace_end = time.monotonic() + FIRST_ERROR_GRACE_S
            if failures and not dead:  # a peer's death is what the others report: look once more
                _find_dead(procs, pending, results, take, dead, wait=DEATH_NOTICE_S)
        finally:
            if failures or dead or stall is not None or pending:
                _stop(procs)
            else:
                for p in procs:
                    p.join()
    if stall is not None:
        raise RanksStalled(stall)
    if dead:  # the cause, whatever its peers said when it left them
        rank = next(iter(dead))
        raise RankCrashed(rank, dead[rank])
    if failures:
        rank, line, tb = _first_cause(failures)
        raise RankFailed(f"rank {rank}: {line}") from RuntimeError(tb)
    return out


# How long the supervisor waits, once a rank reported an error, for a peer's process to show
# that it ended (the error may be the peer's death seen through a closed connection).
DEATH_NOTICE_S = 0.5


def _find_dead(procs: list, pending: set, results, take: Callable, dead: dict, *, wait: float = 0.0) -> None:
    """Record in `dead` (rank -> exit code) the pending ranks whose process ended without a
    report, after `take`-ing whatever the queue still holds (a rank that reported just before
    it ended is not dead). Polls for up to `wait` seconds."""
    deadline = time.monotonic() + wait
    while True:
        ended = [r for r in sorted(pending) if procs[r].exitcode is not None]
        if ended:
            while True:  # its report, if it made one, is in the pipe by now
                try:
                    take(*results.get(timeout=0.05))
                except queue.Empty:
                    break
            for r in ended:
                if r in pending:
                    pending.discard(r)
                    dead[r] = procs[r].exitcode
            return
        if time.monotonic() >= deadline:
            return
        time.sleep(0.05)


def _start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (it unlinks the ranks' semaphores) with SIGHUP
    ignored: it ignores SIGINT and SIGTERM itself, but a closed terminal's SIGHUP to the whole
    process group would kill it and leak them (tracebacks from its relaunch)."""
    if threading.current_thread() is not threading.main_thread():
        return
    from multiprocessing import resource_tracker

    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        resource_tracker.ensure_running()
    finally:
        signal.signal(signal.SIGHUP, previous)


class Heartbeat:
    """A file in which rank 0 says what it is doing, for the spawning parent's watchdog:
    `run_ranks(..., stalled=heartbeat.stalled_after(s))` stops every rank once one item of
    work has run for `s` seconds, and `last()` then names that item. Other ranks may say
    what they are doing in their own file (`of_rank`), so the item a rank died in is known
    (:class:`RankCrashed`), whatever rank 0 went on to."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)

    def of_rank(self, rank: int) -> Heartbeat:
        """Rank `rank`'s heartbeat (rank 0's is this one)."""
        return self if rank == 0 else Heartbeat(f"{self.path}.rank{rank}")

    def beat(self, doing: dict[str, Any] | None, **facts: Any) -> None:
        """Rank 0: `doing` starts now (JSON-able; None: between items); `facts` are for the
        parent to read with `fact()` (e.g. the sweep's run id), not watched."""
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({**facts, "doing": doing, "since": time.time()}, f)
        os.replace(tmp, self.path)

    def _read(self) -> dict[str, Any]:
        try:
            return json.loads(Path(self.path).read_text())
        except (OSError, ValueError):
            return {}

    def last(self) -> dict[str, Any] | None:
        """What rank 0 said it was doing last (None: nothing, or between items)."""
        return self._read().get("doing")

    def fact(self, name: str) -> Any:
        """A fact rank 0 gave with its last beat, or None."""
        return self._read().get(name)

    def clear(self) -> None:
        """Forget what every rank said (the ranks restart)."""
        Path(self.path).unlink(missing_ok=True)
        for other in Path(self.path).parent.glob(Path(self.path).name + ".rank*"):
            other.unlink(missing_ok=True)

    def stalled_after(self, seconds: float) -> Callable[[], str | None]:
        def stalled() -> str | None:
            state = self._read()
            if state.get("doing") and time.time() - state["since"] > seconds:
                return f"{state['doing']} made no progress for {seconds:.0f} s"
            return None

        return stalled
