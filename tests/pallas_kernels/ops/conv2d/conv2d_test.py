"""conv2d: the Pallas kernel in interpret mode against the float32 ground truth.

Expected values come only from `reference.py` (float32 at Precision.HIGHEST),
tolerances only from `tolerances.py`. Every kernel test fails on a recorded
fallback: a passing number computed by XLA would say nothing about the kernel.
Shapes are small and odd, and `SMALL` blocks give several pixel, channel and
output-channel tiles, so the masks at every ragged edge are exercised.
"""

from __future__ import annotations

import dataclasses
import re
import types
import warnings
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk
from pallas_kernels._src import backend
from pallas_kernels._src import compat
from pallas_kernels._src.ops.conv2d import arg_specs
from pallas_kernels._src.ops.conv2d import config as config_lib
from pallas_kernels._src.ops.conv2d import guard
from pallas_kernels._src.ops.conv2d import reference
from pallas_kernels._src.ops.conv2d.api import conv2d
from pallas_kernels._src.ops.conv2d.config import Config
from pallas_kernels._src.spec import CallFacts
from pallas_kernels._src.tolerances import relative_error, tolerance

SMALL = arg_specs.SMALL


def _normal(tag, shape, dtype="float32"):
  # numpy's generator: jax.random compiles a program per shape, seconds each
  # on a shared CPU, for data any generator gives.
  rng = np.random.default_rng(zlib.crc32(f"{tag}{shape}".encode()))
  return jnp.asarray(rng.standard_normal(shape, np.float32)).astype(dtype)


def operands(n, h, w, c, f, kh=3, kw=3, groups=1, dtype="float32", tag=""):
  """x, w, scale, shift (shift far from 0: act(shift) != 0), bias."""
  tag = f"conv{n},{h},{w},{c},{f},{kh},{kw},{groups}{tag}"
  cg = c // groups
  x = _normal(tag + "x", (n, h, w, c), dtype)
  wt = (_normal(tag + "w", (kh, kw, cg, f)) / np.sqrt(kh * kw * cg)).astype(dtype)
  scale = (jnp.abs(_normal(tag + "scale", (c,))) + 0.5).astype(dtype)
  shift = (_normal(tag + "shift", (c,)) + 2.0).astype(dtype)
  bias = _normal(tag + "bias", (f,), dtype)
  return x, wt, scale, shift, bias


def kernel(x, w, **kw):
  kw.setdefault("config", SMALL)
  return conv2d(x, w, implementation="pallas", interpret=True, **kw)


def truth(x, w, **kw):
  kw.pop("config", None)
  f32 = {k: v.astype(jnp.float32) if hasattr(v, "astype") else v for k, v in kw.items()}
  # The op rounds the prologue to x's dtype: the ground truth does too.
  return reference.conv2d_f32(x, w.astype(jnp.float32), **f32)


def assert_close(out, expected, dtype, *, grad=False):
  assert out.shape == expected.shape, (out.shape, expected.shape)
  err, bound = relative_error(out, expected), tolerance(dtype, grad=grad)
  assert err <= bound, f"relative error {err:.3e} > {bound:.0e} ({jnp.dtype(dtype).name})"


def assert_no_fallback():
  assert not pk.fallbacks(), f"the kernel fell back to XLA: {pk.fallbacks()}"


def check(x, w, dtype=None, **kw):
  out = kernel(x, w, **kw)
  want = truth(x, w, **kw)
  dtype = dtype or x.dtype
  for o, t in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(want)):
    assert_close(o, t, o.dtype if o.dtype == jnp.float32 and dtype == x.dtype else dtype)
  assert_no_fallback()
  return out


# ----------------------------------------------------------- forward ----


