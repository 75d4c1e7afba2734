"""Reductions named by what the HLO reduces, on code written the way optax,
flax and jax.numpy users write it: a global norm's sums of squares, a loss
total, a mask's any() test, a prefix sum (a scan, not a reduction), and
XLA:CPU's two-stage reductions (a striding reduce-window, then a reduce
with a clone of the reducer) read as one."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

import hlo_audit
from hlo_audit import FindingKind

optax = pytest.importorskip("optax")
flax_nn = pytest.importorskip("flax.linen")


def _reductions(report):
  return [f for f in report.findings if f.kind is FindingKind.SEPARATE_REDUCTION]


@functools.cache
def clipped_step_report():
  class MLP(flax_nn.Module):
    @flax_nn.compact
    def __call__(self, x):
      return flax_nn.Dense(10)(flax_nn.relu(flax_nn.Dense(512)(x)))

  model = MLP()
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))

  def step(params, opt_state, x, y):
    def loss_fn(p):
      return jnp.mean((model.apply({"params": p}, x) - y) ** 2)
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  x, y = jnp.zeros((64, 256)), jnp.zeros((64, 10))
  params = model.init(jax.random.key(0), x)["params"]
  return hlo_audit.audit(jax.jit(step), params, tx.init(params), x, y)


def test_global_norm_sums_of_squares_are_not_gradients():
  found = {f.boundary_shape: f for f in _reductions(clipped_step_report())}
  # The weight gradients of both Dense layers, re-read by
  # clip_by_global_norm's sum of their squares over every element.
  for shape in ("f32[256,512]", "f32[512,10]"):
    f = found[shape]
    assert f.ops == ("sum_of_squares",), (shape, f.ops)
    assert "global norm" in f.evidence and "bias, gamma or weight gradient" not in f.evidence
    assert "batch axis" not in f.evidence


def test_a_bias_gradient_is_still_a_column_reduction():
  # dy [64,512] summed over the batch for Dense_0's bias: a gradient, leading axes.
  f = {f.boundary_shape: f for f in _reductions(clipped_step_report())}["f32[64,512]"]
  assert f.ops == ("column_reduction",) and "bias, gamma or weight gradient" in f.evidence


@functools.cache
def threshold_report():
  def step(x, w):
    h = x @ w
    far = jnp.any(h > 3.0, axis=0)  # a threshold test over the rows
    return jnp.where(far, 0.0, h).sum()
  return hlo_audit.audit(jax.jit(step), jnp.zeros((512, 256)), jnp.zeros((256, 128)))


def test_any_is_a_test_not_a_sum_and_its_two_stages_are_one_reduction():
  found = _reductions(threshold_report())
  tests = [f for f in found if f.boundary_shape == "pred[512,128]"]
  assert len(tests) == 1 and tests[0].ops == ("any",), [(f.boundary_shape, f.ops) for f in found]
  assert "any() test" in tests[0].evidence and "sum or mean" not in tests[0].evidence
  # XLA:CPU reduces pred[512,128] to pred[16,128] with a striding
  # reduce-window, then to pred[128] with a clone of the reducer: one
  # reduction, whose partial results are no boundary of their own.
  assert not [f for f in found if f.boundary_shape == "pred[16,128]"]
  total = [f for f in found if f.boundary_shape == "f32[512,128]"]
  assert [f.ops for f in total] == [("total",)]


def test_a_prefix_sum_is_no_reduction():
  # jnp.cumsum lowers to reduce-window stages that keep the operand's shape
  # (jax-md's neighbor-list pruning is one): nothing for a producer to reduce.
  def prune(x, cutoff):
    mask = (x < cutoff).astype(jnp.int32)
    idx = jnp.cumsum(mask, axis=1) - 1
    return jnp.where(mask > 0, idx, x.shape[1])

  r = hlo_audit.audit(jax.jit(prune), jnp.zeros((977, 16), jnp.float32), jnp.float32(1.0))
  assert not _reductions(r), [(f.boundary_shape, f.ops, f.evidence[:120]) for f in _reductions(r)]


def test_a_loops_reduction_of_its_carried_state_is_not_the_initialisers():
  # As jax-md's simulation loops do: the state a fori_loop carries is made
  # before the loop (here x * 2), and the body reduces the state it updates
  # on every trip. The kernel that made the initial value runs once; it
  # cannot compute a reduction of values the body has not written yet.
  def simulate(x, y):
    def body(i, s):
      m = jnp.sum(s * s, axis=1, keepdims=True)
      return s * 0.9 + m * y
    return jax.lax.fori_loop(0, 10, body, x * 2.0)

  r = hlo_audit.audit(jax.jit(simulate), jnp.zeros((1000, 2)), jnp.ones((1000, 2)))
  assert not _reductions(r), [(f.boundary, f.consumers) for f in _reductions(r)]
