"""Sweep plots and the sweep report, from records made up to known values."""

from __future__ import annotations

import pytest

from hlo_audit._src.sweep import plots
from hlo_audit._src.sweep import report
from hlo_audit._src.sweep.grid import GridError

PIL = pytest.importorskip("PIL.Image")
pytest.importorskip("matplotlib")


def rec(i, seq, dtype, *, saved, status="ok", speedup=None, step=None):
  r = {"id": f"p{i}", "target": "example", "status": status,
       "params": {"batch": 1, "seq": seq, "dtype": dtype},
       "seconds": {"compile": 1.0, "total": 1.5}, "error": None}
  if status == "ok":
    r["audit"] = {"kernels": 10 + i, "materialized_bytes": 2 * saved,
                  "peak_bytes": 3 * saved, "xla_peak_bytes": 3 * saved + 64,
                  "peak_agreement": -0.001, "bytes_saved": saved, "findings": 3,
                  "actionable": 2, "findings_by_class": {"unfused-epilogue": 2,
                                                         "layout-conflict": 1},
                  "bytes_saved_by_class": {"unfused-epilogue": saved},
                  "platform": "cpu"}
  else:
    r.update(error="ValueError: d_model=33 is not divisible by heads=2",
             traceback="Traceback ...")
  if step is not None:
    # Memory 60%, compute 30%, launch 10%, on a made-up device.
    r["audit"].update(step_time=step, memory_time=0.6 * step, compute_time=0.3 * step,
                      launch_time=0.1 * step, communication_time=0.0, time_device="h200")
  if speedup is not None:
    r["timing"] = {"kernel_ms": 1.0, "xla_ms": speedup, "speedup": speedup,
                   "interpret": True}
  return r


RECORDS = [rec(0, 16, "float32", saved=1024), rec(1, 32, "float32", saved=4096),
           rec(2, 64, "float32", saved=16384), rec(3, 16, "bfloat16", saved=2048),
           rec(4, 32, "bfloat16", saved=8192),
           rec(5, 64, "bfloat16", saved=0, status="error")]
NAMES = ["batch", "seq", "dtype"]


def test_x_is_the_numeric_name_with_most_values_and_lines_the_others():
  assert plots.varying(RECORDS, NAMES) == ["seq", "dtype"]
  assert plots.choose_x(RECORDS, NAMES) == "seq"
  assert plots.choose_x(RECORDS, NAMES, plot_x="dtype") == "dtype"
  with pytest.raises(GridError, match="not a parameter"):
    plots.choose_x(RECORDS, NAMES, plot_x="vocab")
  data = plots.plot_data(RECORDS, NAMES)
  # The failed point is not drawn.
  assert data == {"dtype=float32": [(16, 1024), (32, 4096), (64, 16384)],
                  "dtype=bfloat16": [(16, 2048), (32, 8192)]}
  # A categorical x: positions in order of appearance.
  assert plots.plot_data(RECORDS, NAMES, plot_x="dtype")["seq=16"] == [(0, 1024), (1, 2048)]


def _ink(path) -> float:
  """Fraction of pixels that are not (near) white."""
  img = PIL.open(path).convert("L")
  hist = img.histogram()
  return 1 - sum(hist[245:]) / (img.width * img.height)


def test_plots_are_pngs_with_something_drawn(tmp_path):
  written = plots.plot_sweep(RECORDS, str(tmp_path), NAMES, title="example")
  assert [p.rsplit("/", 1)[-1] for p in written] == ["bytes.png", "peak.png"]
  for p in written:
    assert PIL.open(p).format == "PNG" and _ink(p) > 0.02
  timed = [rec(i, s, "float32", saved=100, speedup=1.0 + i) for i, s in enumerate((8, 16))]
  written = plots.plot_sweep(timed, str(tmp_path), NAMES)
  assert written[-1].endswith("speedup.png") and _ink(written[-1]) > 0.02
  assert plots.plot_sweep([RECORDS[-1]], str(tmp_path / "none"), NAMES) == []
  # An ok point with no audit (a record kept from elsewhere) is not drawn.
  bare = {k: v for k, v in RECORDS[0].items() if k != "audit"}
  assert plots.plot_sweep([bare], str(tmp_path / "bare"), NAMES) == []
  assert len(plots.plot_sweep([bare, *RECORDS], str(tmp_path), NAMES)) == 2


