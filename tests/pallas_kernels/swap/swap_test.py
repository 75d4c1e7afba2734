"""`swap` on unmodified functions: what it replaces, and that values and
gradients stay XLA's within the tolerance table."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels
from pallas_kernels._src.tolerances import relative_error, tolerance
from tests.pallas_kernels.swap.conftest import (attention_probs, mlp,
                                                residual_layer_norm, scan_relu)


def _pallas_calls(fn, *args) -> int:
  """Kernels this CPU runs in fn's jaxpr, nested ones included: the
  interpreted pallas_calls (on a CPU-only machine each site also holds the
  builds its lowering keeps for a GPU)."""
  def count(jaxpr):
    n = 0
    for eqn in jaxpr.eqns:
      n += eqn.primitive.name == "pallas_call" and bool(eqn.params.get("interpret"))
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        n += count(sub)
    return n
  return count(jax.make_jaxpr(fn)(*args).jaxpr)


def _close(out, ref, grad=False):
  for o, r in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
    assert relative_error(o, r) <= tolerance(r.dtype, grad=grad), (o, r)


def test_mlp_epilogue_is_one_matmul_with_values_and_grads(mlp_args):
  swapped = pallas_kernels.swap(mlp)
  report = swapped.report(*mlp_args)
  (site,) = report.sites
  assert site.replaced and site.kernel == "pallas_kernels.matmul"
  assert site.pattern == "dot_general + bias + activation:gelu"
  assert "activation='gelu'" in site.call and site.output == "f32[16,64]"
  assert site.source.endswith("(mlp)") and "conftest.py" in site.source
  assert _pallas_calls(swapped, *mlp_args) == 1
  _close(jax.jit(swapped)(*mlp_args), mlp(*mlp_args))
  grad = lambda f: jax.jit(jax.grad(lambda *a: (f(*a) ** 2).sum(), argnums=(0, 1, 2)))
  _close(grad(swapped)(*mlp_args), grad(mlp)(*mlp_args), grad=True)


def test_a_whole_training_step_keeps_the_pre_activation_its_backward_reads(mlp_args):
  # Swapped after autodiff (a train step, as flax's TrainState steps are
  # written): relu's jvp reads `x @ w + b` (`> 0`) beside relu itself, so the
  # kernel takes the bias alone and the activation stays XLA's, or the
  # backward would read a value no kernel wrote.
  def step(x, w, b):
    loss = lambda w, b: jnp.sum(jax.nn.relu(x @ w + b) ** 2)
    value, (dw, db) = jax.value_and_grad(loss, argnums=(0, 1))(w, b)
    return value, w - 0.1 * dw, b - 0.1 * db

  swapped = pallas_kernels.swap(step)
  site, grads = swapped.report(*mlp_args).sites
  assert site.replaced and site.pattern == "dot_general + bias", site.pattern
  # dw = x^T @ dy beside db = sum(dy): one call reading dy once.
  assert grads.replaced and grads.pattern == "dot_general + column_sum", grads.pattern
  _close(jax.jit(swapped)(*mlp_args), step(*mlp_args))


def test_a_step_that_makes_and_splits_a_prng_key_is_swapped(mlp_args):
  # flax's LSTM carries a key made in the step: folding it while tracing
  # must not ask NumPy for a key array.
  def step(x, w, b):
    keep = jax.random.bernoulli(jax.random.split(jax.random.key(0))[1], 0.9, (16, 64))
    return jnp.where(keep, mlp(x, w, b), 0.0)

  swapped = pallas_kernels.swap(step)
  (site,) = swapped.report(*mlp_args).sites
  assert site.replaced
  _close(swapped(*mlp_args), step(*mlp_args))


def test_outputs_that_are_not_arrays_come_back_as_the_function_returned_them(mlp_args):
  # An `eqx.filter_jit` step returns its model, functions and all.
  def step(x, w, b):
    return {"y": mlp(x, w, b), "act": jax.nn.gelu, "tag": "layer", "n": 3}

  out = pallas_kernels.swap(step)(*mlp_args)
  assert out["act"] is jax.nn.gelu and out["tag"] == "layer" and int(out["n"]) == 3
  _close([out["y"]], [mlp(*mlp_args)])


def test_a_per_example_modulation_is_not_read_as_the_norms_gamma(keys):
  # adaLN (DiT's): the scale and shift are [B, 1, n], one per example; only a
  # [1, ..., 1, n] value is a column parameter the kernel can take.
  def ada_ln(x, scale, shift):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    y = (x - mean) * jax.lax.rsqrt(var + 1e-6)
    return y * (1 + scale[:, None, :]) + shift[:, None, :]

  args = (jax.random.normal(keys[0], (2, 8, 32)), jax.random.normal(keys[1], (2, 32)),
          jax.random.normal(keys[2], (2, 32)))
  swapped = pallas_kernels.swap(ada_ln)
  (site,) = swapped.report(*args).sites
  assert site.replaced and "gamma=constant f32[32]" in site.call, site.call
  _close([swapped(*args)], [ada_ln(*args)])


def test_report_true_returns_report_through_jit(mlp_args):
  out, report = jax.jit(pallas_kernels.swap(mlp, report=True))(*mlp_args)
  assert isinstance(report, pallas_kernels.SwapReport)
  assert report.kernels() == {"pallas_kernels.matmul": 1}
  assert "1 replaced, 0 left to XLA" in str(report)
  _close(out, mlp(*mlp_args))


def test_a_residual_sum_read_before_the_norm_is_computed_there(keys):
  # The pre-norm residual stream h is read (h * 2) before the norm's
  # statistics: the kernel, which writes h too, runs before that reader.
  # (No affine: gamma's broadcast would come after the reader in the jaxpr,
  # and the kernel would then have no place to run.)
  def fn(x, r):
    h = x + r
    side = h * 2.0
    mean = h.mean(-1, keepdims=True)
    var = ((h - mean) ** 2).mean(-1, keepdims=True)
    return (h - mean) * jax.lax.rsqrt(var + 1e-5), side

  x, r = (jax.random.normal(k, (4, 8, 32)) for k in keys[:2])
  swapped = pallas_kernels.swap(fn)
  (site,) = swapped.report(x, r).sites
  assert site.replaced and site.pattern == "layer_norm + residual", site
  _close(jax.jit(swapped)(x, r), fn(x, r))


def test_a_norm_clamping_its_variance_at_zero_keeps_the_users_epsilon(keys):
  # flax's LayerNorm: var = max(0, E[x^2] - E[x]^2). The 0.0 of the clamp is
  # no epsilon; the kernel is called with the user's 1e-06.
  def fn(x):
    mean = x.mean(-1, keepdims=True)
    var = jnp.maximum(0.0, (x * x).mean(-1, keepdims=True) - mean * mean)
    return (x - mean) * jax.lax.rsqrt(var + 1e-6)

  x = jax.random.normal(keys[0], (4, 8, 32))
  swapped = pallas_kernels.swap(fn)
  (site,) = swapped.report(x).sites
  assert site.kernel == "pallas_kernels.layer_norm" and "eps=1e-06" in site.call, site.call
  _close(jax.jit(swapped)(x), fn(x))


def test_a_second_residual_is_left_to_xla(keys):
  # The kernel adds one residual: the second add stays after the call.
  def fn(x, w, b, r1, r2):
    return x @ w + b + r1 + r2

  x, w = jax.random.normal(keys[0], (16, 32)), jax.random.normal(keys[1], (32, 64))
  b, r1, r2 = (jax.random.normal(k, s) for k, s in zip(keys[2:5], [(64,), (16, 64), (16, 64)]))
  swapped = pallas_kernels.swap(fn)
  (site,) = swapped.report(x, w, b, r1, r2).sites
  assert site.replaced and site.pattern.count("residual") == 1, site.pattern
  _close(jax.jit(swapped)(x, w, b, r1, r2), fn(x, w, b, r1, r2))


def test_residual_layer_norm(keys):
  x, r = (jax.random.normal(k, (4, 8, 32)) for k in keys[:2])
  g, b = (jax.random.normal(k, (32,)) for k in keys[2:4])
  swapped = pallas_kernels.swap(residual_layer_norm)
  (site,) = swapped.report(x, r, g, b).sites
  assert site.kernel == "pallas_kernels.layer_norm"
  assert site.pattern == "layer_norm + residual"
  assert "eps=" in site.call and "residual=f32[4,8,32]" in site.call
  _close(jax.jit(swapped)(x, r, g, b), residual_layer_norm(x, r, g, b))
  loss = lambda f: jax.jit(jax.grad(lambda *a: (f(*a)[0] ** 3).sum(), argnums=(0, 1, 2, 3)))
  _close(loss(swapped)(x, r, g, b), loss(residual_layer_norm)(x, r, g, b), grad=True)


def test_attention_softmax_takes_scale_and_mask(keys):
  q, k = (jax.random.normal(kk, (2, 16, 8)) for kk in keys[:2])
  mask = jnp.where(jax.random.uniform(keys[2], (16, 16)) < 0.2, -1e9, 0.0)
  swapped = pallas_kernels.swap(attention_probs)
  report = swapped.report(q, k, mask)
  by_kernel = {s.kernel: s for s in report.sites}
  assert all(s.replaced for s in report.sites) and len(report.sites) == 2
  # The batched q @ k^T takes the scale (its epilogue comes first) ...
  assert by_kernel["pallas_kernels.matmul"].pattern == "dot_general + scale"
  assert "transpose_w=True" in by_kernel["pallas_kernels.matmul"].call
  # ... and softmax the additive mask, compact, never expanded to [2,16,16].
  assert by_kernel["pallas_kernels.softmax"].pattern == "softmax + mask"
  assert "mask=f32[16,16]" in by_kernel["pallas_kernels.softmax"].call
  _close(jax.jit(swapped)(q, k, mask), attention_probs(q, k, mask))


def test_causal_where_mask_becomes_causal(keys):
  def f(s):
    keep = jnp.tril(jnp.ones((16, 16), bool))
    return jax.nn.softmax(jnp.where(keep, s / 4.0, -jnp.inf), axis=-1)
  s = jax.random.normal(keys[0], (2, 16, 16))
  (site,) = pallas_kernels.swap(f).report(s).sites
  assert "causal=True" in site.call and "scale=0.25" in site.call
  _close(jax.jit(pallas_kernels.swap(f))(s), f(s))


def test_scan_body_is_swapped_with_gradients(keys):
  c = jax.random.normal(keys[0], (8, 32))
  xs = jax.random.normal(keys[1], (3, 8, 32))
  w = jax.random.normal(keys[2], (32, 32)) / 6
  b = jax.random.normal(keys[3], (32,))
  swapped = pallas_kernels.swap(scan_relu)
  (site,) = swapped.report(c, xs, w, b).sites
  assert site.where == "scan body" and site.replaced
  assert site.pattern == "dot_general + bias + residual + clamp"  # relu after + x
  # An op left out by `ops=` is reported where it is too.
  (skipped,) = pallas_kernels.swap(scan_relu, ops=("softmax", "layer_norm")
                                   ).report(c, xs, w, b).sites
  assert (skipped.where, skipped.replaced) == ("scan body", False)
  assert skipped.reason == "not among ops=['layer_norm', 'softmax']"  # sorted, as a set
  _close(jax.jit(swapped)(c, xs, w, b), scan_relu(c, xs, w, b))
  loss = lambda f: jax.jit(jax.grad(lambda c, w: f(c, xs, w, b)[0].sum(), argnums=(0, 1)))
  _close(loss(swapped)(c, w), loss(scan_relu)(c, w), grad=True)


def test_vmap_and_nested_jit(keys, mlp_args):
  x, w, b = mlp_args
  xs = jax.random.normal(keys[4], (3, 16, 32))
  inner = jax.jit(lambda x: jax.nn.silu(x @ w + b))
  swapped = pallas_kernels.swap(lambda x: inner(x) * 2.0)
  assert swapped.report(x).replaced[0].pattern == "dot_general + bias + activation:silu"
  _close(jax.jit(jax.vmap(swapped))(xs), jax.vmap(lambda x: inner(x) * 2.0)(xs))


def test_bf16_and_dequantized_weights(keys, mlp_args):
  x, w, b = mlp_args
  xb, wb, bb = (a.astype(jnp.bfloat16) for a in (x, w, b))
  f = lambda x, w, b: jax.nn.gelu(x @ w + b, approximate=True)
  (site,) = pallas_kernels.swap(f).report(xb, wb, bb).sites
  assert site.pattern == "dot_general + bias + activation:gelu_tanh"
  _close(pallas_kernels.swap(f)(xb, wb, bb), f(xb, wb, bb).astype(jnp.float32)
         .astype(jnp.bfloat16))
  wq = jnp.round(w * 40).astype(jnp.int8)
  deq = lambda x, wq, s: jnp.tanh(x @ (wq.astype(jnp.float32) * s))
  (site,) = pallas_kernels.swap(deq).report(x, wq, jnp.float32(0.025)).sites
  assert site.pattern == "dot_general + w dequantize + activation:tanh"
  assert "w=s8[32,64]" in site.call
  _close(pallas_kernels.swap(deq)(x, wq, jnp.float32(0.025)), deq(x, wq, jnp.float32(0.025)))


def test_patterns_outside_the_guard_are_left_untouched_and_reported(mlp_args):
  xi = jnp.arange(16 * 32, dtype=jnp.int32).reshape(16, 32) % 7
  wi = jnp.ones((32, 64), jnp.int32)
  f = lambda x, w: jnp.maximum(x @ w + 3, 0)
  swapped = pallas_kernels.swap(f)
  (site,) = swapped.report(xi, wi).sites
  assert not site.replaced and "x dtype int32" in site.reason
  assert _pallas_calls(swapped, xi, wi) == 0
  np.testing.assert_array_equal(jax.jit(swapped)(xi, wi), f(xi, wi))  # exact: XLA's
  # A shape the guard rejects: no rows.
  norm = lambda x: (x - x.mean(-1, keepdims=True)) * jax.lax.rsqrt(
      x.var(-1, keepdims=True) + 1e-6)
  empty = jnp.ones((0, 32))
  sites = pallas_kernels.swap(norm).report(empty).sites
  assert sites and not sites[0].replaced and "no rows" in sites[0].reason
  assert pallas_kernels.fallbacks() == ()  # dry runs record nothing


def test_ops_restricts_kernels(mlp_args):
  report = pallas_kernels.swap(mlp, ops=["softmax"]).report(*mlp_args)
  (site,) = report.sites
  assert not site.replaced and "not among ops" in site.reason
  with pytest.raises(ValueError, match=r"unknown ops \['conv', 'mlp'\]; expected some of \['"):
    pallas_kernels.swap(mlp, ops=["mlp", "conv"])


def test_transformer_block_forward_and_gradients(example):
  loss, params, tokens = example
  swapped = pallas_kernels.swap(loss)
  report = swapped.report(params, tokens)
  assert report.kernels() == {"pallas_kernels.layer_norm": 2, "pallas_kernels.softmax": 1,
                              "pallas_kernels.matmul": 3}
  patterns = {s.pattern for s in report.replaced}
  assert "dot_general + bias + activation:gelu" in patterns
  assert "softmax + causal mask + scale" in patterns
  # The attention chain is JAX's fused attention's, which this CPU runs as
  # XLA's gemm, softmax and gemm: left, with the reason; its softmax is ours.
  (left,) = report.left
  assert left.kernel == "jax.nn.dot_product_attention"
  assert left.pattern.startswith("gemm -> softmax -> gemm")
  assert "needs an NVIDIA GPU" in left.reason
  _close(jax.jit(swapped)(params, tokens), jax.jit(loss)(params, tokens))
  _close(jax.jit(jax.grad(swapped))(params, tokens), jax.jit(jax.grad(loss))(params, tokens),
         grad=True)


# ---- control flow: every body swap descends into, on every supported jax ----


def test_scan_operands_split_as_jax_describes_them(keys):
  """consts / carry / xs of a scan equation, whichever params this jax uses
  (num_consts/num_carry up to 0.10, ft_in since 0.11)."""
  from pallas_kernels._src import compat
  w, b = jax.random.normal(keys[0], (4, 4)), jax.random.normal(keys[1], (4,))

  def f(c0, c1, xs):
    def body(carry, x):
      a, z = carry
      return (a @ w + b, z + x.sum()), a.sum() * x
    return jax.lax.scan(body, (c0, c1), xs)

  jaxpr = jax.make_jaxpr(f)(jnp.ones((2, 4)), jnp.float32(0), jnp.ones((3, 5)))
  (eqn,) = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "scan"]
  assert compat.scan_layout(eqn.params) == (2, 2)  # w, b closed over; (a, z)
  consts, carry, xs = compat.split_scan_operands(eqn.params, "wbazx")
  assert (consts, carry, xs) == (["w", "b"], ["a", "z"], ["x"])


def test_while_body_is_swapped(keys, mlp_args):
  x, w, b = mlp_args
  w2 = jax.random.normal(keys[5], (64, 64)) / 8

  def f(x):
    def body(s):
      i, h = s
      return i + 1, jax.nn.relu(h @ w2 + b)
    return jax.lax.while_loop(lambda s: s[0] < 3, body, (0, x @ w))[1]

  swapped = pallas_kernels.swap(f)
  sites = swapped.report(x).sites
  inner = [s for s in sites if s.where == "while body"]
  assert len(inner) == 1 and inner[0].replaced
  assert inner[0].pattern == "dot_general + bias + activation:relu"
  _close(jax.jit(swapped)(x), f(x))


def test_cond_branches_are_swapped_with_gradients(mlp_args):
  x, w, b = mlp_args

  def f(p, x, w):
    return jax.lax.cond(p, lambda x: jax.nn.gelu(x @ w + b, approximate=False),
                        lambda x: jnp.tanh(x @ w), x)

  swapped = pallas_kernels.swap(f)
  sites = swapped.report(True, x, w).sites
  assert sorted(s.where for s in sites if s.replaced) == ["cond branch 0", "cond branch 1"]
  for p in (True, False):
    _close(jax.jit(swapped)(p, x, w), f(p, x, w))
    loss = lambda g: jax.jit(jax.grad(lambda x, w: (g(p, x, w) ** 2).sum(), argnums=(0, 1)))
    _close(loss(swapped)(x, w), loss(f)(x, w), grad=True)


def test_checkpoint_body_is_swapped_with_gradients(mlp_args):
  x, w, b = mlp_args
  f = lambda x, w: jax.checkpoint(lambda x, w: jax.nn.silu(x @ w + b))(x, w)
  swapped = pallas_kernels.swap(f)
  (site,) = swapped.report(x, w).sites
  assert site.where == "checkpoint body" and site.replaced
  assert site.pattern == "dot_general + bias + activation:silu"
  _close(jax.jit(swapped)(x, w), f(x, w))
  loss = lambda g: jax.jit(jax.grad(lambda x, w: (g(x, w) ** 2).sum(), argnums=(0, 1)))
  _close(loss(swapped)(x, w), loss(f)(x, w), grad=True)


@jax.custom_jvp
def _dense_jvp(x, w):
  return jnp.tanh(x @ w)


@_dense_jvp.defjvp
def _dense_jvp_rule(primals, tangents):
  (x, w), (dx, dw) = primals, tangents
  y = _dense_jvp(x, w)
  return y, (1 - y * y) * (dx @ w + x @ dw) * 2.0  # not tanh's: the user's rule


@jax.custom_vjp
def _dense_vjp(x, w):
  return jax.nn.sigmoid(x @ w)


_dense_vjp.defvjp(lambda x, w: (_dense_vjp(x, w), (x, w)),
                  lambda res, g: (g @ res[1].T * 3.0, res[0].T @ g))


def test_custom_derivative_bodies_are_swapped_and_keep_the_users_rules(mlp_args):
  x, w, _ = mlp_args
  f = lambda x, w: (_dense_jvp(x, w) ** 2).sum() + _dense_vjp(x, w).sum()
  swapped = pallas_kernels.swap(f)
  sites = swapped.report(x, w).sites
  assert [(s.where, s.pattern) for s in sites] == [
      ("custom_jvp_call _dense_jvp", "dot_general + activation:tanh"),
      ("custom_vjp_call _dense_vjp", "dot_general + activation:sigmoid")]
  assert all(s.replaced for s in sites) and _pallas_calls(swapped, x, w) == 2
  _close(jax.jit(swapped)(x, w), f(x, w))
  grad = lambda g: jax.jit(jax.grad(g, argnums=(0, 1)))
  _close(grad(swapped)(x, w), grad(f)(x, w), grad=True)


def test_a_cond_with_one_swappable_branch_keeps_the_other_as_written():
  def f(x, w, pred):
    return jax.lax.cond(pred, lambda x, w: jnp.tanh(x @ w), lambda x, w: jnp.broadcast_to(x.sum(), (8, 24)), x, w)

  x = jax.random.normal(jax.random.key(5), (8, 16))
  w = jax.random.normal(jax.random.key(6), (16, 24)) / 4
  swapped = pallas_kernels.swap(f)
  sites = swapped.report(x, w, True).sites
  assert [s.replaced for s in sites] == [True] and "cond branch" in sites[0].where
  for pred in (True, False):
    _close(jax.jit(swapped)(x, w, pred), f(x, w, pred))


def test_interpret_reaches_the_kernels_the_swap_builds():
  # On a CPU, interpret=None interprets the kernel (a loop in the program);
  # interpret=False asks for a compiled kernel, which a CPU has not: the op
  # runs XLA's and says so.
  def layer(x, w, b):
    return jax.nn.gelu(x @ w + b)

  k = jax.random.key(0)
  args = (jax.random.normal(k, (64, 256)), jax.random.normal(k, (256, 512)) / 16,
          jnp.zeros(512))
  pallas_kernels.clear_fallbacks()
  interpreted = jax.jit(pallas_kernels.swap(layer)).lower(*args).as_text()
  assert "while" in interpreted and not pallas_kernels.fallbacks()
  compiled = jax.jit(pallas_kernels.swap(layer, interpret=False)).lower(*args).as_text()
  assert "while" not in compiled
  (fb,) = pallas_kernels.fallbacks("matmul")
  assert "no compiled matmul kernel for backend 'cpu'" in fb.reason


def test_a_norm_that_upcasts_its_input_reads_it_in_its_own_dtype():
  # The cast to float32 is part of the norm the probes replay: the kernel
  # reads the bf16 rows and widens them itself (no f32 copy is written).
  def ln(x, g, b):
    xf = x.astype(jnp.float32)
    m = xf.mean(-1, keepdims=True)
    v = ((xf - m) ** 2).mean(-1, keepdims=True)
    return ((xf - m) * jax.lax.rsqrt(v + 1e-5) * g + b).astype(jnp.bfloat16)

  S = jax.ShapeDtypeStruct
  (site,) = pallas_kernels.swap(ln).report(
      S((64, 256), jnp.bfloat16), S((256,), jnp.float32), S((256,), jnp.float32)).sites
  assert site.replaced and site.kernel == "pallas_kernels.layer_norm"
  assert site.call.startswith("layer_norm(x=bf16[64,256], gamma=f32[256]"), site.call


def test_only_a_side_output_in_float32_is_cast_to_the_programs_float():
  # A column sum (output 1 on) the kernel writes in float32 where the
  # program summed in bfloat16 is cast; the main result (output 0) never is,
  # and neither is a float32 sum the program kept, or an integer one.
  from pallas_kernels._src.swap.rewrite import _side_cast  # pylint: disable=import-outside-toplevel
  f32, bf16 = jnp.float32, jnp.bfloat16
  assert _side_cast(1, f32, bf16) and _side_cast(2, f32, jnp.float16)
  assert not _side_cast(0, f32, bf16)
  assert not _side_cast(1, f32, f32) and not _side_cast(1, bf16, f32)
  assert not _side_cast(1, f32, jnp.int32)
