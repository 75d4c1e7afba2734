"""What each matcher of `patterns.py` takes, spelled as users spell it: the
report (pattern, call, reason) for every epilogue, prologue, layout and
softmax/norm prologue, and the values where an operand is transformed
(negated, inverted, broadcast) on its way into the kernel."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallas_kernels
from pallas_kernels._src.tolerances import relative_error, tolerance

_X = jax.ShapeDtypeStruct((8, 16), jnp.float32)
_W = jax.ShapeDtypeStruct((16, 24), jnp.float32)
_B = jax.ShapeDtypeStruct((24,), jnp.float32)


def _sds(*shape, dtype=jnp.float32):
  return jax.ShapeDtypeStruct(shape, dtype)


def _only_site(f, *args):
  sites = pallas_kernels.swap(f).report(*args).sites
  assert len(sites) == 1, [(s.pattern, s.call) for s in sites]
  return sites[0]


def _bias(y, b):
  """`y + b` with b broadcast by lax itself (no [1, N] reshape)."""
  return lax.broadcast_in_dim(b, y.shape, (y.ndim - 1,))


# ------------------------------------------------------- matmul epilogue ----

_EPILOGUES = {
    "scale by a literal divisor": (
        lambda x, w, b, r: (x @ w) / 4.0,
        "dot_general + scale", "matmul(x=f32[8,16], w=f32[16,24], scale=0.25)"),
    "scale by a literal factor, on the left": (
        lambda x, w, b, r: 2.0 * (x @ w),
        "dot_general + scale", "matmul(x=f32[8,16], w=f32[16,24], scale=2)"),
    "only the first scale is the kernel's": (
        lambda x, w, b, r: jnp.tanh(x @ w * 2.0 * 3.0),
        "dot_general + scale", "matmul(x=f32[8,16], w=f32[16,24], scale=2)"),
    "scale by a vector, then bias and tanh": (
        lambda x, w, b, r: jnp.tanh((x @ w) * b + 1.0),
        "dot_general + scale + bias + activation:tanh",
        "matmul(x=f32[8,16], w=f32[16,24], bias=f32[24], scale=f32[24], activation='tanh')"),
    "a literal bias fills a vector": (
        lambda x, w, b, r: x @ w + 2.0,
        "dot_general + bias", "matmul(x=f32[8,16], w=f32[16,24], bias=f32[24])"),
    "a bias on the left": (
        lambda x, w, b, r: (lambda y: lax.add(_bias(y, b), y))(x @ w),
        "dot_general + bias", "matmul(x=f32[8,16], w=f32[16,24], bias=f32[24])"),
    "bias then clip is a clamp": (
        lambda x, w, b, r: jnp.clip(x @ w + b, -1.0, 2.0),
        "dot_general + bias + clamp",
        "matmul(x=f32[8,16], w=f32[16,24], bias=f32[24], clamp=(-1.0, 2.0))"),
    "relu after a residual is a clamp": (
        lambda x, w, b, r: jax.nn.relu(x @ w + r),
        "dot_general + residual + clamp",
        "matmul(x=f32[8,16], w=f32[16,24], residual=f32[8,24], clamp=(0.0, None))"),
    # relu with an upper clamp after the residual: no kernel stage takes
    # both there (clamping at 0 alone would drop the 6), so XLA keeps it.
    "relu6 after a residual stays XLA's": (
        lambda x, w, b, r: jnp.minimum(jax.nn.relu(x @ w + b + r), 6.0),
        "dot_general + bias + residual",
        "matmul(x=f32[8,16], w=f32[16,24], bias=f32[24], residual=f32[8,24])"),
    "an activation then an upper clamp": (
        lambda x, w, b, r: jnp.minimum(jax.nn.gelu(x @ w), 1.0),
        "dot_general + activation:gelu_tanh + clamp",
        "matmul(x=f32[8,16], w=f32[16,24], activation='gelu_tanh', clamp=(None, 1.0))"),
    "relu then a cap (relu6)": (
        lambda x, w, b, r: jnp.minimum(jax.nn.relu(x @ w), 6.0),
        "dot_general + activation:relu + clamp",
        "matmul(x=f32[8,16], w=f32[16,24], activation='relu', clamp=(None, 6.0))"),
    # (Outside (0, 1) a sigmoid or relu clipped once gives that constant first.)
    "a clip to one value in (0, 1) is a clamp": (
        lambda x, w, b, r: jnp.clip(x @ w + b, 0.5, 0.5),
        "dot_general + bias + clamp",
        "matmul(x=f32[8,16], w=f32[16,24], bias=f32[24], clamp=(0.5, 0.5))"),
    "tanh clipped both ways": (
        lambda x, w, b, r: jnp.clip(jnp.tanh(x @ w), -0.5, 0.5),
        "dot_general + activation:tanh + clamp",
        "matmul(x=f32[8,16], w=f32[16,24], activation='tanh', clamp=(-0.5, 0.5))"),
    "a column multiply after the activation stays XLA's": (
        lambda x, w, b, r: jnp.tanh(x @ w) * jnp.arange(24.0),
        "dot_general + activation:tanh", "matmul(x=f32[8,16], w=f32[16,24], activation='tanh')"),
    "sigmoid": (
        lambda x, w, b, r: jax.nn.sigmoid(x @ w),
        "dot_general + activation:sigmoid",
        "matmul(x=f32[8,16], w=f32[16,24], activation='sigmoid')"),
    "a narrowing cast after the bias": (
        lambda x, w, b, r: (x @ w + b).astype(jnp.bfloat16),
        "dot_general + bias + cast", "matmul(x=f32[8,16], w=f32[16,24], bias=f32[24])"),
    "a transposed x": (
        lambda x, w, b, r: jnp.tanh(x.T.T @ w),
        "dot_general + x transpose + activation:tanh",
        "matmul(x=f32[16,8], w=f32[16,24], activation='tanh', transpose_x=True)"),
    "a transposed w": (
        lambda x, w, b, r: jnp.tanh(x @ w.T.T),
        "dot_general + w transpose + activation:tanh",
        "matmul(x=f32[8,16], w=f32[24,16], activation='tanh', transpose_w=True)"),
    "a user's precision is kept": (
        lambda x, w, b, r: jnp.tanh(jnp.dot(x, w, precision=lax.Precision.HIGHEST)),
        "dot_general + activation:tanh",
        "matmul(x=f32[8,16], w=f32[16,24], activation='tanh', "
        "precision=(Precision.HIGHEST, Precision.HIGHEST))"),
}


@pytest.mark.parametrize("name", list(_EPILOGUES))
def test_matmul_epilogue_report(name):
  f, pattern, call = _EPILOGUES[name]
  site = _only_site(f, _X, _W, _B, _sds(8, 24))
  assert site.replaced, site.reason
  assert (site.pattern, site.call) == (pattern, call)
  want_out = "bf16[8,24]" if "cast" in pattern else "f32[8,24]"
  assert site.output == want_out


def test_epilogue_operands_are_transformed_with_their_values():
  """A divisor vector is inverted and a subtracted one negated, a literal
  divisor inverted and a literal bias filled to [N], a traced scalar scale
  and a [1, N] bias reshaped: one kernel each, XLA's values."""
  k = jax.random.split(jax.random.key(3), 4)
  x, w = jax.random.normal(k[0], (8, 16)), jax.random.normal(k[1], (16, 24)) / 4
  b, s = jax.random.uniform(k[2], (24,), minval=0.5, maxval=2.0), jnp.float32(0.5)

  def f(x, w, b, s):
    y = x @ w
    return (lax.sub(lax.div(y, _bias(y, b)), _bias(y, b)),
            x @ w / 4.0 + 2.0,
            (x @ w) * s + b[None, :])

  swapped = pallas_kernels.swap(f)
  sites = swapped.report(x, w, b, s).sites
  assert [(s.pattern, s.replaced) for s in sites] == [("dot_general + scale + bias", True)] * 3
  assert [s.call.removeprefix("matmul(x=f32[8,16], w=f32[16,24], ") for s in sites] == [
      "bias=f32[24], scale=f32[24])", "bias=f32[24], scale=0.25)",
      "bias=f32[24], scale=f32[])"]
  for out, ref in zip(jax.jit(swapped)(x, w, b, s), f(x, w, b, s)):
    assert relative_error(out, ref) <= tolerance(ref.dtype), (out, ref)