def test_prologue_pads_after_the_activation(clean_fallbacks):
  # x * scale + shift, relu, then zero padding: with shift ~ 2 the border of a
  # pad-first order would hold relu(shift) > 0 and change every edge pixel.
  x, w, scale, shift, bias = operands(2, 7, 9, 6, 10)
  out = check(x, w, scale=scale, shift=shift, prologue_activation="relu", bias=bias)
  padded = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
  wrong = jax.lax.conv_general_dilated(
      jax.nn.relu(padded * scale + shift), w, (1, 1), "VALID",
      dimension_numbers=reference.DIMENSION_NUMBERS, precision="highest") + bias
  assert relative_error(out, wrong) > 0.05


@pytest.mark.parametrize("h,w,stride,padding", [
    (9, 11, 2, "SAME"),            # SAME with odd sizes: pad 0 above, 1 below
    (9, 9, 3, "VALID"),
    (8, 9, (2, 1), ((2, 0), (0, 1))),  # rows and columns strided differently
    (8, 8, 1, ((-1, 2), (1, -1))),  # negative padding crops
])
def test_strides_and_padding(clean_fallbacks, h, w, stride, padding):
  x, wt, scale, shift, bias = operands(1, h, w, 5, 12, tag=str(padding))
  check(x, wt, stride=stride, padding=padding, scale=scale, shift=shift,
        prologue_activation="hard_swish", bias=bias, activation="hard_swish")


@pytest.mark.parametrize("dilation,padding", [(2, "SAME"), ((2, 3), ((3, 1), (0, 2)))])
def test_dilation(clean_fallbacks, dilation, padding):
  x, w, _, shift, _ = operands(1, 10, 11, 4, 8)
  check(x, w, dilation=dilation, padding=padding, shift=shift, prologue_activation="silu",
        activation="relu6")


@pytest.mark.parametrize("c,f,kh,stride", [(12, 12, 3, 2), (6, 12, 5, 1)])
def test_depthwise(clean_fallbacks, c, f, kh, stride):
  x, w, scale, shift, bias = operands(1, 9, 8, c, f, kh, kh, groups=c)
  check(x, w, groups=c, stride=stride, scale=scale, shift=shift,
        prologue_activation="hard_swish", bias=bias, activation="hard_sigmoid")


def test_grouped(clean_fallbacks):
  # 3 groups of 4 input and 6 output channels: F tiles of 8 cross groups
  # unless each tile stays inside its group.
  x, w, scale, shift, bias = operands(2, 6, 7, 12, 18, groups=3)
  check(x, w, groups=3, scale=scale, shift=shift, prologue_activation="relu", bias=bias,
        activation="silu")


def test_residual_and_epilogue_order(clean_fallbacks):
  x, w, _, _, bias = operands(2, 5, 6, 8, 12)
  res = _normal("res3", (2, 5, 6, 12), jnp.float32)
  out = check(x, w, bias=bias, activation="relu", residual=res)
  # The residual is added after the activation: negative sums survive.
  assert float(jnp.min(out)) < -0.5


