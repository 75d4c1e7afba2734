"""Suggested kernel calls and guard verdicts on audit findings (written by
the installed kernel library, pallas_kernels)."""

from __future__ import annotations

import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

import hlo_audit
from hlo_audit import FindingKind
from hlo_audit._src.report import json_report, text


def _layer_norm(x, g, b):
  m = x.mean(-1, keepdims=True)
  v = ((x - m) ** 2).mean(-1, keepdims=True)
  return (x - m) * jax.lax.rsqrt(v + 1e-5) * g + b


@pytest.fixture(scope="module")
def epilogue_report():
  x, w, b = jnp.ones((64, 256)), jnp.ones((256, 512)), jnp.ones((512,))
  return hlo_audit.audit(jax.jit(lambda x, w, b: jax.nn.gelu(x @ w + b, approximate=False)),
                         x, w, b)


def test_epilogue_finding_suggests_matmul_with_shapes(epilogue_report):
  (f,) = epilogue_report.findings_of(FindingKind.UNFUSED_EPILOGUE)
  # The call carries the detector's items (ops) and the dot's shapes.
  assert f.suggestion.startswith("pallas_kernels.matmul(x, w, bias=bias, ")
  assert "activation='gelu'" in f.suggestion
  assert f.suggestion.endswith(
      "# x: f32[64,256], w: f32[256,512], bias: f32[512] -> f32[64,512]")
  assert f.guard_verdict.startswith("kernel runs (guard passes on cpu")


def test_integer_matmul_verdict_names_the_guard_reason():
  xi, wi = jnp.ones((64, 256), jnp.int32), jnp.ones((256, 512), jnp.int32)
  r = hlo_audit.audit(jax.jit(lambda x, w: jnp.maximum(x @ w + 3, 0)), xi, wi)
  (f,) = r.findings_of(FindingKind.UNFUSED_EPILOGUE)
  assert "x: s32[64,256]" in f.suggestion
  assert f.guard_verdict.startswith("falls back to XLA") and "int32" in f.guard_verdict


def test_norm_and_softmax_reductions_get_calls_with_eps():
  x = jnp.ones((64, 256))
  r = hlo_audit.audit(jax.jit(_layer_norm), x, x[0], x[0])
  (f,) = [f for f in r.findings_of(FindingKind.SEPARATE_REDUCTION)
          if f.kernel == "pallas_kernels.layer_norm"]
  assert f.suggestion.startswith("pallas_kernels.layer_norm(x, gamma, beta, eps=1e-05)")
  assert "gamma: f32[256]" in f.suggestion
  r = hlo_audit.audit(jax.jit(lambda s: jax.nn.softmax(s, axis=-1)), jnp.ones((4, 128, 128)))
  (f,) = r.findings_of(FindingKind.SEPARATE_REDUCTION)
  assert f.suggestion == "pallas_kernels.softmax(x)  # x: f32[4,128,128] -> f32[4,128,128]"
  assert f.guard_verdict.startswith("kernel runs")


def test_findings_without_a_kernel_get_none(epilogue_report):
  for f in epilogue_report.findings:
    if f.kernel is None:
      assert f.suggestion == "" and f.guard_verdict == ""


def test_rendered_in_text_and_json_round_trip(epilogue_report):
  (f,) = epilogue_report.findings_of(FindingKind.UNFUSED_EPILOGUE)
  fields = dict(text.record_fields(f))
  assert fields["suggested call"] == f.suggestion
  assert fields["guard verdict"] == f.guard_verdict
  d = json_report.to_dict(epilogue_report)
  assert d["findings"][0]["suggestion"] == f.suggestion
  back = json_report.report_from_dict(d)
  assert back.findings == epilogue_report.findings


def test_analyses_import_without_jax():
  code = ("import sys; import hlo_audit._src.analysis.suggestions, "
          "hlo_audit._src.analysis.detectors; print('jax' in sys.modules)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       check=True)
  assert out.stdout.strip() == "False"
