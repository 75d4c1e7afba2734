"""`swap` on a residual added after the activation, `act(x @ w + b) + r`: the
kernel's epilogue order (bias, activation, residual) takes the whole chain."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import pallas_kernels
from pallas_kernels._src.tolerances import relative_error, tolerance


def block(x, w, b, r):
  return jax.nn.silu(x @ w + b) + r


def residual_then_act(x, w, b, r):
  # The residual before the activation is another function: not one kernel.
  return jax.nn.silu(x @ w + b + r)


def _args():
  k = jax.random.split(jax.random.key(0), 4)
  return (jax.random.normal(k[0], (16, 32)), jax.random.normal(k[1], (32, 48)),
          jax.random.normal(k[2], (48,)), jax.random.normal(k[3], (16, 48)))


def test_residual_after_the_activation_is_one_matmul_with_values_and_grads():
  args = _args()
  swapped = pallas_kernels.swap(block)
  (site,) = swapped.report(*args).sites
  assert site.replaced and site.kernel == "pallas_kernels.matmul"
  assert site.pattern == "dot_general + bias + activation:silu + residual"
  assert "residual=" in site.call and "activation='silu'" in site.call
  out, ref = jax.jit(swapped)(*args), block(*args)
  assert relative_error(out, ref) <= tolerance(ref.dtype)
  grad = lambda f: jax.jit(jax.grad(lambda *a: (f(*a) ** 2).sum(), argnums=(0, 1, 2, 3)))
  for g, g_ref in zip(grad(swapped)(*args), grad(block)(*args)):
    assert relative_error(g, g_ref) <= tolerance(g_ref.dtype, grad=True)


def test_a_residual_before_the_activation_is_not_taken_for_one_after():
  args = _args()
  swapped = pallas_kernels.swap(residual_then_act)
  sites = swapped.report(*args).sites
  out, ref = jax.jit(swapped)(*args), residual_then_act(*args)
  assert relative_error(out, ref) <= tolerance(ref.dtype)
  # The kernel adds its residual after its activation: here it may take the
  # bias and the residual, and must leave the activation to XLA.
  (site,) = sites
  assert site.replaced and site.pattern == "dot_general + bias + residual"