def test_the_speedup_plot_warns_when_any_point_was_interpreted(tmp_path, monkeypatch):
  titles = {}
  save = plots._save
  monkeypatch.setattr(plots, "_save", lambda fig, out, name: titles.__setitem__(
      name, fig.axes[0].get_title()) or save(fig, out, name))
  timed = [rec(i, s, "float32", saved=100, speedup=1.0 + i) for i, s in enumerate((8, 16))]
  timed[0]["timing"]["interpret"] = False  # one point on the chip, one emulated
  plots.plot_sweep(timed, str(tmp_path), NAMES)
  assert "interpret mode: the kernel was emulated" in titles["speedup.png"]
  timed[1]["timing"]["interpret"] = False
  plots.plot_sweep(timed, str(tmp_path), NAMES)
  assert "interpret mode" not in titles["speedup.png"]


def test_tick_bytes():
  assert plots.tick_bytes(512) == "512 B"
  assert plots.tick_bytes(1536) == "1.5 KiB"
  assert plots.tick_bytes(3 * 1024 ** 3) == "3 GiB"


def test_report_gathers_table_plots_classes_and_failures():
  md = report.render_markdown("example", RECORDS, NAMES, ["/x/bytes.png", "/x/peak.png"],
                              missing=2, command="hlo-audit sweep example")
  assert "points: 6 recorded (5 ok, 1 failed); 2 of the grid not yet run" in md
  assert "![bytes.png](bytes.png)" in md and "![peak.png](peak.png)" in md
  assert ("| p2 | 1 | 64 | float32 | ok | 12 | 32.00 KiB | 48.00 KiB | 48.06 KiB | -0.10% "
          "| 16.00 KiB | 3 (2 actionable) | unfused-epilogue | 1.00 |") in md
  assert "| p5 | 1 | 64 | bfloat16 | FAILED |" in md
  assert "| unfused-epilogue | 5 | 10 | 16.00 KiB |" in md
  assert "- `p5` batch=1 seq=64 dtype=bfloat16: ValueError: d_model=33" in md
  page = report.render_html("example", RECORDS, NAMES, ["/x/bytes.png"])
  assert '<img class="plot" src="bytes.png"' in page
  assert 'data-v="16384"' in page and "Failed points (1)" in page
  assert "<script>" in page and "http" not in page.replace("http-equiv", "")


TIMED = [rec(0, 16, "float32", saved=1024, step=2e-6), rec(1, 32, "float32", saved=4096, step=8e-6),
         rec(2, 64, "float32", saved=8192, step=3.2e-5),
         rec(3, 16, "bfloat16", saved=1024, step=1.5e-6),
         # Resumed from results written before estimates: drawn nowhere in time.png.
         rec(4, 32, "bfloat16", saved=4096)]


def test_the_estimated_step_is_plotted_for_the_points_that_have_one(tmp_path):
  written = plots.plot_sweep(TIMED, str(tmp_path), NAMES, title="example")
  assert [p.rsplit("/", 1)[-1] for p in written] == ["bytes.png", "peak.png", "time.png"]
  assert PIL.open(written[-1]).format == "PNG" and _ink(written[-1]) > 0.02
  assert plots.plot_data(TIMED, NAMES, metric="step_time") == {
      "dtype=float32": [(16, 2e-6), (32, 8e-6), (64, 3.2e-5)], "dtype=bfloat16": [(16, 1.5e-6)]}
  assert plots.plot_data(TIMED, NAMES, metric="memory_time")["dtype=bfloat16"] == [
      (16, pytest.approx(0.9e-6))]
  # Old records only: no time plot.
  assert "time.png" not in str(plots.plot_sweep(TIMED[4:], str(tmp_path), NAMES))


