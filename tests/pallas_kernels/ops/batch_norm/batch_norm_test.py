"""batch_norm: the Pallas kernels in interpret mode against the float32 ground truth.

Expected values come only from `reference.py` (float32 at Precision.HIGHEST)
and flax's nn.BatchNorm, tolerances only from `tolerances.py`. Every kernel
test fails on any recorded fallback. Interpreted runs are few and small: each
is shared by the assertions about it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

import pallas_kernels as pk
from pallas_kernels._src import inputs
from pallas_kernels._src.ops.batch_norm import arg_specs
from pallas_kernels._src.ops.batch_norm import reference
from pallas_kernels._src.ops.batch_norm.api import batch_norm
from pallas_kernels._src.spec import CallFacts
from pallas_kernels._src.tolerances import relative_error, tolerance

SMALL = arg_specs.SMALL
F32 = jnp.float32


def operands(shape, dtype="float32", edge=False):
  keys = inputs.Keys(0, f"bn{shape}{dtype}")
  c = shape[-1]
  # Off-centre, so that a variance taken as E[x^2] - E[x]^2 would cancel.
  x = (inputs.normal(keys.next(), shape, "float32") * 2.0 + 30.0).astype(dtype)
  gamma = inputs.normal(keys.next(), (c,), dtype)
  beta = inputs.normal(keys.next(), (c,), dtype)
  if edge:  # channel 0's pre-activation exactly 6: relu6's upper edge
    gamma, beta = gamma.at[0].set(0), beta.at[0].set(6)
  g = inputs.normal(keys.next(), shape, dtype)
  return x, gamma, beta, g


def assert_close(out, expected, dtype, grad=False, what=""):
  assert out.shape == expected.shape, (what, out.shape, expected.shape)
  err, bound = relative_error(out, expected), tolerance(dtype, grad=grad)
  assert err <= bound, f"{what}: relative error {err:.3e} > {bound:.0e}"


def assert_no_fallback():
  assert not pk.fallbacks(), f"the kernel fell back to XLA: {pk.fallbacks()}"


def _loss(fn, g, x, gamma, beta):
  # Cotangents on all three outputs: mean and var carry gradients too.
  y, mean, var = fn(x, gamma, beta)
  c = mean.shape[0]
  return (jnp.sum(y.astype(F32) * g.astype(F32)) + jnp.sum(mean * jnp.linspace(-1, 1, c))
          + jnp.sum(var * jnp.linspace(2, -1, c)))


def _run(shape, dtype, activation, edge=False, config=SMALL):
  """One interpreted forward and gradient, and the reference's, in f32."""
  x, gamma, beta, g = operands(shape, dtype, edge)
  kernel = functools.partial(batch_norm, activation=activation, implementation="pallas",
                             interpret=True, config=config)
  ref = functools.partial(reference.batch_norm_f32, activation=activation)
  out = kernel(x, gamma, beta)
  grads = jax.grad(functools.partial(_loss, kernel, g), (0, 1, 2))(x, gamma, beta)
  up = [a.astype(F32) for a in (x, gamma, beta)]
  want = ref(*up)
  want_grads = jax.grad(functools.partial(_loss, ref, g), (0, 1, 2))(*up)
  return out, grads, want, want_grads


@pytest.fixture(scope="module")
def f32_run():
  pk.clear_fallbacks()
  result = _run((2, 5, 7, 12), "float32", None)
  return result, pk.fallbacks()


@pytest.fixture(scope="module")
def relu6_run():
  pk.clear_fallbacks()
  result = _run((2, 5, 7, 12), "bfloat16", "relu6", edge=True)
  return result, pk.fallbacks()


def _check(run, dtype):
  (out, grads, want, want_grads), fallbacks = run
  assert not fallbacks, f"the kernel fell back to XLA: {fallbacks}"
  (y, mean, var), (ry, rmean, rvar) = out, want
  assert y.dtype == jnp.dtype(dtype) and mean.dtype == var.dtype == F32
  assert_close(y, ry, dtype, what="y")
  assert_close(mean, rmean, "float32", what="mean")
  assert_close(var, rvar, "float32", what="var")
  for name, got, expected in zip(("dx", "dgamma", "dbeta"), grads, want_grads):
    assert_close(got, expected, dtype, grad=True, what=name)


def test_f32_forward_and_gradients_ragged(f32_run):
  # 70 rows over 16-row tiles in two splits, 12 channels over 8-channel tiles.
  _check(f32_run, "float32")


def test_bf16_relu6_forward_and_gradients_at_the_edge(relu6_run):
  _check(relu6_run, "bfloat16")
  (_, grads, _, want_grads), _ = relu6_run
  # Channel 0 sits at relu6's 6, where its derivative is 0: beta's gradient too.
  assert float(want_grads[2][0]) == 0.0
  assert float(grads[2][0]) == 0.0