def test_a_bias_broadcast_from_1_by_n_is_passed_as_n():
  # An explicit broadcast of a [1, N] bias to [M, N]: the kernel gets [N].
  k = jax.random.split(jax.random.key(4), 3)
  x, w = jax.random.normal(k[0], (8, 16)), jax.random.normal(k[1], (16, 24)) / 4
  b = jax.random.normal(k[2], (1, 24))
  f = lambda x, w, b: jnp.tanh(x @ w + jnp.broadcast_to(b, (8, 24)))
  site = _only_site(f, x, w, b)
  assert site.replaced and site.call.endswith("bias=f32[24], activation='tanh')"), site.call
  out = jax.jit(pallas_kernels.swap(f))(x, w, b)
  assert relative_error(out, f(x, w, b)) <= tolerance(jnp.float32)


def test_a_dot_contracting_xs_first_dimension_is_transpose_x():
  # The dot itself reads x as [K, M] (no transpose before it): transpose_x.
  k = jax.random.split(jax.random.key(7), 2)
  x, w = jax.random.normal(k[0], (16, 8)), jax.random.normal(k[1], (16, 24)) / 4
  f = lambda x, w: jnp.tanh(jnp.einsum("km,kn->mn", x, w))
  site = _only_site(f, x, w)
  assert site.call == "matmul(x=f32[16,8], w=f32[16,24], activation='tanh', transpose_x=True)"
  out = jax.jit(pallas_kernels.swap(f))(x, w)
  assert relative_error(out, f(x, w)) <= tolerance(jnp.float32)


