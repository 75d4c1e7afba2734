"""group_norm: the Pallas kernels in interpret mode against flax and the float32 ground truth.

Expected values come only from flax.linen.GroupNorm, `reference.py` (float32)
and the op's invariances; tolerances only from `tolerances.py`. Every kernel
test fails on any recorded fallback. Interpreted runs are few and small: each
is shared by the assertions about it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk
from pallas_kernels._src import inputs
from pallas_kernels._src.ops.group_norm import arg_specs
from pallas_kernels._src.ops.group_norm import reference
from pallas_kernels._src.ops.group_norm.api import group_norm
from pallas_kernels._src.ops.group_norm.config import Config
from pallas_kernels._src.spec import CallFacts
from pallas_kernels._src.tolerances import relative_error, tolerance

SMALL = arg_specs.SMALL
F32 = jnp.float32


def operands(shape, dtype="float32"):
  keys = inputs.Keys(0, f"gn{shape}{dtype}")
  c = shape[-1]
  x = inputs.normal(keys.next(), shape, dtype)
  scale = inputs.normal(keys.next(), (c,), dtype)
  bias = inputs.normal(keys.next(), (c,), dtype)
  g = inputs.normal(keys.next(), shape, dtype)
  return x, scale, bias, g


def assert_close(out, expected, dtype, grad=False, what=""):
  assert out.shape == expected.shape, (what, out.shape, expected.shape)
  err, bound = relative_error(out, expected), tolerance(dtype, grad=grad)
  assert err <= bound, f"{what}: relative error {err:.3e} > {bound:.0e}"


def assert_no_fallback():
  assert not pk.fallbacks(), f"the kernel fell back to XLA: {pk.fallbacks()}"


def kernel(groups, config=SMALL, **kwargs):
  return functools.partial(group_norm, groups=groups, implementation="pallas",
                           interpret=True, config=config, **kwargs)


def _loss(fn, g, x, scale, bias):
  return jnp.sum(fn(x, scale, bias).astype(F32) * g.astype(F32))


def _grads(fn, g, *args):
  return jax.grad(functools.partial(_loss, fn, g), (0, 1, 2))(*args)


def _run(shape, groups, dtype, activation):
  """One interpreted forward and gradient, and the reference's, in f32."""
  x, scale, bias, g = operands(shape, dtype)
  fn = kernel(groups, activation=activation)
  ref = functools.partial(reference.group_norm_f32, groups=groups, activation=activation)
  up = [a.astype(F32) for a in (x, scale, bias)]
  return (fn(x, scale, bias), _grads(fn, g, x, scale, bias), ref(*up),
          _grads(ref, g, *up))


@pytest.fixture(scope="module")
def f32_run():
  pk.clear_fallbacks()
  # 35 rows a sample over 16-row tiles; 3 groups of 4 channels: windows of 2, then 1.
  result = _run((2, 5, 7, 12), 3, "float32", None)
  return result, pk.fallbacks()


@pytest.fixture(scope="module")
def silu_run():
  pk.clear_fallbacks()
  # 4 groups of 3 channels: 6 of each 8-channel tile used.
  result = _run((2, 5, 7, 12), 4, "bfloat16", "silu")
  return result, pk.fallbacks()


def _check(run, dtype):
  (y, grads, want, want_grads), fallbacks = run
  assert not fallbacks, f"the kernel fell back to XLA: {fallbacks}"
  assert y.dtype == jnp.dtype(dtype)
  assert_close(y, want, dtype, what="y")
  for name, got, expected in zip(("dx", "dscale", "dbias"), grads, want_grads):
    assert got.dtype == jnp.dtype(dtype), name
    assert_close(got, expected, dtype, grad=True, what=name)


def test_f32_forward_and_gradients_ragged(f32_run):
  _check(f32_run, "float32")


def test_bf16_silu_forward_and_gradients_ragged(silu_run):
  _check(silu_run, "bfloat16")


