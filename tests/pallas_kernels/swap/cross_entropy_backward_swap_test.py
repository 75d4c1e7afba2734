"""A training step's cross-entropy head swapped after `jax.grad` traced it:
the forward one `linear_cross_entropy` call, the backward (`dlogits @ w^T`,
`x^T @ dlogits`, the bias gradient's sum) a second one, the op's own VJP at
the losses' cotangent; neither leaves [tokens, vocab] values in the step."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import pallas_kernels as pk
# The two spellings of the head the forward's tests swap (optax's, and
# log_softmax + take_along_axis).
from cross_entropy_swap_test import log_softmax_head, optax_head

B, S, D, V = 2, 12, 16, 300  # 24 tokens: no [T, V] array shares w's [D, V] size
KERNEL = "pallas_kernels.linear_cross_entropy"


def _args(dtype=jnp.float32):
  k = jax.random.split(jax.random.key(0), 4)
  return (jax.random.normal(k[0], (B, S, D), dtype),
          jax.random.normal(k[1], (D, V), dtype), jax.random.normal(k[2], (V,), dtype),
          jax.random.randint(k[3], (B, S), 0, V))


def _sites(swapped, *args):
  return [s for s in swapped.report(*args).sites if s.kernel == KERNEL]


def _token_vocab_values(fn, *args) -> list[str]:
  """Results of the swapped step's own equations with tokens x vocab elements
  (the kernels' calls are single equations: what they hold stays inside)."""
  jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
  return [str(v.aval) for e in jaxpr.eqns for v in e.outvars
          if math.prod(getattr(v.aval, "shape", ())) == B * S * V]


def _close(got, want, tol):
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32),
                               rtol=tol, atol=tol)


@pytest.mark.parametrize("fn", [optax_head, log_softmax_head])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_the_step_runs_the_head_and_its_backward_as_two_calls(fn, dtype):
  pk.clear_fallbacks()
  args = _args(dtype)
  step = jax.value_and_grad(fn, argnums=(0, 1, 2))
  swapped = pk.swap(step, interpret=True)
  sites = _sites(swapped, *args)
  assert [(s.replaced, s.pattern.endswith("backward")) for s in sites] == [
      (True, False), (True, True)], sites
  assert "cotangent=f32[2,12]" in sites[1].call and "('x', 'w', 'bias')" in sites[1].call
  assert _token_vocab_values(step, *args)  # XLA's step holds the logits...
  assert not _token_vocab_values(swapped, *args)  # ...the swapped one none
  tol = 3e-2 if dtype == jnp.bfloat16 else 1e-5
  _close(swapped(*args), step(*args), tol)
  assert not pk.fallbacks()


def test_a_cotangent_computed_from_the_loss_is_the_one_the_backward_reads():
  # log(mean): the per-token cotangent is 1 / (N * loss), a traced value.
  def log_loss(x, w, b, labels):
    return jnp.log(optax_head(x, w, b, labels))
  args = _args()
  step = jax.value_and_grad(log_loss, argnums=(0, 1, 2))
  swapped = pk.swap(step, interpret=True)
  assert [s.replaced for s in _sites(swapped, *args)] == [True, True]
  _close(swapped(*args), step(*args), 1e-5)


def test_only_the_gradients_the_step_takes_are_computed():
  # The weight alone, a sum over the tokens, no bias: one gradient, dw.
  def head(w, x, labels):
    return optax.softmax_cross_entropy_with_integer_labels(x @ w, labels).sum()
  x, w, _, labels = _args()
  step = jax.grad(head)
  swapped = pk.swap(step, interpret=True)
  sites = _sites(swapped, w, x, labels)
  assert [s.replaced for s in sites] == [True, True]
  assert "grads=('w',)" in sites[1].call and "bias=" not in sites[1].call
  _close(swapped(w, x, labels), step(w, x, labels), 1e-5)


def test_a_weight_gradient_computed_transposed_is_given_transposed():
  # dy^T @ x with no transpose after it: the call returns dw as [V, D].
  def head(x, w, labels):
    logits = jnp.einsum("btd,dv->btv", x, w)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
  x, w, _, labels = _args()

  def step(x, w, labels):
    dw_t = jax.grad(head, argnums=1)(x, w, labels).T  # the transpose XLA would fold
    return dw_t
  swapped = pk.swap(step, interpret=True)
  assert [s.replaced for s in _sites(swapped, x, w, labels)] == [True, True]
  _close(swapped(x, w, labels), step(x, w, labels), 1e-5)


def test_a_z_loss_beside_the_cross_entropy_leaves_the_head_to_xla():
  # PaLM's z-loss reads the log-normalizer too: the backward is not the
  # cross-entropy's alone, and nothing of the head is swapped.
  def with_z_loss(x, w, b, labels):
    logits = (x @ w + b).astype(jnp.float32)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    return jnp.mean(ce + 1e-2 * jax.nn.logsumexp(logits, -1) ** 2)
  args = _args()
  step = jax.value_and_grad(with_z_loss, argnums=(0, 1, 2))
  swapped = pk.swap(step, interpret=True)
  sites = _sites(swapped, *args)
  assert sites and not any(s.replaced for s in sites), sites
  assert "read elsewhere" in sites[0].reason
  _close(swapped(*args), step(*args), 1e-6)