def test_a_batched_w_transposed_over_its_last_two_axes_is_transpose_w():
  # [B, N, K] swapped to [B, K, N] before the dot: the kernel reads it as is.
  k = jax.random.split(jax.random.key(8), 2)
  x, wt = jax.random.normal(k[0], (2, 8, 16)), jax.random.normal(k[1], (2, 24, 16)) / 4
  f = lambda x, wt: jnp.tanh(x @ jnp.swapaxes(wt, -1, -2))
  site = _only_site(f, x, wt)
  assert (site.pattern, site.call) == (
      "dot_general + w transpose + activation:tanh",
      "matmul(x=f32[2,8,16], w=f32[2,24,16], activation='tanh', transpose_w=True)")
  out = jax.jit(pallas_kernels.swap(f))(x, wt)
  assert relative_error(out, f(x, wt)) <= tolerance(jnp.float32)


_REJECTED = {
    "two contracting dimensions": (
        lambda x, w: jnp.tanh(jnp.einsum("bmk,bkn->mn", x, w)),
        (_sds(2, 8, 16), _sds(2, 16, 24)), "contracts 2 dimensions (the kernel contracts one)"),
    "batch dimensions not leading": (
        lambda x, w: jnp.tanh(jnp.einsum("mbk,bkn->bmn", x, w)),
        (_sds(8, 2, 16), _sds(2, 16, 24)),
        "batch dimensions (1,)/(0,) are not the leading dimensions"),
    "w with two free dimensions": (
        lambda x, w: jnp.tanh(jnp.einsum("mk,knp->mnp", x, w)),
        (_sds(8, 16), _sds(16, 4, 6)), "w has 3 free dimensions (the kernel takes one, N)"),
    "x a vector": (
        lambda x, w: jnp.tanh(x @ w), (_sds(16), _sds(16, 24)),
        "x is a vector (the kernel needs [..., M, K])"),
    "x with extra free dimensions beside batch dimensions": (
        lambda x, w: jnp.tanh(jnp.einsum("bmpk,bkn->bmpn", x, w)),
        (_sds(2, 3, 8, 16), _sds(2, 16, 24)), "x has 3 free dimensions with batch dimensions"),
    "x contracting its first of three dimensions": (
        lambda x, w: jnp.tanh(jnp.einsum("kmp,kn->mpn", x, w)),
        (_sds(16, 3, 8), _sds(16, 24)), "x contracts dimension 0, not one of its last two"),
    "a dot algorithm": (
        lambda x, w: jnp.tanh(jnp.dot(x, w, precision=lax.DotAlgorithmPreset.F32_F32_F32)),
        (_X, _W), "dot algorithm F32_F32_F32 (the kernel takes jax.lax.Precision levels only)"),
}