@pytest.mark.parametrize("shape, groups, config", [
    ((2, 4, 6, 12), 3, SMALL),   # NHWC, several windows a sample
    ((3, 10, 8), 8, None),       # rank 3, an instance norm, the default blocks
    ((4, 12), 2, SMALL),         # rank 2: over each group's channels alone
])
def test_matches_flax_group_norm_and_its_gradients(shape, groups, config):
  nn = pytest.importorskip("flax.linen")
  x, scale, bias, g = operands(shape)
  module = nn.GroupNorm(num_groups=groups)
  flax_fn = lambda x, s, b: module.apply({"params": {"scale": s, "bias": b}}, x)
  pk.clear_fallbacks()
  fn = kernel(groups, config)
  assert_close(fn(x, scale, bias), flax_fn(x, scale, bias), "float32", what="y")
  for name, got, want in zip(("dx", "dscale", "dbias"), _grads(fn, g, x, scale, bias),
                             _grads(flax_fn, g, x, scale, bias)):
    assert_close(got, want, "float32", grad=True, what=name)
  assert_no_fallback()


def test_matches_flax_with_swish_after_it_in_bf16():
  # The audited CNN's gn -> nn.swish, x in bf16 (flax computes in f32 and
  # returns f32 with f32 params: compared at bf16's tolerance).
  nn = pytest.importorskip("flax.linen")
  x, scale, bias, _ = operands((2, 4, 4, 16), "bfloat16")
  module = nn.GroupNorm(num_groups=4)
  want = nn.swish(module.apply({"params": {"scale": scale.astype(F32),
                                           "bias": bias.astype(F32)}}, x))
  pk.clear_fallbacks()
  y = kernel(4, activation="silu")(x, scale, bias)
  assert_no_fallback()
  assert y.dtype == jnp.bfloat16
  assert_close(y, want, "bfloat16", what="y")


def test_the_swaps_two_calls_from_the_forwards_statistics(clean_fallbacks):
  # What `swap` calls in a training step: the forward with the statistics
  # the program holds (mean and the clamped variance), and the backward from
  # them, with dx's sum over samples and rows (a bias before the norm). 35
  # rows over 16-row tiles: the padding rows' dx must stay out of the sum.
  from pallas_kernels._src.ops.group_norm import api
  shape, groups = (2, 5, 7, 12), 3
  x, scale, bias, g = operands(shape)
  kw = dict(groups=groups, activation="silu", implementation="pallas", interpret=True,
            config=SMALL)
  y, mean, var = api.group_norm_with_statistics(x, scale, bias, **kw)
  want_mean, want_var = reference.statistics(x, groups=groups)
  ref = functools.partial(reference.group_norm_f32, groups=groups, activation="silu")
  assert_close(y, ref(x, scale, bias), "float32", what="y")
  assert_close(mean, want_mean, "float32", what="mean")
  assert_close(var, want_var, "float32", what="var")
  # Pooled: y's sum over H and W in y's place, the padding rows left out.
  pooled, _, _ = api.group_norm_with_statistics(x, scale, bias, pooled=True, **kw)
  assert pooled.shape == (2, 12)
  assert_close(pooled, jnp.sum(ref(x, scale, bias), axis=(1, 2)), "float32", what="pooled")
  dx, dscale, dbias, dx_sum = api.group_norm_backward(x, scale, bias, mean, var, g,
                                                      dx_sum=True, **kw)
  want = _grads(ref, g, x, scale, bias)
  for name, got, expected in zip(("dx", "dscale", "dbias"), (dx, dscale, dbias), want):
    assert_close(got, expected, "float32", grad=True, what=name)
  assert_close(dx_sum, jnp.sum(want[0], axis=(0, 1, 2)), "float32", grad=True, what="sum")
  # A cotangent the same at every position is read one row a sample.
  row = g[:, :1, :1, :]
  got = api.group_norm_backward(x, scale, bias, mean, var, row, **kw)
  want = _grads(ref, jnp.broadcast_to(row, shape), x, scale, bias)
  for name, a, b in zip(("dx", "dscale", "dbias"), got, want):
    assert_close(a, b, "float32", grad=True, what=f"{name} (row cotangent)")
  with pytest.raises(ValueError, match="cotangent.shape"):
    api.group_norm_backward(x, scale, bias, mean, var, g[:, :1], **kw)
  assert_no_fallback()


