"""What each detector must say about patterns third-party models produce.

Each function below is written the way library code writes it (a donated
optimizer step, a remat LSTM that concatenates its gate weights, a
BatchNorm conv, an embedding gradient, a scanned layer stack) and compiled
by XLA:CPU; the expectations were read off the optimized HLO by hand. The
companion suite in `tests/hlo_audit/real_models/` runs the libraries
themselves.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

import hlo_audit
from hlo_audit import FindingKind, Verdict
from hlo_audit._src.hlo import dtypes

S = jax.ShapeDtypeStruct
F32 = jnp.float32
H = 128


def _remat_lstm_grad(params, xs):
  def cell(params, carry, x):
    h, c = carry
    w = jnp.concatenate([params[n] for n in "ifgo"], axis=1)
    z = (x + h) @ w
    i, f, g, o = jnp.split(z, 4, axis=-1)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    h = jax.nn.sigmoid(o) * jnp.tanh(c)
    return (h, c), h

  def loss(params):
    step = jax.checkpoint(lambda carry, x: cell(params, carry, x))
    _, hs = jax.lax.scan(step, (jnp.zeros((16, H)), jnp.zeros((16, H))), xs)
    return (hs ** 2).mean()
  return jax.grad(loss)(params)


def _sgd_step(params, x):
  def loss(p):
    h = jax.nn.relu(x @ p["w1"])
    return (h @ p["w2"]).sum()
  g = jax.grad(loss)(params)
  return jax.tree.map(lambda a, b: a - 0.1 * b, params, g)


def _conv_bn(w, x):
  def loss(w):
    y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    mean = y.mean(axis=(0, 1, 2))
    var = ((y - mean) ** 2).mean(axis=(0, 1, 2))
    return jax.nn.relu((y - mean) * jax.lax.rsqrt(var + 1e-5)).sum()
  return jax.grad(loss)(w)


def _embedding_grad(table, ids):
  # An optimizer reads the gradient twice (update and second moment): the
  # scatter-add's zero destination then has readers of the scatter result.
  g = jax.grad(lambda t: jnp.tanh(jnp.take(t, ids, axis=0)).sum())(table)
  return table - 0.1 * g, g * g


def _layer_norm(x, gamma):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(var + 1e-5) * gamma


def _scanned_stack(ws, x):
  def layer(h, w):
    return jnp.tanh(h @ w), None
  return jax.lax.scan(layer, x, ws)[0]


@functools.cache
def _audit(name: str) -> hlo_audit.AuditReport:
  params4 = {n: S((H, H), F32) for n in "ifgo"}
  cases = {
      "remat_lstm": (jax.jit(_remat_lstm_grad), (params4, S((32, 16, H), F32))),
      "donated": (jax.jit(_sgd_step, donate_argnums=0),
                  ({"w1": S((128, 256), F32), "w2": S((256, 64), F32)},
                   S((32, 128), F32))),
      "conv_bn": (jax.jit(_conv_bn), (S((3, 3, 8, 16), F32), S((8, 16, 16, 8), F32))),
      "embedding": (jax.jit(_embedding_grad), (S((512, 64), F32), S((8, 32), jnp.int32))),
      "layer_norm": (jax.jit(_layer_norm), (S((256, 512), F32), S((512,), F32))),
      "stack": (jax.jit(_scanned_stack), (S((4, 256, 256), F32), S((64, 256), F32))),
  }
  fn, args = cases[name]
  return hlo_audit.audit(fn, *args)


def test_loop_invariant_concatenate_under_remat_is_hoistable():
  r = _audit("remat_lstm")
  (inv,) = r.findings_of(FindingKind.LOOP_INVARIANT)
  # The backward loop re-concatenates the four f32[128,128] weights each of
  # its 32 steps: 31 of those are redundant.
  assert inv.boundary_shape == "f32[128,512]"
  assert inv.trip_count == 32
  assert inv.bytes_saved == 31 * 2 * 128 * 512 * 4
  assert inv.ops == ("hoist",) and inv.verdict is Verdict.SAFE
  assert inv.source is not None and inv.source.file == __file__


def test_gate_split_of_one_matmul_is_one_epilogue():
  r = _audit("remat_lstm")
  splits = [f for f in r.findings_of(FindingKind.UNFUSED_EPILOGUE)
            if f.ops == ("split:4",)]
  assert splits, [(f.kind, f.ops) for f in r.findings]
  # The readers of the gate block are listed, not called "keep-reuse".
  assert all(len(f.consumers) == 4 and f.kernel is None for f in splits)
  assert not any(f.boundary in {s.boundary for s in splits}
                 for f in r.findings_of(FindingKind.KEEP_REUSE))


def test_loop_copies_are_named_for_what_they_are():
  r = _audit("remat_lstm")
  copies = r.findings_of(FindingKind.STANDALONE_COPY)
  roles = {f.ops[0] for f in copies}
  assert "loop-carry copy (body entry)" in roles
  assert "loop-init copy (shared initial value)" in roles
  for f in copies:
    assert "layout change" not in f.ops
    if f.ops[0].startswith("loop-init copy (shared"):
      assert f.verdict is Verdict.KEEP
  # Nothing here permutes data: no layout conflicts.
  assert not r.findings_of(FindingKind.LAYOUT_CONFLICT)


def test_donated_arguments_read_after_the_update_are_aliasing_copies():
  r = _audit("donated")
  aliasing = [f for f in r.findings if f.ops == ("aliasing copy",)]
  assert aliasing, [(f.kind, f.ops, f.evidence) for f in r.findings]
  for f in aliasing:
    assert f.kind is FindingKind.STANDALONE_COPY
    assert "donated" in f.evidence and "layout" not in f.evidence
    assert f.verdict is Verdict.RISKY
  undonated = hlo_audit.audit(jax.jit(_sgd_step),
                              {"w1": S((128, 256), F32), "w2": S((256, 64), F32)},
                              S((32, 128), F32))
  assert not [f for f in undonated.findings if f.ops == ("aliasing copy",)]


def test_batch_norm_statistics_are_not_a_layer_norm():
  r = _audit("conv_bn")
  for f in r.findings_of(FindingKind.SEPARATE_REDUCTION):
    assert f.kernel not in ("pallas_kernels.layer_norm", "pallas_kernels.rms_norm"), f
  assert any(f.ops == ("batch_norm_stats",)
             for f in r.findings_of(FindingKind.SEPARATE_REDUCTION))


def test_transposes_a_library_convolution_requires_are_kept():
  r = _audit("conv_bn")
  for f in r.findings:
    if "transpose" in f.ops and any("conv" in c or "ynn" in c for c in f.consumers):
      # Not "dimension numbers could read the original layout".
      assert f.verdict is Verdict.KEEP, f
      assert f.kernel is None


def test_scatter_destination_is_not_an_expanded_broadcast():
  r = _audit("embedding")
  assert not r.findings_of(FindingKind.EXPANDED_BROADCAST), [
      (f.boundary, f.evidence) for f in r.findings]
  dest = [b for b in r.buffers if b.producer_opcode in ("broadcast", "fusion")
          and any("scatter" in a for a in b.aliases)]
  assert all(b.lifetime.value != "expanded broadcast" for b in dest)


def test_layer_norm_suggestion_reads_its_own_epsilon():
  r = _audit("layer_norm")
  norms = [f for f in r.findings if f.kernel == "pallas_kernels.layer_norm"]
  assert norms, [(f.kind, f.ops) for f in r.findings]
  assert all("eps=1e-05" in f.suggestion for f in norms)


def test_weight_slices_of_a_scanned_stack_are_sliced_prologues():
  # Each trip dynamic-slices its layer's f32[256,256] weight out of the
  # stack into a buffer of its own that only the dot reads: the dot could
  # load at the layer's offset instead.
  r = _audit("stack")
  slices = [f for f in r.findings_of(FindingKind.UNFUSED_PROLOGUE)
            if f.ops == ("dynamic-slice",)]
  assert slices, [(f.kind, f.ops, f.boundary_shape) for f in r.findings]
  (s,) = [f for f in slices if f.boundary_shape == "f32[256,256]"]
  assert s.trip_count == 4 and len(s.consumers) == 1
  assert s.bytes_saved == 4 * 2 * 256 * 256 * 4
  assert not r.findings_of(FindingKind.MATERIALIZED_SLICE)


def test_in_place_updates_are_charged_the_slice_they_write():
  r = _audit("remat_lstm")
  for k in r.kernels:
    if "dynamic-update-slice" in k.fused_ops and (k.trip_count or 1) > 1:
      # One f32[16,128] step of a f32[32,16,128] stack, not the stack.
      assert k.bytes_written <= 16 * 128 * 4, k


def test_one_record_per_boundary():
  for name in ("remat_lstm", "donated", "conv_bn", "embedding", "stack"):
    r = _audit(name)
    keys = [(f.computation, f.boundary) for f in r.findings if f.boundary]
    assert len(keys) == len(set(keys)), name


@pytest.mark.parametrize("src,dst,widening", [
    ("bf16", "f32", True), ("f32", "bf16", False), ("f16", "bf16", False),
    ("bf16", "f16", False), ("s8", "s32", True), ("s8", "u16", False),
    ("u8", "s16", True), ("s8", "bf16", True), ("s16", "bf16", False),
    ("f8e4m3fn", "bf16", True), ("f32", "f32", True)])
def test_value_preserving_conversions(src, dst, widening):
  assert dtypes.is_widening(src, dst) is widening


def test_readers_needing_the_whole_result_keep_it_stored():
  # The conv output is read by the centering (which needs the batch mean, a
  # reduction of that output) and, in the backward pass, by kernels that
  # need the gradient: no epilogue can take them, so any epilogue on that
  # buffer keeps it stored and claims no peak saving.
  r = _audit("conv_bn")
  for f in r.findings_of(FindingKind.UNFUSED_EPILOGUE):
    if f.boundary_kept:
      assert f.peak_saved == 0 and "stays stored" in f.evidence
  # Same-index work split over kernels (GELU's erf in one fusion, its
  # product in another) is still one epilogue with several outputs.
  from hlo_audit._src.examples.transformer import TransformerConfig, example
  fn, args = example(TransformerConfig(batch=2, seq=32, d_model=64, heads=2, d_ff=128))
  ex = hlo_audit.audit(fn, *args)
  multi = [f for f in ex.findings_of(FindingKind.UNFUSED_EPILOGUE)
           if f.ops and f.ops[0].startswith("outputs:") and "activation:gelu" in f.ops]
  assert multi, [(f.ops, f.evidence[:80]) for f in ex.findings_of(FindingKind.UNFUSED_EPILOGUE)]
  assert all(f.boundary_kept and f.peak_saved == 0 for f in multi)
