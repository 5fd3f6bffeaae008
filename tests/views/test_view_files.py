"""Where `plot` and `report` write (issue 30): where the user points them, by default under the
directory tables are written to, never into the current directory unasked; and a CPU
rehearsal's pictures say that they are one."""

from __future__ import annotations

import pytest
from paths import FIXTURES, REPO
from run_cli import a2a

pytest.importorskip("matplotlib")

CPU_TABLE = FIXTURES / "diff" / "cpu_pair_a.json"  # `a2a-tune run --device cpu`: a rehearsal
H200 = REPO / "profiles" / "h200.nvl18x2.node1.json"


def png_text(data: bytes) -> dict:
    """The tEXt chunks of a PNG file's bytes."""
    import struct

    chunks, at = {}, 8
    while at < len(data):
        (size,), kind = struct.unpack(">I", data[at : at + 4]), data[at + 4 : at + 8]
        if kind == b"tEXt":
            key, _, value = data[at + 8 : at + 8 + size].partition(b"\0")
            chunks[key.decode()] = value.decode("latin-1")
        at += 12 + size
    return chunks


def test_plot_and_report_write_beside_the_tables_not_in_the_current_directory(tmp_path):
    cwd, data = tmp_path / "clone", tmp_path / "data"
    cwd.mkdir()
    env = {"A2A_TUNE_PROFILE_DIR": str(data)}
    r = a2a("plot", "--profile", str(CPU_TABLE), env_extra=env, cwd=cwd)
    assert r.returncode == 0, r.stderr
    [png] = (data / "plots").iterdir()
    assert r.stdout.split() == [str(png)]
    r = a2a("report", "--profile", str(CPU_TABLE), env_extra=env, cwd=cwd)
    assert r.returncode == 0, r.stderr
    [html] = (data / "reports").iterdir()
    assert html.name == "a2a-tune-report.cpu-x86_64.node1.html" and str(html) in r.stdout
    assert list(cwd.iterdir()) == []
    # where the user points them
    out = tmp_path / "mine" / "r.html"
    assert a2a("report", "--profile", str(CPU_TABLE), "--out", str(out), env_extra=env, cwd=cwd).returncode == 0
    assert out.is_file() and list(cwd.iterdir()) == []


def test_a_rehearsals_pictures_carry_its_label(tmp_path):
    from a2a_tune.tuner.views.load import load_profile_view
    from a2a_tune.tuner.views.plot import plot_view, rehearsal_label

    cpu, gpu = load_profile_view(CPU_TABLE), load_profile_view(H200)
    assert rehearsal_label(cpu) and rehearsal_label(gpu) is None
    [png] = plot_view(cpu, tmp_path / "cpu")
    assert png_text(png.read_bytes())["Description"] == rehearsal_label(cpu)
    first = plot_view(gpu, tmp_path / "gpu")[0]
    assert "rehearsal" not in png_text(first.read_bytes())["Description"]