@pytest.mark.parametrize("name", list(_REJECTED))
def test_matmul_layouts_the_kernel_cannot_run_are_left_with_the_reason(name):
  f, args, reason = _REJECTED[name]
  site = _only_site(f, *args)
  assert not site.replaced and site.reason.startswith(reason), site.reason
  assert site.pattern == "dot_general + activation:tanh" and site.call == "matmul(...)"


def test_a_batched_matmul_with_leading_batch_dimensions_is_taken():
  site = _only_site(lambda x, w: jnp.tanh(jnp.einsum("bmk,bkn->bmn", x, w)),
                    _sds(2, 8, 16), _sds(2, 16, 24))
  assert site.replaced and site.output == "f32[2,8,24]"
  assert site.call == "matmul(x=f32[2,8,16], w=f32[2,16,24], activation='tanh')"


def test_nothing_to_fuse_is_no_site():
  """A bare dot, or one whose only extra is a transpose, is XLA's as well
  done; an expanded broadcast (a mask) is no residual to read."""
  for f, args in [(lambda x, w: x @ w, (_X, _W)),
                  (lambda x, w: x @ w.T, (_X, _sds(24, 16))),
                  (lambda x, w, c: x @ w + jnp.broadcast_to(c[:, None], (8, 24)),
                   (_X, _W, _sds(8)))]:
    assert pallas_kernels.swap(f).report(*args).sites == ()


def test_an_activation_the_kernel_lacks_is_no_site():
  leaky = lambda x, w: jax.nn.leaky_relu(x @ w)
  assert pallas_kernels.swap(leaky).report(_X, _W).sites == ()


def test_bf16_activations_are_told_apart_within_bf16_rounding():
  x, w = _sds(8, 16, dtype=jnp.bfloat16), _sds(16, 24, dtype=jnp.bfloat16)
  for act, name in [(jax.nn.silu, "silu"),
                    (lambda y: jax.nn.gelu(y, approximate=False), "gelu"),
                    (lambda y: jax.nn.gelu(y, approximate=True), "gelu_tanh")]:
    site = _only_site(lambda x, w: act(x @ w), x, w)
    assert site.pattern == f"dot_general + activation:{name}"
    assert site.output == "bf16[8,24]"


# ------------------------------------------------------- matmul prologue ----


def test_dequantized_weights_by_scalar_and_per_channel_scale():
  deq = lambda x, q, sc: x @ (q.astype(jnp.float32) * sc)
  q = _sds(16, 24, dtype=jnp.int8)
  scalar = _only_site(deq, _X, q, _sds())
  assert scalar.pattern == "dot_general + w dequantize"
  assert scalar.call == "matmul(x=f32[8,16], w=s8[16,24], w_scale=f32[])"
  channel = _only_site(deq, _X, q, _sds(24))
  assert channel.call == "matmul(x=f32[8,16], w=s8[16,24], w_scale=f32[24])"
  # A per-row scale of x is not constant along K's partner: not the kernel's.
  assert pallas_kernels.swap(lambda w, q, sc: (q.astype(jnp.float32) * sc) @ w).report(
      _sds(16, 24), _sds(8, 16, dtype=jnp.int8), _sds(16)).sites == ()


def test_prologue_casts_are_taken_only_when_the_dot_keeps_its_precision():
  up = _only_site(lambda x, w: jnp.tanh(x.astype(jnp.float32) @ w), _sds(8, 16, dtype=jnp.bfloat16),
                  _W)
  assert up.pattern == "dot_general + x cast + activation:tanh"
  assert up.call == "matmul(x=bf16[8,16], w=f32[16,24], activation='tanh')"
  # Casting both down to bf16 makes a bf16 dot: the kernel reads the bf16 values.
  down = _only_site(lambda x, w: jnp.tanh(x.astype(jnp.bfloat16) @ w.astype(jnp.bfloat16)),
                    _X, _W)
  assert down.pattern == "dot_general + activation:tanh"
  assert down.call == "matmul(x=bf16[8,16], w=bf16[16,24], activation='tanh')"
  assert down.output == "bf16[8,24]"