def test_logits_the_step_returns_leave_the_head_to_xla():
  def with_logits(x, w, b, labels):
    logits = (x @ w + b).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(), logits
  args = _args()
  step = jax.value_and_grad(with_logits, argnums=(0, 1, 2), has_aux=True)
  sites = _sites(pk.swap(step, interpret=True), *args)
  assert sites and not any(s.replaced for s in sites)


def test_the_suites_head_is_swapped_whole_for_an_h200():
  # model_ce_head: a flax Dense head in bf16 to 32k words, optax's loss and
  # adam, the hidden states' gradient returned (what flows into the trunk).
  pytest.importorskip("flax")
  from tests.hlo_audit.real_models import model_ce_head as m
  fn, args = m.build()
  sites = _sites(pk.swap(fn, target="h200"), *args)
  assert [s.replaced for s in sites] == [True, True], sites
  # Both calls read the f32 parameters and hidden states, rounded to bf16 as
  # the kernels load them; x's and w's gradients come out f32, as the step's
  # (the converts' transposes) do.
  for site in sites:
    assert f"x=f32[{m.BATCH},{m.SEQ},{m.DIM}], w=f32[{m.DIM},{m.VOCAB}]" in site.call, site
    assert "compute_dtype='bfloat16'" in site.call, site
  assert "grads=('x', 'w', 'bias')" in sites[1].call
  assert "dtypes=('float32', 'float32', 'bfloat16')" in sites[1].call


def _mixed_head(x, w, labels):
  # f32 parameters and activations, multiplied in bf16 (flax's Dense(dtype=bf16)).
  logits = (x.astype(jnp.bfloat16) @ w.astype(jnp.bfloat16)).astype(jnp.float32)
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def _narrow_weights(fn, *args) -> list[str]:
  """The step's own equations that write w narrowed to bf16."""
  jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
  return [str(e) for e in jaxpr.eqns if e.primitive.name == "convert_element_type"
          and tuple(e.outvars[0].aval.shape) == (D, V)
          and e.outvars[0].aval.dtype == jnp.bfloat16]


def test_a_mixed_precision_heads_casts_happen_as_the_kernels_load():
  pk.clear_fallbacks()
  x, w, _, labels = _args()
  step = jax.value_and_grad(_mixed_head, argnums=(0, 1))
  swapped = pk.swap(step, interpret=True)
  sites = _sites(swapped, x, w, labels)
  assert [s.replaced for s in sites] == [True, True], sites
  assert all("w=f32[16,300]" in s.call and "compute_dtype='bfloat16'" in s.call
             for s in sites), sites
  assert "dtypes=('float32', 'float32')" in sites[1].call
  assert _narrow_weights(step, x, w, labels)
  assert not _narrow_weights(swapped, x, w, labels)
  (loss, grads), (want, want_grads) = swapped(x, w, labels), step(x, w, labels)
  # The operands are rounded to bf16 as the step rounds them (unrounded f32
  # moves the loss by ~5e-5); the logits stay f32 where the step's are bf16.
  bf16 = jnp.bfloat16
  rounded = optax.softmax_cross_entropy_with_integer_labels(
      jnp.dot(x.astype(bf16), w.astype(bf16), preferred_element_type=jnp.float32),
      labels).mean()
  np.testing.assert_allclose(float(loss), float(rounded), rtol=2e-6)
  np.testing.assert_allclose(float(loss), float(want), rtol=2e-3)
  assert [g.dtype for g in grads] == [jnp.float32, jnp.float32]
  # The gradients accumulate in f32 where the step rounds them to bf16 first.
  _close(grads, want_grads, 2e-2)
  assert not pk.fallbacks()


def test_a_narrowed_weight_read_elsewhere_stays_narrowed():
  # The bf16 copy of w is also read by a norm the step returns: it is
  # written anyway, so the calls read it.
  def head(x, w, labels):
    wb = w.astype(jnp.bfloat16)
    logits = (x.astype(jnp.bfloat16) @ wb).astype(jnp.float32)
    norm = jnp.sum(jnp.square(wb.astype(jnp.float32)))
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(), norm
  x, w, _, labels = _args()
  step = jax.value_and_grad(head, argnums=(0, 1), has_aux=True)
  swapped = pk.swap(step, interpret=True)
  sites = _sites(swapped, x, w, labels)
  assert [s.replaced for s in sites] == [True, True], sites
  assert all("w=bf16[16,300]" in s.call for s in sites), sites
  # x's convert is read by the two calls alone: still taken.
  assert all("x=f32[2,12,16]" in s.call for s in sites), sites
  _close(swapped(x, w, labels), step(x, w, labels), 2e-2)


def test_on_an_h200_the_swapped_steps_footprint_drops_by_the_logits():
  # The same step swapped whole, both programs compiled for an H200 here:
  # XLA's own memory analysis of each.
  from pallas_kernels._src.audit import topology
  why = topology.unavailable_reason()
  if why:
    pytest.skip(why)
  pytest.importorskip("flax")
  from tests.hlo_audit.real_models import h200_support
  from tests.hlo_audit.real_models import model_ce_head as m
  fn, args = m.build()
  _, before = h200_support.compile_with_footprint(fn, args)
  text, after = h200_support.compile_with_footprint(jax.jit(pk.swap(fn, target="h200")), args)
  logits = m.BATCH * m.SEQ * m.VOCAB * 4  # the f32 logits, 32 MiB
  assert before - after >= logits, (before, after)
  assert f"f32[{m.BATCH},{m.SEQ},{m.VOCAB}]" not in text
  assert f"bf16[{m.DIM},{m.VOCAB}]" not in text  # the head's weight is read as f32
