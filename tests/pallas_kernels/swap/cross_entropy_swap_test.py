"""A large vocabulary's projection and cross-entropy swapped for one
`linear_cross_entropy` call: recognised by replaying the user's equations,
the same loss and gradients, and on an H200 the logits gone from memory."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import pallas_kernels as pk
from pallas_kernels._src.swap import cross_entropy

T, D, V = 16, 16, 300


def _args(dtype=jnp.float32):
  k = jax.random.split(jax.random.key(0), 4)
  return (jax.random.normal(k[0], (2, T // 2, D), dtype),
          jax.random.normal(k[1], (D, V), dtype), jax.random.normal(k[2], (V,), dtype),
          jax.random.randint(k[3], (2, T // 2), 0, V))


def optax_head(x, w, b, labels):
  # A flax Dense head in bf16, widened for optax's loss (model_ce_head's).
  logits = (x @ w + b).astype(jnp.float32)
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def log_softmax_head(x, w, b, labels):
  logp = jax.nn.log_softmax(x @ w + b, axis=-1)
  return jnp.mean(-jnp.take_along_axis(logp, labels[..., None], axis=-1))


@pytest.mark.parametrize("fn", [optax_head, log_softmax_head])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_the_head_is_one_call_with_the_same_loss_and_gradients(fn, dtype):
  pk.clear_fallbacks()
  args = _args(dtype)
  swapped = pk.swap(fn, interpret=True)
  sites = [s for s in swapped.report(*args).sites
           if s.kernel == "pallas_kernels.linear_cross_entropy"]
  assert len(sites) == 1 and sites[0].replaced, sites
  assert "bias=" in sites[0].call and "reduction='none'" in sites[0].call
  tol = 1e-2 if dtype == jnp.bfloat16 else 1e-5
  np.testing.assert_allclose(swapped(*args), fn(*args), rtol=tol)
  got = jax.grad(swapped, argnums=(0, 1, 2))(*args)
  want = jax.grad(fn, argnums=(0, 1, 2))(*args)
  for g, w in zip(got, want):
    np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32),
                               rtol=5 * tol, atol=5 * tol)
  assert not pk.fallbacks()


def test_logits_another_reader_needs_are_left_with_the_reason():
  def with_accuracy(x, w, b, labels):
    logits = x @ w + b
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    return loss, jnp.mean(jnp.argmax(logits, -1) == labels)
  report = pk.swap(with_accuracy, interpret=True).report(*_args())
  (site,) = [s for s in report.sites if s.kernel == "pallas_kernels.linear_cross_entropy"]
  assert not site.replaced and "read elsewhere" in site.reason


def test_a_loss_that_is_not_a_cross_entropy_is_not_taken():
  def focal_like(x, w, b, labels):  # a per-token value from logits and labels
    logp = jax.nn.log_softmax(x @ w + b)
    picked = jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
    return jnp.mean(-(1 - jnp.exp(picked)) ** 2 * picked)
  report = pk.swap(focal_like, interpret=True).report(*_args())
  assert not [s for s in report.sites if s.kernel == "pallas_kernels.linear_cross_entropy"]


def test_a_narrow_classifier_is_left_to_xla():
  # 10 classes from 16 features: the logits are no larger than the features.
  x, _, _, _ = _args()
  w, b = jnp.ones((D, 10)), jnp.zeros((10,))
  labels = jnp.zeros(x.shape[:-1], jnp.int32)
  report = pk.swap(optax_head, interpret=True).report(x, w, b, labels)
  assert not [s for s in report.sites if s.kernel == "pallas_kernels.linear_cross_entropy"]
  assert V >= cross_entropy.VOCAB_RATIO * D > 10


def test_on_an_h200_the_heads_footprint_drops_by_the_logits():
  # model_ce_head's train step (flax Dense head, optax loss and adam), its
  # loss swapped, both compiled for an H200 here: XLA's own memory analysis.
  from pallas_kernels._src.audit import topology
  why = topology.unavailable_reason()
  if why:
    pytest.skip(why)
  pytest.importorskip("flax")
  from tests.hlo_audit.real_models import model_ce_head as m

  def step_of(loss):
    def step(params, opt_state, hidden, labels):
      value, grads = jax.value_and_grad(loss)(params, hidden, labels)
      updates, opt_state = m.tx.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state, value
    return step

  def loss(params, hidden, labels):
    logits = m.head.apply({"params": params}, hidden).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

  _, args = m.build()
  specs = [topology.placed("sm_90a", jax.ShapeDtypeStruct(a.shape, a.dtype))[0]
           for a in jax.tree.leaves(args)]
  tree = jax.tree.structure(args)

  def footprint(fn):
    compiled = jax.jit(fn).trace(*jax.tree.unflatten(tree, specs)).lower().compile()
    ma = compiled.memory_analysis()
    return (ma.argument_size_in_bytes + ma.output_size_in_bytes + ma.temp_size_in_bytes
            - ma.alias_size_in_bytes), compiled.as_text()

  before, _ = footprint(step_of(loss))
  after, text = footprint(step_of(pk.swap(loss, target="h200")))
  logits = m.BATCH * m.SEQ * m.VOCAB * 4  # the f32 logits, 32 MiB
  assert before - after >= logits, (before, after)
  assert f"f32[{m.BATCH},{m.SEQ},{m.VOCAB}]" not in text
