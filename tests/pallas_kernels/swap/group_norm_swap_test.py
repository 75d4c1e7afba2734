"""flax's GroupNorm (and its activation) swapped for `group_norm` calls: in a
forward alone one call; in a training step traced after `jax.grad`, the
forward and its backward as two, neither leaving the [N, ..., G, C/G] view
or the activation's input in the step."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk

KERNEL = "pallas_kernels.group_norm"
N, HW, C, G = 2, 6, 12, 3


def _sites(swapped, *args):
  return [s for s in swapped.report(*args).sites if s.kernel == KERNEL]


def _grouped_views(fn, *args, groups: int = G) -> list[str]:
  """The step's own equations (in its jit calls too, not inside a kernel)
  writing x viewed as [N, H, W, G, C/G]."""
  def walk(jaxpr):
    for e in jaxpr.eqns:
      if e.primitive.name == "pallas_call":
        continue
      yield from (str(v.aval) for v in e.outvars
                  if tuple(getattr(v.aval, "shape", ())) == (N, HW, HW, groups, C // groups))
      for sub in jax.extend.core.jaxprs_in_params(e.params):
        yield from walk(sub)
  return list(walk(jax.make_jaxpr(fn)(*args).jaxpr))


def _close(got, want, tol):
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32),
                               rtol=tol, atol=tol)


class Block(nn.Module):
  activation: object = nn.swish
  epsilon: float = 1e-6
  groups: int = G

  @nn.compact
  def __call__(self, x):
    x = nn.Conv(C, (3, 3))(x)
    return self.activation(nn.GroupNorm(num_groups=self.groups, epsilon=self.epsilon)(x))


def _init(block, key=0):
  k = jax.random.split(jax.random.key(key), 2)
  x = jax.random.normal(k[0], (N, HW, HW, 3))
  params = block.init(k[1], x)["params"]
  # Non-trivial affine parameters: a swapped scale and bias must show.
  gn = params["GroupNorm_0"]
  gn["scale"] = gn["scale"] + jnp.linspace(-0.5, 0.5, C)
  gn["bias"] = gn["bias"] + jnp.linspace(-1.0, 1.0, C)
  return params, x


@pytest.mark.parametrize("activation,name", [
    (nn.swish, "silu"), (nn.relu, "relu"), (lambda v: v, None)])
def test_a_forward_is_one_call_with_its_activation(activation, name):
  pk.clear_fallbacks()
  block = Block(activation=activation)
  params, x = _init(block)
  fn = jax.jit(lambda p, x: block.apply({"params": p}, x))
  swapped = pk.swap(fn, interpret=True)
  (site,) = _sites(swapped, params, x)
  assert site.replaced, site
  assert f"groups={G}" in site.call and f"activation={name!r}" in site.call, site.call
  assert "epsilon=1e-06" in site.call and "statistics" not in site.call, site.call
  assert _grouped_views(fn, params, x) and not _grouped_views(swapped, params, x)
  _close(swapped(params, x), fn(params, x), 1e-5)
  assert not pk.fallbacks()


# 0.1: the largest epsilon read as one, taken too.
@pytest.mark.parametrize("epsilon", [1e-2, 0.1])
def test_epsilon_is_read_off_the_chain(epsilon):
  block = Block(epsilon=epsilon)
  params, x = _init(block)
  fn = lambda p, x: block.apply({"params": p}, x)  # noqa: E731
  (site,) = _sites(pk.swap(fn, interpret=True), params, x)
  assert f"epsilon={epsilon}" in site.call, site.call


@pytest.mark.parametrize("groups, swapped", [(C // 2, True), (C, False)])
def test_two_channels_a_group_are_a_group_norm_and_one_is_not(groups, swapped):
  # One channel a group is an instance norm (a [..., G, 1] view): the swap
  # leaves it to XLA; two channels are the least group it takes.
  block = Block(groups=groups)
  params, x = _init(block)
  fn = lambda p, x: block.apply({"params": p}, x)  # noqa: E731
  sites = _sites(pk.swap(fn, interpret=True), params, x)
  assert bool(sites) == swapped, sites
  if swapped:
    assert f"groups={groups}" in sites[0].call, sites[0].call


def _step(block):
  def loss_fn(params, x):
    return jnp.mean(jnp.square(block.apply({"params": params}, x) - 0.5))
  return jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1)))


# One group too: flax's GroupNorm(num_groups=1) normalizes over every
# channel and pixel of a sample, x viewed as [N, H, W, 1, C].
@pytest.mark.parametrize("groups", [G, 1])
def test_a_training_step_runs_the_norm_and_its_backward_as_two_calls(groups):
  pk.clear_fallbacks()
  block = Block(groups=groups)
  params, x = _init(block)
  step = _step(block)
  swapped = pk.swap(step, interpret=True)
  sites = _sites(swapped, params, x)
  assert [(s.replaced, s.pattern.endswith("backward")) for s in sites] == [
      (True, False), (True, True)], sites
  assert f"groups={groups}" in sites[0].call, sites[0].call
  assert f"statistics=(({N}, {groups}), ({N}, {groups}))" in sites[0].call, sites[0].call
  assert (f"mean=f32[{N},{groups}], var=f32[{N},{groups}], cotangent=f32[{N},{HW},{HW},{C}]"
          in sites[1].call), sites[1]
  # The convolution's bias gradient, dx summed, comes from the kernel too.
  assert "grads=('x', 'scale', 'bias', 'x_sum')" in sites[1].call, sites[1].call
  assert _grouped_views(step, params, x, groups=groups) and \
      not _grouped_views(swapped, params, x, groups=groups)
  # Loss, the parameters' gradients and the input's, through the kernels.
  _close(swapped(params, x), step(params, x), 2e-5)
  assert not pk.fallbacks()


def test_a_pooled_heads_cotangent_is_read_one_row_a_sample():
  # Global average pooling after the norm: y's cotangent is one [C] row per
  # sample broadcast over H and W; the backward call reads the rows.
  block = Block()
  params, x = _init(block)

  def loss_fn(params, x):
    return jnp.sum(block.apply({"params": params}, x).mean(axis=(1, 2)) ** 2)
  step = jax.value_and_grad(loss_fn, argnums=(0, 1))
  swapped = pk.swap(step, interpret=True)
  sites = _sites(swapped, params, x)
  assert [s.replaced for s in sites] == [True, True], sites
  assert f"cotangent=f32[{N},1,1,{C}]" in sites[1].call, sites[1].call
  # y is read by the pool alone: the forward sums it instead of writing it.
  assert "pooled=True" in sites[0].call and "pooled" not in sites[1].call, sites
  _close(swapped(params, x), step(params, x), 2e-5)


def test_a_pooled_forward_writes_no_y():
  block = Block()
  params, x = _init(block)
  fn = jax.jit(lambda p, x: block.apply({"params": p}, x).mean(axis=(1, 2)))
  swapped = pk.swap(fn, interpret=True)
  (site,) = _sites(swapped, params, x)
  assert site.replaced and "pooled=True" in site.call and "statistics" not in site.call
  assert site.output == f"f32[{N},{C}]", site.output
  _close(swapped(params, x), fn(params, x), 1e-5)
  # Read by anything but the pool (here also returned), y is written.
  both = jax.jit(lambda p, x: (lambda y: (y, y.mean(axis=(1, 2))))(
      block.apply({"params": p}, x)))
  (site,) = _sites(pk.swap(both, interpret=True), params, x)
  assert site.replaced and "pooled" not in site.call, site.call


def test_the_gradients_of_parameters_the_step_does_not_take_are_not_computed():
  # Only the input's gradient: the norm's scale and bias are constants.
  block = Block()
  params, x = _init(block)

  def loss_fn(x):
    return jnp.mean(jnp.square(block.apply({"params": params}, x)))
  step = jax.grad(loss_fn)
  swapped = pk.swap(step, interpret=True)
  sites = _sites(swapped, x)
  assert [s.replaced for s in sites] == [True, True], sites
  assert "grads=('x',)" in sites[1].call, sites[1].call
  _close(swapped(x), step(x), 2e-5)


def _by_hand(x, scale, bias, *, eps=1e-5):
  # A group norm spelled out (two-pass variance, a divide by the root).
  xg = x.reshape(N, HW, HW, G, C // G)
  mean = xg.mean(axis=(1, 2, 4), keepdims=True)
  var = jnp.square(xg - mean).mean(axis=(1, 2, 4), keepdims=True)
  xhat = (xg - mean) / jnp.sqrt(var + eps)
  y = xhat.reshape(x.shape) * scale + bias
  return jax.nn.gelu(y, approximate=False), mean, xhat


def _hand_args():
  k = jax.random.split(jax.random.key(3), 3)
  return (jax.random.normal(k[0], (N, HW, HW, C)) * 2 + 1,
          1 + 0.3 * jax.random.normal(k[1], (C,)), jax.random.normal(k[2], (C,)))


def test_a_group_norm_spelled_out_is_recognised_by_what_it_computes():
  args = _hand_args()
  fn = lambda x, s, b: _by_hand(x, s, b)[0]  # noqa: E731
  swapped = pk.swap(fn, interpret=True)
  (site,) = _sites(swapped, *args)
  assert site.replaced and "epsilon=1e-05" in site.call and "'gelu'" in site.call, site
  _close(swapped(*args), fn(*args), 1e-5)


def test_a_normalized_value_the_step_returns_leaves_the_norm_to_xla():
  # x_hat is returned: the chain's intermediates are read elsewhere and
  # nothing there is its backward, so the chain stays XLA's, saying why.
  args = _hand_args()
  fn = lambda x, s, b: _by_hand(x, s, b)[::2]  # noqa: E731
  sites = _sites(pk.swap(fn, interpret=True), *args)
  assert sites and not any(s.replaced for s in sites), sites
  assert "read elsewhere" in sites[0].reason, sites[0].reason


def _step_returning(which: int):
  """A training step of the hand-written norm that also returns its mean
  (1) or its x_hat (2)."""
  def loss(x, s, b):
    out = _by_hand(x, s, b)
    return jnp.mean(jnp.square(out[0])), out[which]
  return jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)


def test_a_step_that_also_returns_x_hat_leaves_both_calls_to_xla():
  # Forward and backward are found, but x_hat, which the step returns, is
  # one of the values the two calls would absorb.
  args = _hand_args()
  sites = _sites(pk.swap(_step_returning(2), interpret=True), *args)
  assert sites and not any(s.replaced for s in sites), sites
  assert "between x and its gradient is read elsewhere" in sites[0].reason, sites[0].reason


def test_a_step_that_returns_the_group_means_gets_the_kernels():
  # The forward call writes the mean the chain computed: returning it
  # leaves nothing outside the calls reading what they absorb.
  args, step = _hand_args(), _step_returning(1)
  swapped = pk.swap(step, interpret=True)
  assert [s.replaced for s in _sites(swapped, *args)] == [True, True]
  _close(swapped(*args), step(*args), 2e-5)


def test_a_norm_over_channels_without_groups_is_not_a_group_norm():
  # A per-position layer norm reduces the last axis only: no group norm here.
  ln = nn.LayerNorm()
  x = jax.random.normal(jax.random.key(1), (N, HW, C))
  params = ln.init(jax.random.key(2), x)["params"]
  sites = _sites(pk.swap(lambda p, x: ln.apply({"params": p}, x), interpret=True),
                 params, x)
  assert not sites


def test_the_suites_groupnorm_cnn_swaps_both_norms_for_an_h200():
  from tests.hlo_audit.real_models import model_groupnorm_cnn as m
  fn, args = m.build()
  sites = _sites(pk.swap(fn, target="h200"), *args)
  assert [(s.replaced, s.pattern.endswith("backward")) for s in sites] == [
      (True, False), (True, True), (True, False), (True, True)], sites
  assert all("activation='silu'" in s.call for s in sites)


def test_on_an_h200_the_group_norms_findings_are_gone():
  # The suite's step swapped whole, both programs compiled for an H200 here
  # and audited as the H200 prices them.
  from pallas_kernels._src.audit import topology
  why = topology.unavailable_reason()
  if why:
    pytest.skip(why)
  import hlo_audit
  from tests.hlo_audit.real_models import h200_support
  from tests.hlo_audit.real_models import model_groupnorm_cnn as m
  fn, args = m.build()
  options = hlo_audit.AuditOptions(device="h200")

  def group_norm_findings(step):
    report = hlo_audit.audit_hlo(h200_support.compile_text(step, args), options=options)
    return [f for f in report.actionable
            if any(w in ("group_norm_stats", "activation_grad:silu") for w in f.ops)
            or (f.need is not None and f.need.anchor.startswith("group_norm"))]

  assert len(group_norm_findings(fn)) >= 5
  assert not group_norm_findings(jax.jit(pk.swap(fn, target="h200")))


def test_the_forward_writes_the_first_value_holding_the_mean():
  # The mean as [N, G], then broadcast back for the chain: the step returns
  # the [N, G] one, which the forward call must write itself, not the
  # broadcast made from it (that would leave the [N, G] mean read elsewhere).
  def by_hand(x, scale, bias, eps=1e-5):
    xg = x.reshape(N, HW, HW, G, C // G)
    mean = xg.mean(axis=(1, 2, 4))
    centred = xg - mean[:, None, None, :, None]
    var = jnp.square(centred).mean(axis=(1, 2, 4), keepdims=True)
    y = (centred / jnp.sqrt(var + eps)).reshape(x.shape) * scale + bias
    return jax.nn.gelu(y, approximate=False), mean

  def loss(x, s, b):
    y, mean = by_hand(x, s, b)
    return jnp.mean(jnp.square(y)), mean

  args, step = _hand_args(), jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)
  swapped = pk.swap(step, interpret=True)
  sites = _sites(swapped, *args)
  assert [s.replaced for s in sites] == [True, True], [(s.replaced, s.reason) for s in sites]
  _close(swapped(*args), step(*args), 2e-5)


def test_a_group_norm_over_features_alone_is_swapped():
  # flax's GroupNorm on [N, C] (no spatial axes): x viewed as [N, G, C/G].
  gn = nn.GroupNorm(num_groups=G)
  x = jax.random.normal(jax.random.key(0), (N, C))
  params = gn.init(jax.random.key(1), x)
  fn = lambda p, x: gn.apply(p, x)  # noqa: E731
  swapped = pk.swap(fn, interpret=True)
  (site,) = _sites(swapped, params, x)
  assert site.replaced and f"x=f32[{N},{C}]" in site.call, site
  _close(swapped(params, x), fn(params, x), 1e-5)
