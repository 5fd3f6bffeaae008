"""Virtual ranks at wide EP (issue 27): a case the shape cannot take is skipped with the reason,
every case is sized to one device's free memory or refused before allocating, and the world
limit is memory's, not a constant's."""

from __future__ import annotations

import pytest

from a2a_tune.kernels import get_backend
from a2a_tune.kernels.virtual import VirtualWorld
from a2a_tune.tuner import check as check_mod
from a2a_tune.tuner.check import Case, fit_virtual_case, virtual_case_bytes
from a2a_tune.tuner.plans import PlanError, resolve_virtual
from a2a_tune.tuner.shapes import ModelShape

NVL72 = ModelShape("nvl72", 288, 8, 7168)  # 288 experts, top-8, hidden 7168: 4 experts per rank at W = 72
ONE_SIDED = get_backend("nvlink_one_sided")
REPEATED = Case("repeated", (1024,), calls=3)


def test_a_world_of_72_virtual_ranks_is_accepted_and_memory_is_the_limit():
    assert resolve_virtual("cpu", 72) == ("cpu", 72)
    assert VirtualWorld(72, "cpu").size == 72
    with pytest.raises(PlanError, match="--world must be 2..1024 with --virtual"):
        resolve_virtual("cpu", 1)


def test_a_case_is_shrunk_to_fit_or_refused_saying_the_bytes_it_needs():
    need = virtual_case_bytes(ONE_SIDED, NVL72, REPEATED, 72)
    assert need > 100 * 2**30  # 72 ranks x 72 x 1024 received rows of 7168: far beyond one GPU
    assert fit_virtual_case(ONE_SIDED, NVL72, REPEATED, 72, need) == (REPEATED, "")
    fitted, note = fit_virtual_case(ONE_SIDED, NVL72, REPEATED, 72, need // 3)
    assert fitted.tokens == (256,) and note.startswith("token counts x0.25 to fit one device: ")
    assert virtual_case_bytes(ONE_SIDED, NVL72, fitted, 72) <= need // 3
    fitted, note = fit_virtual_case(ONE_SIDED, NVL72, REPEATED, 72, 2**20)
    assert fitted is None and note == f"needs {need / 2**30:.1f} GiB on one device for 72 virtual ranks, 0.0 GiB free"


def test_a_case_the_shape_cannot_take_is_skipped_and_one_that_cannot_fit_is_refused_before_allocating(monkeypatch):
    world = VirtualWorld(72, "cpu")
    row = check_mod._check_case_virtual(world, "nvlink_one_sided", NVL72, Case("local", (64,), routing="local"), 0)
    assert (row.status, row.reason) == ("skip", "'local' routing needs topk 8 <= the 4 experts of one rank")

    def no_allocation(*args, **kwargs):
        raise AssertionError("allocated for a case that cannot fit")

    monkeypatch.setattr(check_mod, "device_free_bytes", lambda device: 2**20)
    monkeypatch.setattr(world, "build", no_allocation)
    row = check_mod._check_case_virtual(world, "nvlink_one_sided", NVL72, REPEATED, 0)
    assert row.status == "skip" and row.reason.startswith("needs ") and "for 72 virtual ranks" in row.reason
