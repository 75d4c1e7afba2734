"""The Mosaic GPU kernels compile for an H200 on a CPU: ptxas's own numbers.

Compiled through XLA for a compile-only H200 topology (the CUDA plugin wheels
and nvidia-cuda-nvcc-cu12; skipped, naming the pip command, without them):
default configs do not spill and fit the H200's opt-in shared memory, and
our bias+GELU+residual matmul uses JAX's `hopper_matmul_mgpu` tile and stage
count without spilling.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import pytest

from pallas_kernels._src import compat
from pallas_kernels._src.audit import topology

_WHY = topology.unavailable_reason() or compat.mosaic_gpu_unavailable_reason()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(_WHY is not None, reason=f"{_WHY}")]

from pallas_kernels._src import compile_report  # noqa: E402


@functools.cache
def _run() -> subprocess.CompletedProcess:
  """The compile report as the CLI makes it, in a process of its own (Mosaic
  GPU writes a kernel's resources only to the first dump folder a process
  compiles with, and this one may have compiled kernels already)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-m", "pallas_kernels", "compile-report", "--json"],
                       capture_output=True, text=True, env=env, timeout=900, check=False)
  assert out.returncode in (0, 1), out.stderr[-2000:]
  return out


def _report() -> dict:
  return json.loads(_run().stdout)


def _rows(which: str) -> dict[str, compile_report.KernelStats]:
  return {r["case"]: compile_report.KernelStats(**r) for r in _report()[which]["rows"]}


def _fits(r: compile_report.KernelStats):
  assert r.spills == 0, f"{r.kernel} spills {r.spill_stores}/{r.spill_loads} B"
  assert r.shared is not None and 0 < r.shared <= compile_report.SMEM_LIMIT, r
  assert r.wgmma > 0, r


def test_every_default_config_compiles_and_fits():
  report = _report()["ours"]
  assert not report["errors"], report["errors"]
  assert len(report["rows"]) >= 13, "kernels missing from the report"
  for r in _rows("ours").values():
    _fits(r)
  assert report["fits"]


def test_our_epilogue_matmul_uses_jaxs_tile_and_stages():
  ours = _rows("ours")["matmul bf16 8192x512x8192 bias+gelu+res"]
  theirs = _rows("jax")["JAX hopper_matmul_mgpu bf16 8192x512x8192"]
  _fits(ours)
  assert ours.config == theirs.config == "128x128x64 s4 wg2:n"
  assert theirs.spills == 0 and ours.registers <= theirs.registers + 8
  assert ours.shared <= theirs.shared


def test_stderr_holds_no_native_traces():
  """Mosaic GPU's dump runs nvdisasm on every kernel, and the nvcc wheel has
  none: one line says so, not a source-location trace per kernel."""
  err = _run().stderr
  assert "Source Location Trace" not in err, err[-2000:]
  assert err.count("nvdisasm") <= 1, err[-2000:]


def test_nvdisasm_failures_are_counted_and_the_rest_kept():
  failure = ("nvdisasm invocation failed: INTERNAL: Process spawn failed: No such file or "
             "directory\n=== Source Location Trace: === \njaxlib/mosaic/gpu/dump.cc:134\n\n")
  other = "x.py:1: FutureWarning: said once\n  return f()\n"
  rest, n, why = compile_report.nvdisasm_failures(failure + other + failure + "E0000 else\n")
  assert (rest, n) == (other + "E0000 else\n", 2)
  assert why == "INTERNAL: Process spawn failed: No such file or directory"
  assert compile_report.nvdisasm_failures(other) == (other, 0, "")


def test_a_kernel_without_its_resources_does_not_fit():
  unknown = compile_report.KernelStats("c", "k", "128x128x64 s4 wg2:n", 168, 0, 0, None, 8)
  assert not unknown.fits and "?" in compile_report.format_table([unknown])


def test_the_report_lists_every_kernel_and_config():
  assert len(compile_report.default_cases()) >= 13
  text = compile_report.format_table(
      [compile_report.KernelStats("c", "k", "128x128x64 s4 wg2:n", 168, 0, 4, 1, 8)])
  assert "0/4" in text and text.rstrip().endswith("NO")