def test_statistics_over_batch_and_pixels(clean_fallbacks):
  # 2 images x 35 pixels: the last 16-pixel tile of each image is partial.
  x, w, scale, shift, bias = operands(2, 5, 7, 6, 10)
  res = _normal("res4", (2, 5, 7, 10), jnp.float32)
  y, (s, ss) = check(x, w, scale=scale, shift=shift, prologue_activation="relu", bias=bias,
                     activation="gelu", residual=res, statistics=True)
  assert s.shape == ss.shape == (10,) and s.dtype == ss.dtype == jnp.float32
  y32 = y.astype(jnp.float32)
  np.testing.assert_allclose(s, y32.sum((0, 1, 2)), rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(ss, (y32 * y32).sum((0, 1, 2)), rtol=1e-5, atol=1e-4)


def test_statistics_depthwise_bf16_before_the_cast(clean_fallbacks):
  x, w, scale, shift, _ = operands(2, 9, 9, 16, 16, groups=16, dtype="bfloat16")
  y, (s, ss) = check(x, w, groups=16, stride=2, scale=scale, shift=shift,
                     prologue_activation="hard_swish", statistics=True)
  assert y.dtype == jnp.bfloat16 and s.dtype == jnp.float32
  # Held to f32: the sums are of the f32 output, not of its bf16 rounding.
  _, (s_ref, ss_ref) = truth(x, w, groups=16, stride=2, scale=scale, shift=shift,
                             prologue_activation="hard_swish", statistics=True)
  assert_close(s, s_ref, "float32")
  assert_close(ss, ss_ref, "float32")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16_bit(clean_fallbacks, dtype):
  x, w, scale, shift, bias = operands(2, 7, 6, 20, 24, dtype=dtype)
  out = check(x, w, stride=2, scale=scale, shift=shift, prologue_activation="relu",
              bias=bias, activation="hard_swish")
  assert out.dtype == jnp.dtype(dtype)
  out = check(x, w, out_dtype=jnp.float32, config=None)
  assert out.dtype == jnp.float32


_HALF = len(reference.ACTIVATIONS) // 2 + 1


@pytest.mark.parametrize("act_in,act", list(zip(reference.ACTIVATIONS[:_HALF],
                                                reference.ACTIVATIONS[::-1][:_HALF])))
def test_every_activation_on_both_sides(clean_fallbacks, act_in, act):
  x, w, scale, shift, bias = operands(1, 5, 5, 4, 8, tag=act_in)
  check(x, w, scale=scale, shift=shift - 2.0, prologue_activation=act_in, bias=bias,
        activation=act)


def test_default_tiling_and_no_prologue(clean_fallbacks):
  x, w, *_ = operands(2, 6, 6, 3, 5, kh=1, kw=1)
  check(x, w, padding="VALID", config=None)


def test_xla_implementation_is_the_reference():
  x, w, scale, shift, bias = operands(1, 6, 6, 4, 8)
  kw = dict(scale=scale, shift=shift, prologue_activation="relu", bias=bias, statistics=True)
  out = conv2d(x, w, implementation="xla", **kw)
  for o, t in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(truth(x, w, **kw))):
    assert_close(o, t, "float32")


# --------------------------------------------------------- gradients ----


def _grads(fn, args, ct):
  _, pullback = jax.vjp(fn, *args)
  return pullback(ct)


@pytest.mark.parametrize("dtype,groups,stats", [
    ("float32", 1, False), ("float32", 6, True), ("bfloat16", 2, True)])
def test_gradients_of_every_array(clean_fallbacks, dtype, groups, stats):
  x, w, scale, shift, bias = operands(1, 7, 6, 6, 6, groups=groups, dtype=dtype)
  res = _normal("res5", (1, 4, 3, 6), dtype)
  opts = dict(stride=2, groups=groups, prologue_activation="hard_swish", activation="silu",
              statistics=stats)

  def fn(*a):
    return kernel(a[0], a[1], scale=a[2], shift=a[3], bias=a[4], residual=a[5], **opts)

  def ref(*a):
    return reference.conv2d_f32(a[0], a[1], scale=a[2], shift=a[3], bias=a[4],
                                residual=a[5], **opts)

  args = (x, w, scale, shift, bias, res)
  ct = jax.tree_util.tree_map(lambda o: _normal("ct", o.shape, o.dtype),
                              jax.eval_shape(fn, *args))
  grads = jax.jit(lambda a, c: _grads(fn, a, c))(args, ct)
  args32 = [a.astype(jnp.float32) for a in args]
  ct32 = jax.tree_util.tree_map(lambda c: c.astype(jnp.float32), ct)
  want = jax.jit(lambda a, c: _grads(ref, a, c))(args32, ct32)
  for name, g, wg, a in zip(("x", "w", "scale", "shift", "bias", "residual"), grads, want,
                            args):
    assert g.dtype == a.dtype and g.shape == a.shape, name
    err, bound = relative_error(g, wg), tolerance(dtype, grad=True)
    assert err <= bound, f"d{name}: relative error {err:.3e} > {bound:.0e}"
  assert_no_fallback()


# ------------------------------------------------------------- guard ----


