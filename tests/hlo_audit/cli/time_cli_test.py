"""The command line's word on time: the estimated step, ranking by time,
--device, --sort, --min-time, and `hlo-audit calibrate`."""

from __future__ import annotations

import json
import pathlib
import re

import pytest

import hlo_audit
from hlo_audit._src.cli.common import ExitCode
from hlo_audit._src.cli.main import run
from hlo_audit._src.target import calibration

FIXTURES = pathlib.Path(__file__).parents[1] / "analysis" / "time_fixtures"
CE_HEAD = str(FIXTURES / "ce_head_h200.hlo.gz")


@pytest.fixture
def ce_head(tmp_path):
  """The cross-entropy head's H200 compile, as a text file."""
  import gzip

  path = tmp_path / "ce_head.hlo"
  path.write_bytes(gzip.decompress(pathlib.Path(CE_HEAD).read_bytes()))
  return str(path)


def test_file_with_a_device_prints_the_step_and_ranks_by_time(ce_head, capsys):
  assert run(["file", ce_head, "--device", "h200", "--width", "160"]) == ExitCode.OK
  out = capsys.readouterr().out
  assert re.search(r"estimated step on h200 \(NVIDIA H200 141GB HBM3e\): [\d.]+ us "
                   r"\(memory-bound", out)
  words = " ".join(out.split())  # the header's lines wrap at the width
  assert "not yet checked against kernels timed on the device" in words
  assert "by estimated time saved per step" in out
  rows = [line for line in out.splitlines() if re.match(r"\s+\d\s", line) and ".py:" in line]
  # The f32 gradient the one-hot scatter writes costs the most time, then
  # the bf16 logits; each row says its time and share of the step.
  assert "f32[256,32768]" in rows[0] and re.search(r"\d us\s+\d+\.\d%", rows[0])
  assert "bf16[256,32768]" in rows[1] and "unfused prologue" in rows[1]
  assert "Memory capacity: 2 finding groups, by peak memory saved" in out


def test_sort_by_peak_puts_the_donations_before_faster_fixes(ce_head, capsys):
  assert run(["file", ce_head, "--device", "h200", "--sort", "peak",
              "--width", "160"]) == ExitCode.OK
  out = capsys.readouterr().out
  rows = [line for line in out.splitlines() if re.match(r"\s+\d\s", line) and ".py:" in line]
  # 16 MiB off the peak, then the donations' 15.9 and 8 MiB, then the bf16
  # logits that save more time than either donation but no peak.
  assert "f32[256,32768]" in rows[0]
  assert "argument not donated" in rows[1] and "argument not donated" in rows[2]
  assert "bf16[256,32768]" in rows[3] and "by peak memory saved" in out
  assert "Memory capacity" not in out  # one ranking, by peak


def test_min_time_gates_fail_on(ce_head, capsys):
  args = ["file", ce_head, "--device", "h200", "--fail-on", "unfused-prologue"]
  assert run([*args, "--min-time", "1ms"]) == ExitCode.OK
  assert run([*args, "--min-time", "1us"]) == ExitCode.FINDINGS
  err = capsys.readouterr().err
  assert "saving >= 1.00 us (--fail-on)" in err


def test_min_time_without_an_estimate_or_a_class_is_a_usage_error(ce_head, capsys):
  assert run(["file", ce_head, "--fail-on", "unfused-prologue", "--min-time", "1us"]) \
      == ExitCode.USAGE
  err = capsys.readouterr().err
  assert "--min-time needs a time estimate" in err and "device is unknown" in err
  assert len(err.strip().splitlines()) == 1
  assert run(["file", ce_head, "--device", "h200", "--min-time", "1us"]) == ExitCode.USAGE
  assert "--min-time applies to --fail-on" in capsys.readouterr().err
  assert run(["file", ce_head, "--device", "h200", "--fail-on", "unfused-prologue",
              "--min-time", "soon"]) == ExitCode.USAGE
  assert "'soon' is not a time" in capsys.readouterr().err


def test_an_unknown_device_is_one_line(ce_head, capsys):
  assert run(["file", ce_head, "--device", "h9000"]) == ExitCode.USAGE
  err = capsys.readouterr().err.strip()
  assert err.startswith("hlo-audit: error: unknown target 'h9000'") and "\n" not in err


def test_json_carries_every_kernel_and_finding_estimate(ce_head, capsys):
  assert run(["file", ce_head, "--device", "h200", "--json"]) == ExitCode.OK
  d = json.loads(capsys.readouterr().out)
  t = d["timing"]
  assert t["device"]["name"] == "h200" and t["device"]["memory_bandwidth"] == 4.8e12
  assert "XLA's spec" in t["device"]["sources"]["memory_bandwidth"]
  assert len(t["kernels"]) == len(d["kernels"])
  assert sum(t["split"].values()) == pytest.approx(t["step_time"])
  assert {"bytes", "matrix_flops", "vector_flops", "bound", "intensity",
          "launches"} <= set(t["kernels"][0])
  assert all(f["time_saved"] is not None for f in d["findings"])
  assert d["groups"][0]["time_saved"] == max(g["time_saved"] or 0 for g in d["groups"])


def test_targets_lists_each_gpu_rates(capsys):
  assert run(["targets"]) == ExitCode.OK
  out = capsys.readouterr().out
  row = next(line for line in out.splitlines() if line.startswith("h200"))
  assert row.split()[-2:] == ["4.80", "989"]


def test_calibrate_shows_the_cached_facts(tmp_path, monkeypatch, capsys):
  monkeypatch.setenv(calibration.CACHE_ENV, str(tmp_path))
  monkeypatch.setattr(calibration, "_facts", None)
  facts = hlo_audit.DeviceFacts(
      name="cpu", description="a cached CPU", platform="cpu", memory_bandwidth=2.5e10,
      matrix_flops={"f32": 1.5e11}, vector_flops={"f32": 6e10}, launch_overhead=8e-7,
      parallel_overhead=2.5e-5, sources={"memory_bandwidth": "measured here"},
      measured=True)
  calibration._save(calibration.cache_path(), calibration.machine_key(), facts)
  monkeypatch.setattr(calibration, "measure", lambda: pytest.fail("measured again"))
  assert run(["calibrate", "--show", "--verbose"]) == ExitCode.OK
  out = capsys.readouterr().out
  assert out.startswith("a cached CPU: cached (")
  assert re.search(r"memory bandwidth\s+25.0 GB/s", out)
  assert re.search(r"matmul f32\s+150 GFLOP/s", out)
  assert re.search(r"launch overhead\s+800 ns", out)
  assert "memory_bandwidth: measured here" in out
  assert run(["calibrate", "--show", "--json"]) == ExitCode.OK
  assert json.loads(capsys.readouterr().out)["memory_bandwidth"] == 2.5e10


def test_trace_writes_the_estimated_timeline_and_says_where(ce_head, tmp_path, capsys):
  trace = tmp_path / "step.json"
  assert run(["file", ce_head, "--device", "h200", "--trace", str(trace)]) == ExitCode.OK
  out = capsys.readouterr().out
  assert f"estimated timeline written to {trace} (Chrome trace JSON)" in out
  events = json.loads(trace.read_text())["traceEvents"]
  assert any(e.get("ph") == "X" for e in events)
