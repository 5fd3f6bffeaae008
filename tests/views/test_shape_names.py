"""A shape is named alike in every view, and never after a model that was not run: two presets
share E=256 k=8 H=7168 (deepseek-v3 and deepseek-v3.2), and a table does not record which of
them was measured, so a deepseek-v3 run is named by both, in show, diff and plot (issue 37)."""

from __future__ import annotations

import json
import re
from importlib.util import find_spec
from pathlib import Path

import pytest
from run_cli import a2a

from a2a_tune.tuner.runtime.point import shape_label

NAME = "deepseek-v3/deepseek-v3.2 E=256 k=8 H=7168 · bf16 · uniform · EP 2"


@pytest.fixture(scope="module")
def deepseek_run(tmp_path_factory) -> tuple[Path, Path]:
    """A deepseek-v3 run on 2 CPU ranks (one backend, one token count): its store and table."""
    where = tmp_path_factory.mktemp("deepseek")
    db = f"sqlite:///{where / 'runs.db'}"
    r = a2a(
        *("run", "--device", "cpu", "--world", "2", "--preset", "deepseek-v3", "--tokens", "1"),
        *("--backend", "nccl_all2allv", "--db", db, "--out", str(where / "out")),
    )
    assert r.returncode == 0, r.stderr
    (table,) = (where / "out").glob("*.json")
    return where / "runs.db", table


def test_the_one_label_names_every_part_it_is_given():
    assert shape_label(256, 8, 7168) == "E=256 k=8 H=7168"
    assert (
        shape_label(256, 8, 7168, "bf16", "uniform", 2, models=("a", "b"))
        == "a/b E=256 k=8 H=7168 · bf16 · uniform · EP 2"
    )


def test_show_names_a_deepseek_v3_run_by_both_presets_of_its_shape(deepseek_run):
    db, table = deepseek_run
    for source in (("--profile", str(table)), ("--db", str(db))):
        out = a2a("show", *source).stdout
        assert NAME in out, out
        assert not re.search(r"(?<!/)deepseek-v3\.2 E=", out)  # never the other model alone


def test_diff_names_it_alike(deepseek_run, tmp_path):
    _, table = deepseek_run
    slower = json.loads(table.read_text())
    curve = slower["entries"][0]["backends"]["nccl_all2allv"]
    median = curve["median_us"]
    for key in ("median_us", "p10_us", "p90_us"):  # 10x slower, beyond any noise
        curve[key] = [v * 10 for v in median]
    b = tmp_path / "b.json"
    b.write_text(json.dumps(slower))
    out = a2a("diff", str(table), str(b)).stdout
    assert NAME in out, out


@pytest.mark.skipif(find_spec("matplotlib") is None, reason="matplotlib not installed (a2a-tune[plot])")
def test_plot_titles_it_alike(deepseek_run, tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    from a2a_tune.tuner.views.load import load_view
    from a2a_tune.tuner.views.plot import plot_view

    _, table = deepseek_run
    titles = []
    original = Figure.suptitle
    monkeypatch.setattr(Figure, "suptitle", lambda self, t, **kw: titles.append(t) or original(self, t, **kw))
    plot_view(load_view(profile=str(table)), tmp_path)
    assert titles == [NAME]