def test_unsupported_dtype_falls_back_records_and_names_it(clean_fallbacks):
  x, w, *_ = operands(1, 5, 5, 4, 8)
  x8, w8 = x.astype(jnp.float8_e4m3fn), w.astype(jnp.float8_e4m3fn)
  out = kernel(x8, w8, out_dtype=jnp.float32)
  (f,) = pk.fallbacks("conv2d")
  assert "float8_e4m3fn" in f.reason and "x " in f.reason, f.reason
  assert "x=float8_e4m3fn[1,5,5,4]" in f.signature
  assert_close(out, truth(x8.astype(jnp.float32), w8), "float32")


def test_mismatched_dtypes_fall_back(clean_fallbacks):
  x, w, *_ = operands(1, 5, 5, 4, 8, dtype="bfloat16")
  kernel(x, w.astype(jnp.float32))
  (f,) = pk.fallbacks("conv2d")
  assert "mismatched dtypes" in f.reason and "float32" in f.reason, f.reason


def test_a_fallback_fails_validation_with_kernels_required(clean_fallbacks):
  case = arg_specs.build_case(arg_specs.CaseDef(1, 5, 5, 4, 8, dtype="float16"), 0)
  case = dataclasses.replace(case, args=(case.args[0], case.args[1].astype(jnp.float32)))
  spec = dataclasses.replace(pk.get_spec("conv2d"), cases=lambda tag, seed: iter([case]))
  report = pk.validate(spec, interpret=True, require_kernel=True, check_grads=False)
  (row,) = report.rows
  assert "mismatched dtypes" in row.fallback and not report.passed, str(report)


def _struct(shape, dtype="float32"):
  return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))


def test_guard_reasons_name_the_shape_or_dtype():
  cfg = Config()
  x, w = _struct((2, 8, 8, 4)), _struct((3, 3, 4, 8))
  ask = lambda x=x, w=w, **kw: guard.unsupported_reason(  # noqa: E731
      x, w, **{"out_dtype": jnp.float32, "groups": 1, "out_hw": (8, 8), "interpret": True,
               "config": cfg, **kw})
  assert ask() is None
  assert "bias int32[8]" in ask(bias=_struct((8,), "int32"))
  assert "scale float64[4]" in ask(scale=_struct((4,), "float64"))
  # The supported dtypes listed in name order, as every run prints them.
  assert ask(out_dtype=jnp.int8) == (
      "out_dtype int8 is not one of ['bfloat16', 'float16', 'float32']")
  assert "mismatched dtypes" in ask(w=_struct((3, 3, 4, 8), "bfloat16"))
  assert "empty dimension" in ask(x=_struct((0, 8, 8, 4)))
  big = ask(x=_struct((64, 1024, 1024, 64)), out_hw=(1024, 1024))
  assert "x has 4294967296 > 2**31-1 elements" in big


def test_gpu_guard_checks_triton_tiles_and_shared_memory():
  x, w = _struct((32, 28, 28, 128), "bfloat16"), _struct((3, 3, 128, 128), "bfloat16")
  kw = dict(out_dtype=jnp.bfloat16, groups=1, out_hw=(28, 28), interpret=False)
  with backend.targeting(backend.DEFAULT_GPU):
    cfg = config_lib.choose_config(28 * 28, 128, 128, jnp.bfloat16, False, depthwise=False)
    assert min(cfg.block_p, cfg.block_f, cfg.block_c) >= config_lib.GPU_MIN_BLOCK
    if guard.gpu.unavailable_reason(False) is None:
      assert guard.unsupported_reason(x, w, config=cfg, **kw) is None
      assert "tiles >= 16" in guard.unsupported_reason(
          x, w, config=Config(block_p=64, block_f=64, block_c=8), **kw)
      huge = Config(block_p=256, block_f=256, block_c=256, num_stages=4)
      assert "shared memory" in guard.unsupported_reason(x, w, config=huge, **kw)


