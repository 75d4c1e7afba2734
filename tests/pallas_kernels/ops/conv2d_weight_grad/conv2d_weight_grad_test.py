"""conv2d_weight_grad: the Pallas kernel in interpret mode against the float32 ground truth.

Expected values come only from `reference.py` (float32 at Precision.HIGHEST),
tolerances only from `tolerances.py`. Every kernel test fails on any recorded
fallback: a passing number computed by XLA would say nothing about the kernel.
"""

from __future__ import annotations

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk
from pallas_kernels._src import backend
from pallas_kernels._src import inputs
from pallas_kernels._src.ops.conv2d_weight_grad import arg_specs
from pallas_kernels._src.ops.conv2d_weight_grad import config as config_lib
from pallas_kernels._src.ops.conv2d_weight_grad import guard
from pallas_kernels._src.ops.conv2d_weight_grad import reference
from pallas_kernels._src.ops.conv2d_weight_grad.api import conv2d_weight_grad
from pallas_kernels._src.ops.conv2d_weight_grad.config import Config
from pallas_kernels._src.spec import CallFacts
from pallas_kernels._src.tolerances import relative_error, tolerance

#: Ragged everywhere: 16-pixel steps, 4-channel C and F tiles, two splits.
SMALL = arg_specs.SMALL
F32 = jnp.float32


def operands(x_shape, kernel_size, f, dtype="float32", tag="", **window):
  win = reference.window(x_shape, kernel_size, **window)
  ho, wo = win.out_size(x_shape[1], x_shape[2])
  keys = inputs.Keys(0, f"conv{x_shape}{kernel_size}{f}{dtype}{window}{tag}")
  x = inputs.normal(keys.next(), x_shape, dtype)
  dy = inputs.normal(keys.next(), (x_shape[0], ho, wo, f), dtype)
  return x, dy, win


def kernel(x, dy, kernel_size, **kw):
  return conv2d_weight_grad(x, dy, kernel_size, implementation="pallas", interpret=True,
                            **kw)


def assert_close(out, expected, dtype):
  assert out.shape == expected.shape, (out.shape, expected.shape)
  err, bound = relative_error(out, expected), tolerance(dtype)
  assert err <= bound, f"relative error {err:.3e} > {bound:.0e} ({jnp.dtype(dtype).name})"


def assert_no_fallback():
  assert not pk.fallbacks(), f"the kernel fell back to XLA: {pk.fallbacks()}"


# ------------------------------------------------------------ dw ----

WINDOWS = {
    # Odd H and W, stride 2, SAME: a one-sided pad the kernel must place as lax does.
    "stride2_same": ((2, 7, 9, 5), (3, 3), 6, dict(stride=2, padding="SAME")),
    "dilation_valid": ((1, 9, 8, 4), (3, 2), 8, dict(dilation=(2, 1), padding="VALID")),
    "explicit_asymmetric": ((1, 6, 7, 4), (3, 3), 8,
                            dict(stride=(1, 2), padding=((2, 0), (1, 3)))),
    "depthwise_x2": ((2, 6, 6, 6), (3, 3), 12, dict(stride=2, groups=6)),
    "grouped": ((2, 6, 5, 8), (3, 3), 6, dict(groups=2)),
    "pointwise": ((2, 5, 3, 8), (1, 1), 16, dict(padding="VALID")),
}


@pytest.mark.parametrize("name", list(WINDOWS))
def test_dw_matches_the_convolutions_gradient(clean_fallbacks, name):
  # Default (CPU) blocks; the column-sum tests and `validate` run small ones.
  x_shape, k, f, window = WINDOWS[name]
  x, dy, win = operands(x_shape, k, f, **window)
  dw = kernel(x, dy, k, **window)
  assert dw.dtype == x.dtype
  assert_close(dw, reference.conv2d_weight_grad_f32(x, dy, win), "float32")
  assert_no_fallback()


@pytest.mark.parametrize("dtype,out_dtype", [("bfloat16", None), ("bfloat16", "float32"),
                                             ("float16", None)])