def test_matches_flax_batch_norm():
  nn = pytest.importorskip("flax.linen")
  x, gamma, beta, _ = operands((2, 3, 4, 8))
  x = x - 30.0  # flax's fast variance E[x^2] - E[x]^2 cancels off-centre
  module = nn.BatchNorm(use_running_average=False, epsilon=1e-5, momentum=0.9)
  variables = {"params": {"scale": gamma, "bias": beta},
               "batch_stats": {"mean": jnp.zeros(8), "var": jnp.ones(8)}}
  want, updated = module.apply(variables, x, mutable=["batch_stats"])
  pk.clear_fallbacks()
  y, mean, var = batch_norm(x, gamma, beta, eps=1e-5, implementation="pallas",
                            interpret=True)
  assert_no_fallback()
  assert_close(y, want, "float32", what="y")
  # flax's running update is momentum * old + (1 - momentum) * batch.
  stats = updated["batch_stats"]
  assert_close(0.1 * mean, stats["mean"], "float32", what="running mean")
  assert_close(0.9 + 0.1 * var, stats["var"], "float32", what="running var")


def test_xla_implementation_is_the_reference():
  x, gamma, beta, _ = operands((2, 3, 5))
  out = batch_norm(x, gamma, beta, activation="relu", implementation="xla")
  for got, want in zip(out, reference.batch_norm(x, gamma, beta, activation="relu")):
    assert_close(got, want, "float32")


@pytest.mark.parametrize("args, reason", [
    (((12,), "float32", "float32"), "x float32[12] has no axis before the channels"),
    (((2, 3, 4), "float64", "float32"), "x float64[2, 3, 4]: dtype float64 is not one of"),
    (((2, 3, 4), "float32", "float64"), "gamma float64[4]: dtype float64 is not one of"),
    (((2, 0, 4), "float32", "float32"), "empty dimension in x"),
])
def test_guard_falls_back_and_says_why(clean_fallbacks, args, reason):
  shape, xdt, pdt = args
  x = jax.ShapeDtypeStruct(shape, jnp.dtype(xdt))
  p = jax.ShapeDtypeStruct(shape[-1:], jnp.dtype(pdt))
  with jax.enable_x64(True):
    check = pk.check_guard("batch_norm", x, p, p, interpret=True)
  assert not check.runs and check.reason.startswith(reason), check.reason


def test_a_fallback_is_recorded_and_runs_the_reference(clean_fallbacks):
  x = jnp.arange(4.0)
  y, mean, var = batch_norm(x, jnp.ones(4), jnp.zeros(4), implementation="pallas",
                            interpret=True)
  (fb,) = pk.fallbacks("batch_norm")
  assert "no axis before the channels" in fb.reason and fb.signature.startswith("x=float32[4]")
  assert jnp.array_equal(mean, x) and jnp.array_equal(var, jnp.zeros(4))


@pytest.mark.parametrize("kwargs, message", [
    (dict(gamma=jnp.ones(3)), r"gamma.shape \(3,\) must be"),
    (dict(eps=-1.0), "eps must be finite and >= 0"),
    (dict(activation="softplus"), "unknown activation"),
])
def test_invalid_calls_raise(kwargs, message):
  args = dict(x=jnp.ones((2, 4)), gamma=jnp.ones(4), beta=jnp.zeros(4)) | kwargs
  with pytest.raises(ValueError, match=message):
    batch_norm(args.pop("x"), args.pop("gamma"), args.pop("beta"), **args)


# -------------------------------------------------------- the audit's call ----


class _Array:
  def __init__(self, dtype, dims):
    self.dtype, self.dims = dtype, dims


def _facts(dims, axes, eps=None):
  from hlo_audit import plugins
  return CallFacts(kind="separate-reduction", ops=(), boundary=_Array("f32", dims),
                   shape=f"f32[{','.join(map(str, dims))}]",
                   statistics=plugins.Statistics(dims, axes), epsilon=lambda: eps)


def test_suggests_a_call_for_a_channels_last_column_sum_only():
  call = arg_specs.suggest(_facts((8, 16, 16, 72), (0, 1, 2), eps=0.001))
  assert call.text() == (
      "pallas_kernels.batch_norm(x, gamma, beta, eps=0.001)  # x: f32[8,16,16,72], "
      "gamma: f32[72], beta: f32[72] -> (f32[8,16,16,72], f32[72], f32[72])")
  # A dense layer's bias gradient, and a sum over the batch axis alone: not ours.
  assert arg_specs.suggest(_facts((128, 64), (0,))) is None
  assert arg_specs.suggest(_facts((8, 1, 1, 96), (0,))) is None
  assert arg_specs.suggest(_facts((8, 32, 512), (0, 1))) is None


def test_keras_mobilenets_column_sums_get_the_call_on_the_h200():
  import hlo_audit
  from tests.hlo_audit.real_models import h200_support
  report = hlo_audit.audit_hlo(h200_support.fixture("keras_mobilenet"),
                               options=hlo_audit.AuditOptions(device="h200"))
  found = [f for f in report.actionable if f.kernel == "pallas_kernels.batch_norm"]
  assert found
  first = max(found, key=lambda f: f.bytes_saved)
  assert first.suggestion == (
      "pallas_kernels.batch_norm(x, gamma, beta, eps=0.001)  # x: f32[8,16,16,72], "
      "gamma: f32[72], beta: f32[72] -> (f32[8,16,16,72], f32[72], f32[72])")
  assert first.guard_verdict.startswith("kernel runs"), first.guard_verdict


def test_validate_ci_with_kernels_required(clean_fallbacks):
  # The rank-1 case falls back by design; every other case must run the kernel.
  report = pk.validate("batch_norm", tags=("ci",), interpret=True, require_kernel=True)
  assert report.passed, str(report)
  assert sum(not r.fallback for r in report.rows) >= 4, str(report)