@pytest.mark.parametrize("change,match", [
    (dict(w_shape=(3, 3, 5, 8)), "input channels"),
    (dict(groups=3), "must divide C=4"),
    # Not a zero division, nor a window read as C/-2 channels.
    (dict(groups=0), "groups must be a positive int, got 0"),
    (dict(groups=-2), "groups must be a positive int, got -2"),
    (dict(groups=True), "groups must be a positive int, got True"),
    (dict(groups=2.0), "groups must be a positive int, got 2.0"),
    (dict(padding="FULL"), "padding must be"),
    # int() would take 1.0 and "1": each must already be an int.
    (dict(padding=((1, 1), (1, 1.0))), "explicit padding must hold ints"),
    (dict(stride=0), "stride must be a positive int"),
    # Each of a pair must be positive, and an int (True is no stride).
    (dict(stride=(2, 0)), r"stride must be a positive int or a pair of them, got \(2, 0\)"),
    (dict(dilation=(True, 1)), "dilation must be a positive int"),
    (dict(stride=(1, 1, 1)), "stride must be a positive int"),
    (dict(activation="softplus"), "unknown activation"),
    (dict(prologue_activation="elu"), "unknown activation"),
    (dict(bias_shape=(7,)), r"bias must have shape \[8\]"),
    (dict(residual_shape=(1, 5, 5, 8)), "residual must have the output's shape"),
    (dict(w_shape=(9, 9, 4, 8), padding="VALID"), "window does not fit"),
    (dict(implementation="triton"), "implementation must be"),
    (dict(config=object()), "config must be"),
    (dict(x_shape=(6, 6, 4)), "NHWC"),
])
def test_invalid_calls_raise(change, match):
  x = jnp.ones(change.pop("x_shape", (1, 6, 6, 4)))
  w = jnp.ones(change.pop("w_shape", (3, 3, 4, 8)))
  if "bias_shape" in change:
    change["bias"] = jnp.ones(change.pop("bias_shape"))
  if "residual_shape" in change:
    change["residual"] = jnp.ones(change.pop("residual_shape"))
  change.setdefault("implementation", "pallas")
  with pytest.raises(ValueError, match=match):
    conv2d(x, w, interpret=True, **change)


def test_config_rejects_non_powers_of_two():
  with pytest.raises(ValueError, match="block_c must be a power of two"):
    Config(block_c=24)


# --------------------------------------------------------- the spec ----


def test_ci_cases_cover_the_features():
  ci = [d for d in arg_specs.CASE_DEFS if "ci" in d.tags]
  assert any(d.stride != 1 for d in ci) and any(d.dilation != 1 for d in ci)
  assert {"SAME", "VALID"} <= {d.padding for d in ci if isinstance(d.padding, str)}
  assert any(not isinstance(d.padding, str) for d in ci)
  assert any(d.groups == d.c for d in ci) and any(1 < d.groups < d.c for d in ci)
  assert any(d.prologue == "affine" and d.prologue_activation for d in ci)
  assert any(d.activation == "hard_swish" for d in ci)
  assert any(d.residual for d in ci) and any(d.statistics for d in ci)
  assert any(d.dtype == "bfloat16" for d in ci) and sum(d.grad for d in ci) >= 3


def test_validate_with_kernels_required(clean_fallbacks):
  # One ci case end to end (the whole ci set, a minute on a CPU, is
  # `python -m pallas_kernels validate --ops conv2d --interpret true --require-kernel true`).
  d = next(d for d in arg_specs.CASE_DEFS if "ci" in d.tags and d.dtype == "float16")
  spec = dataclasses.replace(pk.get_spec("conv2d"),
                             cases=lambda tag, seed: iter([arg_specs.build_case(d, seed)]))
  report = pk.validate(spec, interpret=True, require_kernel=True)
  assert report.passed and len(report.rows) == 1, str(report)