# ---------------------------------------------------------------- softmax ----

_S = _sds(2, 8, 16)
_KEEP = np.asarray(np.random.default_rng(0).uniform(size=(8, 16)) < 0.7)


def _causal(offset):
  return np.arange(16)[None, :] <= np.arange(8)[:, None] + offset


_SOFTMAX = {
    "a literal divisor is the scale": (
        lambda s: jax.nn.softmax(s / 4.0), "softmax + scale", "softmax(x=f32[2,8,16], scale=0.25)"),
    "a literal factor on the left": (
        lambda s: jax.nn.softmax(0.25 * s), "softmax + scale", "softmax(x=f32[2,8,16], scale=0.25)"),
    "a where fill of 0 is no mask": (
        lambda s: jax.nn.softmax(jnp.where(_KEEP, s, 0.0)), "softmax", "softmax(x=f32[2,8,16])"),
    "a where fill of -1e9 is a mask": (
        lambda s: jax.nn.softmax(jnp.where(_KEEP, s, -1e9)), "softmax + mask",
        "softmax(x=f32[2,8,16], mask=pred[8,16])"),
    "a where fill of the dtype's lowest is a mask": (
        lambda s: jax.nn.softmax(jnp.where(_KEEP, s, jnp.finfo(jnp.float32).min)),
        "softmax + mask", "softmax(x=f32[2,8,16], mask=pred[8,16])"),
    "a bottom-right causal mask": (
        lambda s: jax.nn.softmax(jnp.where(_causal(8), s, -jnp.inf)), "softmax + causal mask",
        "softmax(x=f32[2,8,16], causal=True, causal_alignment='bottom_right')"),
    "a top-left causal mask": (
        lambda s: jax.nn.softmax(jnp.where(_causal(0), s, -jnp.inf)), "softmax + causal mask",
        "softmax(x=f32[2,8,16], causal=True, causal_alignment='top_left')"),
    "a mask that is almost causal is a mask": (
        lambda s: jax.nn.softmax(jnp.where(_causal(1), s, -jnp.inf)), "softmax + mask",
        "softmax(x=f32[2,8,16], mask=pred[8,16])"),
    "an additive mask of the causal triangle's values is no causal mask": (
        # tril(ones) added to the logits: numbers, not which keys are kept.
        lambda s: jax.nn.softmax(s + _causal(0).astype(np.float32)), "softmax + mask",
        "softmax(x=f32[2,8,16], mask=f32[8,16])"),
    "a scale shared with another reader stays XLA's": (
        lambda s: (lambda y: (jax.nn.softmax(y), y))(s * 0.5), "softmax",
        "softmax(x=f32[2,8,16])"),
    "the scale comes after the mask: the mask stays XLA's": (
        lambda s: jax.nn.softmax((s + jnp.where(_KEEP, 0.0, -1e9)) * 0.5), "softmax + scale",
        "softmax(x=f32[2,8,16], scale=0.5)"),
    "a cast after the softmax": (
        lambda s: jax.nn.softmax(s * 2.0).astype(jnp.bfloat16), "softmax + scale",
        "softmax(x=f32[2,8,16], scale=2.0)"),
    "a mask broadcast over the queries": (
        lambda s, m: jax.nn.softmax(s + m[:, None, :]), "softmax + mask",
        "softmax(x=f32[2,8,16], mask=f32[2,1,16])", _sds(2, 16)),
    "an additive mask of one number": (
        lambda s, m: jax.nn.softmax(s + m), "softmax + mask",
        "softmax(x=f32[2,8,16], mask=f32[])", _sds()),
    "a full additive mask": (
        lambda s, m: jax.nn.softmax(s + m), "softmax + mask",
        "softmax(x=f32[2,8,16], mask=f32[2,8,16])", _S),
    "a division by zero is no scale": (
        lambda s: jax.nn.softmax(s / 0.0), "softmax", "softmax(x=f32[2,8,16])"),
    "a traced scale is no scale": (
        lambda s, g: jax.nn.softmax(s * g[0]), "softmax", "softmax(x=f32[2,8,16])", _sds(16)),
    "converts around the softmax": (
        lambda s: jax.nn.softmax(s.astype(jnp.float32)).astype(jnp.bfloat16), "softmax",
        "softmax(x=bf16[2,8,16])"),
    "softmax spelled out": (
        lambda s: (lambda e: e / e.sum(-1, keepdims=True))(jnp.exp(s - s.max(-1, keepdims=True))),
        "softmax", "softmax(x=f32[2,8,16])"),
}


