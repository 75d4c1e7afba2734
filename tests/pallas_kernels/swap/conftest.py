"""Shared fixtures of the swap tests: small functions, compiled once per module."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

from hlo_audit import examples


def mlp(x, w, b):
  """Dense -> bias -> exact GELU, as users write it."""
  return jax.nn.gelu(x @ w + b, approximate=False)


def residual_layer_norm(x, r, gamma, beta):
  """Residual add, then a layer norm spelled out (returns both)."""
  h = x + r
  mean = h.mean(-1, keepdims=True)
  var = ((h - mean) ** 2).mean(-1, keepdims=True)
  return (h - mean) * jax.lax.rsqrt(var + 1e-5) * gamma + beta, h


def attention_probs(q, k, mask):
  """softmax(q @ k.T * s + mask) with a broadcast additive mask."""
  s = jnp.einsum("bqd,bkd->bqk", q, k) * 0.125
  return jax.nn.softmax(s + mask, axis=-1)


def scan_relu(c, xs, w, b):
  """A lax.scan whose body is a matmul + bias + relu."""
  def body(carry, x):
    carry = jax.nn.relu(carry @ w + b + x)
    return carry, carry.sum()
  return jax.lax.scan(body, c, xs)


@pytest.fixture(scope="module")
def keys():
  return jax.random.split(jax.random.PRNGKey(0), 8)


@pytest.fixture(scope="module")
def mlp_args(keys):
  return (jax.random.normal(keys[0], (16, 32)), jax.random.normal(keys[1], (32, 64)) / 6,
          jax.random.normal(keys[2], (64,)))


@pytest.fixture(scope="module")
def example():
  """The built-in transformer block at small sizes: (loss, params, tokens)."""
  cfg = examples.TransformerConfig(batch=2, seq=16, d_model=32, heads=2, d_ff=64,
                                   vocab=64)
  params = examples.init_params(cfg, jax.random.PRNGKey(0))
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 16), 0, 64)
  return functools.partial(examples.loss_fn, cfg=cfg), params, tokens