def test_cost_model_of_a_bench_case():
  d = next(c for c in arg_specs.CASE_DEFS if "bench" in c.tags and c.groups == 1
           and c.kh == 1)
  args = jax.eval_shape(lambda: arg_specs.build_case(d, 0).args)
  case = types.SimpleNamespace(args=args, kwargs=arg_specs.build_case(
      arg_specs.CaseDef(1, 1, 1, 1, 1, kh=1, kw=1), 0).kwargs | {
          "operands": ("scale", "shift"), "statistics": True, "padding": "SAME"})
  n, h, w, c, f = d.n, d.h, d.w, d.c, d.f
  assert arg_specs.flops(case) == 2 * n * h * w * c * f
  assert arg_specs.bytes_moved(case) == 2 * (n * h * w * c + c * f + 2 * c + n * h * w * f) \
      + 2 * 4 * f


def _array(dt, dims):
  return types.SimpleNamespace(dtype=dt, dims=tuple(dims))


def _facts(kind, ops, *, lhs=(8, 58, 58, 32), rhs=(3, 3, 32, 64), result=(8, 28, 28, 64),
           boundary=None, sources=()):
  anchor = types.SimpleNamespace(lhs=_array("bf16", lhs), rhs=_array("bf16", rhs),
                                 result=tuple(result), lhs_contracting=None,
                                 rhs_contracting=None, lhs_batch=(), rhs_batch=())
  b = boundary or (lhs if kind == "unfused-prologue" else result)
  return CallFacts(kind=kind, ops=tuple(ops), boundary=_array("bf16", b),
                   shape=f"bf16[{','.join(map(str, b))}]", matmul=anchor,
                   sources=tuple(sources),
                   numpy_name={"bf16": "bfloat16", "f32": "float32"}.get)


def test_suggest_a_prologue_from_the_padded_input_it_reads():
  facts = _facts("unfused-prologue", ("affine", "activation:relu", "pad"),
                 sources=(_array("bf16", (8, 56, 56, 32)), _array("f32", (32,)),
                          _array("f32", (32,))))
  call = arg_specs.suggest(facts)
  assert call.text() == (
      "pallas_kernels.conv2d(x, w, scale=scale, shift=shift, stride=2, "
      "padding=((top, bottom), (left, right)), prologue_activation='relu')  "
      "# x: bf16[8,56,56,32], w: bf16[3,3,32,64], scale: f32[32], shift: f32[32] "
      "-> bf16[8,28,28,64]")
  check = pk.check_guard(call.op, *[_struct(d, {"bf16": "bfloat16"}[dt])
                                    for _, dt, d, pos in call.arrays if pos],
                         interpret=True,
                         **{n: _struct(d, {"bf16": "bfloat16", "f32": "float32"}[dt])
                            for n, dt, d, pos in call.arrays if not pos},
                         **{k: v for k, _, v in call.options})
  assert check.runs, check


def test_suggest_an_epilogue_with_statistics():
  facts = _facts("unfused-epilogue",
                 ("bias", "activation:hard_swish", "residual", "batch_norm_stats"),
                 lhs=(8, 28, 28, 32), rhs=(1, 1, 32, 64), result=(8, 28, 28, 64))
  call = arg_specs.suggest(facts)
  assert call.text() == (
      "pallas_kernels.conv2d(x, w, bias=bias, residual=residual, padding='VALID', "
      "activation='hard_swish', statistics=True)  # x: bf16[8,28,28,32], "
      "w: bf16[1,1,32,64], bias: bf16[64], residual: bf16[8,28,28,64] "
      "-> (bf16[8,28,28,64], (f32[64], f32[64]))")


