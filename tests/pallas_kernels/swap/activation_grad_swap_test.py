"""A gemm whose result an activation's derivative multiplies (an MLP's
backward, as `jax.grad` writes it, or by hand) swapped for one `matmul`
with `activation_grad` and the pre-activation: the derivative recognised by
replaying the work, nothing taken that another reader needs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk

ACTS = {"gelu": lambda v: jax.nn.gelu(v, approximate=False), "gelu_tanh": jax.nn.gelu,
        "silu": jax.nn.silu, "sigmoid": jax.nn.sigmoid, "tanh": jnp.tanh,
        "relu": jax.nn.relu, "softplus": jax.nn.softplus}


def _mlp_grad(act):
  def loss(p, x):
    h = act(x @ p["w1"] + p["b1"])
    return jnp.sum((h @ p["w2"]).astype(jnp.float32) ** 2)
  return jax.grad(loss)


def _params(dtype=jnp.float32):
  k = jax.random.split(jax.random.key(0), 4)
  p = {"w1": jax.random.normal(k[0], (16, 40), dtype) / 4,
       "b1": jax.random.normal(k[1], (40,), dtype),
       "w2": jax.random.normal(k[2], (40, 24), dtype) / 6}
  return p, jax.random.normal(k[3], (8, 16), dtype)


def _derivative_sites(swapped, *args):
  return [s for s in swapped.report(*args).sites if "activation_grad" in s.call]


@pytest.mark.parametrize("name, dtype", [
    ("gelu", jnp.float32), ("gelu_tanh", jnp.float32), ("silu", jnp.float32),
    # In bf16 the derivatives of tanh-GELU and exact GELU agree to its
    # rounding: the replay in float32 still tells them apart.
    ("gelu_tanh", jnp.bfloat16), ("gelu", jnp.bfloat16)])
def test_the_backward_through_an_activation_is_one_matmul_with_its_derivative(name, dtype):
  pk.clear_fallbacks()
  grad = _mlp_grad(ACTS[name])
  args = _params(dtype)
  swapped = pk.swap(grad, interpret=True)
  (site,) = _derivative_sites(swapped, *args)
  assert site.replaced and site.kernel == "pallas_kernels.matmul"
  # dh = dy @ w2^T read in place, times act'(z), z = x @ w1 + b1.
  assert f"activation_grad='{name}'" in site.call and "transpose_w=True" in site.call
  assert f"preactivation={'bf16' if dtype == jnp.bfloat16 else 'f32'}[8,40]" in site.call
  got, want = swapped(*args), grad(*args)
  tol = 3e-2 if dtype == jnp.bfloat16 else 1e-4
  for k in want:
    np.testing.assert_allclose(np.asarray(got[k], np.float32), np.asarray(want[k], np.float32),
                               rtol=tol, atol=tol * float(jnp.max(jnp.abs(want[k]))))
  assert not pk.fallbacks()  # the kernels ran (interpreted), no XLA fallback


@pytest.mark.parametrize("name", ["sigmoid", "tanh"])
def test_a_backward_reading_the_activations_output_leaves_the_forward_its_activation(name):
  # JAX differentiates sigmoid and tanh from their output (s * (1 - s),
  # 1 - t^2): the backward never reads z, so the forward's matmul applies
  # bias and activation and z is never written; the derivative, needing z,
  # stays XLA's (the dx gemm is an ordinary matmul).
  swapped = pk.swap(_mlp_grad(ACTS[name]), interpret=True)
  args = _params()
  sites = swapped.report(*args).sites
  assert any(s.replaced and f"activation='{name}'" in s.call for s in sites)
  assert not _derivative_sites(swapped, *args)
  got, want = swapped(*args), _mlp_grad(ACTS[name])(*args)
  for k in want:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-4,
                               atol=1e-4 * float(jnp.max(jnp.abs(want[k]))))


@pytest.mark.parametrize("name", ["relu", "softplus"])
def test_an_activation_the_kernel_does_not_differentiate_is_left_to_xla(name):
  # relu's derivative is a select; softplus' (a sigmoid) is no derivative
  # of an activation the kernel applies.
  assert not _derivative_sites(pk.swap(_mlp_grad(ACTS[name]), interpret=True), *_params())


def _dh(dy, w):
  return dy @ w.T


def test_a_derivative_written_by_hand_is_recognised_and_a_saved_mask_is_not():
  k = jax.random.split(jax.random.key(1), 3)
  dy, w = jax.random.normal(k[0], (8, 24)), jax.random.normal(k[1], (40, 24))
  z = jax.random.normal(k[2], (8, 40))

  def sigmoid_backward(dy, w, z):
    s = jax.nn.sigmoid(z)
    return _dh(dy, w) * (s * (1 - s))

  (site,) = _derivative_sites(pk.swap(sigmoid_backward, interpret=True), dy, w, z)
  assert "activation_grad='sigmoid'" in site.call
  np.testing.assert_allclose(pk.swap(sigmoid_backward, interpret=True)(dy, w, z),
                             sigmoid_backward(dy, w, z), rtol=1e-5, atol=1e-5)

  def masked(dy, w, m):  # a dropout mask saved by the forward pass: no derivative
    return _dh(dy, w) * m

  assert not _derivative_sites(pk.swap(masked, interpret=True), dy, w, z > 0)
  assert not _derivative_sites(pk.swap(masked, interpret=True), dy, w, z)


def test_a_product_read_elsewhere_is_left_and_a_bias_after_it_stays_xlas():
  k = jax.random.split(jax.random.key(2), 4)
  dy, w = jax.random.normal(k[0], (8, 24)), jax.random.normal(k[1], (40, 24))
  z, b = jax.random.normal(k[2], (8, 40)), jax.random.normal(k[3], (40,))

  def also_returned(dy, w, z):  # dh itself is a result: the call would not write it
    dh = _dh(dy, w)
    return dh * (1 - jnp.tanh(z) ** 2), dh

  assert not _derivative_sites(pk.swap(also_returned, interpret=True), dy, w, z)

  def then_bias(dy, w, z, b):  # the derivative, then an add of a vector
    return _dh(dy, w) * (1 - jnp.tanh(z) ** 2) + b

  swapped = pk.swap(then_bias, interpret=True)
  (site,) = _derivative_sites(swapped, dy, w, z, b)
  assert "activation_grad='tanh'" in site.call
  np.testing.assert_allclose(swapped(dy, w, z, b), then_bias(dy, w, z, b), rtol=1e-5, atol=1e-5)
