"""matmul's `w_column_sum`: w's column sums beside the product (cuBLASLt's BGRADB).

The kernel runs in interpret mode with `implementation="pallas"` and any
recorded fallback fails a test (the reference would pass them all); expected
values come from `reference.py` at Precision.HIGHEST. Small tiles make ragged
multi-tile grids (several row tiles per column tile, a ragged K tail).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk
from pallas_kernels._src import backend
from pallas_kernels._src import compat
from pallas_kernels._src import guard as guard_lib
from pallas_kernels._src.ops.matmul import arg_specs
from pallas_kernels._src.ops.matmul import guard
from pallas_kernels._src.ops.matmul.config import Config, MosaicConfig
from pallas_kernels._src.spec import CallFacts

from matmul_base import SMALL, assert_close, normal, operands, ref, scales

#: block_k 32 over K=83: two full steps and a tail of 19 padding rows.
WIDE_K = Config(block_m=16, block_n=16, block_k=32, num_warps=4, num_stages=2, group_m=2)


def kernel(x, w, **kw):
  return pk.matmul(x, w, w_column_sum=True, implementation="pallas", interpret=True, **kw)


def expected(x, w, **kw):
  return ref(x, w, w_column_sum=True, **kw)


@pytest.fixture(autouse=True)
def _no_fallback(clean_fallbacks):
  """Every call here must run the kernel: a fallback would hide it."""
  yield
  assert pk.fallbacks("matmul") == (), pk.fallbacks("matmul")


def _check(got, want):
  (out, colsum), (want_out, want_colsum) = got, want
  assert colsum.dtype == jnp.float32 and colsum.shape == want_colsum.shape
  assert_close(out, want_out)
  assert_close(colsum, want_colsum)


@pytest.mark.parametrize("m,k,n,dtype,flags,cfg", [
    (37, 83, 41, "float32", dict(transpose_x=True), WIDE_K),
    (37, 83, 41, "bfloat16", dict(transpose_w=True), WIDE_K),
    (21, 53, 26, "float32", dict(transpose_x=True, transpose_w=True), SMALL),
    (21, 53, 26, "float16", {}, SMALL),
    (1, 7, 3, "float32", {}, None),
    (40, 96, 70, "bfloat16", dict(transpose_x=True, transpose_out=True), None),
])
def test_values_match_reference(m, k, n, dtype, flags, cfg):
  x, w, _ = operands(m, k, n, dtype, **flags)
  prec = dict(precision="highest") if dtype == "float32" else {}
  _check(kernel(x, w, config=cfg, **flags, **prec), expected(x, w, **flags))


def test_with_a_fused_epilogue_and_quantized_output():
  x, w, extra = operands(19, 53, 33, "bfloat16", bias=True, residual=True)
  kw = dict(activation="gelu", clamp=(-1.0, 2.0), config=SMALL)
  _check(kernel(x, w, **extra, **kw), expected(x, w, **extra, **kw))
  (values, row_scales), colsum = kernel(x, w, quantize="int8", config=SMALL)
  (want_v, want_s), want_c = expected(x, w, quantize="int8")
  assert_close(values.astype(jnp.float32) * row_scales,
               want_v.astype(jnp.float32) * want_s)
  assert_close(colsum, want_c)


def test_integer_w_without_scale_sums_its_values():
  # Unscaled int8 w: the sums of its integers (exact in float32).
  x, w, _ = operands(9, 40, 20, "bfloat16", w_dtype="int8")
  _, colsum = kernel(x, w, config=SMALL)
  assert (colsum == jnp.sum(w.astype(jnp.float32), axis=0)).all()


@pytest.mark.parametrize("batch,w_batch,flags", [
    ((2, 3), (), {}),                                  # x's batch folded into M
    ((3,), (), dict(transpose_x=True)),                # one w shared by 3 products
    ((2,), (2,), dict(transpose_x=True, transpose_w=True)),
    ((2, 1), (3,), {}),                                # w broadcast (materialized)
])
def test_batched_sums_have_ws_own_batch(batch, w_batch, flags):
  x, w, _ = operands(11, 45, 18, "float32", batch=batch, w_batch=w_batch, **flags)
  out, colsum = kernel(x, w, config=SMALL, precision="highest", **flags)
  assert colsum.shape == w_batch + (18,)
  _check((out, colsum), expected(x, w, **flags))


def _grads(fn, primals, cts):
  _, pullback = jax.vjp(fn, *primals)
  return pullback(cts)


@pytest.mark.parametrize("dtype,batch,w_batch,kw", [
    # w unbatched: dcolsum enters as the dw kernel's bias.
    ("float32", (), (), dict(transpose_x=True)),
    ("bfloat16", (), (), dict(transpose_w=True, activation="silu", bias=True)),
    ("float32", (2,), (), dict(activation="tanh", bias=True)),       # folded
    # dcolsum added in XLA: a batched w, and a broadcast w whose dw is summed.
    ("float32", (2,), (2,), dict(transpose_x=True, transpose_w=True)),
    ("float16", (3,), (), dict(transpose_x=True)),
])
def test_gradients_match_reference(dtype, batch, w_batch, kw):
  kw = dict(kw)
  flags = {f: kw.pop(f) for f in ("transpose_x", "transpose_w") if f in kw}
  x, w, extra = operands(21, 45, 26, dtype, batch=batch, w_batch=w_batch,
                         bias=kw.pop("bias", False), **flags)
  names = ["x", "w"] + list(extra)
  prec = dict(precision="highest") if dtype == "float32" else {}

  def call(impl, *primals):
    a = dict(zip(names, primals))
    xx, ww = a.pop("x"), a.pop("w")
    if impl == "ref":
      return expected(xx, ww, **a, **flags, **kw)
    return kernel(xx, ww, **a, **flags, **kw, **prec)

  primals = [x, w, *extra.values()]
  shapes = jax.eval_shape(functools.partial(call, "ref"), *primals)
  cts = (normal(shapes[0].shape, shapes[0].dtype, "ct"),
         normal(shapes[1].shape, jnp.float32, "ct_colsum"))
  got = jax.jit(functools.partial(_grads, functools.partial(call, "pallas")))(primals, cts)
  want = jax.jit(functools.partial(_grads, functools.partial(call, "ref")))(primals, cts)
  for name, g, e, p in zip(names, got, want, primals):
    assert g.dtype == p.dtype, name
    assert_close(g, e, grad=True)


def test_the_column_sums_gradient_reaches_w_alone():
  # Only colsum is used: dw[k, n] = dcolsum[n] everywhere, dx = 0.
  x, w, _ = operands(12, 30, 10, "float32", transpose_w=True)
  c = normal((10,), "float32", "c")

  def loss(x, w):
    return jnp.sum(kernel(x, w, transpose_w=True, precision="highest")[1] * c)

  dx, dw = jax.grad(loss, argnums=(0, 1))(x, w)
  assert (dx == 0).all()
  assert_close(dw, jnp.broadcast_to(c[:, None], w.shape), grad=True)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_bias_and_weight_gradients_of_a_dense_layer(dtype):
  # y = x @ W + b: dW = x^T @ dy and db = sum(dy, 0), one call reading dy once.
  tokens, d_in, d_out = 77, 24, 40
  x = normal((tokens, d_in), dtype, "act")
  kern, b = normal((d_in, d_out), dtype, "W"), normal((d_out,), dtype, "b")
  c = normal((tokens, d_out), dtype, "upstream")

  def dense_loss(kern, b):
    y = jnp.matmul(x.astype(jnp.float32), kern.astype(jnp.float32),
                   precision=jax.lax.Precision.HIGHEST) + b.astype(jnp.float32)
    return jnp.sum(y * c.astype(jnp.float32))

  # The layer's gradients in float32 (dy = c is exact there).
  want_dw, want_db = jax.grad(dense_loss, argnums=(0, 1))(kern.astype(jnp.float32),
                                                          b.astype(jnp.float32))
  prec = dict(precision="highest") if dtype == "float32" else {}
  dw, db = kernel(x, c, transpose_x=True, config=WIDE_K, out_dtype=jnp.float32, **prec)
  assert dw.shape == kern.shape and db.shape == b.shape
  assert_close(dw, want_dw)
  assert_close(db, want_db)


def test_validate_covers_the_column_sum_cases():
  report = pk.validate("matmul", tags=("column_sum",), require_kernel=True)
  assert report.passed, str(report)
  assert len(report.rows) >= 5 and all("colsum" in r.case for r in report.rows)
  assert any(r.grad_err is not None for r in report.rows)


# ---- what the kernel does not do, and says ------------------------------------


def test_a_scaled_w_falls_back_with_the_reason():
  x, w, _ = operands(9, 64, 24, "bfloat16", w_dtype="int8")
  kw = dict(w_scale=scales((24,), 0.01))
  _check(kernel(x, w, **kw), expected(x, w, **kw))
  (f,) = pk.fallbacks("matmul")
  assert "w_column_sum with a w_scale" in f.reason
  pk.clear_fallbacks()  # Seen; the fixture asks for none.


def test_the_guards_name_the_column_sum():
  assert guard.column_sum_reason(True, None) is None
  assert guard.column_sum_reason(False, jnp.ones(())) is None
  assert "w_scale" in guard.column_sum_reason(True, jnp.ones(()))


@pytest.mark.skipif(compat.mosaic_gpu_unavailable_reason() is not None,
                    reason=str(compat.mosaic_gpu_unavailable_reason()))
def test_on_hopper_the_column_sum_runs_on_triton_and_says_why():
  x, w, _ = operands(64, 128, 64, "bfloat16", transpose_w=True)
  with backend.targeting(backend.resolve_target("h200")):
    out = kernel(x, w, transpose_w=True)
  _check(out, expected(x, w, transpose_w=True))
  choice = guard_lib.choices("matmul")[-1]
  assert choice.backend == "triton" and "w_column_sum" in choice.why, choice
  # Named explicitly, the Mosaic GPU kernel cannot: XLA, recorded.
  with backend.targeting(backend.resolve_target("h200")):
    _check(kernel(x, w, transpose_w=True, backend="mosaic_gpu"),
           expected(x, w, transpose_w=True))
  (f,) = pk.fallbacks("matmul")
  assert f.reason.startswith("mosaic_gpu: w_column_sum")
  pk.clear_fallbacks()  # Seen; the fixture asks for none.


def test_mosaic_guard_reason(monkeypatch):
  monkeypatch.setattr(compat, "mosaic_gpu_unavailable_reason", lambda: None)
  s = jax.ShapeDtypeStruct
  why = guard.mosaic_unsupported_reason(
      s((64, 128), jnp.bfloat16), s((128, 64), jnp.bfloat16), out_dtype=jnp.bfloat16,
      interpret=True, config=MosaicConfig(), column_sum=True)
  assert why.startswith("w_column_sum: the Mosaic GPU matmul emits no column sums")


def test_invalid_keyword():
  x, w, _ = operands(4, 8, 4, "float32")
  with pytest.raises(ValueError, match="w_column_sum must be a bool"):
    pk.matmul(x, w, w_column_sum=1)


# ---- the audit's call ---------------------------------------------------------


class _Array:
  def __init__(self, dtype, dims):
    self.dtype, self.dims = dtype, dims


class _Dot:
  def __init__(self, lhs, rhs, result, lc, rc, lb=(), rb=()):
    self.lhs, self.rhs, self.result = lhs, rhs, result
    self.lhs_contracting, self.rhs_contracting = lc, rc
    self.lhs_batch, self.rhs_batch = lb, rb


def _facts(dot, boundary):
  return CallFacts(kind="separate-reduction", ops=("column_sum",), boundary=boundary,
                   shape="", matmul=dot)


_DENSE = ("pallas_kernels.matmul(x, dy, transpose_x=True, w_column_sum=True)  "
          "# x: bf16[512,64], dy: bf16[512,256] -> (bf16[64,256], f32[256])")


def test_closes_and_suggests_the_column_sum():
  closes = arg_specs.CLOSES
  assert "column_sum" in closes.epilogues and "separate-reduction" in closes.kinds
  assert ("column_sum", "w_column_sum") in closes.keywords
  x, dy = _Array("bf16", (512, 64)), _Array("bf16", (512, 256))
  # However XLA orders or batches the weight gradient's dot, the call is the
  # dense layer's backward over its tokens: dW = x^T @ dy and db = sum(dy).
  assert arg_specs.suggest(_facts(_Dot(x, dy, (64, 256), (0,), (0,)), dy)).text() == _DENSE
  assert arg_specs.suggest(_facts(_Dot(dy, x, (256, 64), (0,), (0,)), dy)).text() == _DENSE
  # XLA:GPU batches it over the batch axis, then adds the batches: [4,128] tokens.
  xb, dyb = _Array("bf16", (64, 4, 128)), _Array("bf16", (4, 128, 256))
  batched = _Dot(xb, dyb, (4, 64, 256), (2,), (1,), (1,), (0,))
  call = arg_specs.suggest(_facts(batched, dyb))
  assert call.text() == _DENSE
  opts = dict((k, v) for k, _, v in call.options)
  xs, ws = jnp.zeros((512, 64), jnp.bfloat16), jnp.ones((512, 256), jnp.bfloat16)
  out, colsum = jax.eval_shape(lambda a, b: pk.matmul(a, b, **opts), xs, ws)
  assert out.shape == (64, 256) and colsum.shape == (256,)

