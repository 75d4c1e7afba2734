"""`hlo-audit sweep` end to end: a 10-point sweep of the example killed and
resumed, and usage errors."""

from __future__ import annotations

import csv
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from hlo_audit._src.sweep.runner import SweepOptions, plan
from hlo_audit._src.sweep.store import read_jsonl

CLI = [sys.executable, "-m", "hlo_audit", "sweep"]

#: 10 points of the forward pass at small sizes (about 1 s each on a CPU).
GRID10 = ("batch=1;seq=8,16,32,64,128;dtype=float32,bfloat16;"
          "d_model=32;heads=2;d_ff=64;vocab=64;backward=false")


def _alive(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/status") as f:
      return "\nState:\tZ" not in f.read()  # A zombie has exited.
  except FileNotFoundError:
    return False


def _wait_for_lines(path: pathlib.Path, n: int, proc, timeout: float = 180) -> None:
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if path.exists() and path.read_bytes().count(b"\n") >= n:
      return
    if proc.poll() is not None:
      pytest.fail(f"the sweep exited early with code {proc.returncode}")
    time.sleep(0.1)
  pytest.fail(f"fewer than {n} points in {timeout} s")


@pytest.mark.slow
def test_a_killed_sweep_resumes_with_no_point_lost_or_doubled(tmp_path):
  out = tmp_path / "out"
  cmd = [*CLI, "example", f"--out={out}", f"--grid={GRID10}", "--no-progress"]
  with open(tmp_path / "first.log", "w") as log:
    first = subprocess.Popen(cmd + ["--jobs=1"], stdout=log, stderr=log)
    _wait_for_lines(out / "results.jsonl", 3, first)
    first.send_signal(signal.SIGKILL)
    first.wait()
  before, _ = read_jsonl(str(out / "results.jsonl"))
  assert 3 <= len(before) < 10, "the kill came too late to test a resume"
  lines_before = (out / "results.jsonl").read_bytes().split(b"\n")[:len(before)]
  # The workers die with the sweep, not compile on as orphans.
  workers = {r["pid"] for r in before}
  deadline = time.monotonic() + 10
  while any(_alive(p) for p in workers) and time.monotonic() < deadline:
    time.sleep(0.1)
  assert not any(_alive(p) for p in workers)

  # The resume's cost is not asserted (a wall-clock bound measures the machine);
  # the count of points it ran and the untouched earlier lines show that it
  # redid none.
  again = subprocess.run(cmd + ["--jobs=0"], capture_output=True, text=True, timeout=300)
  assert again.returncode == 0, again.stderr[-2000:]
  assert f"{10 - len(before)} points run (0 failed), {len(before)} already done" in again.stdout

  expected = {p.id for p in plan(SweepOptions(target="example", out=str(out),
                                              grid=GRID10)).points}
  records, damaged = read_jsonl(str(out / "results.jsonl"))
  ids = [r["id"] for r in records]
  assert not damaged and len(ids) == 10 and set(ids) == expected
  assert all(r["status"] == "ok" for r in records)
  # The points finished before the kill are kept as they were, not redone.
  assert (out / "results.jsonl").read_bytes().split(b"\n")[:len(before)] == lines_before
  with open(out / "results.csv", newline="") as f:
    rows = list(csv.DictReader(f))
  assert [r["id"] for r in rows] == ids
  assert {(r["batch"], r["seq"], r["dtype"]) for r in rows} == {
      (b, s, d) for b in ("1",) for s in ("8", "16", "32", "64", "128")
      for d in ("float32", "bfloat16")}
  for name in ("bytes.png", "peak.png", "report.md", "report.html"):
    assert (out / name).stat().st_size > 0
  assert "points: 10 recorded (10 ok, 0 failed)" in (out / "report.md").read_text()


@pytest.mark.parametrize("flags, message, one_line", [
    (["example", "--grid=bacth=1"],
     "grid name 'bacth' is not a parameter of target 'example'", True),
    (["matmul", "--grid=m=8", "--point-timeout=5", "--jobs=0"],
     "--point-timeout needs worker processes", True),
    (["example", "--gpus=8"], "--gpus needs --target", True),
    (["nosuchop", "--grid=m=8"], "expected 'example', MODULE:FUNCTION, or a kernel", True),
    (["example", "--jobs=x"], "--jobs", False),         # argparse: usage, then the error
    (["--grid=batch=1"], "SUBJECT", False),
])
def test_usage_errors_exit_2_without_a_traceback(tmp_path, flags, message, one_line):
  r = subprocess.run([*CLI, f"--out={tmp_path / 'out'}", *flags],
                     capture_output=True, text=True, timeout=120)
  assert r.returncode == 2
  lines = r.stderr.strip().splitlines()
  assert message in lines[-1] and "Traceback" not in r.stderr
  if one_line:
    assert len(lines) == 1 and lines[0].startswith("hlo-audit: error: ")
  assert not os.path.exists(tmp_path / "out" / "results.jsonl")


def test_without_matplotlib_the_sweep_writes_results_and_reports(tmp_path, monkeypatch, capsys):
  from hlo_audit._src.cli import main
  from hlo_audit._src.sweep import plots

  monkeypatch.setattr(plots, "unavailable_reason",
                      lambda: "matplotlib is not installed (pip install 'hlo-audit[plot]')")
  out = tmp_path / "out"
  code = main.run(["sweep", "example", f"--out={out}", "--jobs=0", "--no-progress",
                   "--grid=batch=1;seq=8;d_model=32;heads=2;d_ff=64;vocab=64;backward=false"])
  err = capsys.readouterr().err
  assert code == 0 and "no plots: matplotlib is not installed" in err
  assert (out / "report.md").exists() and (out / "results.jsonl").exists()
  assert not list(out.glob("*.png"))


# ---------------------------------------- input checked before any point ----

#: A function whose every point fails while being traced (nothing compiles).
FAILING = 'def f(x, tag=""):\n  raise ValueError("no")\n'


@pytest.fixture
def nothing_runs(monkeypatch):
  """Fails the test if a point starts (in this process or in workers)."""
  from hlo_audit._src.sweep import runner

  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.setattr(runner, "execute", lambda *a, **k: pytest.fail("a point ran"))
  monkeypatch.setattr(runner.WorkerPool, "run", lambda *a, **k: pytest.fail("a point ran"))


def _sweep(capsys, *flags):
  from hlo_audit._src.cli import main

  code = main.run(["sweep", *flags])
  out, err = capsys.readouterr()
  return code, out, err


def _error_line(err: str) -> str:
  """The one line on stderr of a usage error."""
  lines = err.splitlines()
  assert len(lines) == 1 and lines[0].startswith("hlo-audit: error: "), err
  assert "Traceback" not in err
  return lines[0]


def _module(tmp_path, body: str = FAILING) -> str:
  (tmp_path / "m.py").write_text(body)
  return f"{tmp_path / 'm.py'}:f"


@pytest.mark.parametrize("template, grid, message", [
    ("x=f32[{b//0}]", "b=1,2", "--args entry 'x=f32[{b//0}]': {b//0} divides by zero at b=1"),
    ("x=f32[{b},{d//(b-2)}]", "b=3,2,1;d=4",
     "--args entry 'x=f32[{b},{d//(b-2)}]': {d//(b-2)} divides by zero at b=2, d=4"),
    ("x=f32[{b-2}]", "b=2,1",
     "--args entry 'x=f32[{b-2}]': {b-2} is -1 at b=1, not a dimension (a non-negative "
     "integer)"),
])
def test_a_template_that_fails_at_a_point_is_one_line_naming_both(
    tmp_path, capsys, nothing_runs, template, grid, message):
  out = tmp_path / "out"
  code, _, err = _sweep(capsys, _module(tmp_path), f"--out={out}", f"--args={template}",
                        f"--grid={grid}", "--jobs=0", "--no-progress")
  assert code == 2 and _error_line(err) == f"hlo-audit: error: {message}"
  assert not out.exists()


@pytest.mark.parametrize("flags, message", [
    (["--target=nosuchgpu"], "unknown target 'nosuchgpu': known are "),
    (["--target={binary}"], "{binary}': not a GpuTargetConfigProto text file"),
    (["--target=h100", "--gpus=0"], "--gpus must be >= 1, got 0"),
    (["--target=h100", "--gpus=-3"], "--gpus must be >= 1, got -3"),
    (["--jobs=-2"], "--jobs must be >= 0, got -2"),
    (["--num-shards=0"], "--num-shards must be >= 1, got 0"),
    (["--num-shards=2", "--shard-index=2"],
     "--shard-index must be from 0 to 1 (--num-shards 2), got 2"),
    (["--shard-index=-1"], "--shard-index must be from 0 to 0 (--num-shards 1), got -1"),
    (["--repeats=0"], "--repeats must be >= 1, got 0"),
    (["--warmup=-1"], "--warmup must be >= 0, got -1"),
    (["--jobs=1", "--point-timeout=nan"], "--point-timeout must be a number of seconds > 0"),
    (["--jobs=1", "--point-timeout=0"], "--point-timeout must be a number of seconds > 0, got 0"),
    (["--max-points=0"], "--max-points must be >= 1, got 0"),
])
def test_flags_are_checked_before_any_point_runs(tmp_path, capsys, nothing_runs, flags,
                                                message):
  binary = tmp_path / "spec.pb"
  binary.write_bytes(b"\x08\xea\xff\x00\x9c" * 20)
  flags = [f.format(binary=binary) for f in flags]
  out = tmp_path / "out"
  code, _, err = _sweep(capsys, _module(tmp_path), f"--out={out}", "--args=x=f32[{b}]",
                        "--grid=b=1", "--no-progress", *(["--jobs=0"] if not any(
                            f.startswith("--jobs") for f in flags) else []), *flags)
  assert code == 2 and message.format(binary=binary) in _error_line(err)
  assert not out.exists()


def test_missing_gpu_wheels_stop_the_sweep_before_any_point(tmp_path, capsys, nothing_runs,
                                                             monkeypatch):
  from hlo_audit._src.target import wheels

  monkeypatch.setattr(wheels, "problems", lambda: ["jax-cuda12-plugin is not installed"])
  out = tmp_path / "out"
  code, _, err = _sweep(capsys, "example", f"--out={out}", "--grid=batch=1",
                        "--target=h100", "--jobs=0", "--no-progress")
  line = _error_line(err)
  assert code == 2 and "compiling for a GPU target needs" in line and "pip install" in line
  assert not out.exists()


@pytest.mark.parametrize("name, body, expected", [
    ("g.toml", '[grid]\nb = "notalist"\n', 'b = ["notalist"]'),
    ("g.json", '{"grid": {"b": "notalist"}}', '"b": ["notalist"]'),
])
def test_a_grid_file_value_that_is_not_a_list_names_the_file_and_name(
    tmp_path, capsys, nothing_runs, name, body, expected):
  (tmp_path / name).write_text(body)
  code, _, err = _sweep(capsys, _module(tmp_path), f"--out={tmp_path / 'out'}",
                        "--args=x=f32[{b}]", f"--grid-file={tmp_path / name}", "--jobs=0")
  assert code == 2 and _error_line(err) == (
      f"hlo-audit: error: --grid-file '{tmp_path / name}', grid.b: expected a list of "
      f"values, got the string 'notalist' (one value is a one-item list: {expected})")


@pytest.mark.parametrize("bad", ["garbage", "42", "[]", '{"id": "0123456789ab"}'])
@pytest.mark.parametrize("report_only", [False, True])
def test_a_bad_line_inside_the_results_stops_the_sweep_and_is_left_alone(
    tmp_path, capsys, nothing_runs, bad, report_only):
  out = tmp_path / "out"
  out.mkdir()
  records = [{"id": f"p{i}", "index": i, "status": "ok", "params": {"b": i},
              "audit": {"kernels": 1}} for i in range(3)]
  lines = [json.dumps(r) + "\n" for r in records]
  jsonl = out / "results.jsonl"
  jsonl.write_text("".join([lines[0], bad + "\n", *lines[1:]]))
  before = jsonl.read_bytes()
  code, _, err = _sweep(capsys, _module(tmp_path), f"--out={out}", "--args=x=f32[{b}]",
                        "--grid=b=1,2,3", "--jobs=0", "--no-progress",
                        *(["--report-only"] if report_only else []))
  line = _error_line(err)
  assert code == 2 and line.startswith(f"hlo-audit: error: {jsonl}:2: ")
  assert "only the last line can be torn by a kill" in line
  assert jsonl.read_bytes() == before


def test_a_grid_over_the_limit_stops_at_once_unless_yes(tmp_path, capsys, monkeypatch):
  from hlo_audit._src.cli import sweep_cmd
  from hlo_audit._src.sweep import grid as grid_lib
  from hlo_audit._src.sweep.runner import MAX_POINTS

  assert f"(default\n{MAX_POINTS};" in sweep_cmd.__doc__  # The --help text says it.
  model, out = _module(tmp_path), tmp_path / "out"
  points = grid_lib.Grid.points
  monkeypatch.setattr(grid_lib.Grid, "points", lambda self: pytest.fail("points made"))
  values = ",".join(map(str, range(1, 101)))
  code, _, err = _sweep(capsys, model, f"--out={out}", "--args=x=f32[{a}]",
                        f"--grid=a={values};b={values};c={values}", "--jobs=0")
  assert code == 2 and _error_line(err) == (
      "hlo-audit: error: 1,000,000 points to run (grid: a 100 x b 100 x c 100; over "
      "--max-points 10,000); pass --yes to run them, or narrow the grid")
  code, _, err = _sweep(capsys, model, f"--out={out}", "--args=x=f32[{a}]",
                        "--grid=a=1,2,3", "--max-points=2", "--jobs=0")
  assert code == 2 and "3 points to run (grid: a 3; over --max-points 2)" in _error_line(err)
  assert not out.exists()
  monkeypatch.setattr(grid_lib.Grid, "points", points)
  code, stdout, _ = _sweep(capsys, model, f"--out={out}", "--args=x=f32[{a}]",
                           "--grid=a=1,2,3", "--max-points=2", "--yes", "--jobs=0",
                           "--no-progress")
  assert code == 1 and stdout.startswith("3 points run (3 failed)")


def test_progress_lines_show_the_users_text_as_it_is(tmp_path, capsys, monkeypatch):
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.setenv("COLUMNS", "400")  # The bar's description not elided.
  folder = tmp_path / "[bold red]d"
  folder.mkdir()
  (folder / "X.py").write_text(
      'def ok(x, tag=""):\n  raise ValueError("\\x1b[2Jcleared :ok: [bold]b[/bold]")\n')
  subject = f"{folder}/X.py:ok"
  code, _, err = _sweep(capsys, subject, f"--out={tmp_path / 'out'}", "--args=x=f32[{b}]",
                        "--grid=b=1;tag=[bold red],:ok:", "--jobs=0")
  assert code == 1
  assert f"sweep {subject}: 2 points" in err  # The emoji code :ok: as typed.
  assert "FAIL tag=[bold red] " in err and "FAIL tag=:ok: " in err
  assert "\\x1b[2Jcleared :ok: [bold]b[/bold]" in err
  assert f"{subject} " in err.splitlines()[-1]  # The progress bar's description.
  assert "\x1b" not in err and "\U0001f197" not in err