def test_16_bit_inputs_accumulate_in_f32(clean_fallbacks, dtype, out_dtype):
  x, dy, win = operands((2, 7, 9, 5), (3, 3), 6, dtype, stride=2)
  dw = kernel(x, dy, (3, 3), stride=2, out_dtype=out_dtype, config=SMALL)
  assert dw.dtype == jnp.dtype(out_dtype or dtype)
  # 45 pixels per tap summed in f32, rounded once: within the output dtype's bound.
  assert_close(dw, reference.conv2d_weight_grad_f32(x, dy, win), out_dtype or dtype)
  assert_no_fallback()


# --------------------------------------------------- column sums ----


@pytest.mark.parametrize("name", ["stride2_same", "depthwise_x2", "grouped",
                                  "explicit_asymmetric"])
def test_column_sum_counts_each_dy_element_once(clean_fallbacks, name):
  x_shape, k, f, window = WINDOWS[name]
  x, dy, win = operands(x_shape, k, f, **window)
  pixels = dy.shape[0] * dy.shape[1] * dy.shape[2]
  assert pixels % SMALL.block_p, "the pixel count must leave a ragged tile"
  dw, db = kernel(x, dy, k, column_sum=True, config=SMALL, **window)
  assert db.dtype == F32 and db.shape == (f,)
  want_dw, want_db = reference.conv2d_weight_grad_f32(x, dy, win, column_sum_=True)
  assert_close(dw, want_dw, "float32")
  assert_close(db, want_db, "float32")
  np.testing.assert_allclose(db, np.asarray(dy, np.float64).sum(axis=(0, 1, 2)),
                             rtol=1e-5, atol=1e-5)
  assert_no_fallback()


def test_column_sum_of_bf16_dy_is_f32(clean_fallbacks):
  x, dy, _ = operands((2, 7, 9, 5), (3, 3), 6, "bfloat16", stride=2)
  dw, db = kernel(x, dy, (3, 3), stride=2, column_sum=True)
  assert dw.dtype == jnp.bfloat16 and db.dtype == F32
  assert_close(db, reference.column_sum(dy), "float32")
  assert_no_fallback()


def test_xla_implementation_is_the_reference():
  x, dy, win = operands((1, 6, 7, 4), (3, 3), 8, padding=((2, 0), (1, 3)))
  dw, db = conv2d_weight_grad(x, dy, (3, 3), padding=((2, 0), (1, 3)), column_sum=True,
                              implementation="xla")
  want_dw, want_db = reference.conv2d_weight_grad_f32(x, dy, win, column_sum_=True)
  assert_close(dw, want_dw, "float32")
  assert_close(db, want_db, "float32")


# ------------------------------------------------------------- guard ----


def test_unsupported_dtype_falls_back_and_is_recorded(clean_fallbacks):
  x, dy, win = operands((1, 5, 5, 3), (3, 3), 4)
  xi = (x * 4).astype(jnp.int8)
  dw = kernel(xi, dy, (3, 3), out_dtype=F32)
  (f,) = pk.fallbacks("conv2d_weight_grad")
  assert "x int8[1, 5, 5, 3]" in f.reason and "int8" in f.reason, f.reason
  assert f.signature == "x=int8[1,5,5,3] dy=float32[1,5,5,4]"
  assert_close(dw, reference.conv2d_weight_grad_f32(xi, dy, win), "float32")


def test_mismatched_dtypes_fall_back(clean_fallbacks):
  x, dy, _ = operands((1, 5, 5, 3), (3, 3), 4, "bfloat16")
  kernel(x, dy.astype(F32), (3, 3))
  (f,) = pk.fallbacks("conv2d_weight_grad")
  assert "mismatched dtypes" in f.reason and "dy float32" in f.reason, f.reason


def _struct(shape, dtype="float32"):
  return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))


def _reason(x_shape, dy_shape, k=(3, 3), dtype="float32", out_dtype=F32, config=Config(),
            interpret=True, **window):
  win = reference.window(x_shape, k, **window)
  return guard.unsupported_reason(_struct(x_shape, dtype), _struct(dy_shape, dtype), win,
                                  out_dtype=out_dtype, interpret=interpret, config=config)


