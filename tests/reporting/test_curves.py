"""curves.csv / curves.png of a run, and `seedq plot`'s overlay of runs."""

from __future__ import annotations

import csv
import types

import pytest

from seedq.reporting import curves
from seedq.reporting.records import RunRecords


def _tick(frames, ret, loss=None, seconds=1.0):
    stats = types.SimpleNamespace(frames=frames, episodes=frames // 20, train_steps=frames // 640,
                                  mean_return=ret, mean_length=ret)
    metrics = {} if loss is None else {"loss/total": loss, "policy/entropy": 0.5}
    return types.SimpleNamespace(stats=stats, metrics=metrics, elapsed_seconds=seconds)


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.unit
def test_a_row_per_tick_keyed_by_frames_with_wall_time_apart(tmp_path):
    sink = curves.CurvesSink(str(tmp_path))
    sink.tick(_tick(1000, None, seconds=0.5))
    sink.tick(_tick(2000, 20.0, loss=0.25, seconds=1.25))
    sink.close()
    rows = _rows(tmp_path / "curves.csv")
    assert list(rows[0]) == list(curves.COLUMNS)
    assert [r["frames"] for r in rows] == ["1000", "2000"]
    assert rows[0]["return"] == "" and rows[0]["loss"] == ""
    assert rows[1]["return"] == "20" and rows[1]["loss"] == "0.25" and rows[1]["entropy"] == "0.5"
    assert [r["wall_seconds"] for r in rows] == ["0.5", "1.25"]
    assert (tmp_path / "curves.png").stat().st_size > 0


@pytest.mark.unit
def test_a_resumed_run_keeps_the_rows_up_to_its_checkpoint(tmp_path):
    sink = curves.CurvesSink(str(tmp_path))
    for frames in (1000, 2000, 3000):
        sink.tick(_tick(frames, 10.0))
    sink.close()
    resumed = curves.CurvesSink(str(tmp_path), resumed_frames=2000)
    resumed.tick(_tick(2500, 12.0))
    resumed.close()
    assert [r["frames"] for r in _rows(tmp_path / "curves.csv")] == ["1000", "2000", "2500"]
    fresh = curves.CurvesSink(str(tmp_path))  # a fresh run in the directory starts the file anew
    fresh.close()
    assert _rows(tmp_path / "curves.csv") == []


@pytest.mark.unit
def test_a_resume_that_fails_while_restarting_the_file_leaves_every_row(tmp_path, monkeypatch):
    """The resumed file's start replaces the old one in one rename: a failure
    midway (a full disk, a kill) leaves the old rows, not a truncated file."""
    sink = curves.CurvesSink(str(tmp_path))
    for frames in (1000, 2000, 3000):
        sink.tick(_tick(frames, 10.0))
    sink.flush()
    before = (tmp_path / "curves.csv").read_text()
    real_writerow, written = csv.DictWriter.writerow, []

    def writerow(self, row):
        if written:
            raise OSError(28, "No space left on device")
        written.append(row)
        return real_writerow(self, row)

    monkeypatch.setattr(csv.DictWriter, "writerow", writerow)
    with pytest.raises(OSError, match="No space left"):
        curves.CurvesSink(str(tmp_path), resumed_frames=2000)
    assert (tmp_path / "curves.csv").read_text() == before


@pytest.mark.unit
def test_plot_overlays_runs_and_names_a_directory_without_curves(tmp_path):
    for name, ret in (("a", 10.0), ("b", 30.0)):
        (tmp_path / name).mkdir()
        sink = curves.CurvesSink(str(tmp_path / name))
        sink.tick(_tick(1000, ret))
        sink.tick(_tick(2000, ret + 5))
        sink.close()
    out = curves.plot_runs([str(tmp_path / "a"), str(tmp_path / "b")], str(tmp_path / "both.png"))
    assert out.endswith("both.png") and (tmp_path / "both.png").stat().st_size > 0
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty: no curves.csv"):
        curves.plot_runs([str(tmp_path / "a"), str(tmp_path / "empty")], str(tmp_path / "x.png"))


@pytest.mark.unit
def test_seedq_plot_writes_the_overlay_or_names_what_is_missing(tmp_path, capsys):
    from seedq import cli

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        sink = curves.CurvesSink(str(tmp_path / name))
        sink.tick(_tick(1000, 10.0))
        sink.close()
    assert cli.main(["plot", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "ab.svg")]) == 0
    assert (tmp_path / "ab.svg").read_text().count("<svg") == 1
    assert cli.main(["plot", str(tmp_path / "a"), str(tmp_path), "--out", str(tmp_path / "x.png")]) == 2
    assert "no curves.csv" in capsys.readouterr().err


@pytest.mark.unit
def test_records_pass_every_call_to_every_sink():
    calls = []

    class Sink:
        def __init__(self, name):
            self.name = name

        def tick(self, tick):
            calls.append((self.name, "tick"))

        def evaluation(self, result, step):
            calls.append((self.name, "evaluation", step))

        def flush(self):
            calls.append((self.name, "flush"))

        def close(self):
            calls.append((self.name, "close"))

    records = RunRecords([Sink("tb"), Sink("csv")])
    records.tick(None)
    records.evaluation({}, 7)
    records.close()
    assert calls == [("tb", "tick"), ("csv", "tick"), ("tb", "evaluation", 7), ("csv", "evaluation", 7),
                     ("tb", "close"), ("csv", "close")]


@pytest.mark.unit
@pytest.mark.parametrize("frames, seconds", [(200_000_000, 60_000.0), (3_000_000, 100_000.0), (40_000, 90.0)])
def test_plot_ticks_stay_readable_on_long_runs(tmp_path, frames, seconds):
    """Short labels (50M, hours), no scientific offset to multiply by, and no two labels touching."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    sink = curves.CurvesSink(str(tmp_path))
    for i in range(1, 101):
        sink.tick(_tick(frames * i // 100, float(i), seconds=seconds * i / 100))
    sink.close()
    fig = curves.curves_figure([str(tmp_path)])
    renderer = FigureCanvasAgg(fig).get_renderer()
    for ax in fig.axes:
        low, high = ax.get_xlim()
        shown = [t for t, x in zip(ax.get_xticklabels(), ax.get_xticks()) if low <= x <= high and t.get_text()]
        assert 3 <= len(shown) <= 7, [t.get_text() for t in shown]
        assert ax.xaxis.get_offset_text().get_text() == ""
        assert all(len(t.get_text()) <= 5 for t in shown), [t.get_text() for t in shown]
        boxes = sorted((t.get_window_extent(renderer) for t in shown), key=lambda b: b.x0)
        assert all(a.x1 + 5 <= b.x0 for a, b in zip(boxes, boxes[1:])), [t.get_text() for t in shown]
    assert fig.axes[1].get_xlabel() == f"elapsed {curves.time_unit(seconds)[0]}"
