"""A weight gradient and optax's Adam update swapped for one `adam_matmul`:
the constants read off by probing, the schedule's learning rate passed as
traced, the same step, and a gradient other readers need left to XLA."""

from __future__ import annotations

import inspect

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state

import pallas_kernels as pk
from pallas_kernels._src import tolerances

B, F, H, C = 16, 32, 64, 8


class _MLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Dense(H)(x))
    return nn.Dense(C)(x)


def _step(state, batch):
  # model_linen_mlp's train step: flax TrainState, optax's integer-label loss.
  def loss_fn(params):
    logits = state.apply_fn({"params": params}, batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
  loss, grads = jax.value_and_grad(loss_fn)(state.params)
  return state.apply_gradients(grads=grads), loss


def _state(tx, steps=2):
  """A state some steps in (moments and count not at their initial values)."""
  model = _MLP()
  k = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(k[0], (B, F))
  params = model.init(k[1], x)["params"]
  state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)
  batch = {"x": x, "y": jax.random.randint(k[2], (B,), 0, C)}
  for _ in range(steps):
    state, _ = jax.jit(_step)(state, batch)
  return state, batch


def _adam_sites(report):
  return [s for s in report.sites if s.kernel == "pallas_kernels.adam_matmul"]


def _check_same(tx):
  pk.clear_fallbacks()
  state, batch = _state(tx)
  swapped = pk.swap(_step, interpret=True)
  got = jax.jit(swapped)(state, batch)
  want = jax.jit(_step)(state, batch)
  tol = tolerances.tolerance(jnp.float32)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    if jnp.issubdtype(b.dtype, jnp.floating):
      assert tolerances.relative_error(a, b) <= tol
    else:
      np.testing.assert_array_equal(a, b)
  assert not pk.fallbacks()  # the kernels ran (interpreted)
  return swapped.last_report


def test_each_dense_kernel_and_its_adam_step_are_one_call():
  report = pk.swap(_step, interpret=True).report(*_state(optax.adam(1e-3), 0))
  sites = _adam_sites(report)
  assert len(sites) == 2 and all(s.replaced for s in sites), report
  for s in sites:
    assert "learning_rate=0.001, b1=0.9, b2=0.999, eps=1e-08, eps_root=0.0, " \
        "weight_decay=0.0" in s.call, s.call
    # The step donates nothing: an aliased update would have XLA copy each
    # undonated parameter and moment first.
    assert "in_place=False" in s.call, s.call
  shapes = sorted(s.output for s in sites)
  assert shapes == [f"f32[{F},{H}], f32[{F},{H}], f32[{F},{H}]",
                    f"f32[{H},{C}], f32[{H},{C}], f32[{H},{C}]"]


def test_a_step_whose_jit_donates_its_state_updates_it_in_place():
  # flax's examples jit the step with the state donated: the update may
  # write over the parameter and moments it reads (jit the swapped step
  # with the same donation).
  donating = jax.jit(_step, donate_argnums=(0,))
  state, batch = _state(optax.adam(1e-3), 0)
  sites = _adam_sites(pk.swap(donating, interpret=True).report(state, batch))
  assert len(sites) == 2 and all("in_place=True" in s.call for s in sites), sites
  # Donating the batch alone donates no state.
  other = jax.jit(_step, donate_argnums=(1,))
  sites = _adam_sites(pk.swap(other, interpret=True).report(state, batch))
  assert sites and all("in_place=False" in s.call for s in sites), sites
  pk.clear_fallbacks()
  swapped = jax.jit(pk.swap(donating, interpret=True), donate_argnums=(0,))
  want = jax.jit(_step)(*_state(optax.adam(1e-3), 1))
  got = swapped(*_state(optax.adam(1e-3), 1))
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert tolerances.relative_error(a, b) <= tolerances.tolerance(jnp.float32)
  assert not pk.fallbacks()


def test_adam_step_values_equal_the_unswapped_step():
  assert len(_adam_sites(_check_same(optax.adam(1e-3)))) == 2


def test_adamw_weight_decay_and_other_constants_are_read_off():
  tx = optax.adamw(3e-3, b1=0.8, b2=0.99, eps=1e-6, weight_decay=0.05)
  report = pk.swap(_step, interpret=True).report(*_state(tx, 0))
  (s, _) = _adam_sites(report)
  assert s.replaced
  assert ("learning_rate=0.003, b1=0.8, b2=0.99, eps=1e-06, eps_root=0.0, "
          "weight_decay=0.05") in s.call, s.call


def test_adamw_values_equal_the_unswapped_step():
  _check_same(optax.adamw(3e-3, b1=0.8, b2=0.99, eps=1e-6, weight_decay=0.05))