def test_guard_reasons_name_the_shape_or_dtype():
  assert _reason((2, 8, 8, 4), (2, 8, 8, 8)) is None
  assert "out_dtype int8" in _reason((2, 8, 8, 4), (2, 8, 8, 8), out_dtype=jnp.int8)
  assert "empty dimension" in _reason((0, 8, 8, 4), (0, 8, 8, 8))
  assert "x float64[2, 8, 8, 4]" in _reason((2, 8, 8, 4), (2, 8, 8, 8), dtype="float64")
  # Offsets are int32: x past 2**31 elements.
  why = _reason((64, 1024, 1024, 64), (64, 1024, 1024, 8))
  assert "x has 4294967296 > 2**31-1 elements" in why
  # ... and the splits' f32 partials of dw, [splits, taps, C, F].
  why = _reason((2, 8, 8, 32), (2, 8, 8, 32), config=Config(splits=2**20))
  assert "the 1048576 split partials of dw has 9663676416 > 2**31-1" in why
  # CUDA's grid: 256 taps x 256 groups x 2 C tiles of one channel.
  why = _reason((1, 16, 16, 512), (1, 16, 16, 256), k=(16, 16), groups=256,
                config=Config(block_c=1))
  assert "grid of 131072" in why and "65535" in why


def test_gpu_guard_checks_triton_tiles_and_shared_memory():
  with backend.targeting(backend.DEFAULT_GPU):
    cfg = config_lib.choose_config(64 * 56 * 56, 24, 72, 1, 1, jnp.bfloat16,
                                   interpret=False)
    assert min(cfg.block_p, cfg.block_c, cfg.block_f) >= config_lib.GPU_MIN_BLOCK
    # 200k pixels for a 24 x 72 weight: the pixels are split across the GPU.
    assert cfg.splits > 1
    if guard.gpu.unavailable_reason(False) is None:
      x, dy = (64, 56, 56, 24), (64, 56, 56, 72)
      assert _reason(x, dy, k=(1, 1), dtype="bfloat16", config=cfg, interpret=False) is None
      tiny = Config(block_p=8, block_c=16, block_f=16)
      assert "tiles >= 16" in _reason(x, dy, k=(1, 1), dtype="bfloat16", config=tiny,
                                      interpret=False)
      huge = Config(block_p=1024, block_c=256, block_f=256, num_stages=4)
      assert "shared memory" in _reason(x, dy, k=(1, 1), dtype="bfloat16", config=huge,
                                        interpret=False)


@pytest.mark.parametrize("window", [dict(stride=2), dict(groups=32)],
                         ids=["dense_stride2", "depthwise"])
def test_lowers_for_an_h200_as_one_triton_kernel(clean_fallbacks, window):
  # No GPU here: the abstract H200 makes Pallas lower the Triton kernel itself.
  x, dy = _struct((8, 28, 28, 32), "bfloat16"), _struct((8, 14, 14, 32), "bfloat16")
  if "groups" in window:
    dy = _struct((8, 28, 28, 32), "bfloat16")
  device = jax.sharding.AbstractDevice("NVIDIA H200", 132, "cuda")
  mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)
  fn = lambda a, b: pk.conv2d_weight_grad(a, b, (3, 3), column_sum=True,  # noqa: E731
                                          implementation="pallas", **window)
  with warnings.catch_warnings(), jax.sharding.use_abstract_mesh(mesh):
    warnings.simplefilter("ignore")
    text = jax.jit(fn).trace(x, dy).lower(lowering_platforms=("cuda",)).as_text()
  calls = re.findall(r"stablehlo\.custom_call @(__gpu\$xla\.gpu\.triton|triton_kernel_call)",
                     text)
  assert len(calls) == 1 and "stablehlo.convolution" not in text
  assert_no_fallback()