def test_tick_time():
  assert plots.tick_time(8.5e-7) == "850 ns"
  assert plots.tick_time(1.25e-5) == "12.5 us"
  assert plots.tick_time(2e-3) == "2 ms"
  assert plots.tick_time(3.0) == "3 s"
  assert plots.tick_time(0) == "0"


def test_report_shows_the_estimated_step_where_there_is_one():
  md = report.render_markdown("example", TIMED, NAMES, [])
  assert "- estimated step on h200: 1.50 us to 32.0 us (4 of 5 ok points estimated)" in md
  # Results merged from runs on two devices name both, in name order.
  mixed = [dict(r, audit=dict(r["audit"], time_device="b200")) if i == 1 else r
           for i, r in enumerate(TIMED)]
  assert "- estimated step on b200, h200: " in report.render_markdown(
      "example", mixed, NAMES, [])
  header = next(line for line in md.splitlines() if line.startswith("| id |"))
  assert header.endswith("| compile s | est. step | bound by |")
  assert "| p1 | 1 | 32 | float32 | ok |" in md
  assert md.split("| p1 |")[1].split("\n")[0].endswith("| 1.00 | 8.00 us | memory 60% |")
  assert md.split("| p4 |")[1].split("\n")[0].endswith("| 1.00 | - | - |")
  page = report.render_html("example", TIMED, NAMES, [])
  assert 'data-v="3.2e-05">32.0 us</td>' in page
  # Results without any estimate: no columns for it, and the summary says so.
  old = report.render_markdown("example", RECORDS, NAMES, [])
  assert "est. step" not in old and "- estimated step: none (the device was unknown" in old
  assert report.bound_by(TIMED[0]["audit"]) == "memory 60%"
  assert report.bound_by({"step_time": None}) == "-"


def test_a_byte_axis_labels_its_top_when_the_top_is_a_round_value():
  import matplotlib

  matplotlib.use("Agg")
  from matplotlib.figure import Figure

  ax = Figure().subplots()
  mib = 1 << 20
  ax.plot([1, 2], [0, 4 * mib])
  ax.set_ylim(0, 4 * mib)
  plots._style_axes(ax, "seq", [1, 2], None, "bytes", True, [mib, 4 * mib])
  assert [t / mib for t in ax.get_yticks()] == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_classes_rank_by_most_traffic_saved_then_by_findings():
  assert report.class_totals(RECORDS) == [("unfused-epilogue", 5, 10, 16384),
                                          ("layout-conflict", 5, 5, 0)]
  tie = [{"audit": {"findings_by_class": {"a": 1, "b": 3},
                    "bytes_saved_by_class": {"a": 64, "b": 64}}}]
  assert [c for c, *_ in report.class_totals(tie)] == ["b", "a"]
  # A point's audit saved before the bytes by class were: its findings count.
  older = [{"audit": {"findings_by_class": {"a": 2}}}]
  assert report.class_totals(older) == [("a", 1, 2, 0)]


def test_the_table_has_a_valid_column_when_any_point_was_validated():
  validated = [dict(RECORDS[0], validation={"passed": True}), RECORDS[1]]
  assert "valid" in report.table(validated, NAMES)[0]


def test_the_table_has_timing_columns_when_any_point_was_timed():
  timed = [rec(0, 16, "float32", saved=1024, speedup=2.0), RECORDS[1]]
  columns, rows, _ = report.table(timed, NAMES)
  assert columns[-3:] == ["kernel ms", "XLA ms", "speedup"], columns
  assert "timing" not in RECORDS[1] and len(rows[1]) == len(columns)


