"""`hlo-audit sweep` end to end: a 10-point sweep of the example killed and
resumed, and usage errors."""

from __future__ import annotations

import csv
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