def test_a_schedule_learning_rate_is_passed_as_the_step_computes_it():
  tx = optax.adam(optax.linear_schedule(1e-2, 1e-3, transition_steps=10))
  report = _check_same(tx)
  sites = _adam_sites(report)
  assert len(sites) == 2 and all(s.replaced for s in sites)
  assert all("learning_rate=f32[]" in s.call for s in sites), sites[0].call


def test_a_clipped_gradient_is_left_to_xla_with_a_reason():
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))
  report = pk.swap(_step, interpret=True).report(*_state(tx, 0))
  sites = _adam_sites(report)
  assert len(sites) == 2 and not any(s.replaced for s in sites), report
  for s in sites:
    assert "also read by" in s.reason or "scaled" in s.reason, s.reason


def test_a_rejection_names_the_first_other_reader_of_the_gradient():
  # dW read by two metrics on their own lines: the reason points the user at
  # the first in program order (the sum), where they would look first.
  def step(state, batch):
    def loss_fn(params):
      logits = state.apply_fn({"params": params}, batch["x"])
      return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    dw = grads["Dense_0"]["kernel"]
    total = jnp.sum(dw)  # the first reader
    peak = jnp.max(dw)
    return state.apply_gradients(grads=grads), loss, total, peak
  lines, start = inspect.getsourcelines(step)
  line = start + next(i for i, l in enumerate(lines) if "jnp.sum(dw)" in l)
  report = pk.swap(step, interpret=True).report(*_state(optax.adam(1e-3), 0))
  (s,) = [s for s in _adam_sites(report) if not s.replaced]  # Dense_0's
  assert f"also read by reduce_sum at {__file__}:{line}:" in s.reason, s.reason
  assert "reduce_max" not in s.reason, s.reason


def test_a_learning_rate_looked_up_from_a_table_of_rates_is_passed_as_traced():
  # lr = lrs[count] with the table an argument of the step: the lookup reads
  # an array, so it is where the learning rate's replay starts (its value
  # free), not a scalar computation to replay back to the table.
  def step(state, batch, lrs):
    tx = optax.adam(lambda count: lrs[count])
    def loss_fn(params):
      logits = state.apply_fn({"params": params}, batch["x"])
      return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), loss
  lrs = jnp.linspace(1e-2, 1e-3, 10)
  state, batch = _state(optax.adam(lambda count: lrs[count]))
  pk.clear_fallbacks()
  swapped = pk.swap(step, interpret=True)
  got = jax.jit(swapped)(state, batch, lrs)
  sites = _adam_sites(swapped.last_report)
  assert len(sites) == 2 and all(s.replaced for s in sites), swapped.last_report
  assert all("learning_rate=f32[]" in s.call for s in sites), sites[0].call
  want = jax.jit(step)(state, batch, lrs)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    if jnp.issubdtype(b.dtype, jnp.floating):
      assert tolerances.relative_error(a, b) <= tolerances.tolerance(jnp.float32)
    else:
      np.testing.assert_array_equal(a, b)
  assert not pk.fallbacks()


def test_a_gradient_the_step_returns_is_left_to_xla():
  def step(state, batch):
    def loss_fn(params):
      logits = state.apply_fn({"params": params}, batch["x"])
      return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss, grads
  report = pk.swap(step, interpret=True).report(*_state(optax.adam(1e-3), 0))
  sites = _adam_sites(report)
  assert len(sites) == 2 and not any(s.replaced for s in sites)
  assert all("the function's result" in s.reason for s in sites), sites[0].reason


def test_a_plain_gradient_descent_step_is_no_adam():
  report = pk.swap(_step, interpret=True).report(*_state(optax.sgd(1e-2), 0))
  assert not _adam_sites(report)


def test_the_update_must_match_the_kernels_own_reference_in_each_result(monkeypatch):
  # The kernel computes adam_reference.update's terms: a step matching the
  # swap's float64 mirror but not the kernel's reference in one of its three
  # results (here mu') is no Adam update the kernel can run.
  from pallas_kernels._src.ops import adam_reference  # pylint: disable=import-outside-toplevel
  update = adam_reference.update

  def mu_off(*args, **kwargs):
    p, mu, nu = update(*args, **kwargs)
    return p, mu * 1.01, nu

  args = _state(optax.adam(1e-3), 0)
  assert len(_adam_sites(pk.swap(_step, interpret=True).report(*args))) == 2
  monkeypatch.setattr(adam_reference, "update", mu_off)
  assert not _adam_sites(pk.swap(_step, interpret=True).report(*args))
