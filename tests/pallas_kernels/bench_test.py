"""bench(): smoke test with tiny repeats, and the device table."""

from __future__ import annotations

import dataclasses
import json

import jax
import pytest

import pallas_kernels as pk
from pallas_kernels._src import bench as bench_lib
from pallas_kernels._src import devices
from pallas_kernels._src import registry


def _one_case_spec():
  spec = registry.get_spec("softmax")
  first = next(iter(spec.cases("ci", 0)))  # x=f32[1,1]
  return dataclasses.replace(spec, cases=lambda tag, seed: iter([first]))


def test_bench_smoke_flags_interpret_mode_and_computes_fields():
  report = pk.bench(_one_case_spec(), tags=("ci",), repeats=2, warmup=1)
  [row] = report.rows
  assert row.kernel_ms > 0 and row.xla_ms > 0
  assert row.speedup == pytest.approx(row.xla_ms / row.kernel_ms)
  assert row.bytes_moved == 8 and row.flops == 7  # 1 float in, 1 out; 7 flops.
  assert row.kernel_gbps == pytest.approx(row.bytes_moved / row.kernel_ms / 1e6)
  if jax.default_backend() == "cpu":
    assert report.interpret and not report.timings_meaningful
    assert report.device_spec == "generic CPU"
    assert bench_lib.INTERPRET_WARNING in str(report)
    assert bench_lib.INTERPRET_WARNING in report.to_markdown()
    assert json.loads(report.to_json())["warning"] == bench_lib.INTERPRET_WARNING
    assert row.kernel_pct_hbm == pytest.approx(100 * row.kernel_gbps / 100.0)
  assert json.loads(report.to_json())["rows"][0]["case"] == row.case
  assert report.to_rows()[0]["speedup"] == row.speedup


def test_bench_rejects_bad_arguments():
  with pytest.raises(ValueError, match="repeats"):
    pk.bench("softmax", repeats=0)
  with pytest.raises(ValueError, match="no cases"):
    pk.bench("softmax", tags=("no-such-tag",), repeats=1)


@pytest.mark.parametrize("kind,name", [
    ("NVIDIA H200", "NVIDIA H200"), ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"),
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB"), ("TPU v5 lite", "TPU v5e"),
    ("cpu", "generic CPU"),
])
def test_device_table_lookup(kind, name):
  spec = devices.lookup(kind)
  assert spec is not None and spec.name == name
  assert spec.hbm_gbps > 0 and spec.peak_tflops("bfloat16") >= spec.peak_tflops("float32")


def test_unknown_device_has_no_roofline():
  assert devices.lookup("Some Future Accelerator") is None
