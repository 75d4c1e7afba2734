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
    assert report.warning == bench_lib.INTERPRET_WARNING
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


def test_a_row_that_fell_back_gets_no_speedup(clean_fallbacks):
  from pallas_kernels._src import guard  # noqa: PLC0415
  spec = _one_case_spec()

  def fn(*args, implementation, interpret=None, **kwargs):
    if implementation == "pallas":
      guard.record_fallback(spec.name, "no kernel here", guard.signature(x=args[0]))
    return pk.softmax(*args, implementation="xla", **kwargs)

  report = pk.bench(dataclasses.replace(spec, fn=fn), tags=("ci",), repeats=1, warmup=1)
  [row] = report.rows
  assert row.fallback == "no kernel here" and row.speedup is None
  assert "fell back" in str(report) and "FALLBACK" in report.to_markdown()


def test_quantized_matmul_baseline_is_what_xla_does_for_the_user_call():
  import jax.numpy as jnp  # noqa: PLC0415
  spec = registry.get_spec("matmul")
  S = jax.ShapeDtypeStruct
  x, w, s = S((64, 128), jnp.bfloat16), S((128, 256), jnp.int8), S((256,), jnp.float32)
  jaxpr = str(jax.make_jaxpr(lambda x, w, s: spec.baseline(x, w, w_scale=s,
                                                           activation="gelu"))(x, w, s))
  # w dequantized to the compute dtype (bf16), one dot at default precision
  # (XLA:CPU then widens the bf16 operands to f32 for its dot): not HIGHEST.
  assert jaxpr.count("dot_general") == 1 and "HIGHEST" not in jaxpr
  assert "bf16[128,256]" in jaxpr
  ref = str(jax.make_jaxpr(lambda x, w, s: spec.reference_f32(x, w, w_scale=s))(x, w, s))
  assert "HIGHEST" in ref  # the validation reference is the other one