@pytest.mark.parametrize("name", list(_SOFTMAX))
def test_softmax_prologue_report(name):
  f, pattern, call, *others = _SOFTMAX[name]
  dtype = jnp.bfloat16 if "bf16" in call else jnp.float32
  site = _only_site(f, _sds(2, 8, 16, dtype=dtype), *others)
  assert site.replaced, site.reason
  assert (site.pattern, site.call) == (pattern, call)


def test_softmax_masks_and_scales_keep_xlas_values():
  s = jax.random.normal(jax.random.key(4), (2, 8, 16))

  def f(s):
    return (jax.nn.softmax(jnp.where(_KEEP, s / 4.0, -1e9)),
            jax.nn.softmax(jnp.where(_causal(8), s, -jnp.inf)))

  swapped = pallas_kernels.swap(f)
  assert [s.pattern for s in swapped.report(s).replaced] == [
      "softmax + mask + scale", "softmax + causal mask"]
  for out, ref in zip(jax.jit(swapped)(s), f(s)):
    assert relative_error(out, ref) <= tolerance(ref.dtype)


def test_what_agrees_with_softmax_on_some_rows_only_is_no_softmax():
  # Softmax with each term floored at 0.05: the same as softmax on a row of
  # a narrow range, not on a wide one. Every probe row must agree.
  def floored(x):
    e = jnp.maximum(jnp.exp(x - x.max(-1, keepdims=True)), 0.05)
    return e / e.sum(-1, keepdims=True)
  x = jax.random.normal(jax.random.key(0), (8, 16)) * 2
  assert relative_error(floored(x), jax.nn.softmax(x)) > 0.01
  assert not pallas_kernels.swap(floored, interpret=True).report(x).sites


# ------------------------------------------------------------------ norms ----


def test_rms_norm_spellings_with_their_eps_gamma_and_residual():
  rms = lambda x, g: x * lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g
  plain = _only_site(lambda x: x / jnp.sqrt(jnp.mean(jnp.square(x), -1, keepdims=True) + 1e-5),
                     _S)
  assert plain.pattern == "rms_norm"
  assert plain.call == "rms_norm(x=f32[2,8,16], gamma=constant f32[16], eps=1e-05)"
  res = _only_site(lambda x, r, g: (rms(x + r, g), x + r), _S, _S, _sds(16))
  assert res.pattern == "rms_norm + residual"
  assert res.call == ("rms_norm(x=f32[2,8,16], gamma=f32[16], residual=f32[2,8,16], "
                      "eps=1e-06)")
  assert res.output == "f32[2,8,16], f32[2,8,16]"


def _x_hat(x, eps=1e-5):
  m = x.mean(-1, keepdims=True)
  return (x - m) * lax.rsqrt(((x - m) ** 2).mean(-1, keepdims=True) + eps)


_NORMS = {
    "a gamma of shape [1, 1, N]": (
        lambda x, g: x * lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g, _sds(1, 1, 16),
        "rms_norm(x=f32[2,8,16], gamma=f32[16], eps=1e-06)"),
    "a layer norm with gamma only": (
        lambda x, g: _x_hat(x) * g, _sds(16),
        "layer_norm(x=f32[2,8,16], gamma=f32[16], beta=constant f32[16], eps=1e-05)"),
    "a layer norm with beta only": (
        lambda x, b: _x_hat(x, 1e-3) + b, _sds(16),
        "layer_norm(x=f32[2,8,16], gamma=constant f32[16], beta=f32[16], eps=0.001)"),
    # 0.1, the largest epsilon read off: float32's 0.1 is past 0.1.
    "a layer norm with the largest epsilon": (
        lambda x, b: _x_hat(x, 0.1) + b, _sds(16),
        "layer_norm(x=f32[2,8,16], gamma=constant f32[16], beta=f32[16], eps=0.1)"),
    "a beta computed from another parameter": (
        lambda x, g: _x_hat(x) * g + g * g, _sds(16),
        "layer_norm(x=f32[2,8,16], gamma=f32[16], beta=f32[16], eps=1e-05)"),
}


