"""A weight gradient x^T @ dy beside its bias gradient sum(dy) (a dense
layer's backward, as `jax.grad` writes it) swapped for one
`matmul(..., w_column_sum=True)`: dy read once, whichever operand of the dot
it is, flattened from [B, T, D] activations."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk


def _dense_grad(shape, dtype=jnp.float32):
  k = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(k[0], shape, dtype)
  w = jax.random.normal(k[1], (shape[-1], 24), dtype) / 4
  b = jax.random.normal(k[2], (24,), dtype)

  def loss(w, b, x):
    return jnp.sum(jnp.tanh((x @ w + b).astype(jnp.float32)))
  return jax.grad(loss, argnums=(0, 1)), (w, b, x)


def _sites(swapped, *args):
  return [s for s in swapped.report(*args).sites if "w_column_sum" in s.call]


@pytest.mark.parametrize("shape, dtype", [
    ((40, 16), jnp.float32),
    # flax's Dense on [B, T, D]: the dot contracts two leading axes, read
    # as one of B * T rows.
    ((2, 20, 16), jnp.float32),
    # dy summed in bf16 by the program, in float32 by the kernel: cast back.
    ((40, 16), jnp.bfloat16)])
def test_the_weight_and_bias_gradients_are_one_call(shape, dtype):
  pk.clear_fallbacks()
  grad, args = _dense_grad(shape, dtype)
  swapped = pk.swap(grad, interpret=True)
  (site,) = _sites(swapped, *args)
  assert site.replaced and site.kernel == "pallas_kernels.matmul"
  assert "transpose_x=True" in site.call
  (dw, db), (want_dw, want_db) = swapped(*args), grad(*args)
  assert (dw.dtype, db.dtype, db.shape) == (want_dw.dtype, want_db.dtype, want_db.shape)
  tol = 3e-2 if dtype == jnp.bfloat16 else 1e-5
  for got, want in ((dw, want_dw), (db, want_db)):
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               rtol=tol, atol=tol * float(jnp.max(jnp.abs(want))))
  assert not pk.fallbacks()


def test_dy_on_either_side_of_the_dot():
  # dy^T @ x (as jax.grad writes the first layer of an MLP) is x^T @ dy
  # stored transposed.
  k = jax.random.split(jax.random.key(1), 2)
  dy, x = jax.random.normal(k[0], (32, 24)), jax.random.normal(k[1], (32, 16))

  def both(dy, x):
    return jnp.einsum("md,mn->dn", dy, x), dy.sum(0)

  swapped = pk.swap(both, interpret=True)
  (site,) = _sites(swapped, dy, x)
  assert "transpose_out=True" in site.call
  for got, want in zip(swapped(dy, x), both(dy, x)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_a_sum_over_other_axes_or_none_leaves_the_dot_a_plain_one():
  k = jax.random.split(jax.random.key(2), 2)
  x, dy = jax.random.normal(k[0], (32, 16)), jax.random.normal(k[1], (32, 24))

  def rows(x, dy):  # a sum over the other axis: no column sum
    return x.T @ dy, dy.sum(1)

  def no_sum(x, dy):
    return x.T @ dy

  assert not _sites(pk.swap(rows, interpret=True), x, dy)
  assert not _sites(pk.swap(no_sum, interpret=True), x, dy)
