"""Write a run's table everywhere it belongs: where `lookup` looks on this node, and after a
multi-node job on every node.

`a2a-tune select` writes on this node (:func:`write_table`). `a2a-tune run` gives the sweep
:func:`publish_run` as the step after a completed run, on every rank: rank 0 builds the table from
the store (:func:`a2a_tune.tuner.select.profile_for_run`), and each node's local rank 0 writes
it. When the table is a cluster's (another fingerprint than the node's own), the node also gets
a pointer from its own fingerprint to the cluster's
(:data:`~a2a_tune.tuner.runtime.profiles.CLUSTER_POINTER_SUFFIX`). An engine on any node probes
only its own node, and the pointer leads it to the cluster's table.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from .launch import RankContext, one_line
from .probe import Topology
from .runtime.profiles import (
    add_cluster_pointer,
    parse_table_json,
    profile_filename,
    read_table_bytes,
    table_dir,
    table_lock,
)
from .runtime.table import Profile, ProfileError, parse_profile, to_dict
from .select import profile_for_run, write_profile_to
from .tables import merge

log = logging.getLogger("a2a_tune")

if TYPE_CHECKING:
    from .sweep import CompletedRun


def unwritable(directory: Path) -> str:
    """Why no table could be written into `directory` (created if missing), or "": checked
    by writing a file where it would go (its nearest existing ancestor), so a read-only mount
    is seen even by root, and by opening the tables' lock files there as the writer will
    (:class:`~a2a_tune.tuner.runtime.profiles.table_lock`). For `run`, before a sweep of
    hours ends in a table it cannot write."""
    existing = directory
    try:
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            return f"{existing} is not a directory"
    except OSError as exc:  # e.g. a name over the file system's 255 bytes ($A2A_TUNE_PROFILE_DIR)
        return f"cannot use it ({exc.strerror or exc})"
    try:
        fd, probe = tempfile.mkstemp(prefix=".a2a-tune-write-test-", dir=existing)
    except OSError as exc:
        return f"cannot write in {existing} ({exc.strerror or exc})"
    os.close(fd)
    os.unlink(probe)
    for lock in sorted(existing.glob(".*.json.lock")) if existing == directory else []:
        try:
            os.close(os.open(lock, os.O_RDONLY))  # as table_lock opens it
        except OSError as exc:
            return f"cannot open the lock file {lock} ({exc.strerror or exc})"
    return ""


def write_table(profile: Profile, out_dir: str | None, node_fingerprint: str | None = None) -> Path:
    """Write `profile` into :func:`~a2a_tune.tuner.runtime.profiles.table_dir` (:func:`merge_into_table`)
    and return the file's path."""
    return Path(merge_into_table(profile, out_dir, node_fingerprint).path)


def merge_into_table(profile: Profile, out_dir: str | None, node_fingerprint: str | None = None) -> Profile:
    """Write `profile` into :func:`~a2a_tune.tuner.runtime.profiles.table_dir`, merged with the
    table already there (:func:`a2a_tune.tuner.tables.merge`: a new run never drops the points,
    shapes and EP sizes it did not measure), under the directory's lock for that fingerprint,
    so two writers at once merge one after the other. Given this node's fingerprint, also
    point it at the table when the table is a cluster's. Returns the table written (its
    ``path`` the file). Raises ProfileError or OSError. A table on disk that does not load is
    never overwritten unread: it is moved to a name of its own (:func:`_set_aside`) with a
    warning, and the new table written alone."""
    directory = table_dir(out_dir)
    cluster = profile.fingerprint
    target = Path(directory) / profile_filename(cluster)
    with table_lock(directory, cluster):
        if os.path.lexists(target):
            try:
                old = parse_profile(parse_table_json(read_table_bytes(target), target), str(target))
                if old.fingerprint != cluster:
                    raise ValueError(f"it holds the table of {old.fingerprint}")
            except (OSError, ValueError) as exc:  # ProfileError and JSON errors are ValueErrors
                if isinstance(exc, ProfileError):
                    exc.path = None  # the warning names the file
                kept = _set_aside(target)
                log.warning("a2a-tune: %s does not load (%s); moved to %s, not merged", target, one_line(exc), kept)
            else:
                profile = merge(old, profile)
        path = write_profile_to(profile, target)
    if node_fingerprint is not None and cluster != node_fingerprint:
        add_cluster_pointer(directory, node_fingerprint, cluster)
    return profile._replace(path=str(path))


def _set_aside(target: Path) -> Path:
    """Move the table `target` (through a symlink: its file) to the first free
    ``<name>.unreadable[.N]`` beside it, never over an earlier one. Returns the new name."""
    real = Path(os.path.realpath(target))
    for n in range(1000):
        kept = real.with_name(f"{real.name}.unreadable" + (f".{n}" if n else ""))
        try:
            os.link(real, kept)  # fails if the name is taken: nothing is overwritten
        except FileExistsError:
            continue
        os.unlink(real)
        return kept
    raise OSError(f"{real}: 1000 unreadable tables beside it already; remove some")


def publish_run(ctx: RankContext, run: CompletedRun, out_dir: str | None = None) -> dict:
    """Collective, after a completed run (the sweep's `after` step, with `out_dir` bound by
    the caller): rank 0 builds the table from the store, every node (its local rank 0) writes
    it, into `out_dir` else where lookup looks there. Returns, on every rank: {"tables": host -> path written,
    "errors": host -> why not, "entries": shapes in the table, "kept_knobs", "note"}."""
    payload: list[Any] = [None]
    if ctx.rank == 0:
        try:
            profile, kept, note = profile_for_run(run.db_url, run.run_id)
            payload[0] = {"profile": to_dict(profile), "kept": kept, "note": note}
        except Exception as exc:  # every rank must learn of it, or they wait forever
            payload[0] = {"error": one_line(exc)}
    dist.broadcast_object_list(payload, src=0, group=ctx.group)
    built = payload[0]
    answer = None  # (written?, path or reason), from the ranks that write
    if "error" in built:
        answer = (False, built["error"])
    elif ctx.local_rank == 0:
        node = Topology.from_dict(run.view.reports[ctx.rank].topology).fingerprint
        try:
            answer = (True, str(write_table(parse_profile(built["profile"]), out_dir, node)))
        except Exception as exc:
            answer = (False, one_line(exc))
    answers: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(answers, answer, group=ctx.group)
    mine = [(run.view.reports[r].host, a) for r, a in enumerate(answers) if a is not None]
    return {
        "tables": {host: text for host, (ok, text) in mine if ok},
        "errors": {host: text for host, (ok, text) in mine if not ok},
        "entries": len(built.get("profile", {}).get("entries", [])),
        "kept_knobs": built.get("kept", 0),
        "note": built.get("note"),
    }