def test_suggest_from_a_cudnn_call_names_what_the_hlo_leaves_open():
  # XLA:GPU's cuDNN call: an OHWI filter and a tuple result (no output dims),
  # as in the keras MobileNetV3 H200 fixture.
  facts = _facts("unfused-prologue", ("affine", "activation:relu", "pad"),
                 lhs=(8, 17, 17, 72), rhs=(72, 3, 3, 1), result=(),
                 sources=(_array("f32", (72,)), _array("f32", (8, 16, 16, 72)),
                          _array("f32", (72,))))
  assert arg_specs.suggest(facts).text() == (
      "pallas_kernels.conv2d(x, w, scale=scale, shift=shift, stride=stride, "
      "padding=((top, bottom), (left, right)), groups=72, prologue_activation='relu')  "
      "# x: f32[8,16,16,72], w: bf16[3,3,1,72], scale: f32[72], shift: f32[72] "
      "-> bf16[8,HO,WO,72]")
  # A 3x3 call without a pad kernel before it pads its input itself.
  facts = _facts("unfused-prologue", ("affine",), lhs=(8, 8, 8, 88), rhs=(88, 3, 3, 1),
                 result=(), sources=(_array("bf16", (8, 8, 8, 88)), _array("f32", (88,))))
  assert "stride=stride, padding=padding, groups=88" in arg_specs.suggest(facts).text()


def test_suggest_depthwise_groups():
  facts = _facts("unfused-epilogue", ("activation:relu",), lhs=(8, 57, 57, 72),
                 rhs=(3, 3, 1, 72), result=(8, 28, 28, 72))
  assert "groups=72" in arg_specs.suggest(facts).text()


@pytest.mark.parametrize("h, padding", [
    (20, ((2, 2), (2, 2))),   # a full convolution's: k - 1 a side, the window's reach
    (19, ((1, 2), (1, 2))),   # odd: the extra row and column at the end
])
def test_a_prologue_pads_up_to_the_windows_reach(h, padding):
  facts = _facts("unfused-prologue", ("pad",), lhs=(8, h, h, 16), rhs=(16, 3, 3, 1),
                 result=(), sources=(_array("f32", (8, 16, 16, 16)),))
  call = arg_specs.suggest(facts)
  assert call is not None and {k: v for k, _, v in call.options}["padding"] == padding


@pytest.mark.parametrize("facts", [
    _facts("unfused-epilogue", ("bias",)).__class__(  # no anchor: XLA's convolution op
        kind="unfused-epilogue", ops=("bias",), boundary=_array("bf16", (8, 28, 28, 64)),
        shape="bf16[8,28,28,64]"),
    _facts("unfused-epilogue", ("activation:softplus",)),
    _facts("unfused-epilogue", ("bias",), rhs=(3, 3, 5, 64)),       # 5 does not divide 32
    _facts("unfused-epilogue", ("bias",), rhs=(3, 3, 32, 60)),      # F is not the output's
    # Zeros past the window's reach: a transposed convolution's interior padding.
    _facts("unfused-prologue", ("pad",), lhs=(8, 35, 35, 16), rhs=(16, 3, 3, 1), result=(),
           sources=(_array("f32", (8, 16, 16, 16)),)),
    # A squeeze-excite's per-sample factor is no per-channel scale.
    _facts("unfused-prologue", ("scale",), lhs=(8, 4, 4, 96), rhs=(24, 1, 1, 96), result=(),
           sources=(_array("f32", (8, 4, 4, 96)), _array("f32", (8, 1, 1, 96)))),
    _facts("separate-reduction", ("bias",)),
])
def test_suggest_declines(facts):
  assert arg_specs.suggest(facts) is None


# ------------------------------------------------- GPU lowering (no GPU) ----

_TRITON_CALL = re.compile(r"stablehlo\.custom_call @(__gpu\$xla\.gpu\.triton|triton_kernel_call\w*)")