def test_each_sample_and_group_is_normalized_on_its_own():
  # Group norm forgets a positive scale and any shift of one (sample, group):
  # only that sample's group is changed, and its output stays.
  x, scale, bias, _ = operands((3, 4, 5, 12))
  fn = kernel(3)
  pk.clear_fallbacks()
  y = fn(x, scale, bias)
  # Sample 1, group 1 (channels 4..7): scaled by 3 and shifted per channel
  # by different amounts (a per-channel shift changes the group's statistics
  # unless the groups are those channels exactly).
  moved = x.at[1, ..., 4:8].set(3.0 * x[1, ..., 4:8] + 5.0)
  y_moved = fn(moved, scale, bias)
  assert_no_fallback()
  np.testing.assert_allclose(y_moved, y, atol=1e-4)
  # And not invariant to moving part of a group: channels 4..5 alone.
  part = x.at[1, ..., 4:6].add(5.0)
  assert not np.allclose(fn(part, scale, bias)[1, ..., 4:8], y[1, ..., 4:8], atol=1e-2)


def test_a_constant_group_has_zero_variance():
  # E[x^2] - E[x]^2 of a constant group rounds to either side of 0: clamped
  # at 0 (flax's), y is bias there, never NaN.
  x, scale, bias, _ = operands((2, 9, 7, 16))
  constants = jnp.array([0.1, 1.7, 3.3, 7.9, 11.3, 29.7, 77.7, 123.4])
  x = x.at[0].set(jnp.repeat(constants, 2)[None, None, :] * jnp.ones((9, 7, 16)))
  pk.clear_fallbacks()
  y = kernel(8)(x, scale, bias)
  assert_no_fallback()
  assert bool(jnp.all(jnp.isfinite(y)))
  np.testing.assert_allclose(y[0], jnp.broadcast_to(bias, (9, 7, 16)), atol=0.1)
  want = reference.group_norm(x, scale, bias, groups=8)
  np.testing.assert_allclose(y[0], want[0], atol=0.1)


def test_tiles_do_not_change_the_result():
  # One group a program in 1-row tiles, and every group in one tile.
  x, scale, bias, _ = operands((2, 3, 3, 12))
  pk.clear_fallbacks()
  outs = [kernel(3, cfg, activation="relu")(x, scale, bias) for cfg in
          (Config(block_m=1, block_c=4), Config(block_m=16, block_c=16))]
  assert_no_fallback()
  np.testing.assert_allclose(outs[0], outs[1], atol=1e-5)


def test_xla_implementation_is_the_reference():
  x, scale, bias, _ = operands((2, 3, 6))
  out = group_norm(x, scale, bias, groups=2, activation="relu", implementation="xla")
  assert_close(out, reference.group_norm(x, scale, bias, groups=2, activation="relu"),
               "float32")


@pytest.mark.parametrize("args, kwargs, reason", [
    (((2, 3, 4), "float64", "float32"), {}, "x float64[2, 3, 4]: dtype float64 is not one of"),
    (((2, 3, 4), "float32", "float64"), {}, "scale float64[4]: dtype float64 is not one of"),
    (((2, 0, 4), "float32", "float32"), {}, "empty dimension in x"),
    (((2, 3, 8200), "float32", "float32"), {}, "a group of 4100 channels"),
    (((2, 3, 24), "float32", "float32"), {"config": Config(block_c=4)},
     "a group of 12 channels does not fit config.block_c=4"),
])
def test_guard_falls_back_and_says_why(clean_fallbacks, args, kwargs, reason):
  shape, xdt, pdt = args
  x = jax.ShapeDtypeStruct(shape, jnp.dtype(xdt))
  p = jax.ShapeDtypeStruct(shape[-1:], jnp.dtype(pdt))
  with jax.enable_x64(True):
    check = pk.check_guard("group_norm", x, p, p, groups=2, interpret=True, **kwargs)
  assert not check.runs and check.reason.startswith(reason), check.reason


def test_a_fallback_is_recorded_and_runs_the_reference(clean_fallbacks):
  x, scale, bias, _ = operands((2, 3, 8))
  y = group_norm(x, scale, bias, groups=2, implementation="pallas", interpret=True,
                 config=Config(block_c=2))
  (fb,) = pk.fallbacks("group_norm")
  assert "does not fit config.block_c=2" in fb.reason
  assert fb.signature.startswith("x=float32[2,3,8]")
  assert_close(y, reference.group_norm(x, scale, bias, groups=2), "float32")