@pytest.mark.parametrize("change,match", [
    (dict(dy_shape=(1, 4, 5, 4)), r"does not match the convolution's output"),
    (dict(groups=2), "groups=2 must divide"),
    (dict(padding="FULL"), "padding must be"),
    (dict(padding=((1, 1),)), "padding must be"),
    # Every side an int: one float (or True) among ints is refused too.
    (dict(padding=((1, 1), (1, 1.0))), "padding must be"),
    (dict(padding=((1, True), (1, 1))), "padding must be"),
    (dict(stride=0), "stride must be a positive int"),
    (dict(stride=(1, 0)), "stride must be a positive int"),  # every one, not any
    (dict(kernel_size=(3,)), "kernel_size must be"),
    (dict(x_shape=(5, 5, 3)), "x must be NHWC"),
    (dict(column_sum=1), "column_sum must be a bool"),
    (dict(implementation="triton"), "implementation must be"),
    (dict(config=object()), "config must be"),
])
def test_invalid_calls_raise(change, match):
  x = jnp.ones(change.pop("x_shape", (1, 5, 5, 3)))
  dy = jnp.ones(change.pop("dy_shape", (1, 5, 5, 4)))
  kernel_size = change.pop("kernel_size", (3, 3))
  options = dict(implementation="pallas", interpret=True) | change
  with pytest.raises(ValueError, match=match):
    conv2d_weight_grad(x, dy, kernel_size, **options)


def test_config_rejects_bad_values():
  with pytest.raises(ValueError, match="block_p must be a power of two"):
    Config(block_p=48)
  with pytest.raises(ValueError, match="splits must be an int >= 1"):
    Config(splits=0)


# -------------------------------------------------- the audit's call ----


class _Array:
  def __init__(self, dtype, dims):
    self.dtype, self.dims = dtype, dims


class _Conv:
  """An anchor naming the convolution: its input, dy and its weight gradient."""

  def __init__(self, x, dy, result):
    self.lhs, self.rhs, self.result = x, dy, result


def _facts(anchor, dy, ops=("column_sum",)):
  return CallFacts(kind="separate-reduction", ops=ops, boundary=dy, shape="", matmul=anchor,
                   numpy_name={"bf16": "bfloat16", "f32": "float32"}.get)


def test_closes_the_column_sum_beside_a_convolution():
  closes = arg_specs.CLOSES
  assert closes.anchors == frozenset({"convolution"})
  assert closes.kinds == frozenset({"separate-reduction"})
  assert ("column_sum", "column_sum") in closes.keywords


def test_suggests_nothing_from_dy_alone():
  dy = _Array("bf16", (64, 56, 56, 72))
  assert arg_specs.suggest(_facts(None, dy)) is None


def test_suggests_a_pointwise_and_a_strided_valid_call():
  x, dy = _Array("bf16", (64, 56, 56, 24)), _Array("bf16", (64, 56, 56, 72))
  call = arg_specs.suggest(_facts(_Conv(x, dy, (1, 1, 24, 72)), dy))
  assert call.text() == (
      "pallas_kernels.conv2d_weight_grad(x, dy, kernel_size=(1, 1), padding='VALID', "
      "column_sum=True)  # x: bf16[64,56,56,24], dy: bf16[64,56,56,72] "
      "-> (bf16[1,1,24,72], f32[72])")
  opts = {k: v for k, _, v in call.options}
  specs = (jax.ShapeDtypeStruct((64, 56, 56, 24), jnp.bfloat16),
           jax.ShapeDtypeStruct((64, 56, 56, 72), jnp.bfloat16))
  dw, db = jax.eval_shape(lambda a, b: pk.conv2d_weight_grad(a, b, **opts), *specs)
  assert dw.shape == (1, 1, 24, 72) and db.shape == (72,)
  # A depthwise 3x3 VALID window at stride 2: one stride, no dilation fits.
  x, dy = _Array("f32", (8, 29, 29, 16)), _Array("f32", (8, 14, 14, 16))
  call = arg_specs.suggest(_facts(_Conv(x, dy, (3, 3, 1, 16)), dy, ("column_sum", "cast:bf16")))
  assert ("stride=(2, 2), padding='VALID', groups=16, column_sum=True, "
          "out_dtype=jnp.bfloat16)") in call.text()
  assert call.text().endswith("-> (bf16[3,3,1,16], f32[16])")
  opts = {k: v for k, _, v in call.options}
  dw, _ = jax.eval_shape(lambda a, b: pk.conv2d_weight_grad(a, b, **opts),
                         _struct((8, 29, 29, 16)), _struct((8, 14, 14, 16)))
  assert dw.shape == (3, 3, 1, 16) and dw.dtype == jnp.bfloat16