@pytest.mark.parametrize("groups,c,f", [(1, 32, 64), (32, 32, 32), (4, 32, 64)])
def test_lowers_for_a_gpu_to_one_kernel(clean_fallbacks, groups, c, f):
  # The route of tests/pallas_kernels/lowering_test.py: an abstract H200, lowered for CUDA.
  if guard.gpu.unavailable_reason(True) or not compat.TRITON_LOWERS_WITHOUT_GPU:
    pytest.skip("this JAX cannot lower Triton kernels without a GPU")
  device = jax.sharding.AbstractDevice("NVIDIA H200", 132, "cuda")
  mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)
  x, w = _struct((2, 28, 28, c), "bfloat16"), _struct((3, 3, c // groups, f), "bfloat16")
  v, b, r = _struct((c,)), _struct((f,)), _struct((2, 14, 14, f), "bfloat16")

  def fwd(x, w, s, t, b, r):
    return conv2d(x, w, stride=2, groups=groups, scale=s, shift=t,
                  prologue_activation="hard_swish", bias=b, activation="gelu", residual=r,
                  statistics=True, implementation="pallas")

  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    with jax.sharding.use_abstract_mesh(mesh):
      text = jax.jit(fwd).trace(x, w, v, v, b, r).lower(lowering_platforms=("cuda",)).as_text()
  assert len(_TRITON_CALL.findall(text)) == 1
  for op in ("stablehlo.convolution", "stablehlo.pad", "chlo.erf", "stablehlo.maximum"):
    assert op not in text, op
  assert_no_fallback()


def test_on_a_gpu_shared_memory_is_held_to_its_bound(monkeypatch):
  # Compiled for a GPU (faked here: no GPU runs this): a config needing
  # exactly the shared memory there is passes; one byte less is refused.
  monkeypatch.setattr(guard.gpu, "unavailable_reason", lambda interpret: None)
  monkeypatch.setattr(backend, "current_backend", lambda: backend.Backend.GPU)
  x, w = _struct((2, 8, 8, 32), "bfloat16"), _struct((3, 3, 32, 32), "bfloat16")
  cfg = Config(block_p=64, block_f=32, block_c=32)
  need = config_lib.smem_bytes(cfg, 2, False)

  def reason(limit):
    monkeypatch.setattr(guard.matmul_gpu, "shared_memory_bytes", lambda: limit)
    return guard.unsupported_reason(x, w, config=cfg, out_dtype=jnp.bfloat16, groups=1,
                                    out_hw=(8, 8), interpret=False)

  assert reason(need) is None
  assert f"needs ~{need // 1024} KiB of shared memory" in reason(need - 1)


def test_the_heuristic_sheds_pipeline_stages_to_fit_shared_memory_down_to_one(monkeypatch):
  gpu_backend = backend.Backend.GPU
  full = config_lib.heuristic_config(4096, 128, 128, jnp.bfloat16, gpu_backend,
                                     depthwise=False)
  assert full.num_stages == 3
  need = {s: config_lib.smem_bytes(dataclasses.replace(full, num_stages=s), 2, False)
          for s in (1, 2, 3)}
  for budget, stages in ((need[3], 3), (need[2], 2), (need[2] - 1, 1), (1, 1)):
    monkeypatch.setattr(config_lib.matmul_gpu, "shared_memory_bytes_of", lambda kind: budget)
    cfg = config_lib.heuristic_config(4096, 128, 128, jnp.bfloat16, gpu_backend,
                                      depthwise=False)
    assert cfg.num_stages == stages, (budget, cfg)


@pytest.mark.parametrize("padding, said", [
    (((1, 1), (0, 0)), "padding=((1, 1), (0, 0))"),   # only the rows padded
    (((0, 0), (0, 0)), "padding='VALID'"),
])
def test_a_call_read_off_a_convolution_pads_explicitly_where_any_side_is(padding, said):
  out_w = 26 + padding[1][0] + padding[1][1]
  conv = types.SimpleNamespace(
      role="forward", input=_array("bf16", (8, 28, 28, 32)),
      kernel=_array("bf16", (3, 3, 32, 64)), output=_array("bf16", (8, 28, out_w, 64)),
      stride=(1, 1), padding=padding, dilation=(1, 1), input_dilation=(1, 1), groups=1)
  facts = CallFacts(kind="unfused-epilogue", ops=("activation:relu",),
                    boundary=_array("bf16", (8, 28, out_w, 64)), shape="",
                    convolution=conv, numpy_name={"bf16": "bfloat16"}.get)
  assert said in arg_specs.suggest(facts).text()