@pytest.mark.parametrize("name", list(_NORMS))
def test_norm_parameters_report(name):
  f, param, call = _NORMS[name]
  site = _only_site(f, _S, param)
  assert site.replaced and site.call == call


def test_what_is_no_row_norm_is_no_site():
  """A traced eps (kernels take Python scalars), a softmax over another
  axis and rows of one element are left alone."""
  for f, args in [(lambda x, e: _x_hat(x, e), (_S, _sds())),
                  (lambda x: jax.nn.softmax(x, axis=0), (_S,)),
                  (lambda x: jax.nn.softmax(x), (_sds(8, 1),))]:
    assert pallas_kernels.swap(f).report(*args).sites == ()


def test_norms_compute_xlas_values():
  k = jax.random.split(jax.random.key(5), 4)
  x, r = jax.random.normal(k[0], (4, 32)), jax.random.normal(k[1], (4, 32))
  g, b = jax.random.normal(k[2], (32,)), jax.random.normal(k[3], (32,))

  def f(x, r, g, b):
    h = x + r
    ms = (h * h).mean(-1, keepdims=True)
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return h * lax.rsqrt(ms + 1e-6) * g, h, (x - m) * lax.rsqrt(v + 1e-5) * g + b

  swapped = pallas_kernels.swap(f)
  assert [s.pattern for s in swapped.report(x, r, g, b).sites] == [
      "rms_norm + residual", "layer_norm"]
  for out, ref in zip(jax.jit(swapped)(x, r, g, b), f(x, r, g, b)):
    assert relative_error(out, ref) <= tolerance(ref.dtype)


def test_constants_fold_up_to_the_limit_and_no_further():
  # A mask made from constants is read while tracing when its values total
  # FOLD_LIMIT elements or fewer; one element more stays traced.
  from pallas_kernels._src.swap import program as prog

  def made(n):
    def f(x):
      return x + jnp.arange(n, dtype=jnp.int32).astype(jnp.float32)
    p = prog.build(jax.make_jaxpr(f)(jax.ShapeDtypeStruct((n,), jnp.float32)))
    (converted,) = [node for node in p.nodes if node.prim == "convert_element_type"]
    return p.value_of(converted.outs[0])

  at = made(prog.FOLD_LIMIT)
  assert at is not None and at.shape == (prog.FOLD_LIMIT,) and at[-1] == prog.FOLD_LIMIT - 1
  assert made(prog.FOLD_LIMIT + 1) is None


def test_a_narrowing_cast_after_a_norm_or_softmax_is_written_by_its_kernel():
  k = jax.random.split(jax.random.key(5), 2)
  x, g = jax.random.normal(k[0], (2, 8, 16)), 1 + 0.1 * jax.random.normal(k[1], (16,))
  for f, pattern, call in (
      (lambda x, g: (_x_hat(x) * g).astype(jnp.bfloat16), "layer_norm + cast",
       "layer_norm(x=f32[2,8,16], gamma=f32[16], beta=constant f32[16], eps=1e-05)"),
      (lambda x, g: jax.nn.softmax(x * g).astype(jnp.bfloat16), "softmax",
       "softmax(x=f32[2,8,16])")):
    site = _only_site(f, _S, _sds(16))
    assert (site.pattern, site.call, site.output, site.replaced) == (
        pattern, call, "bf16[2,8,16]", True), site
    got = jax.jit(pallas_kernels.swap(f, interpret=True))(x, g)
    assert got.dtype == jnp.bfloat16
    assert relative_error(got, f(x, g)) <= tolerance(jnp.bfloat16)