@pytest.mark.parametrize("kwargs, message", [
    (dict(groups=5), r"x's 12 channels \(x of shape \(2, 12\).*do not split into groups=5"),
    (dict(groups=0), "groups must be a Python int >= 1"),
    (dict(x=jnp.ones(12)), "rank >= 2"),
    (dict(scale=jnp.ones(3)), r"scale.shape \(3,\) must be"),
    (dict(epsilon=-1.0), "epsilon must be finite and >= 0"),
    (dict(epsilon=float("inf")), "epsilon must be finite and >= 0, got inf"),
    (dict(epsilon=float("nan")), "epsilon must be finite and >= 0, got nan"),
    (dict(activation="softplus"), "unknown activation"),
])
def test_invalid_calls_raise(kwargs, message):
  args = dict(x=jnp.ones((2, 12)), scale=jnp.ones(12), bias=jnp.zeros(12), groups=3) | kwargs
  with pytest.raises(ValueError, match=message):
    group_norm(args.pop("x"), args.pop("scale"), args.pop("bias"), **args)


# -------------------------------------------------------- the audit's call ----


class _Array:
  def __init__(self, dtype, dims):
    self.dtype, self.dims = dtype, dims


def _facts(dims, ops, stats=None, eps=None):
  from hlo_audit import plugins
  return CallFacts(kind="separate-reduction", ops=ops, boundary=_Array("f32", dims),
                   shape=f"f32[{','.join(map(str, dims))}]",
                   statistics=plugins.Statistics(*stats) if stats else None,
                   epsilon=lambda: eps)


def test_suggests_a_call_with_the_groups_of_the_statistics():
  # XLA:GPU sums [8, 1024, 8, 4] over {1, 3} of the [8, 32, 32, 32] it re-reads;
  # XLA:CPU reads the image as [8, 32, 32, 8, 4].
  want = ("pallas_kernels.group_norm(x, scale, bias, groups=8, epsilon=1e-06)  "
          "# x: f32[8,32,32,32], scale: f32[32], bias: f32[32] -> f32[8,32,32,32]")
  for dims, stats in (((8, 32, 32, 32), ((8, 1024, 8, 4), (1, 3))),
                      ((8, 32, 32, 8, 4), ((8, 32, 32, 8, 4), (1, 2, 4)))):
    assert arg_specs.suggest(_facts(dims, ("group_norm_stats",), stats, 1e-6)).text() == want
  # The backward's column sums cannot tell the groups, nor an unknown epsilon.
  call = arg_specs.suggest(_facts((8, 32, 32, 32), ("column_reduction",)))
  assert call.text().startswith(
      "pallas_kernels.group_norm(x, scale, bias, groups=GROUPS, epsilon=EPS)  "
      "# x: f32[8,32,32,32]")


def test_the_flax_cnns_group_norm_findings_get_the_call_on_the_h200():
  import hlo_audit
  from tests.hlo_audit.real_models import h200_support
  report = hlo_audit.audit_hlo(h200_support.fixture("groupnorm_cnn"),
                               options=hlo_audit.AuditOptions(device="h200"))
  found = [f for f in report.findings
           if f.need is not None and f.need.anchor.startswith("group_norm")]
  # Each GroupNorm's statistics, and its backward's scale gradient.
  assert sorted(f.need.anchor for f in found) == ["group_norm_backward"] * 2 + [
      "group_norm_stats"] * 2
  for f in found:
    assert f.kernel == "pallas_kernels.group_norm", (f.kernel, f.evidence)
    assert f.guard_verdict.startswith("kernel runs"), f.guard_verdict
  stats = [f for f in found if f.need.anchor == "group_norm_stats"]
  assert all(f.suggestion.startswith(
      "pallas_kernels.group_norm(x, scale, bias, groups=8, epsilon=1e-06)") for f in stats)


def test_validate_ci_with_kernels_required(clean_fallbacks):
  # The group wider than a tile falls back by design; every other case runs the kernel.
  report = pk.validate("group_norm", tags=("ci",), interpret=True, require_kernel=True)
  assert report.passed, str(report)
  assert sum(not r.fallback for r in report.rows) >= 6, str(report)
