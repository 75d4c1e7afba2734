"""Shared test suite of softmax.

Subclasses choose where the kernel runs (`implementation`, `interpret`).
Expected values come only from `reference.py`, tolerances only from
`tolerances.py`. Shapes and options repeat the "ci" validation cases where
they can, so the interpreted kernels compile once for both.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk
from pallas_kernels._src import inputs
from pallas_kernels._src.ops.softmax import reference
from pallas_kernels._src.ops.softmax.config import Config
from pallas_kernels._src.tolerances import relative_error, tolerance

CHUNKED = Config(block_rows=2, block_cols=128)


def normal(shape, dtype, tag=""):
  return inputs.normal(inputs.Keys(0, f"{shape}{dtype}{tag}").next(), shape, dtype)


def ref_f32(x, mask=None, **kw):
  kw = {k: v for k, v in kw.items() if k not in ("config", "backward_config")}
  return reference.softmax_f32(x, mask=mask, **kw)


def assert_close(out, expected, *, grad: bool = False):
  assert out.shape == expected.shape
  err = relative_error(out, expected)
  bound = tolerance(out.dtype, grad=grad)
  assert err <= bound, f"relative error {err:.3e} > {bound:.0e} ({out.dtype})"


class SoftmaxTestBase:
  """All behaviour of softmax; see the module docstring."""

  __test__ = False
  implementation: str = "pallas"
  interpret: bool | None = None

  def op(self, x, **kw):
    return pk.softmax(x, implementation=self.implementation,
                      interpret=self.interpret, **kw)

  @pytest.mark.parametrize("shape,dtype,kw", [
      ((1, 1), "float32", {}),                              # One row, width 1.
      ((7, 129), "float32", dict(scale=0.125)),             # Prime rows, scale.
      ((1, 131), "bfloat16", {}),                           # One row, prime width.
  ])
  def test_matches_reference(self, shape, dtype, kw):
    x = normal(shape, dtype)
    out = self.op(x, **kw)
    assert out.dtype == jnp.dtype(dtype)
    assert_close(out, ref_f32(x, **kw))

  def test_causal_with_scale_and_leading_dims(self):
    x = normal((2, 3, 17, 33), "bfloat16")
    out = self.op(x, scale=0.5, causal=True)
    expected = ref_f32(x, scale=0.5, causal=True)
    assert_close(out, expected)
    # Top-left: query i keeps keys 0..i, so entries above the diagonal are 0.
    upper = np.triu(np.ones((17, 33), bool), k=1)
    assert np.all(np.asarray(out, np.float32)[..., upper] == 0)

  def test_causal_bottom_right_with_boolean_mask_and_empty_rows(self):
    x = normal((2, 5, 9), "float32")
    keep = jax.random.bernoulli(jax.random.key(3), 0.75, (5, 9))
    keep = keep.at[0, :].set(False).at[-2, :].set(False)
    kw = dict(mask=keep, causal=True, causal_alignment="bottom_right")
    out = np.asarray(self.op(x, **kw))
    expected = ref_f32(x, **kw)
    assert_close(jnp.asarray(out), expected)
    # Fully masked rows are zeros (like jax.nn.softmax(where=)), not NaN.
    np.testing.assert_array_equal(out[:, [0, 3]], 0.0)
    # Bottom-right: the last query sees every key (9 - 5 = offset 4).
    np.testing.assert_array_equal(out[:, -1] > 0, np.broadcast_to(keep[-1], (2, 9)))

  def test_causal_alignments_differ_only_when_not_square(self):
    x = normal((6, 5), "float32")
    top = self.op(x, causal=True)
    bottom = self.op(x, causal=True, causal_alignment="bottom_right")
    assert_close(top, ref_f32(x, causal=True))
    assert_close(bottom, ref_f32(x, causal=True, causal_alignment="bottom_right"))
    # q=6 > k=5: bottom-right leaves the first query with no key at all.
    np.testing.assert_array_equal(np.asarray(bottom)[0], 0.0)
    assert float(np.asarray(top)[0, 0]) == 1.0

  def test_boolean_mask_broadcast_over_batch_and_heads(self):
    x = normal((2, 4, 5, 31), "float16")
    keep = jax.random.bernoulli(jax.random.key(1), 0.75, (5, 31))
    out = self.op(x, mask=keep)
    assert_close(out, ref_f32(x, mask=keep))
    assert np.all(np.asarray(out)[..., ~np.asarray(keep)] == 0)

  def test_additive_mask_long_rows_ragged_blocks(self):
    # 2*3*8 = 48 rows in blocks of 2, 300 columns in chunks of 128 (online).
    x = normal((2, 3, 8, 300), "float32")
    bias = normal((2, 1, 8, 300), "float32", "mask")
    out = self.op(x, mask=bias, config=CHUNKED, backward_config=CHUNKED)
    assert_close(out, ref_f32(x, mask=bias))

  def test_additive_mask_broadcast_over_keys(self):
    x = normal((4, 300), "float32")
    bias = normal((4, 1), "float32", "mask")
    assert_close(self.op(x, mask=bias, scale=2.0), ref_f32(x, mask=bias, scale=2.0))

  def test_out_dtype_cast(self):
    x = normal((3, 40), "float32")
    out = self.op(x, out_dtype="bfloat16")
    assert out.dtype == jnp.bfloat16
    assert_close(out, ref_f32(x))

  def test_nonfinite_propagate_like_xla(self):
    x = normal((6, 33), "float32")
    x = x.at[1, 3].set(jnp.nan).at[4, 0].set(jnp.inf).at[5, -1].set(-jnp.inf)
    out = np.asarray(self.op(x))
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref_f32(x)))
    assert np.isnan(out[[1, 4]]).all()  # NaN, and exp(inf - inf).
    assert out[5, -1] == 0 and np.isfinite(out[5]).all()  # -inf: probability 0.
    np.testing.assert_array_equal(np.isnan(jax.nn.softmax(x)), np.isnan(out))

  def _check_grads(self, args, **kw):
    def kernel_fn(*a):
      return self.op(a[0], mask=a[1] if len(a) > 1 else None, **kw)

    def ref_fn(*a):
      return ref_f32(a[0], mask=a[1] if len(a) > 1 else None, **kw)

    out, pullback = jax.vjp(kernel_fn, *args)
    ct = inputs.normal(jax.random.key(7), out.shape, out.dtype)
    grads = pullback(ct)
    ref_grads = jax.jit(lambda a, c: jax.vjp(ref_fn, *a)[1](c))(
        [a.astype(jnp.float32) for a in args], ct.astype(jnp.float32))
    for g, rg, a in zip(grads, ref_grads, args):
      assert g.dtype == a.dtype
      assert_close(g, rg.astype(jnp.float32), grad=True)
    return grads

  def test_gradients_scale(self):
    self._check_grads((normal((7, 129), "float32"),), scale=0.125)

  def test_gradients_additive_mask_long_rows(self):
    x = normal((2, 3, 8, 300), "float32")
    bias = normal((2, 1, 8, 300), "float32", "mask")
    _, dbias = self._check_grads((x, bias), config=CHUNKED, backward_config=CHUNKED)
    assert dbias.shape == bias.shape

  def test_gradients_causal_bf16(self):
    self._check_grads((normal((2, 3, 17, 33), "bfloat16"),), scale=0.5, causal=True)

  def test_backward_fallback_recorded_and_correct(self, clean_fallbacks):
    # y saved as bfloat16 cannot give float32-accurate gradients: the guard
    # sends the backward to the reference's vjp and records why.
    self._check_grads((normal((3, 40), "float32"),), out_dtype="bfloat16")
    if self.implementation == "pallas":
      [record] = pk.fallbacks("softmax")
      assert record.reason.startswith("backward: out_dtype bfloat16 is less precise")

  def test_empty_rows_fall_back_and_are_recorded(self, clean_fallbacks):
    out = self.op(jnp.ones((0, 8)))
    assert out.shape == (0, 8)
    if self.implementation == "pallas":
      [record] = pk.fallbacks("softmax")
      assert record.reason == "x has no rows"

  @pytest.mark.parametrize("bad,match", [
      (dict(mask_shape=(3, 7)), r"mask.shape \(3, 7\) does not broadcast to x.shape "
                                r"\(2, 5, 9\)"),
      (dict(mask_shape=(1, 2, 5, 9)), "more axes than x.shape"),
      (dict(mask_dtype="int32"), "mask must be boolean"),
      (dict(x_shape=(9,), causal=True), r"query axis, got shape \(9,\)"),
      (dict(causal_alignment="diagonal"), "causal_alignment must be"),
      (dict(scale=float("inf")), "scale must be finite"),
      (dict(scale=jnp.float32(2.0)), "scale must be a Python float"),
      (dict(implementation="cuda"), "implementation must be"),
      (dict(out_dtype="int8"), "out_dtype must be a floating"),
      (dict(x_shape=(4, 0)), r"empty last axis: x.shape \(4, 0\)"),
  ])
  def test_bad_arguments_raise_value_error(self, bad, match):
    bad = dict(bad)
    x = jnp.ones(bad.pop("x_shape", (2, 5, 9)))
    mask_shape = bad.pop("mask_shape", None)
    mask_dtype = bad.pop("mask_dtype", None)
    if mask_shape or mask_dtype:
      bad["mask"] = jnp.ones(mask_shape or (5, 9), mask_dtype or "bool")
    kw = dict(implementation=self.implementation, interpret=self.interpret)
    kw.update(bad)
    with pytest.raises(ValueError, match=match):
      pk.softmax(x, **kw)
