"""The Mosaic GPU kernels compile for an H200 on a CPU: ptxas's own numbers.

Compiled through XLA for a compile-only H200 topology (the CUDA plugin wheels
and nvidia-cuda-nvcc-cu12; skipped, naming the pip command, without them):
default configs do not spill and fit the H200's opt-in shared memory, and
our bias+GELU+residual matmul uses JAX's `hopper_matmul_mgpu` tile and stage
count without spilling.
"""

from __future__ import annotations

import pytest

from pallas_kernels._src import compat
from pallas_kernels._src import topology

_WHY = topology.unavailable_reason() or compat.mosaic_gpu_unavailable_reason()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(_WHY is not None, reason=f"{_WHY}")]

if _WHY is None:
  from pallas_kernels._src import compile_report  # noqa: E402
  _CASES = {c.name: c for c in compile_report.default_cases()}
else:
  _CASES = {}


@pytest.fixture(scope="module")
def jax_rows():
  return {r.case: r for r in compile_report.report(compile_report.jax_reference_cases()).rows}


def _fits(report):
  assert not report.errors, report.errors
  assert report.rows, "nothing compiled"
  for r in report.rows:
    assert r.spills == 0, f"{r.kernel} spills {r.spill_stores}/{r.spill_loads} B"
    assert 0 < r.shared <= compile_report.SMEM_LIMIT, r
    assert r.wgmma > 0, r


def test_our_epilogue_matmul_uses_jaxs_tile_and_stages(jax_rows):
  report = compile_report.report([_CASES["matmul bf16 8192x512x8192 bias+gelu+res"]])
  _fits(report)
  [ours] = report.rows
  theirs = jax_rows["JAX hopper_matmul_mgpu bf16 8192x512x8192"]
  assert ours.config == theirs.config == "128x128x64 s4 wg2:n"
  assert theirs.spills == 0 and ours.registers <= theirs.registers + 8
  assert ours.shared <= theirs.shared


@pytest.mark.parametrize("name", ["matmul bf16 x int4 g128 w bias+gelu",
                                  "matmul int8 x int8 w[N,K] (row, channel scales)",
                                  "matmul bf16 quantize=int8 n=256"])
def test_default_configs_fit(name):
  _fits(compile_report.report([_CASES[name]]))


def test_the_report_lists_every_kernel_and_config():
  assert len(_CASES) >= 13
  text = compile_report.format_table(
      [compile_report.KernelStats("c", "k", "128x128x64 s4 wg2:n", 168, 0, 4, 1, 8)])
  assert "0/4" in text and text.rstrip().endswith("NO")
