"""Running sweeps: planning, in-process and worker runs, failures, shards."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os

import pytest

from hlo_audit._src.sweep.grid import GridError
from hlo_audit._src.sweep import grid as grid_lib
from hlo_audit._src.sweep import runner
from hlo_audit._src.sweep.runner import (PlannedPoint, RichReporter, SweepOptions, Task,
                                         WorkerPool, plan, point_line, run_sweep,
                                         shard_size)
from hlo_audit._src.sweep.store import read_jsonl
from hlo_audit._src.sweep.targets import Measure, TargetRef

MODEL = """\
import os, signal, time
import jax.numpy as jnp

def f(x, w, mode="ok"):
  if mode == "raise":
    raise RuntimeError("boom")
  if mode == "segv":
    os.kill(os.getpid(), signal.SIGSEGV)
  if mode == "hang":
    time.sleep(120)
  return jnp.tanh(x @ w + 1.0)
"""

ARGS = "x=f32[{b},{d}];w=f32[{d},{2*d}]"


@pytest.fixture
def model(tmp_path) -> str:
  (tmp_path / "model.py").write_text(MODEL)
  return f"{tmp_path / 'model.py'}:f"


def options(model, out, grid, **kw) -> SweepOptions:
  return SweepOptions(target=model, out=str(out), grid=grid, args=ARGS, jobs=0, **kw)


def test_a_point_line_says_its_validation_and_speedup():
  record = {"id": "p0", "status": "ok", "params": {"b": 8}, "seconds": {"total": 1.25},
            "audit": {"kernels": 3, "peak_bytes": 2048, "xla_peak_bytes": 2048,
                      "bytes_saved": 1024},
            "validation": {"passed": True}, "timing": {"speedup": 1.5, "interpret": True}}
  assert point_line(record) == ("ok   b=8 (1.2 s): 3 kernels, peak 2.00 KiB (XLA 2.00 KiB), "
                                "saves 1.00 KiB, valid, 1.50x vs XLA (interpret)")
  record.update(validation={"passed": False}, timing={"speedup": 0.5, "interpret": False})
  assert point_line(record).endswith(", INVALID, 0.50x vs XLA")
  del record["seconds"]  # a record written before points were timed
  assert point_line(record).startswith("ok   b=8 (0.0 s): ")


def test_points_are_labelled_by_the_names_that_vary(model, tmp_path):
  # d takes one value in the grid: only b and mode tell the points apart.
  from hlo_audit._src.sweep.runner import Reporter  # pylint: disable=import-outside-toplevel
  started = []

  class Recorder(Reporter):
    def start(self, total, skipped, description, label_names=()):
      started.append((total, skipped, list(label_names)))

  run_sweep(options(model, tmp_path / "out", "b=8,16;d=64;mode=ok,raise", report=False),
            Recorder())
  assert started == [(4, 0, ["b", "mode"])]


def test_in_process_sweep_records_every_point_and_a_rerun_skips_them(model, tmp_path):
  out = tmp_path / "out"
  # b=8 twice: 2 of the 6 grid points are duplicates.
  opts = options(model, out, "b=8,16,8;d=64;mode=ok,raise")
  result = run_sweep(opts)
  assert (result.total, result.ran, result.failed, result.duplicates) == (4, 4, 2, 2)
  records, damaged = read_jsonl(str(out / "results.jsonl"))
  assert not damaged and len(records) == 4
  ok = [r for r in records if r["status"] == "ok"]
  bad = [r for r in records if r["status"] == "error"]
  assert {r["params"]["b"] for r in ok} == {8, 16}
  assert all(r["error"].startswith("CaptureError") and "boom" in r["error"] for r in bad)
  assert "RuntimeError" in bad[0]["traceback"]
  # Run here: each record names this machine.
  import socket  # pylint: disable=import-outside-toplevel
  assert {r["host"] for r in records} == {socket.gethostname()}
  a = ok[0]["audit"]
  # tanh(x @ w + 1): the add and tanh are an epilogue XLA leaves unfused on CPU.
  assert a["findings_by_class"] == {"unfused-epilogue": 1}
  # The [b, 128] f32 product, written once and read once more.
  assert a["bytes_saved"] == 2 * ok[0]["params"]["b"] * 128 * 4
  assert a["bytes_saved_by_class"] == {"unfused-epilogue": a["bytes_saved"]}
  assert a["peak_bytes"] == a["xla_peak_bytes"]
  # The point's own seconds, each part and the whole (a failed point: the whole).
  secs = ok[0]["seconds"]
  assert set(secs) == {"compile", "analysis", "total"}
  assert secs["total"] >= secs["compile"] + secs["analysis"] > 0
  assert all(set(r["seconds"]) == {"total"} for r in bad)
  assert ok[0]["params"]["args"] == f"f32[{ok[0]['params']['b']},64];f32[64,128]"
  # The step estimated on this machine's CPU, split into parts that sum to it.
  assert a["time_device"] == "cpu" and a["step_time"] > 0
  assert sum(a[k] for k in ("memory_time", "compute_time", "launch_time",
                            "communication_time")) == pytest.approx(a["step_time"])
  with open(out / "results.csv", newline="") as f:
    rows = list(csv.DictReader(f))
  assert [r["id"] for r in rows] == [r["id"] for r in records]
  row = next(r for r in rows if r["id"] == ok[0]["id"])
  assert float(row["step_time_s"]) == pytest.approx(a["step_time"], rel=1e-5)
  assert row["time_device"] == "cpu"
  assert {os.path.basename(p) for p in result.files} == {
      "bytes.png", "peak.png", "time.png", "report.md", "report.html"}
  assert "est. step" in point_line(ok[0]) and "on cpu" in point_line(ok[0])
  # The report's table, sorted by the parameters that vary (b, then mode).
  rows = [l.split(" | ")[1:3] for l in (out / "report.md").read_text().splitlines()
          if l.startswith("| ") and " | f32" in l]
  assert rows == [["8", "ok"], ["8", "raise"], ["16", "ok"], ["16", "raise"]], rows

  again = run_sweep(opts)
  assert (again.ran, again.skipped) == (0, 4)
  # Nothing left to run: no worker pool is started for it, whatever --jobs.
  with pytest.MonkeyPatch.context() as m:
    m.setattr(runner, "WorkerPool", lambda *a: pytest.fail("a pool for no points"))
    assert run_sweep(dataclasses.replace(opts, jobs=2)).skipped == 4
  retried = run_sweep(options(model, out, "b=8,16;d=64;mode=ok,raise", retry_failed=True))
  assert (retried.ran, retried.skipped, retried.failed) == (2, 2, 2)
  assert len(read_jsonl(str(out / "results.jsonl"))[0]) == 4


def test_shards_split_the_grid_and_the_report_merges_them(model, tmp_path):
  out = tmp_path / "out"
  grid = "b=1,2,3,4,5;d=8"
  runs = [run_sweep(options(model, out, grid, num_shards=2, shard_index=i, report=False))
          for i in range(2)]
  assert [r.total for r in runs] == [3, 2]
  ids = [[r["id"] for r in read_jsonl(str(out / f"results-00{i}-of-002.jsonl"))[0]]
         for i in range(2)]
  assert not set(ids[0]) & set(ids[1]) and len(ids[0] + ids[1]) == 5
  result = run_sweep(options(model, out, grid, report_only=True))
  assert result.ran == 0
  md = (out / "report.md").read_text()
  assert "points: 5 recorded (5 ok, 0 failed)" in md
  assert all(f"| {i} |" in md for i in ids[0] + ids[1])


def test_plan_merges_identical_points_and_checks_up_front(model, tmp_path):
  p = plan(SweepOptions(target="example", out=str(tmp_path),
                        grid="dtype=f32,float32,bf16;batch=1"))
  assert len(p.points) == 2 and p.duplicates == 1
  assert [pt.params["dtype"] for pt in p.points] == ["float32", "bfloat16"]
  with pytest.raises(GridError, match="apply to kernel targets"):
    plan(SweepOptions(target="example", out=str(tmp_path),
                      measure=Measure(validate=True)))
  with pytest.raises(GridError, match="--plot-x 'seq' is not a parameter"):
    plan(options(model, tmp_path, "b=1;d=8", plot_x="seq"))
  # Measuring more makes a different point (a rerun with --time is not skipped).
  timed = plan(SweepOptions(target="softmax", out=str(tmp_path), grid="rows=8",
                            measure=Measure(time=True)))
  plain = plan(SweepOptions(target="softmax", out=str(tmp_path), grid="rows=8"))
  assert timed.points[0].id != plain.points[0].id
  # One timed run and no warmup is the least a timing takes (the API's
  # options, which no flag parser checked first).
  least = plan(SweepOptions(target="softmax", out=str(tmp_path), grid="rows=8",
                            measure=Measure(time=True, repeats=1, warmup=0)))
  assert len(least.points) == 1
  for repeats, warmup in ((0, 0), (1, -1)):
    with pytest.raises(GridError, match=f"need --repeats >= 1 and --warmup >= 0, got "
                                        f"{repeats}, {warmup}"):
      plan(SweepOptions(target="softmax", out=str(tmp_path), grid="rows=8",
                        measure=Measure(time=True, repeats=repeats, warmup=warmup)))


def test_workers_survive_crashes_and_hangs(model, tmp_path):
  ref = TargetRef(model, ARGS)
  tasks = []
  for i, mode in enumerate(("ok", "segv", "hang", "raise", "ok")):
    params = {"b": 2 + i, "d": 8, "mode": mode, "args": f"f32[{2 + i},8];f32[8,16]"}
    tasks.append(Task(target=ref, point=PlannedPoint(id=f"p{i}", index=i, values=params,
                                                     params=params),
                      measure=Measure()))
  records = []
  # (A worker's first audit took over 4 s on two cores shared by five suites.)
  WorkerPool(2, point_timeout=10).run(tasks, records.append)
  by_id = {r["id"]: r for r in records}
  assert sorted(by_id) == ["p0", "p1", "p2", "p3", "p4"]
  assert by_id["p0"]["status"] == by_id["p4"]["status"] == "ok"
  assert "killed by SIGSEGV" in by_id["p1"]["error"]
  assert "timed out after 10 s" in by_id["p2"]["error"]
  assert "boom" in by_id["p3"]["error"]
  assert by_id["p0"]["pid"] != os.getpid()
  assert point_line(by_id["p1"], ["b", "mode"]).startswith("FAIL b=3 mode=segv")


def test_a_sweep_written_before_estimates_resumes_and_reports(model, tmp_path):
  out = tmp_path / "out"
  run_sweep(options(model, out, "b=8;d=16", report=False))
  # As an older version wrote it: no estimate in the records or the CSV.
  (old,) = read_jsonl(str(out / "results.jsonl"))[0]
  for key in ("step_time", "memory_time", "compute_time", "launch_time",
              "communication_time", "time_device"):
    del old["audit"][key]
  (out / "results.jsonl").write_text(json.dumps(old) + "\n")
  header = (out / "results.csv").read_text().splitlines()[0]
  (out / "results.csv").write_text(header.replace(",step_time_s", "") + "\n")
  result = run_sweep(options(model, out, "b=8,16;d=16"))
  assert (result.ran, result.skipped, result.failed) == (1, 1, 0)
  with open(out / "results.csv", newline="") as f:
    rows = {r["b"]: r for r in csv.DictReader(f)}
  assert rows["8"]["step_time_s"] == "" and float(rows["16"]["step_time_s"]) > 0
  md = (out / "report.md").read_text()
  assert "(1 of 2 ok points estimated)" in md and "![time.png](time.png)" in md
  assert (out / "time.png").exists()


def test_a_grid_over_max_points_stops_before_any_point_is_made(model, tmp_path,
                                                                monkeypatch):
  monkeypatch.setattr(grid_lib.Grid, "points", lambda self: pytest.fail("points made"))
  grid = "b=" + ",".join(map(str, range(1, 101))) + ";d=" + ",".join(map(str, range(100)))
  with pytest.raises(GridError, match=r"^10,000 points to run \(grid: b 100 x d 100; over "
                     r"--max-points 9,999\); pass --yes to run them, or narrow the grid$"):
    run_sweep(options(model, tmp_path / "out", grid, max_points=9_999))
  with pytest.raises(GridError, match=r"^3,334 points to run \(shard 0 of 3 of a "
                     r"10,000-point grid: b 100 x d 100; over --max-points 3,000\)"):
    run_sweep(options(model, tmp_path / "out", grid, max_points=3_000, num_shards=3))
  assert not (tmp_path / "out").exists()
  # Exactly --max-points, the whole grid or a shard's, is allowed.
  for kw in (dict(max_points=10_000), dict(max_points=3_334, num_shards=3)):
    opts = options(model, tmp_path / "out", grid, **kw)
    runner.check_size(opts, runner.build_grid(opts))


def test_shard_size_is_the_length_of_the_shard():
  for total in range(12):
    for n in range(1, 5):
      for i in range(n):
        assert shard_size(total, n, i) == len(grid_lib.shard(range(total), n, i))
  # (len(range) would overflow here.)
  assert shard_size(10**30, 7, 3) == range(3, 10**30, 7)[-1] // 7 + 1


def test_progress_lines_print_the_users_text_as_it_is():
  from rich.console import Console

  buf = io.StringIO()
  # A console that reads markup and emoji codes: the reporter must not.
  reporter = RichReporter(Console(file=buf, width=300, force_terminal=False))
  reporter.message("sweep X.py:ok: [bold red]1 point\x1b[2J")
  reporter.start(1, 0, "[bold red]x/X.py:ok:", ["tag"])
  reporter.point({"id": "p0", "status": "error", "params": {"tag": "[bold red]:ok:"},
                  "error": "ValueError: \x1b]8;;http://x\x07link", "seconds": {"total": 0.1}},
                 1, 1)
  reporter.stop()
  out = buf.getvalue()
  assert "sweep X.py:ok: [bold red]1 point\\x1b[2J" in out
  assert "[1/1] FAIL tag=[bold red]:ok: (0.1 s): ValueError: \\x1b]8;;http://x\\x07link" in out
  assert "[bold red]x/X.py:ok:" in out
  assert "\x1b" not in out and "\x07" not in out and "\U0001f197" not in out


def test_point_reports_are_written_under_out_points_and_linked_by_id(model, tmp_path):
  out = tmp_path / "out"
  result = run_sweep(options(model, out, "b=8,16;d=16", point_reports=True))
  records, _ = read_jsonl(str(out / "results.jsonl"))
  ids = sorted(r["id"] for r in records)
  assert result.ran == 2 and sorted(p.name for p in (out / "points").iterdir()) == [
      f"{i}.html" for i in ids]
  page = (out / "report.html").read_text()
  for i in ids:
    assert f'<a href="points/{i}.html">{i}</a>' in page


def test_a_pool_of_one_runs_every_point_in_its_one_worker(model):
  ref = TargetRef(model, ARGS)
  tasks = []
  for i in range(3):
    params = {"b": 2 + i, "d": 8, "mode": "ok", "args": f"f32[{2 + i},8];f32[8,16]"}
    tasks.append(Task(target=ref, point=PlannedPoint(id=f"p{i}", index=i, values=params,
                                                     params=params),
                      measure=Measure()))
  records = []
  WorkerPool(1, point_timeout=60).run(tasks, records.append)
  assert sorted(r["id"] for r in records) == ["p0", "p1", "p2"]
  assert all(r["status"] == "ok" for r in records)
  assert len({r["pid"] for r in records}) == 1 and records[0]["pid"] != os.getpid()
