"""`python -m pallas_kernels`: each verb on a tiny case, in this process.

The verbs run on CPU in interpret mode; the exit status and what they print
and write are checked, and bad flags give one line saying what is wrong.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from pallas_kernels._src import validate as validate_lib
from pallas_kernels._src.cli import main


def _run(capsys, *argv: str) -> tuple[int, str, str]:
  status = main.run(list(argv))
  out, err = capsys.readouterr()
  return int(status), out, err


def test_validate_passes_and_writes_results(capsys, tmp_path):
  out = tmp_path / "validate"
  status, stdout, _ = _run(capsys, "validate", "--ops=softmax", "--tags=nonfinite",
                           f"--out={out}")
  assert status == 0
  assert stdout.startswith("validate: PASSED, 1 cases")
  data = json.loads(out.with_suffix(".json").read_text())
  assert data["passed"] and data["rows"][0]["op"] == "softmax"
  assert "| softmax |" in out.with_suffix(".md").read_text()


def test_validate_exits_1_on_a_failing_case(capsys, monkeypatch):
  real = validate_lib.validate

  def failing(*args, **kwargs):
    report = real(*args, **kwargs)
    row = dataclasses.replace(report.rows[0], written=False)
    return dataclasses.replace(report, rows=(row,) + report.rows[1:])

  monkeypatch.setattr(validate_lib, "validate", failing)
  status, stdout, _ = _run(capsys, "validate", "--ops", "softmax", "--tags", "nonfinite")
  assert status == 1 and "FAIL" in stdout


def test_validate_for_a_target_interprets_its_kernels(capsys):
  # The old scripts' flag spellings still work.
  status, stdout, _ = _run(capsys, "validate", "--ops=softmax", "--tags=nonfinite",
                           "--target=h200", "--require_kernel=false", "--nograds")
  assert status == 0
  assert "interpret mode, NVIDIA H200" in stdout.splitlines()[0]


def test_bench_prints_ratios_and_writes_results(capsys, tmp_path):
  out = tmp_path / "bench"
  status, stdout, _ = _run(capsys, "bench", "--ops=softmax", "--tags=nonfinite",
                           "--repeats=1", "--warmup=0", f"--out={out}")
  assert status == 0
  assert "interpret mode" in stdout and "kernel/XLA:" in stdout
  data = json.loads(out.with_suffix(".json").read_text())
  assert data["interpret"] and len(data["rows"]) == 1
  assert "speedup" in out.with_suffix(".md").read_text()


def test_triton_compile_report_of_one_kernel(capsys):
  pytest.importorskip("triton")
  status, stdout, stderr = _run(capsys, "compile-report", "--backend=triton",
                                "--case=softmax causal bf16 fwd", "--arch=sm_80")
  if status == 2:  # this JAX writes Triton IR the installed Triton cannot read
    assert "cannot read the Triton IR" in stderr and len(stderr.splitlines()) == 1
    return
  assert status == 0, stderr
  assert "softmax_fwd" in stdout and "sm_80" in stdout
  assert stdout.rstrip().endswith("1 kernels compiled, 0 spill or overflow shared memory")


def test_mosaic_compile_report_says_in_one_line_what_is_missing(capsys):
  from pallas_kernels._src import compat  # noqa: PLC0415
  from pallas_kernels._src.audit import topology  # noqa: PLC0415
  reason = topology.unavailable_reason() or compat.mosaic_gpu_unavailable_reason()
  if reason is None:
    pytest.skip("this machine compiles for an H200 (compile_report_test runs it)")
  status, stdout, stderr = _run(capsys, "compile-report", "--case=bf16 4096", "--no-jax")
  assert status == 2 and not stdout
  assert stderr == f"python -m pallas_kernels compile-report: error: cannot compile for " \
                   f"an H200 here: {reason}\n"


@pytest.mark.parametrize("argv, message", [
    (["validate", "--bogus"], "validate: error: unrecognized arguments: --bogus"),
    (["bench", "--repeats=0"], "bench: error: argument --repeats: '0' is not an integer >= 1"),
    (["validate", "--ops=nope"], "validate: error: unknown op 'nope'; registered: "),
    (["validate", "--ops=softmax", "--tags=nope"], "validate: error: no cases for ops"),
    (["compile-report", "--backend=mosaic_gpu", "--arch=sm_80"],
     "compile-report: error: --arch applies to --backend triton"),
])
def test_bad_flags_say_what_is_wrong_in_one_line(capsys, argv, message):
  status, stdout, stderr = _run(capsys, *argv)
  assert status == 2 and not stdout
  last = stderr.splitlines()[-1]
  assert last.startswith("python -m pallas_kernels " + message), stderr
  # Only argparse's usage lines come before it.
  assert all(line.startswith(("usage:", " ")) for line in stderr.splitlines()[:-1]), stderr


def test_python_dash_m_runs_the_verbs():
  out = subprocess.run([sys.executable, "-m", "pallas_kernels", "validate", "--help"],
                       capture_output=True, text=True, check=False)
  assert out.returncode == 0 and "--require-kernel" in out.stdout and "--target" in out.stdout
  out = subprocess.run([sys.executable, "-m", "pallas_kernels"], capture_output=True,
                       text=True, check=False)
  assert out.returncode == 2 and "the following arguments are required: VERB" in out.stderr
