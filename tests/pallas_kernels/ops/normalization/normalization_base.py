"""Shared test suite of layer_norm and rms_norm.

Subclasses choose where the kernel runs (`implementation`, `interpret`); every
test runs for both ops. Expected values come only from `reference.py`,
tolerances only from `tolerances.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk
from pallas_kernels._src import inputs
from pallas_kernels._src.ops.normalization import guard
from pallas_kernels._src.ops.normalization import reference
from pallas_kernels._src.ops.normalization.config import Config
from pallas_kernels._src.tolerances import relative_error, tolerance

KINDS = ("layer_norm", "rms_norm")
CHUNKED = Config(block_rows=2, block_cols=128)


def make(kind: str, shape, dtype, *, residual: bool = False, seed: int = 0,
         residual_dtype=None):
  """(x, gamma, beta-or-None, residual-or-None), random normal."""
  keys = inputs.Keys(seed, f"{kind}{shape}{dtype}")
  n = shape[-1]
  x = inputs.normal(keys.next(), shape, dtype)
  gamma = inputs.normal(keys.next(), (n,), dtype)
  beta = inputs.normal(keys.next(), (n,), dtype) if kind == "layer_norm" else None
  res = (inputs.normal(keys.next(), shape, residual_dtype or dtype)
         if residual else None)
  return x, gamma, beta, res


def ref_f32(kind, x, gamma, beta, **kw):
  kw = {k: v for k, v in kw.items() if k not in ("config", "backward_config")}
  if kind == "layer_norm":
    return reference.layer_norm_f32(x, gamma, beta, **kw)
  return reference.rms_norm_f32(x, gamma, **kw)


def ref(kind, x, gamma, beta, **kw):
  if kind == "layer_norm":
    return reference.layer_norm(x, gamma, beta, **kw)
  return reference.rms_norm(x, gamma, **kw)


def assert_close(out, expected, *, grad: bool = False):
  assert out.shape == expected.shape
  err = relative_error(out, expected)
  bound = tolerance(out.dtype, grad=grad)
  assert err <= bound, f"relative error {err:.3e} > {bound:.0e} ({out.dtype})"


@pytest.mark.parametrize("kind", KINDS)
class NormalizationTestBase:
  """All behaviour of the two ops; see the module docstring."""

  __test__ = False
  implementation: str = "pallas"
  interpret: bool | None = None

  def op(self, kind, x, gamma, beta, **kw):
    kw = dict(implementation=self.implementation, interpret=self.interpret, **kw)
    if kind == "layer_norm":
      return pk.layer_norm(x, gamma, beta, **kw)
    return pk.rms_norm(x, gamma, **kw)

  # Shapes and options repeat the "ci" validation cases where they can, so the
  # interpreted kernels compile once for both (the suite must stay fast).
  @pytest.mark.parametrize("shape,dtype", [
      ((1, 1), "float32"),        # One row, width 1.
      ((2, 131), "float16"),      # Prime width.
  ])
  def test_matches_reference(self, kind, shape, dtype):
    x, gamma, beta, _ = make(kind, shape, dtype)
    out = self.op(kind, x, gamma, beta)
    assert out.dtype == jnp.dtype(dtype)
    assert_close(out, ref_f32(kind, x, gamma, beta))

  def test_rows_not_multiple_of_block_and_long_rows(self, kind):
    # 5 rows in blocks of 2, 300 columns in chunks of 128: both ragged.
    x, gamma, beta, res = make(kind, (5, 300), "float32", residual=True)
    (y, h) = self.op(kind, x, gamma, beta, residual=res, config=CHUNKED)
    ry, rh = ref_f32(kind, x, gamma, beta, residual=res)
    assert_close(y, ry)
    np.testing.assert_array_equal(h, rh)

  def test_residual_prologue_returns_the_sum(self, kind):
    # Also: a prime row count (7) that no power-of-two block divides.
    x, gamma, beta, res = make(kind, (7, 129), "float32", residual=True)
    y, h = self.op(kind, x, gamma, beta, residual=res)
    ry, rh = ref_f32(kind, x, gamma, beta, residual=res)
    np.testing.assert_array_equal(h, rh)  # h = x + residual, bit for bit.
    assert_close(y, ry)

  def test_mixed_dtype_residual_promotes(self, kind):
    x, gamma, beta, res = make(kind, (3, 5, 67), "bfloat16", residual=True,
                               residual_dtype="float32")
    y, h = self.op(kind, x, gamma, beta, residual=res)
    assert y.dtype == h.dtype == jnp.float32
    ry, rh = ref_f32(kind, x, gamma, beta, residual=res)
    np.testing.assert_array_equal(h, rh)
    assert_close(y, ry)

  def test_cast_epilogue_with_leading_dims(self, kind):
    x, gamma, beta, res = make(kind, (3, 5, 67), "bfloat16", residual=True)
    y, h = self.op(kind, x, gamma, beta, residual=res, out_dtype="float32")
    assert y.dtype == jnp.float32 and h.dtype == jnp.bfloat16
    assert_close(y, ref_f32(kind, x, gamma, beta, residual=res)[0])

  @pytest.mark.parametrize("quantize,shape,dtype,residual,config", [
      ("int8", (6, 96), "bfloat16", False, None),
      ("int8", (5, 300), "float32", False, CHUNKED),  # Three passes over chunks.
      ("float8_e4m3fn", (3, 64), "float32", True, None),
  ])
  def test_quantize_epilogue(self, kind, quantize, shape, dtype, residual, config):
    x, gamma, beta, res = make(kind, shape, dtype, residual=residual)
    out = self.op(kind, x, gamma, beta, residual=res, quantize=quantize, config=config)
    expected = ref_f32(kind, x, gamma, beta, residual=res, quantize=quantize)
    if residual:
      (values, scales), h = out
      (rv, rs), rh = expected
      np.testing.assert_array_equal(h, rh)
    else:
      (values, scales), (rv, rs) = out, expected
    assert values.dtype == jnp.dtype(quantize) and values.shape == x.shape
    assert scales.dtype == jnp.float32 and scales.shape == shape[:-1] + (1,)
    assert_close(scales, rs)
    assert_close(values, rv)
    if quantize == "int8":
      # Round to nearest: dequantized values sit within half a step of y.
      y = np.asarray(ref_f32(kind, x, gamma, beta, residual=res))
      deq = np.asarray(values, np.float32) * np.asarray(scales)
      assert np.all(np.abs(deq - y) <= 0.5 * np.asarray(scales) * (1 + 1e-3))

  def test_gradients_match_reference_vjp(self, kind):
    x, gamma, beta, res = make(kind, (7, 129), "float32", residual=True)
    self._check_grads(kind, x, gamma, beta, res)

  def test_gradients_long_rows(self, kind):
    x, gamma, beta, res = make(kind, (5, 300), "float32", residual=True)
    self._check_grads(kind, x, gamma, beta, res, config=CHUNKED,
                      backward_config=CHUNKED)

  def _check_grads(self, kind, x, gamma, beta, res, **kw):
    params = (x, gamma, beta, res) if beta is not None else (x, gamma, res)

    def split(p):
      return (p[0], p[1], p[2], p[3]) if beta is not None else (p[0], p[1], None, p[2])

    def kernel_fn(*p):
      x_, g_, b_, r_ = split(p)
      return self.op(kind, x_, g_, b_, residual=r_, **kw)

    def ref_fn(*p):
      x_, g_, b_, r_ = split(p)
      return ref_f32(kind, x_, g_, b_, residual=r_)

    out, pullback = jax.vjp(kernel_fn, *params)
    keys = inputs.Keys(1, "cotangent")
    cts = jax.tree_util.tree_map(lambda o: inputs.normal(keys.next(), o.shape, o.dtype),
                                 out)
    grads = pullback(cts)

    @jax.jit
    def ref_grads_of(p32, cts):
      ref_out, ref_pullback = jax.vjp(ref_fn, *p32)
      return ref_pullback(jax.tree_util.tree_map(
          lambda c, r: c.astype(r.dtype), cts, ref_out))

    ref_grads = ref_grads_of([p.astype(jnp.float32) for p in params], cts)
    for g, rg, p in zip(grads, ref_grads, params):
      assert g.dtype == p.dtype
      assert_close(g, rg.astype(jnp.float32), grad=True)
    # h = x + residual: both inputs get the same gradient.
    np.testing.assert_array_equal(np.asarray(grads[0], np.float32),
                                  np.asarray(grads[-1], np.float32))

  def test_quantized_output_is_not_differentiable(self, kind):
    x, gamma, beta, _ = make(kind, (6, 96), "bfloat16")
    with pytest.raises(TypeError, match="not differentiable"):
      jax.grad(lambda x_: self.op(kind, x_, gamma, beta, quantize="int8")[1].sum())(x)

  def test_nonfinite_rows_propagate_like_xla(self, kind):
    x, gamma, beta, res = make(kind, (6, 33), "float32", residual=True)
    x = x.at[1, 3].set(jnp.nan).at[4, 0].set(jnp.inf).at[5, -1].set(-jnp.inf)
    out = np.asarray(self.op(kind, x, gamma, beta, residual=res)[0])
    expected = np.asarray(ref_f32(kind, x, gamma, beta, residual=res)[0])
    np.testing.assert_array_equal(np.isnan(out), np.isnan(expected))
    np.testing.assert_array_equal(np.isinf(out), np.isinf(expected))
    assert np.isnan(out[1]).all()  # A NaN poisons its row's statistics.
    if kind == "layer_norm":
      assert np.isnan(out[[4, 5]]).all()  # inf - inf in the centering.
    else:
      assert np.isnan(out[4, 0]) and np.isnan(out[5, -1])  # inf * rstd(=0).
    assert_close(jnp.asarray(out[[0, 2, 3]]), jnp.asarray(expected[[0, 2, 3]]))

  def test_empty_rows_fall_back_and_are_recorded(self, kind, clean_fallbacks):
    x, gamma, beta, _ = make(kind, (0, 16), "float32")
    out = self.op(kind, x, gamma, beta)
    assert out.shape == (0, 16)
    if self.implementation == "pallas":
      [record] = pk.fallbacks(kind)
      assert record.reason == "x has no rows" and "x=float32[0,16]" in record.signature

  def test_backward_fallback_recorded_and_correct(self, kind, clean_fallbacks,
                                                  monkeypatch):
    monkeypatch.setattr(guard, "MAX_PARTIAL_BYTES", 0)
    # A shape of its own: guards run when a shape is first traced (then cached).
    x, gamma, beta, res = make(kind, (4, 40), "float32", residual=True)
    self._check_grads(kind, x, gamma, beta, res)
    if self.implementation == "pallas":
      reasons = {f.reason for f in pk.fallbacks(kind)}
      assert any(r.startswith("backward: backward partial sums") for r in reasons), reasons

  @pytest.mark.parametrize("bad,match", [
      (dict(gamma_shape=(5,)), r"gamma.shape \(5,\) must be .*\(7, 129\)"),
      (dict(residual_shape=(7, 128)), r"residual.shape \(7, 128\) must equal"),
      (dict(quantize="int4"), "quantize must be"),
      (dict(quantize="int8", out_dtype="float32"), "exclusive"),
      (dict(eps=-1.0), "eps must be finite and >= 0"),
      (dict(implementation="triton"), "implementation must be"),
      (dict(out_dtype="int32"), "out_dtype must be a floating"),
      (dict(x_shape=(3, 0)), r"empty last axis: x.shape \(3, 0\)"),
      (dict(x_dtype="int32"), "x must be floating point"),
  ])
  def test_bad_arguments_raise_value_error(self, kind, bad, match):
    bad = dict(bad)
    x_shape = bad.pop("x_shape", (7, 129))
    x = jnp.ones(x_shape, bad.pop("x_dtype", "float32"))
    gamma = jnp.ones(bad.pop("gamma_shape", x_shape[-1:]))
    beta = jnp.ones(x_shape[-1:]) if kind == "layer_norm" else None
    res_shape = bad.pop("residual_shape", None)
    residual = None if res_shape is None else jnp.ones(res_shape)
    kw = dict(implementation=self.implementation, interpret=self.interpret,
              residual=residual)
    kw.update(bad)
    with pytest.raises(ValueError, match=match):
      if kind == "layer_norm":
        pk.layer_norm(x, gamma, beta, **kw)
      else:
        pk.rms_norm(x, gamma, **kw)
