"""conv2d_weight_grad with Adam's update as its epilogue: the kernel in
interpret mode against the float32 ground truth, its guard, and the call the
audit writes for an update reading a convolution's filter gradient.

Expected values come only from `reference.py` (float32 at Precision.HIGHEST),
tolerances only from `tolerances.py`; the reference itself is held against
optax's `adamw` where optax is installed. Every kernel test fails on any
recorded fallback. Kernel runs are few and small (each costs seconds
interpreted); `validate`'s ci cases (conv2d_weight_grad_test) add a
depthwise layer with its column sum, weight decay and bf16 state.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import re
import types
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo_audit
import pallas_kernels as pk
from hlo_audit import FindingKind
from hlo_audit import plugins
from pallas_kernels._src import backend
from pallas_kernels._src import inputs
from pallas_kernels._src.audit import library
from pallas_kernels._src.ops import adam
from pallas_kernels._src.ops.conv2d_weight_grad import arg_specs
from pallas_kernels._src.ops.conv2d_weight_grad import config as config_lib
from pallas_kernels._src.ops.conv2d_weight_grad import guard
from pallas_kernels._src.ops.conv2d_weight_grad import reference
from pallas_kernels._src.ops.conv2d_weight_grad.api import conv2d_weight_grad
from pallas_kernels._src.ops.conv2d_weight_grad.config import Config
from pallas_kernels._src.tolerances import relative_error, tolerance
from tests.hlo_audit.real_models import h200_support

F32 = jnp.float32
LR = arg_specs.LEARNING_RATE
#: One split (the update's), ragged 16-pixel steps, 4-channel C and F tiles.
SMALL = arg_specs.SMALL_ADAM


def operands(x_shape, kernel_size, f, dtype="float32", state="float32", tag="", **window):
  """x, dy, the window, and param, mu, nu as a run of Adam holds them."""
  win = reference.window(x_shape, kernel_size, **window)
  ho, wo = win.out_size(x_shape[1], x_shape[2])
  keys = inputs.Keys(0, f"adamconv{x_shape}{kernel_size}{f}{dtype}{state}{window}{tag}")
  x = inputs.normal(keys.next(), x_shape, dtype)
  dy = inputs.normal(keys.next(), (x_shape[0], ho, wo, f), dtype)
  shape = win.kernel + (x_shape[3] // win.groups, f)
  param = inputs.normal(keys.next(), shape, state)
  mu = (0.1 * inputs.normal(keys.next(), shape, F32)).astype(state)
  nu = (0.01 * jnp.abs(inputs.normal(keys.next(), shape, F32))).astype(state)
  return x, dy, win, (param, mu, nu)


def kernel(x, dy, kernel_size, state, count, **kw):
  kw.setdefault("learning_rate", LR)
  param, mu, nu = state
  return conv2d_weight_grad(x, dy, kernel_size, param=param, mu=mu, nu=nu,
                            count=jnp.int32(count) if isinstance(count, int) else count,
                            implementation="pallas", interpret=True, **kw)


def truth(x, dy, win, state, count, **kw):
  kw.setdefault("learning_rate", LR)
  return reference.adam_step_f32(x, dy, win, *state, jnp.int32(count), **kw)


def assert_close(outs, expected, names=("param", "mu", "nu", "db")):
  for name, out, ref in zip(names, outs, expected):
    assert out.shape == ref.shape, (name, out.shape, ref.shape)
    err, bound = relative_error(out, ref), tolerance(out.dtype)
    assert err <= bound, f"{name}: relative error {err:.3e} > {bound:.0e}"


def assert_no_fallback():
  assert not pk.fallbacks(), f"the kernel fell back to XLA: {pk.fallbacks()}"


def moved(a, b) -> bool:
  """Whether two param' differ by far more than float32's tolerance."""
  return relative_error(a, b) > 10 * tolerance(F32)


# ----------------------------------------------------------- kernel ----

#: Ragged everywhere against SMALL: C = 5 and F = 6 in 4-channel tiles,
#: 2 * 7 * 6 = 84 pixels in 16-pixel steps; a per-axis stride and an
#: explicit, asymmetric padding.
RAGGED = ((2, 7, 9, 5), (3, 3), 6, dict(stride=(1, 2), padding=((2, 0), (1, 3))))


def test_update_on_a_ragged_strided_padded_layer(clean_fallbacks):
  x_shape, k, f, window = RAGGED
  x, dy, win, state = operands(x_shape, k, f, **window)
  out = kernel(x, dy, k, state, 2, weight_decay=0.1, column_sum=True, config=SMALL,
               **window)
  assert [o.dtype for o in out] == [F32] * 4
  assert_close(out, truth(x, dy, win, state, 2, weight_decay=0.1, column_sum_=True))
  assert_no_fallback()
  # Each term shows at the tolerance: the decay, the step count's bias
  # corrections, the update itself.
  assert moved(out[0], truth(x, dy, win, state, 2)[0])
  assert moved(out[0], truth(x, dy, win, state, 3, weight_decay=0.1)[0])
  assert moved(out[0], state[0])


def test_update_of_a_depthwise_layer(clean_fallbacks):
  # Channel multiplier 2: F = 12 in 8-channel tiles (ragged), 18 pixels.
  x, dy, win, state = operands((2, 6, 6, 6), (3, 3), 12, stride=2, groups=6)
  out = kernel(x, dy, (3, 3), state, 7, stride=2, groups=6,
               config=Config(block_p=16, block_f=8))
  assert [o.shape for o in out] == [(3, 3, 1, 12)] * 3
  assert_close(out, truth(x, dy, win, state, 7))
  assert_no_fallback()


def test_bf16_state_in_a_jitted_step_with_a_traced_count(clean_fallbacks):
  x, dy, win, state = operands((2, 5, 6, 8), (1, 1), 16, "bfloat16", "bfloat16",
                               padding="VALID")
  traces = []

  @jax.jit
  def step(x, dy, param, mu, nu, count):
    traces.append(1)
    return kernel(x, dy, (1, 1), (param, mu, nu), count, padding="VALID",
                  weight_decay=1e-2)

  for count in (0, 5):
    out = step(x, dy, *state, jnp.int32(count))
    assert [o.dtype for o in out] == [jnp.bfloat16] * 3
    assert_close(out, truth(x, dy, win, state, count, weight_decay=1e-2))
  assert len(traces) == 1, "a new count retraced the step"
  assert_no_fallback()


def test_the_gradient_is_never_written():
  # One kernel, whose outputs are the state's (viewed per tap) and db: no
  # weights-sized f32 gradient, no convolution beside it.
  x, dy, _, state = operands(*RAGGED[:3], **RAGGED[3])
  fn = functools.partial(kernel, kernel_size=(3, 3), count=1, column_sum=True,
                         config=SMALL, **RAGGED[3])
  jaxpr = jax.make_jaxpr(lambda x, dy, *s: fn(x, dy, state=s))(x, dy, *state)
  calls = [e for e in _equations(jaxpr.jaxpr) if e.primitive.name == "pallas_call"]
  assert len(calls) == 1
  outs = [(tuple(v.aval.shape), v.aval.dtype) for v in calls[0].outvars]
  assert outs == [((9, 5, 1, 6), F32)] * 3 + [((1, 1, 6), F32)]
  assert "conv_general_dilated" not in str(jaxpr)


@pytest.mark.parametrize("in_place, aliases", [(True, {2: 0, 3: 1, 4: 2}), (False, {})])
def test_the_state_is_written_in_place_only_when_asked(in_place, aliases):
  # Aliased, a step that donates its state updates it where it lies; one
  # that does not would have XLA copy param, mu and nu first.
  x, dy, _, state = operands(*RAGGED[:3], **RAGGED[3])
  fn = functools.partial(kernel, kernel_size=(3, 3), count=1, config=SMALL,
                         in_place=in_place, **RAGGED[3])
  jaxpr = jax.make_jaxpr(lambda x, dy, *s: fn(x, dy, state=s))(x, dy, *state)
  (call,) = [e for e in _equations(jaxpr.jaxpr) if e.primitive.name == "pallas_call"]
  assert dict(call.params["input_output_aliases"]) == aliases


def test_every_access_to_the_state_is_masked_at_ragged_edges():
  # Interpret mode pads a block past the array's edge and drops what lands
  # there, so an unmasked access would pass every numeric test here; on a GPU
  # it reads and writes the next tap's or group's weights. The kernel's body
  # must mask all six: param, mu and nu read, param', mu' and nu' written.
  x, dy, _, state = operands(*RAGGED[:3], **RAGGED[3])
  fn = functools.partial(kernel, kernel_size=(3, 3), count=1, config=SMALL, **RAGGED[3])
  jaxpr = jax.make_jaxpr(lambda x, dy, *s: fn(x, dy, state=s))(x, dy, *state)
  (call,) = [e for e in _equations(jaxpr.jaxpr) if e.primitive.name == "pallas_call"]
  body = call.params["jaxpr"]
  refs = body.invars  # x, dy, param, mu, nu, lr, c1, c2, param', mu', nu'
  state_refs = {id(r) for r in refs[2:5] + refs[8:11]}
  masks = []
  for e in body.eqns:
    if e.invars and id(e.invars[0]) in state_refs:
      assert e.primitive.name in ("masked_load", "masked_swap"), e.primitive.name
      parts = e.params["args_tree"].unflatten(e.invars)
      masks.append(parts[2] if e.primitive.name == "masked_load" else parts[3])
  assert len(masks) == 6 and None not in masks and len({id(m) for m in masks}) == 1, masks


def _equations(jaxpr):
  """Every equation of a jaxpr and of the jaxprs its equations hold."""
  for e in jaxpr.eqns:
    yield e
    for p in e.params.values():
      for sub in p if isinstance(p, (tuple, list)) else (p,):
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          yield from _equations(inner)


def test_xla_implementation_is_the_reference():
  x, dy, win, state = operands(*RAGGED[:3], tag="xla", **RAGGED[3])
  out = conv2d_weight_grad(x, dy, (3, 3), param=state[0], mu=state[1], nu=state[2],
                           count=jnp.int32(4), learning_rate=LR, eps_root=1e-8,
                           column_sum=True, implementation="xla", **RAGGED[3])
  assert_close(out, truth(x, dy, win, state, 4, eps_root=1e-8, column_sum_=True))


def test_the_bias_corrections_hold_the_count_at_int32s_largest():
  # optax's safe_increment: t stays at 2**31 - 1 instead of wrapping negative.
  c1, c2 = adam.corrections(jnp.int32(2**31 - 1), 0.9, 0.999)
  assert float(c1[0]) == 1.0 and float(c2[0]) == 1.0
  c1, c2 = adam.corrections(jnp.int32(0), 0.9, 0.999)
  np.testing.assert_allclose([float(c1[0]), float(c2[0])], [0.1, 0.001], rtol=1e-4)


# ------------------------------------------------------------ optax ----


@pytest.mark.parametrize("count,weight_decay,eps_root", [(0, 0.0, 0.0), (7, 1e-2, 1e-8)])
def test_the_reference_is_optax_adamw_on_the_filter_gradient(count, weight_decay, eps_root):
  optax = pytest.importorskip("optax")
  x, dy, win, (param, mu, nu) = operands((2, 6, 6, 6), (3, 3), 12, tag="optax", stride=2,
                                          groups=6)
  g = reference.weight_grad(x, dy, win, precision=jax.lax.Precision.HIGHEST)
  opt = optax.adamw(LR, b1=0.9, b2=0.999, eps=1e-8, eps_root=eps_root,
                    weight_decay=weight_decay)
  opt_state = opt.init(param)
  opt_state = (opt_state[0]._replace(count=jnp.int32(count), mu=mu, nu=nu),) + \
      tuple(opt_state[1:])
  updates, new_state = opt.update(g, opt_state, param)
  want = (optax.apply_updates(param, updates), new_state[0].mu, new_state[0].nu)
  got = reference.adam_step(x, dy, win, param, mu, nu, jnp.int32(count), learning_rate=LR,
                            weight_decay=weight_decay, eps_root=eps_root,
                            precision=jax.lax.Precision.HIGHEST)
  for a, b in zip(got, want):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------- guard ----


def _struct(shape, dtype="float32"):
  return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))


def _reason(state_dtypes=("float32",) * 3, config=SMALL, interpret=True, x=(2, 8, 8, 4),
            f=8, k=(3, 3), dtype="float32", **window):
  win = reference.window(x, k, **window)
  dy = (x[0], *win.out_size(x[1], x[2]), f)
  shape = win.kernel + (x[3] // win.groups, f)
  state = tuple(_struct(shape, dt) for dt in state_dtypes)
  return guard.unsupported_reason(_struct(x, dtype), _struct(dy, dtype), win,
                                  out_dtype=F32, interpret=interpret, config=config,
                                  state=state)


def test_guard_reasons_name_the_state_and_the_split():
  assert _reason() is None
  assert "param int8[3, 3, 4, 8]: dtype int8" in _reason(("int8", "float32", "float32"))
  mixed = _reason(("bfloat16", "float32", "float32"))
  assert "mixed state dtypes" in mixed and "param bfloat16[3, 3, 4, 8]" in mixed
  # Split pixels: no program would hold its tile's whole gradient.
  assert "splits=1" in _reason(config=Config(splits=2))


def test_gpu_guard_counts_the_updates_tiles():
  with backend.targeting(backend.DEFAULT_GPU):
    cfg = config_lib.choose_config(8 * 4 * 4, 120, 48, 1, 1, F32, interpret=False,
                                   update=True)
    assert cfg.splits == 1 and min(cfg.block_p, cfg.block_c, cfg.block_f) >= 16
    # The update's four f32 tiles are counted with the pipeline's.
    assert config_lib.smem_bytes(cfg, 4, False, update=True) >= \
        4 * 4 * cfg.block_c * cfg.block_f
    if guard.gpu.unavailable_reason(False) is None:
      x = (8, 4, 4, 128)
      assert _reason(config=cfg, interpret=False, x=x, f=128, k=(1, 1)) is None
      limit = Config(block_p=16, block_c=64, block_f=128)  # exactly 64 x 128
      assert _reason(config=limit, interpret=False, x=x, f=128, k=(1, 1)) is None
      big = Config(block_p=16, block_c=128, block_f=128)
      why = _reason(config=big, interpret=False, x=x, f=128, k=(1, 1))
      assert "four f32 tiles of 16384 elements" in why, why


def test_a_fallback_runs_the_reference_and_is_recorded(clean_fallbacks):
  x, dy, win, (param, mu, nu) = operands((1, 5, 5, 3), (3, 3), 4, tag="fallback")
  state = (param.astype(jnp.bfloat16), mu, nu)
  out = kernel(x, dy, (3, 3), state, 2)
  (f,) = pk.fallbacks("conv2d_weight_grad")
  assert "mixed state dtypes" in f.reason, f.reason
  assert f.signature == ("x=float32[1,5,5,3] dy=float32[1,5,5,4] param=bfloat16[3,3,3,4] "
                         "mu=float32[3,3,3,4] nu=float32[3,3,3,4]")
  assert out[0].dtype == jnp.bfloat16 and out[1].dtype == F32
  assert_close(out[1:], truth(x, dy, win, state, 2)[1:], names=("mu", "nu"))


def test_a_split_config_falls_back(clean_fallbacks):
  x, dy, win, state = operands((1, 5, 5, 3), (3, 3), 4, tag="fallback")
  out = kernel(x, dy, (3, 3), state, 0, config=Config(block_p=16, splits=2))
  (f,) = pk.fallbacks("conv2d_weight_grad")
  assert "the Adam update needs each program to sum every pixel" in f.reason, f.reason
  assert_close(out, truth(x, dy, win, state, 0))


@pytest.mark.parametrize("change,match", [
    (dict(nu=None), "needs param, mu, nu, count and learning_rate together; missing nu"),
    (dict(param=None, mu=None, nu=None, count=None), "missing param, mu, nu, count$"),
    (dict(out_dtype=jnp.bfloat16), "out_dtype is dw's dtype"),
    (dict(mu=jnp.ones((3, 3, 4, 3))), r"mu must have the gradient's shape "
                                      r"\[KH, KW, C/groups, F\]=\[3, 3, 3, 4\]"),
    (dict(param=jnp.ones((3, 3, 3, 4), jnp.int32)), "param must be a real floating array"),
    (dict(count=jnp.float32(0)), "count must be an integer scalar"),
    (dict(learning_rate=jnp.ones((2,))), "learning_rate must be"),
    (dict(b2=jnp.float32(0.9)), "b2 must be a Python float"),
])
def test_invalid_calls_raise(change, match):
  w = jnp.ones((3, 3, 3, 4))
  args = dict(param=w, mu=w, nu=w, count=jnp.int32(0), learning_rate=1e-3) | change
  with pytest.raises(ValueError, match=match):
    conv2d_weight_grad(jnp.ones((1, 5, 5, 3)), jnp.ones((1, 5, 5, 4)), (3, 3),
                       implementation="pallas", interpret=True, **args)


@pytest.mark.parametrize("x,dy,k,window", [
    ((8, 4, 4, 120), (8, 4, 4, 48), (1, 1), {}),
    ((8, 11, 11, 96), (8, 4, 4, 96), (5, 5), dict(stride=2, groups=96)),
], ids=["pointwise", "depthwise"])
def test_lowers_for_an_h200_as_one_triton_kernel(clean_fallbacks, x, dy, k, window):
  # No GPU here: the abstract H200 makes Pallas lower the Triton kernel itself
  # (keras' MobileNetV3 layers, f32 state).
  x, dy = _struct(x), _struct(dy)
  w, count = _struct(k + (x.shape[3] // window.get("groups", 1), dy.shape[3])), \
      _struct((), "int32")
  device = jax.sharding.AbstractDevice("NVIDIA H200", 132, "cuda")
  mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)

  def step(x, dy, p, mu, nu, count):
    return pk.conv2d_weight_grad(x, dy, k, padding="VALID", param=p, mu=mu, nu=nu,
                                 count=count, learning_rate=1e-3, weight_decay=1e-4,
                                 implementation="pallas", **window)

  with warnings.catch_warnings(), jax.sharding.use_abstract_mesh(mesh):
    warnings.simplefilter("ignore")
    text = jax.jit(step).trace(x, dy, w, w, w, count).lower(
        lowering_platforms=("cuda",)).as_text()
  calls = re.findall(r"stablehlo\.custom_call @(__gpu\$xla\.gpu\.triton|triton_kernel_call)",
                     text)
  assert len(calls) == 1 and "stablehlo.convolution" not in text
  assert_no_fallback()


# ---------------------------------------------------- the audit's call ----


@functools.cache
def _keras():
  """keras' MobileNetV3 step compiled for an H200: its Adam updates, with
  the facts the library reads of each."""
  text = h200_support.fixture("keras_mobilenet")
  module = hlo_audit.parse_hlo(text)
  report = hlo_audit.audit_hlo(text, options=hlo_audit.AuditOptions(device="h200"))
  return {f.producer: (f, library._facts(f, module)) for f in report.actionable
          if "adam" in f.ops}


_KERAS_CALLS = {
    # cuDNN's backward filter (OHWI), transposed back to HWIO for the update.
    "cudnn-conv-bw-filter.50": (
        "pallas_kernels.conv2d_weight_grad(x, dy, param=param, mu=mu, nu=nu, count=count, "
        "kernel_size=(1, 1), padding='VALID', learning_rate=learning_rate)  "
        "# x: f32[8,4,4,120], dy: f32[8,4,4,48], param: f32[1,1,120,48], "
        "mu: f32[1,1,120,48], nu: f32[1,1,120,48], count: s32[] "
        "-> (f32[1,1,120,48], f32[1,1,120,48], f32[1,1,120,48])"),
    # A strided depthwise 5x5 on ZeroPadding2D's output.
    "cudnn-conv-bw-filter.43": (
        "pallas_kernels.conv2d_weight_grad(x, dy, param=param, mu=mu, nu=nu, count=count, "
        "kernel_size=(5, 5), stride=(2, 2), padding='VALID', groups=96, "
        "learning_rate=learning_rate)  # x: f32[8,11,11,96], dy: f32[8,4,4,96], "
        "param: f32[5,5,1,96], mu: f32[5,5,1,96], nu: f32[5,5,1,96], count: s32[] "
        "-> (f32[5,5,1,96], f32[5,5,1,96], f32[5,5,1,96])"),
    # A depthwise 5x5 SAME's gradient as XLA computes it: a forward grouped
    # convolution of x as [1, 4, 4, 240 * 8] with dy as its kernel.
    "cudnn-conv.256": (
        "pallas_kernels.conv2d_weight_grad(x, dy, param=param, mu=mu, nu=nu, count=count, "
        "kernel_size=(5, 5), padding=((2, 2), (2, 2)), groups=240, "
        "learning_rate=learning_rate)  # x: f32[8,4,4,240], dy: f32[8,4,4,240], "
        "param: f32[5,5,1,240], mu: f32[5,5,1,240], nu: f32[5,5,1,240], count: s32[] "
        "-> (f32[5,5,1,240], f32[5,5,1,240], f32[5,5,1,240])"),
    # A squeeze-excite 1x1's: x as [C, 1, 1, N] convolved with dy.
    "cudnn-conv.263": (
        "pallas_kernels.conv2d_weight_grad(x, dy, param=param, mu=mu, nu=nu, count=count, "
        "kernel_size=(1, 1), padding='VALID', learning_rate=learning_rate)  "
        "# x: f32[8,1,1,144], dy: f32[8,1,1,40], param: f32[1,1,144,40], "
        "mu: f32[1,1,144,40], nu: f32[1,1,144,40], count: s32[] "
        "-> (f32[1,1,144,40], f32[1,1,144,40], f32[1,1,144,40])"),
}


@pytest.mark.parametrize("producer", list(_KERAS_CALLS))
def test_keras_mobilenet_h200_suggestion(producer):
  f, _ = _keras()[producer]
  assert f.kernel == "pallas_kernels.conv2d_weight_grad"
  assert f.suggestion == _KERAS_CALLS[producer]
  assert f.guard_verdict.startswith("kernel runs (guard passes on gpu"), f.guard_verdict


def test_every_keras_update_gets_a_call_that_runs_on_the_h200():
  found = _keras()
  ops = collections.Counter(f.ops for f, _ in found.values())
  assert set(ops) == {("outputs:3", "adam"), ("outputs:3", "adam", "transpose")}, ops
  for f, _ in found.values():
    assert f.kernel == "pallas_kernels.conv2d_weight_grad", f.producer
    assert f.suggestion and f.guard_verdict.startswith("kernel runs"), (f.producer, f.guard_verdict)


def test_each_keras_call_reads_the_gradient_the_hlo_writes():
  # The call's param is the written gradient's elements (cuDNN's OHWI, XLA's
  # [C, KH, KW, F] or [1, KH, KW, C]) in HWIO.
  for f, facts in _keras().values():
    call = arg_specs.suggest(facts)
    param = dict((n, dims) for n, _, dims, _ in call.arrays)["param"]
    assert sorted(param) == sorted(facts.boundary.dims), (f.producer, param)
    options = {k: v for k, _, v in call.options}
    arrays = {n: _struct(dims, plugins.numpy_dtype_name(dt)) for n, dt, dims, _ in call.arrays}
    out = jax.eval_shape(lambda a: pk.conv2d_weight_grad(**a, implementation="xla",
                                                         **options), arrays)
    assert [o.shape for o in out] == [param] * 3


def _user_window_test_cases():
  return {
      "stride2_same": ((2, 9, 7, 3), (3, 3), 5, dict(stride=2, padding="SAME")),
      "dilation_valid": ((1, 9, 8, 4), (3, 2), 6, dict(dilation=(2, 1), padding="VALID")),
      "asymmetric": ((1, 6, 7, 4), (3, 3), 8, dict(stride=(1, 2), padding=((2, 0), (1, 3)))),
  }


def _anchor(role, x, w, y, stride, padding, dilation, groups, dtype="f32"):
  def spec(dims):
    return types.SimpleNamespace(dtype=dtype, dims=tuple(int(d) for d in dims))
  return types.SimpleNamespace(role=role, input=spec(x), kernel=spec(w), output=spec(y),
                               stride=tuple(stride), padding=tuple(map(tuple, padding)),
                               dilation=tuple(dilation), input_dilation=(1, 1), groups=groups)


@pytest.mark.parametrize("name", list(_user_window_test_cases()))
def test_a_forward_convolution_is_read_as_jax_writes_the_filter_gradient(name):
  # JAX's transpose rule for w, read off its jaxpr: the one convolution of
  # the gradient, as an anchor of role "forward" names it.
  x_shape, k, f, window = _user_window_test_cases()[name]
  win = reference.window(x_shape, k, **window)
  x, dy = (jnp.zeros(s) for s in (x_shape, (x_shape[0], *win.out_size(*x_shape[1:3]), f)))
  jaxpr = jax.make_jaxpr(lambda x, dy: reference.weight_grad(x, dy, win))(x, dy)
  # The vjp's forward convolution, then the gradient's.
  *_, eq = [e for e in _equations(jaxpr.jaxpr) if e.primitive.name == "conv_general_dilated"]
  assert eq.outvars[0].aval.shape == win.kernel + (x_shape[3], f)
  p = eq.params
  lhs, rhs, out = p["dimension_numbers"]
  a, b = (v.aval.shape for v in eq.invars)
  y = eq.outvars[0].aval.shape
  anchor = _anchor("forward", [a[lhs[0]], a[lhs[2]], a[lhs[3]], a[lhs[1]]],
                   [b[rhs[2]], b[rhs[3]], b[rhs[1]], b[rhs[0]]],
                   [y[out[0]], y[out[2]], y[out[3]], y[out[1]]],
                   p["window_strides"], p["padding"], p["rhs_dilation"],
                   p["feature_group_count"])
  assert set(p["lhs_dilation"]) == {1} and p["batch_group_count"] == 1
  found = arg_specs._filter_gradient(anchor)
  assert (found.x, found.dy, found.kernel) == (x.shape, dy.shape, win.kernel)
  assert (found.stride, found.dilation, found.groups) == (win.stride, win.dilation, 1)
  assert found.padding[0][0] == win.padding[0][0] and found.padding[1][0] == win.padding[1][0]
  assert reference.window(x_shape, k, stride=found.stride, padding=found.padding,
                          dilation=found.dilation).out_size(*x_shape[1:3]) == dy.shape[1:3]


def test_a_grouped_forward_convolution_is_a_depthwise_filter_gradient():
  # The form XLA gives a depthwise layer's filter gradient (keras' on the
  # H200): x as [1, H, W, C*N], C groups, dy as the kernel [HO, WO, N, F].
  # Computed with lax, it is the gradient; read back, it is the layer.
  x, dy, win, _ = operands((3, 9, 9, 4), (3, 3), 8, tag="grouped", stride=2, groups=4)
  n, h, w, c = x.shape
  _, ho, wo, f = dy.shape
  lo = tuple(p[0] for p in win.padding)
  hi = tuple((k - 1) * d + (o - 1) * s + 1 - size - l_ for k, d, o, s, size, l_ in
             zip(win.kernel, win.dilation, (ho, wo), win.stride, (h, w), lo))
  xt = x.transpose(1, 2, 3, 0).reshape(1, h, w, c * n)  # channel-major groups
  g = jax.lax.conv_general_dilated(
      xt, dy.transpose(1, 2, 0, 3), window_strides=win.dilation,
      padding=tuple(zip(lo, hi)), rhs_dilation=win.stride, feature_group_count=c,
      dimension_numbers=("NHWC", "HWIO", "NHWC"), precision=jax.lax.Precision.HIGHEST)
  want = reference.conv2d_weight_grad_f32(x, dy, win)
  np.testing.assert_allclose(g.reshape(want.shape), want, rtol=1e-5, atol=1e-5)
  anchor = _anchor("forward", xt.shape, (ho, wo, n, f), g.shape, win.dilation,
                   tuple(zip(lo, hi)), win.stride, c)
  found = arg_specs._filter_gradient(anchor)
  assert (found.x, found.dy, found.groups, found.stride) == (x.shape, dy.shape, 4, (2, 2))
  assert found.dw == want.shape


def test_suggests_nothing_for_other_epilogues_or_shapes():
  _, facts = _keras()["cudnn-conv-bw-filter.50"]
  assert arg_specs.suggest(facts) is not None
  # No update: no call (nor a column sum's).
  assert arg_specs.suggest(dataclasses.replace(facts, ops=("outputs:3", "transpose"))) is None
  # A boundary that is not the convolution's gradient (its dy).
  dy = types.SimpleNamespace(dtype="f32", dims=(8, 4, 4, 48))
  assert arg_specs.suggest(dataclasses.replace(facts, boundary=dy)) is None
  # A convolution writing an input gradient.
  conv = dataclasses.replace(facts.convolution, role="backward_input")
  assert arg_specs.suggest(dataclasses.replace(facts, convolution=conv)) is None


def _choose(ops, outputs):
  need = plugins.KernelNeed(FindingKind.UNFUSED_EPILOGUE, "convolution", ops, outputs=outputs)
  return library.LIBRARY.kernel_for(types.SimpleNamespace(need=need, boundary_kept=False))


def test_the_library_picks_it_only_for_an_update():
  for ops in (("outputs:3", "adam"), ("outputs:3", "adam", "transpose"),
              ("outputs:3", "cast:f32", "adam")):
    assert _choose(ops, 3).op == "pallas_kernels.conv2d_weight_grad", ops
  # A convolution's other epilogues stay conv2d's, or no op's.
  assert _choose(("bias", "activation:relu"), 1).op == "pallas_kernels.conv2d"
  assert _choose(("outputs:3", "transpose"), 3).op is None
  assert _choose(("outputs:2", "cast:bf16"), 2).op is None
