"""Which table (runtime/profiles.py): the file name a fingerprint's table has, the search
path and its order, cluster pointers and tables of the same GPU domain, the hardware check,
loading and its cache -- and that a table or a place on the search path that cannot be read
is reported with one warning, never skipped."""

from __future__ import annotations

import builtins
import errno
import json
import logging
import os
import time
from pathlib import Path

import pytest
from hangs import bounded
from lookups import FIXTURE, FIXTURES, FP, A, B, fixture_data, variant, warnings_of, write

from a2a_tune.tuner.runtime import fingerprint as fingerprint_module
from a2a_tune.tuner.runtime import profiles
from a2a_tune.tuner.runtime.files import MAX_TABLE_BYTES
from a2a_tune.tuner.runtime.lookup import FALLBACK_BACKEND, lookup
from a2a_tune.tuner.runtime.measurement import Measurement
from a2a_tune.tuner.runtime.profiles import (
    add_cluster_pointer,
    clear_cache,
    find_profile,
    load_profile,
    profile_filename,
    profile_search_paths,
)
from a2a_tune.tuner.runtime.table import Profile, ProfileError, to_json
from a2a_tune.tuner.select import build_profile, write_profile

# --------------------------------------------------------------- naming and search order


def test_profile_filename_is_the_shared_key():
    assert profile_filename("h200-sxm.nvl18x2.node1") == "h200-sxm.nvl18x2.node1.json"
    assert profile_filename("H200.NVL18x2.Node1") == "h200.nvl18x2.node1.json"
    for bad in ["", "../etc/passwd", "a b", ".hidden", "a/b", "x" * 201, None]:
        with pytest.raises(ValueError):
            profile_filename(bad)


def test_fingerprints_with_plus_are_valid_keys():
    # The probe joins GPU models / island shapes with '+': such machines must have tables too.
    assert profile_filename("h100-sxm+l40s.nvl18x4+pciex2.node1") == "h100-sxm+l40s.nvl18x4+pciex2.node1.json"
    from a2a_tune.tuner.runtime.fingerprint import domain_key

    assert domain_key("h100-sxm+l40s.nvl18x4+pciex2.node1") == ("h100-sxm+l40s", "nvl18x4+pciex2")
    assert domain_key("l40s.pciex4.node1") is None  # no NVLink domain
    assert domain_key("cpu-x86_64.node1") is None
    assert domain_key("gb200.mnnvl18x16.nodes4") == ("gb200", "mnnvl18x16")


def test_search_paths_env_dirs_first_then_user_then_packaged(monkeypatch, tmp_path):
    import importlib.resources

    packaged = Path(os.fspath(importlib.resources.files("a2a_tune.profiles")))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    user = tmp_path / "xdg" / "a2a-tune" / "profiles"
    assert profile_search_paths() == [user, packaged]
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", os.pathsep.join([str(tmp_path / "a"), "", str(tmp_path / "b")]))
    assert profile_search_paths() == [tmp_path / "a", tmp_path / "b", user, packaged]


def test_env_dir_beats_packaged_and_earlier_env_dir_wins(monkeypatch, tmp_path):
    pkg, env1, env2 = (tmp_path / n for n in ("pkg", "env1", "env2"))
    for d in (pkg, env1, env2):
        d.mkdir()
    write(pkg, variant("allgather_reducescatter"))
    write(env2, variant("nccl_all2allv"))
    monkeypatch.setattr(profiles, "_packaged_dir", lambda: str(pkg))

    assert lookup(fingerprint=FP, tokens=1024, **B).source == str(pkg / f"{FP}.json")
    assert lookup(fingerprint=FP, tokens=1024, **B).backend == "allgather_reducescatter"

    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", os.pathsep.join([str(env1), str(env2)]))
    c = lookup(fingerprint=FP, tokens=1024, **B)
    assert (c.source, c.backend) == (str(env2 / f"{FP}.json"), "nccl_all2allv")  # env1 has none

    write(env1, variant("allgather_reducescatter"))
    assert lookup(fingerprint=FP, tokens=1024, **B).source == str(env1 / f"{FP}.json")
    assert find_profile(FP) == env1 / f"{FP}.json"


