"""Rules that must hold on code nobody here wrote: library-shaped functions
(equinox and flax norms, an RMS norm feeding four projections, a
pre-optimization dump) compiled by XLA:CPU, with what the HLO shows read off
it by hand. Each test fails when its rule is broken; the rules seen in whole
third-party models are held in tests/hlo_audit/real_models/rules_test.py."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

import hlo_audit
from hlo_audit import FindingKind, NumericalClass, Verdict

eqx = pytest.importorskip("equinox")
nn = pytest.importorskip("flax.linen")

S = jax.ShapeDtypeStruct
F32 = jnp.float32
R = FindingKind.SEPARATE_REDUCTION


def _eqx_layer_norm_2d(x):
  # equinox's LayerNorm over a whole [N, D] sample: statistics over dims {1,2}.
  norm = eqx.nn.LayerNorm((32, 64))
  return jax.vmap(norm)(x) * 2.0


def _eqx_layer_norm_last(x):
  norm = eqx.nn.LayerNorm(64)
  return jax.vmap(jax.vmap(norm))(x) * 2.0


class _GroupNormNet(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.swish(nn.GroupNorm(num_groups=4)(nn.Conv(16, (3, 3))(x)))


def _group_norm_loss(params, x):
  return _GroupNormNet().apply({"params": params}, x).sum()


def _router(x, w):
  # An MoE router's one-hot dispatch, reduced over its top-k axis (audited
  # unoptimized here).
  probs = jax.nn.softmax(x @ w, axis=-1)
  _, idx = jax.lax.top_k(probs, 2)
  dispatch = jax.nn.one_hot(idx, 8)  # [tokens, k, experts]
  per_token = dispatch.sum(axis=1)  # [tokens, experts]
  return per_token * probs


def _rms_into_projections(x, g, wq, wk, wv, wo):
  # An RMS norm's apply read by four projections (Q, K, V, MLP).
  h = x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g
  return (h @ wq) * (h @ wk) + (h @ wv) * (h @ wo)


@functools.cache
def _audit(name: str) -> hlo_audit.AuditReport:
  x = jnp.zeros((4, 16, 16, 3))
  gn_params = _GroupNormNet().init(jax.random.key(0), x)["params"]
  cases = {
      "ln2d": (_eqx_layer_norm_2d, (S((8, 32, 64), F32),)),
      "ln_last": (_eqx_layer_norm_last, (S((8, 32, 64), F32),)),
      "group_norm": (jax.grad(_group_norm_loss), (gn_params, x)),
      "rms4": (_rms_into_projections, (S((64, 256), F32), S((256,), F32),
                                       *[S((256, 256), F32)] * 4)),
  }
  fn, args = cases[name]
  return hlo_audit.audit(jax.jit(fn), *args)


def test_a_norm_over_two_axes_gets_no_last_axis_norm_kernel():
  r = _audit("ln2d")
  norms = [f for f in r.findings_of(R) if f.ops == ("layer_norm",)]
  assert norms, [(f.ops, f.evidence) for f in r.findings_of(R)]
  for f in norms:
    assert f.kernel is None and f.suggestion == "", f
    assert "dims {1,2} of [8,32,64]" in f.evidence and "2048 elements" in f.evidence
    assert f.need.statistics.axes == (1, 2)
  # The same library norm over the last axis keeps its kernel.
  last = [f for f in _audit("ln_last").findings_of(R) if f.ops == ("layer_norm",)]
  assert last and all(f.kernel == "pallas_kernels.layer_norm" for f in last)


def test_group_norm_statistics_are_named_per_sample_not_batch_norm():
  r = _audit("group_norm")
  stats = [f for f in r.findings_of(R) if f.ops == ("group_norm_stats",)]
  assert stats, [(f.ops, f.evidence[-200:]) for f in r.findings_of(R)]
  for f in stats:
    assert "batch axis 0 kept" in f.evidence and "dims {1,2,4}" in f.evidence
  for f in r.findings:
    assert "batch_norm" not in f.ops and "batch-norm" not in f.evidence, f


def test_a_prologue_read_by_four_matmuls_saves_what_it_removes_minus_what_it_adds():
  r = _audit("rms4")
  (f,) = [f for f in r.findings_of(FindingKind.UNFUSED_PROLOGUE)
          if f.boundary_shape == "f32[64,256]"]
  assert len(f.consumers) == 4
  b = 64 * 256 * 4
  producer = {k.name: k for k in r.kernels}[f.producer]
  # Write + 4 reads and the producer's reads go; each reader reads the
  # producer's inputs instead: about two buffers' worth, not five.
  assert f.bytes_saved == 5 * b - 3 * producer.bytes_read
  assert f.bytes_saved <= 2 * b + 2 * 256 * 4


def test_an_unoptimized_module_says_so_and_reports_no_findings():
  text = jax.jit(_router).lower(S((128, 32), F32), S((32, 8), F32)).as_text(dialect="hlo")
  r = hlo_audit.audit_hlo(text)
  assert not r.findings and not r.module.optimized
  assert "not optimized" in r.notes[0] and "after_optimizations" in r.notes[0]
  assert r.kernels  # what it runs is still listed
  optimized = hlo_audit.audit_hlo(
      jax.jit(_router).lower(S((128, 32), F32), S((32, 8), F32)).compile().as_text())
  assert optimized.module.optimized and optimized.findings


def test_a_library_call_or_bitcast_marks_optimized_hlo_without_a_schedule():
  # XLA's own tests print optimized modules unscheduled and unfused: a gemm
  # rewritten into cuBLASLt, or a bitcast, only its passes write.
  gemm = """HloModule m
ENTRY e (p0: f32[2,256], p1: f32[256,512]) -> f32[2,512] {
  p0 = f32[2,256]{1,0} parameter(0)
  p1 = f32[256,512]{1,0} parameter(1)
  mm = (f32[2,512]{1,0}, s8[4194304]{0}) custom-call(p0, p1), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"epilogue":"RELU"}}
  ROOT r = f32[2,512]{1,0} get-tuple-element(mm), index=0
}"""
  r = hlo_audit.audit_hlo(gemm)
  assert r.module.optimized and not any("not optimized" in n for n in r.notes)
  plain = gemm.replace('custom-call(p0, p1), custom_call_target="__cublas$lt$matmul", '
                       'backend_config={"gemm_backend_config":{"epilogue":"RELU"}}',
                       "custom-call(p0, p1), custom_call_target=\"my_op\"")
  assert not hlo_audit.audit_hlo(plain).module.optimized