def test_suggests_nothing_where_several_windows_fit():
  # 3x3 SAME at stride 1 keeps 28x28 under every dilation: which one is unknown.
  x, dy = _Array("bf16", (8, 28, 28, 32)), _Array("bf16", (8, 28, 28, 32))
  assert arg_specs.suggest(_facts(_Conv(x, dy, (3, 3, 32, 32)), dy)) is None


# --------------------------------------------------------- the spec ----


def test_validate_ci_with_kernels_required(clean_fallbacks):
  report = pk.validate("conv2d_weight_grad", tags=("ci",), interpret=True,
                       require_kernel=True)
  assert report.passed, str(report)


def test_on_a_gpu_shared_memory_is_held_to_its_bound(monkeypatch):
  # Compiled for a GPU (faked here: no GPU runs this): a config needing
  # exactly the shared memory there is passes; one byte less is refused.
  monkeypatch.setattr(guard.gpu, "unavailable_reason", lambda interpret: None)
  monkeypatch.setattr(backend, "current_backend", lambda: backend.Backend.GPU)
  cfg = Config(block_p=64, block_c=32, block_f=32)
  need = config_lib.smem_bytes(cfg, 2, False)

  def reason(limit):
    monkeypatch.setattr(guard.matmul_gpu, "shared_memory_bytes", lambda: limit)
    return _reason((2, 8, 8, 32), (2, 8, 8, 32), dtype="bfloat16", config=cfg,
                   interpret=False)

  assert reason(need) is None
  assert f"needs ~{need // 1024} KiB of shared memory" in reason(need - 1)


@pytest.mark.parametrize("kwargs, dw_bytes", [
    ({}, 3 * 3 * 4 * 6 * 4),                                  # one group, f32 dw
    (dict(groups=2), 3 * 3 * 2 * 6 * 4),                      # C/G input channels
    (dict(out_dtype="bfloat16"), 3 * 3 * 4 * 6 * 2),          # dw in its dtype
    (dict(column_sum=True), 3 * 3 * 4 * 6 * 4 + 4 * 6),       # and db, f32
])
def test_bytes_moved_reads_x_and_dy_and_writes_what_is_asked(kwargs, dw_bytes):
  from pallas_kernels._src.spec import Case  # pylint: disable=import-outside-toplevel
  x, dy = jnp.zeros((2, 8, 8, 4)), jnp.zeros((2, 8, 8, 6))
  case = Case(name="by hand", args=(x, dy), kwargs=dict(kernel_size=(3, 3), **kwargs))
  assert arg_specs.bytes_moved(case) == (2 * 8 * 8 * 4 + 2 * 8 * 8 * 6) * 4 + dw_bytes


@pytest.mark.parametrize("padding, said", [
    (((0, 0), (0, 0)), "'VALID'"),
    (((1, 1), (0, 0)), "((1, 1), (0, 0))"),   # only the rows padded
    (((0, 0), (0, 2)), "((0, 0), (0, 2))"),   # one side of one axis
])
def test_the_calls_padding_is_explicit_where_any_side_is_padded(padding, said):
  options = dict((k, text) for k, text, _ in arg_specs._window_options(
      (3, 3), (1, 1), padding, (1, 1), 1))
  assert options["padding"] == said, options


@pytest.mark.parametrize("groups", [1, 4])
def test_a_cases_flops_are_the_dots_over_its_groups(groups):
  # 2 * N*HO*WO * KH*KW * C/groups * F: SAME keeps 8x8, a 3x3 kernel.
  case = arg_specs.make_case(seed=0, n=2, h=8, w=8, c=16, f=8, groups=groups)
  if groups == 1:  # a case built without the key reads as one group
    import dataclasses  # pylint: disable=import-outside-toplevel
    case = dataclasses.replace(case, kwargs={k: v for k, v in case.kwargs.items()
                                             if k != "groups"})
    assert "groups" not in case.kwargs
  assert arg_specs.flops(case) == 2 * (2 * 8 * 8) * 9 * (16 // groups) * 8