def test_plot_x_need_only_be_a_parameter_of_some_points():
  # An older run's point, from a grid without seq, kept in the same folder.
  older = {**RECORDS[-1], "id": "older", "params": {"batch": 8, "dtype": "float32"}}
  assert plots.choose_x([*RECORDS, older], NAMES, plot_x="seq") == "seq"
  with pytest.raises(GridError, match="not a parameter"):
    plots.choose_x([older], NAMES, plot_x="seq")
  assert "valid" not in report.table(RECORDS[1:3], NAMES)[0]


def test_x_prefers_a_name_whose_every_value_is_a_number():
  # seq has more values, one of them not a number; batch's are all numbers.
  records = [{**rec(i, seq, "float32", saved=1), "params": {"batch": b, "seq": seq}}
             for i, (b, seq) in enumerate([(1, 16), (2, "auto"), (1, 32), (2, 64)])]
  assert plots.varying(records, ["batch", "seq"]) == ["batch", "seq"]
  assert plots.choose_x(records, ["batch", "seq"]) == "batch"


def test_a_record_saved_without_its_seconds_has_a_row_with_none_spent():
  # readers rely on an id, a status and the parameters only.
  older = {k: v for k, v in RECORDS[0].items() if k != "seconds"}
  columns, rows, _ = report.table([older], NAMES)
  assert rows[0][columns.index("compile s")] == "0.00"
  # Its time counts as none in the summary: RECORDS[1]'s 1.5 s over two.
  lines = report._summary_lines("example", [older, RECORDS[1]], 0, "")
  assert "time in points: 1.5 s (0.75 s per point)" in lines, lines


def test_an_x_with_any_value_not_a_number_is_placed_by_order():
  # seq=16, seq="auto", seq=32: categories in order of appearance.
  records = [rec(0, 16, "float32", saved=1), rec(1, "auto", "float32", saved=2),
             rec(2, 32, "float32", saved=3)]
  data = plots.plot_data(records, NAMES, plot_x="seq")
  assert data == {"all points": [(0, 1), (1, 2), (2, 3)]}, data
  numbers = [rec(0, 16, "float32", saved=1), rec(2, 32, "float32", saved=3)]
  assert plots.plot_data(numbers, NAMES, plot_x="seq") == {"all points": [(16, 1), (32, 3)]}


@pytest.mark.parametrize("seqs, log_x, ticked", [
    ((1, 2, 4), False, True),                 # a span under 8x: a linear axis
    ((1, 8), True, True),                     # 8x: log2
    (tuple(range(1, 13)), True, True),        # 12 values: each one ticked
    (tuple(range(1, 14)), True, False),       # 13: the locator's ticks
])
def test_a_numeric_x_axis_goes_log_at_8x_and_ticks_each_value_up_to_12(
    tmp_path, monkeypatch, seqs, log_x, ticked):
  axes = {}
  monkeypatch.setattr(plots, "_save", lambda fig, out, name: axes.__setitem__(
      name, (fig.axes[0].get_xscale(), list(fig.axes[0].get_xticks()))))
  records = [rec(i, s, "float32", saved=100 * (i + 1)) for i, s in enumerate(seqs)]
  plots.plot_sweep(records, str(tmp_path), NAMES)
  scale, ticks = axes["bytes.png"]
  assert scale == ("log" if log_x else "linear"), scale
  assert (ticks == [float(s) for s in seqs]) == ticked, ticks


def test_the_time_line_counts_estimated_points_only_when_some_are_not():
  every = [rec(i, 16, "float32", saved=1, step=1e-3 * (i + 1)) for i in range(2)]
  assert report._time_line(every, 2).endswith("1.00 ms to 2.00 ms")
  some = every + [rec(2, 16, "float32", saved=1)]
  assert report._time_line(some, 3).endswith("2.00 ms (2 of 3 ok points estimated)")