def test_missing_profile_warns_once_listing_every_path(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", os.pathsep.join([str(tmp_path / "a"), str(tmp_path / "b")]))
    for _ in range(3):
        c = lookup(fingerprint="no.such.machine", tokens=8, **A)
        assert (c.backend, c.match, c.source) == (FALLBACK_BACKEND, "fallback", None)
    assert find_profile("no.such.machine") is None
    (rec,) = warnings_of(caplog)
    msg = rec.getMessage()
    for d in profile_search_paths():
        assert str(d / "no.such.machine.json") in msg
    assert "no profile for fingerprint 'no.such.machine'" in msg and FALLBACK_BACKEND in msg
    assert "\n" not in msg


def test_distinct_problems_each_warn_once(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", str(tmp_path))
    lookup(fingerprint="machine.one", tokens=1, **A)
    lookup(fingerprint="machine.two", tokens=1, **A)
    lookup(fingerprint="machine.one", tokens=1, **A)
    assert len(warnings_of(caplog)) == 2


# ------------------------------------------------------------ this machine's fingerprint


def test_fingerprint_from_env_then_probe(monkeypatch, fixture_dir, caplog):
    monkeypatch.setenv("A2A_TUNE_FINGERPRINT", FP)
    assert lookup(tokens=64, **A).match == "exact"

    monkeypatch.delenv("A2A_TUNE_FINGERPRINT")
    calls = []  # the probe's child (tests/runtime/test_fingerprint.py), standing in
    monkeypatch.setattr(fingerprint_module, "_probe_child", lambda timeout_s: calls.append(timeout_s) or FP)
    assert lookup(tokens=64, **A).match == "exact"
    assert lookup(tokens=8, **A).match == "exact"
    assert len(calls) == 1  # probed once
    assert 0 < calls[0] <= 10  # a hung NVML delays start-up by seconds, not a minute
    assert warnings_of(caplog) == []


def test_probe_failure_falls_back_with_one_warning(monkeypatch, caplog):
    def probe_child(timeout_s):
        raise fingerprint_module.ProbeError("the probe exited with code 1: NvmlQueryError: Unknown: boom")

    monkeypatch.setattr(fingerprint_module, "_probe_child", probe_child)
    for _ in range(2):
        c = lookup(tokens=64, **A)
        assert (c.backend, c.match) == (FALLBACK_BACKEND, "fallback")
    (rec,) = warnings_of(caplog)
    assert "hardware probe failed (ProbeError: the probe exited with code 1: NvmlQueryError: Unknown: boom)" in (
        rec.getMessage()
    )


# ----------------------------------------------------------------------- hardware levels


def _as_machine(tmp_path, fingerprint: str) -> Path:
    data = fixture_data()
    data["hardware"]["fingerprint"] = fingerprint
    return write(tmp_path, data, f"{fingerprint}.json")


def test_explicit_profile_checks_fingerprint_only_when_given(caplog):
    assert lookup(profile=str(FIXTURE), tokens=64, **A).match == "exact"
    assert lookup(profile=FIXTURE, fingerprint=FP, tokens=64, **A).match == "exact"
    c = lookup(profile=FIXTURE, fingerprint="other.machine", tokens=64, **A)
    assert c.match == "fallback"
    (rec,) = warnings_of(caplog)
    assert "profile is for 'test.fixture.node1', this machine is 'other.machine'" in rec.getMessage()


def test_same_gpus_and_nvlink_domain_on_more_nodes_borrow_the_table(tmp_path, monkeypatch, caplog):
    _as_machine(tmp_path, "h200.nvl18x2.node1")
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", str(tmp_path))
    exact = lookup(fingerprint="h200.nvl18x2.node1", tokens=64, **A)
    assert (exact.hardware_match, exact.match, exact.backend) == ("exact", "exact", "nvlink_one_sided")

    borrowed = lookup(fingerprint="h200.nvl18x2.nodes2", tokens=64, **A)
    assert (borrowed.hardware_match, borrowed.match, borrowed.backend) == (
        "same-gpu-domain",
        "exact",
        "nvlink_one_sided",
    )
    assert borrowed.profile_fingerprint == "h200.nvl18x2.node1"
    assert "(measured on h200.nvl18x2.node1: same GPUs and NVLink domain as h200.nvl18x2.nodes2)" in borrowed.reason
    # EP across the two nodes: the one-node table has no such entry -> engine default.
    wide = lookup(fingerprint="h200.nvl18x2.nodes2", tokens=64, **{**A, "ep_size": 4})
    assert (wide.match, wide.hardware_match) == ("fallback", "same-gpu-domain")
    assert warnings_of(caplog)[0].getMessage().count("no entry for ep_size=4") == 1


@pytest.mark.parametrize(
    "machine",
    [
        "h200.nvl18x2-degraded.nodes2",  # a dead link never borrows a healthy table
        "h200.nvl18x4.node1",  # another NVLink domain size
        "h200.nvl12x2.node1",  # other links per GPU
        "h100-sxm.nvl18x2.node1",  # another GPU model
        "cpu-x86_64.nodes2",  # no NVLink domain at all
    ],
)
def test_other_hardware_falls_back_to_the_engine_default(machine, tmp_path, monkeypatch, caplog):
    _as_machine(tmp_path, "h200.nvl18x2.node1")
    _as_machine(tmp_path, "cpu-x86_64.node1")
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", str(tmp_path))
    c = lookup(fingerprint=machine, tokens=64, **A)
    assert (c.backend, c.match, c.hardware_match) == (FALLBACK_BACKEND, "fallback", "engine-default")
    (rec,) = warnings_of(caplog)
    assert f"no profile for fingerprint {machine!r}" in rec.getMessage()


def test_same_domain_prefers_closest_node_count_and_search_order(tmp_path, monkeypatch):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    _as_machine(second, "h200.nvl18x2.nodes4")
    _as_machine(first, "h200.nvl18x2.node1")
    _as_machine(first, "h200.nvl18x2.nodes8")
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", os.pathsep.join([str(first), str(second)]))
    c = lookup(fingerprint="h200.nvl18x2.nodes4", tokens=64, **A)
    assert (c.hardware_match, c.source) == ("exact", str(second / "h200.nvl18x2.nodes4.json"))
    c = lookup(fingerprint="h200.nvl18x2.nodes6", tokens=64, **A)
    # The first directory with a candidate wins; in it the closest node count (8 vs 1).
    assert (c.hardware_match, c.source) == ("same-gpu-domain", str(first / "h200.nvl18x2.nodes8.json"))
    # A new table in a searched directory is seen (directories are re-listed when they change).
    _as_machine(first, "h200.nvl18x2.nodes6")
    os.utime(first, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    assert lookup(fingerprint="h200.nvl18x2.nodes6", tokens=64, **A).hardware_match == "exact"


def test_explicit_profile_of_the_same_domain_is_accepted_and_named(tmp_path):
    p = _as_machine(tmp_path, "h200.nvl18x2.node1")
    c = lookup(profile=p, fingerprint="h200.nvl18x2.nodes2", tokens=64, **A)
    assert (c.hardware_match, c.backend) == ("same-gpu-domain", "nvlink_one_sided")
    assert lookup(profile=p, tokens=64, **A).hardware_match == "unchecked"


def test_a_file_named_for_this_machine_with_a_sibling_table_inside_is_refused(tmp_path, monkeypatch, caplog):
    # h200.nvl18x2.nodes2.json holding the node1 table: a mislabelled file, not a borrowed table.
    data = fixture_data()
    data["hardware"]["fingerprint"] = "h200.nvl18x2.node1"
    write(tmp_path, data, "h200.nvl18x2.nodes2.json")
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", str(tmp_path))
    c = lookup(fingerprint="h200.nvl18x2.nodes2", tokens=64, **A)
    assert (
        c.match == "fallback"
        and "profile is for 'h200.nvl18x2.node1', this machine is 'h200.nvl18x2.nodes2'" in c.reason
    )


def _table(fingerprint: str, ep_size: int, fastest: str, tmp_path) -> Profile:
    rows = []
    for backend, us in ((fastest, 10.0), ("allgather_reducescatter", 20.0)):
        for tokens in (1, 64):
            rows.append(
                dict(
                    backend=backend,
                    ep_size=ep_size,
                    hidden=64,
                    topk=2,
                    num_experts=8,
                    dtype="bf16",
                    routing="uniform",
                    tokens_per_rank=tokens,
                    timing="eager",
                    median_us=us * tokens,
                    p10_us=us * tokens * 0.99,
                    p90_us=us * tokens * 1.01,
                )
            )
    names = {b: {"vllm_name": None, "sglang_name": None} for b in (fastest, "allgather_reducescatter")}
    return build_profile(
        [Measurement.from_columns(r) for r in rows],
        [],
        hardware={"fingerprint": fingerprint, "facts_hash": "x", "facts": {}},
        run={"id": 1, "device_type": "cuda", "world_size": ep_size, "versions": {}},
        backend_names=names,
    )


def _ask(ep_size: int, fingerprint: str = "gb200.nvl18x4.node1"):
    return lookup(ep_size=ep_size, hidden=64, topk=2, num_experts=8, tokens=8, fingerprint=fingerprint)


def test_a_node_answers_its_own_ep_sizes_from_its_table_and_the_jobs_from_its_clusters(tmp_path, monkeypatch):
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", str(tmp_path))
    clear_cache()
    write_profile(_table("gb200.nvl18x4.node1", 4, "nccl_all2allv", tmp_path), tmp_path)
    write_profile(_table("gb200.mnnvl18x8.nodes2", 8, "nvlink_one_sided", tmp_path), tmp_path)
    assert _ask(8).match == "fallback"  # no pointer yet: the node does not know it was part of that job
    add_cluster_pointer(tmp_path, "gb200.nvl18x4.node1", "gb200.mnnvl18x8.nodes2")
    inside, across = _ask(4), _ask(8)
    assert (inside.backend, inside.hardware_match) == ("nccl_all2allv", "exact")
    assert (across.backend, across.hardware_match) == ("nvlink_one_sided", "cluster")
    assert across.profile_fingerprint == "gb200.mnnvl18x8.nodes2" and "this node among them" in across.reason
    assert _ask(16).match == "fallback" and "no entry for ep_size=16" in _ask(16).reason  # neither has it
    # Several jobs: newest first, each answering its own EP sizes.
    write_profile(_table("gb200.mnnvl18x16.nodes4", 16, "nccl_all2allv", tmp_path), tmp_path)
    add_cluster_pointer(tmp_path, "gb200.nvl18x4.node1", "gb200.mnnvl18x16.nodes4")
    pointer = json.loads((tmp_path / "gb200.nvl18x4.node1.cluster").read_text())
    assert pointer == {"clusters": ["gb200.mnnvl18x16.nodes4", "gb200.mnnvl18x8.nodes2"]}
    assert (_ask(16).hardware_match, _ask(8).profile_fingerprint) == ("cluster", "gb200.mnnvl18x8.nodes2")


def test_a_cluster_pointer_never_makes_a_wrong_table_answer(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", str(tmp_path))
    clear_cache()
    impostor = _table("h200.nvl18x2.nodes2", 8, "nvlink_one_sided", tmp_path)
    (tmp_path / "gb200.mnnvl18x8.nodes2.json").write_text(to_json(impostor))  # named for another
    add_cluster_pointer(tmp_path, "gb200.nvl18x4.node1", "gb200.mnnvl18x8.nodes2")
    choice = _ask(8)
    assert choice.match == "fallback" and "the file is named for 'gb200.mnnvl18x8.nodes2'" in choice.reason
    (tmp_path / "gb200.nvl18x4.node1.cluster").write_text("{not json")
    clear_cache()
    with caplog.at_level(logging.WARNING, logger="a2a_tune"):
        assert _ask(8).match == "fallback"
    assert any("not a cluster pointer" in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------------------------- loading


def test_unreadable_file_chmod_000(tmp_path, monkeypatch, caplog):
    p = write(tmp_path, FIXTURE.read_text())
    p.chmod(0)
    try:
        if os.access(p, os.R_OK):
            pytest.skip("running as root: chmod 000 does not make the file unreadable")
        monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", str(tmp_path))
        c = lookup(fingerprint=FP, tokens=64, **A)
        assert (c.backend, c.match) == (FALLBACK_BACKEND, "fallback")
        (rec,) = warnings_of(caplog)
        assert str(p) in rec.getMessage() and "cannot read" in rec.getMessage()
    finally:
        p.chmod(0o644)


def test_unreadable_file_open_fails(tmp_path, monkeypatch, caplog):
    """Same as chmod 000, but also runs as root: opening raises PermissionError."""
    p = write(tmp_path, FIXTURE.read_text())

    def denying(real):
        def deny(file, *a, **k):
            if os.fspath(file) == str(p):
                raise PermissionError(13, "Permission denied", str(p))
            return real(file, *a, **k)

        return deny

    monkeypatch.setattr(builtins, "open", denying(builtins.open))
    monkeypatch.setattr(os, "open", denying(os.open))
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", str(tmp_path))
    c = lookup(fingerprint=FP, tokens=64, **A)
    assert (c.backend, c.match) == (FALLBACK_BACKEND, "fallback")
    (rec,) = warnings_of(caplog)
    assert f"{p}: cannot read: Permission denied" in rec.getMessage()


def test_packaged_table_loads_and_answers():
    import importlib.resources

    packaged = Path(os.fspath(importlib.resources.files("a2a_tune.profiles")))
    for p in packaged.glob("*.json"):
        if p.name.startswith("schema-"):
            continue
        prof = load_profile(p)
        e = prof.entries[0]
        c = lookup(fingerprint=prof.fingerprint, tokens=e.tokens[0], **e.shape._asdict())
        assert c.match == "exact" and c.source == str(p), c.reason


def test_loading_restores_the_garbage_collector(tmp_path):
    import gc

    assert gc.isenabled()
    load_profile(FIXTURE)
    with pytest.raises(ProfileError):
        load_profile(write(tmp_path, "{not json"))
    assert gc.isenabled()
    gc.disable()
    try:
        clear_cache()
        load_profile(FIXTURE)
        assert not gc.isenabled()  # an engine that runs without the GC keeps it off
    finally:
        gc.enable()


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "oversized"])
def test_an_explicit_profile_that_is_no_table_falls_back_at_once(kind, fifo, tmp_path, caplog):
    path = {"fifo": fifo, "/dev/zero": Path("/dev/zero"), "oversized": tmp_path / "huge.json"}[kind]
    if kind == "oversized":
        with open(path, "wb") as f:
            f.truncate(MAX_TABLE_BYTES + 1)  # sparse: no disk, no time
    start = time.monotonic()
    c = bounded(lambda: lookup(profile=path, tokens=64, **A))
    assert time.monotonic() - start < 5
    assert (c.backend, c.match) == (FALLBACK_BACKEND, "fallback")
    (warning,) = warnings_of(caplog)
    expected = "16 MiB cap" if kind == "oversized" else "not a regular file"
    assert expected in warning.getMessage() and str(path) in warning.getMessage()


def test_a_fifo_on_the_search_path_is_reported_not_read(tmp_path, monkeypatch, caplog):
    os.mkfifo(tmp_path / f"{FP}.json")
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", str(tmp_path))
    c = bounded(lambda: lookup(fingerprint=FP, tokens=64, **A))
    assert c.match == "fallback"
    (warning,) = warnings_of(caplog)
    assert f"{tmp_path / FP}.json" in warning.getMessage() and "FIFO" in warning.getMessage()


# ------------------------------------------------------------- a broken override never hides


def _override_and_user_table(tmp_path, monkeypatch) -> tuple:
    """$A2A_TUNE_PROFILE_DIR = override/, and a good table for FP in the user's directory
    after it: what a broken override would otherwise silently fall through to."""
    override = tmp_path / "override"
    override.mkdir()
    user = Path(profiles.user_profile_dir())
    user.mkdir(parents=True)
    write(user, fixture_data())
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", str(override))
    assert lookup(fingerprint=FP, tokens=64, **A).source == str(user / f"{FP}.json")  # what it hides
    clear_cache()
    return override, user


@pytest.mark.parametrize(
    "make, problem",
    [
        (lambda d: (d / f"{FP}.json").symlink_to(d / "gone.json"), "a dangling symbolic link (to "),
        (lambda d: (d / f"{FP}.json").symlink_to(d / f"{FP}.json"), "a symbolic link loop"),
        (
            lambda d: (
                (d / "a.json").symlink_to(d / "b.json"),
                (d / "b.json").symlink_to(d / "a.json"),
                (d / f"{FP}.json").symlink_to(d / "a.json"),
            ),
            "a symbolic link loop",
        ),
    ],
    ids=["dangling", "loop", "loop-of-two"],
)
def test_a_broken_link_in_the_override_is_reported_not_skipped(make, problem, tmp_path, monkeypatch, caplog):
    override, _ = _override_and_user_table(tmp_path, monkeypatch)
    make(override)
    for _ in range(2):
        c = lookup(fingerprint=FP, tokens=64, **A)
        assert (c.backend, c.match, c.source) == (FALLBACK_BACKEND, "fallback", str(override / f"{FP}.json"))
    (rec,) = warnings_of(caplog)
    msg = rec.getMessage()
    assert f"{override / FP}.json: cannot read: {problem}" in msg and FALLBACK_BACKEND in msg
    assert find_profile(FP) == override / f"{FP}.json"  # found, and loading it says why it is no table


def test_an_override_directory_that_is_a_dangling_link_is_reported(tmp_path, monkeypatch, caplog):
    override, _ = _override_and_user_table(tmp_path, monkeypatch)
    override.rmdir()
    override.symlink_to(tmp_path / "unmounted")
    c = lookup(fingerprint=FP, tokens=64, **A)
    assert c.match == "fallback"
    (rec,) = warnings_of(caplog)
    assert f"{override}: cannot read: a dangling symbolic link (to " in rec.getMessage()


def _deny(monkeypatch, directory: Path, call: str = "stat"):
    """os.<call> of anything in ``directory`` raises PermissionError, as for a directory the
    user may not search (chmod 000 does not stop root, who runs these tests in CI)."""
    real = getattr(os, call)

    def denied(path, *args, **kwargs):
        if os.fspath(path).startswith(str(directory)):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, call, denied)


def test_a_directory_that_cannot_be_searched_is_a_permission_error_not_no_profile(tmp_path, monkeypatch, caplog):
    override, _ = _override_and_user_table(tmp_path, monkeypatch)
    _deny(monkeypatch, override)
    c = lookup(fingerprint=FP, tokens=64, **A)
    assert (c.match, c.source) == ("fallback", str(override / f"{FP}.json"))
    (rec,) = warnings_of(caplog)
    msg = rec.getMessage()
    assert f"{override / FP}.json: cannot read: Permission denied" in msg and "no profile" not in msg


def test_a_directory_that_cannot_be_listed_hides_no_table_of_the_same_domain(tmp_path, monkeypatch, caplog):
    override, user = tmp_path / "override", Path(profiles.user_profile_dir())
    override.mkdir()
    user.mkdir(parents=True)
    data = fixture_data()
    data["hardware"]["fingerprint"] = "h200.nvl18x2.node1"
    write(user, data, "h200.nvl18x2.node1.json")
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", str(override))
    assert lookup(fingerprint="h200.nvl18x2.nodes2", tokens=64, **A).hardware_match == "same-gpu-domain"
    clear_cache()
    _deny(monkeypatch, override, "scandir")
    c = lookup(fingerprint="h200.nvl18x2.nodes2", tokens=64, **A)
    assert (c.match, c.source) == ("fallback", str(override))
    (rec,) = warnings_of(caplog)
    assert f"{override}: cannot read: Permission denied" in rec.getMessage()


def test_a_broken_cluster_pointer_is_named_in_a_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", str(tmp_path))
    (tmp_path / "gb200.nvl18x4.node1.cluster").symlink_to(tmp_path / "gone")
    assert _ask(8).match == "fallback"
    assert any(
        "gb200.nvl18x4.node1.cluster: cannot read: a dangling symbolic link" in r.getMessage()
        and "not a cluster pointer" in r.getMessage()
        for r in warnings_of(caplog)
    )


def test_a_missing_directory_on_the_search_path_holds_no_table(tmp_path, monkeypatch, caplog):
    # Nothing broken: the user's directory does not exist before the first run.
    monkeypatch.setenv("A2A_TUNE_PROFILE_DIR", os.pathsep.join([str(tmp_path / "absent"), str(FIXTURES)]))
    c = lookup(fingerprint=FP, tokens=64, **A)
    assert (c.match, c.source) == ("exact", str(FIXTURES / f"{FP}.json"))
    assert warnings_of(caplog) == []
