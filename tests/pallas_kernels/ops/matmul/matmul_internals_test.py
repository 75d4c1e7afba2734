"""matmul: API validation, config/guard rules, epilogue math, specs, Triton lowering."""

from __future__ import annotations

import functools
import warnings

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk
from pallas_kernels._src import backend
from pallas_kernels._src import compat
from pallas_kernels._src import gpu as tiles
from pallas_kernels._src import registry
from pallas_kernels._src.ops.matmul import arg_specs
from pallas_kernels._src.ops.matmul import config as config_lib
from pallas_kernels._src.ops.matmul import gpu
from pallas_kernels._src.ops.matmul import guard
from pallas_kernels._src.ops.matmul import kernel
from pallas_kernels._src.ops.matmul import reference
from pallas_kernels._src.ops.matmul.config import BackwardConfig, Config
from pallas_kernels._src.spec import Case, OpSpec

from matmul_base import assert_close, ints, normal, operands, ref, scales, top_level_primitives

S = jax.ShapeDtypeStruct
GPU = backend.Backend.GPU
CPU = backend.Backend.CPU


# ---- launch, implementation choice, named scope ---------------------------


def test_kernel_launches_carry_the_named_scope():
  x, w, extra = operands(7, 33, 20, "float32", bias=True)
  def fn(x, w, b):
    return pk.matmul(x, w, bias=b, activation="gelu", implementation="pallas",
                     interpret=True)

  text = jax.jit(fn).lower(x, w, extra["bias"]).as_text(debug_info=True)
  assert "pallas_kernels.matmul" in text
  grad = jax.jit(jax.grad(lambda *a: fn(*a).sum(), argnums=(0, 1, 2)))
  assert "pallas_kernels.matmul" in grad.lower(x, w, extra["bias"]).as_text(debug_info=True)


def test_backward_runs_kernels_not_xla_dots(clean_fallbacks):
  x, w, extra = operands(9, 40, 24, "bfloat16", bias=True, residual=True)

  def loss(x, w, b, r):
    return pk.matmul(x, w, bias=b, residual=r, activation="silu", clamp=(-3.0, 3.0),
                     implementation="pallas", interpret=True).astype(jnp.float32).sum()

  grad = jax.grad(loss, argnums=(0, 1, 2, 3))
  args = (x, w, extra["bias"], extra["residual"])
  jaxpr = str(jax.make_jaxpr(grad)(*args))
  # Forward, fused dAct+dbias, dx and dw: four kernels, no XLA matmul.
  assert jaxpr.count("pallas_call[") == 4, jaxpr.count("pallas_call[")
  assert "dot_general" not in top_level_primitives(grad, *args)
  assert pk.fallbacks("matmul") == ()


def test_default_implementation_on_cpu_is_xla():
  if jax.default_backend() != "cpu":
    pytest.skip("the default differs where kernels compile")
  x, w, _ = operands(5, 16, 8, "float32")
  # Eager: the operands name this CPU, and XLA's dot runs.
  assert "pallas_call" not in str(jax.make_jaxpr(lambda: pk.matmul(x, w))())
  # Traced: lowered for this CPU, XLA's dot, no interpreted kernel's loop.
  cpu = jax.jit(pk.matmul).lower(x, w).as_text()
  assert "stablehlo.dot_general" in cpu and "stablehlo.while" not in cpu
  jaxpr = jax.make_jaxpr(functools.partial(pk.matmul, interpret=True))(x, w)
  assert "pallas_call" in str(jaxpr)


def test_interpret_false_without_gpu_falls_back_with_reason(clean_fallbacks):
  if jax.default_backend() != "cpu":
    pytest.skip("needs a machine without GPU/TPU")
  x, w, _ = operands(5, 16, 8, "float32")
  out = pk.matmul(x, w, implementation="pallas", interpret=False)
  assert_close(out, ref(x, w))
  [fb] = pk.fallbacks("matmul")
  assert "no compiled matmul kernel for backend 'cpu'" in fb.reason
  assert "x=float32[5,16]" in fb.signature


def test_xla_implementation_agrees_with_the_kernel_and_differentiates():
  x, w, extra = operands(12, 40, 18, "float32", transpose_w=True, bias=True, residual=True)
  kw = dict(activation="gelu_tanh", scale=scales((18,), 1.0), clamp=(-1.0, 2.0),
            transpose_w=True, **extra)
  xla = jax.jit(lambda x, w: pk.matmul(x, w, implementation="xla", **kw))(x, w)
  kern = jax.jit(lambda x, w: pk.matmul(x, w, implementation="pallas", interpret=True,
                                        **kw))(x, w)
  assert_close(kern, xla)
  g = jax.jit(jax.grad(lambda x: pk.matmul(x, w, implementation="xla", **kw).sum()))(x)
  assert_close(g, jax.jit(jax.grad(lambda x: ref(x, w, **kw).sum()))(x), grad=True)


def test_nonfinite_inputs_propagate_like_xla():
  x, w, extra = operands(6, 20, 10, "float32", bias=True)
  x = x.at[2, 3].set(jnp.nan).at[4, 0].set(jnp.inf)
  out = pk.matmul(x, w, activation="relu", implementation="pallas", interpret=True, **extra)
  expected = ref(x, w, activation="relu", **extra)
  np.testing.assert_array_equal(np.isnan(out), np.isnan(expected))
  np.testing.assert_array_equal(np.isinf(out), np.isinf(expected))
  assert np.isnan(np.asarray(out)[2]).all()
  finite = np.array([0, 1, 3, 5])
  assert_close(out[finite], expected[finite])


def test_quantizing_a_zero_row_gives_scale_one():
  x, w, _ = operands(6, 16, 12, "float32")
  x = x.at[3].set(0.0)  # A zero row on purpose: the quantizer's edge case.
  values, s = pk.matmul(x, w, quantize="int8", implementation="pallas", interpret=True)
  assert float(s[3, 0]) == 1.0 and not np.asarray(values[3]).any()
  want_values, want_s = ref(x, w, quantize="int8")
  assert_close(values, want_values)
  assert_close(s, want_s)


# ---- argument validation ----------------------------------------------------


def _bad_calls():
  x = jnp.ones((4, 8), jnp.float32)
  w = jnp.ones((8, 6), jnp.float32)
  return [
      (dict(x=x, w=jnp.ones((9, 6))), r"x\[4, 8\].*K=8 but w\[9, 6\].*K=9"),
      (dict(x=x, w=jnp.ones((6, 9)), transpose_w=True), r"w\[6, 9\] \(transpose_w=True\)"),
      (dict(x=jnp.ones((2, 4, 8)), w=jnp.ones((3, 8, 6))), r"x\[2, 4, 8\] and w\[3, 8, 6\]"),
      (dict(x=jnp.ones((8,)), w=w), r"at least 2 dims, got x\[8\]"),
      (dict(x=x, w=w, bias=jnp.ones((5,))), r"bias must have shape \[N\]=\[6\], got \[5\]"),
      (dict(x=x, w=w, residual=jnp.ones((6, 4))), r"result's shape \[4, 6\], got \[6, 4\]"),
      (dict(x=x, w=w, scale=jnp.ones((4,))), r"scale must be a scalar or \[N\]=\[6\]"),
      (dict(x=x, w=w, x_scale=jnp.ones((5,))), r"x_scale must be .*per row \[4\].*got \[5\]"),
      (dict(x=x, w=w, w_scale=jnp.ones((8,))), r"w_scale for w\[8, 6\].*got \[8\]"),
      (dict(x=x, w=w, w_scale=jnp.ones((3, 6)), w_group_size=4),
       r"w_group_size=4 must have shape \[2, 6\], got \[3, 6\]"),
      (dict(x=x, w=w, w_group_size=4), "w_group_size needs a per-group w_scale"),
      (dict(x=x, w=w, activation="swish"), "unknown activation 'swish'"),
      (dict(x=x, w=w, clamp=(2.0, 1.0)), "clamp lo 2.0 > hi 1.0"),
      (dict(x=x, w=w, clamp=3.0), "clamp must be a"),
      (dict(x=x, w=w, quantize="int4"), "quantize must be one of"),
      (dict(x=x, w=w, quantize="int8", out_dtype=jnp.float32), "either quantize or out_dtype"),
      (dict(x=x, w=w, implementation="cuda"), "implementation must be one of"),
      (dict(x=x.astype(jnp.complex64), w=w), r"x must be a real .* complex64\[4, 8\]"),
      (dict(x=x, w=w, config=(16, 16, 16)), "config must be a matmul Config"),
  ]


@pytest.mark.parametrize("kwargs,match", _bad_calls())
def test_bad_arguments_raise_value_error(kwargs, match):
  kwargs = dict(kwargs)
  x, w = kwargs.pop("x"), kwargs.pop("w")
  with pytest.raises(ValueError, match=match):
    pk.matmul(x, w, **kwargs)


# ---- config and guard --------------------------------------------------------


def test_config_rejects_invalid_tiles():
  with pytest.raises(ValueError, match="block_k must be a power of two"):
    Config(block_m=16, block_n=16, block_k=24)
  with pytest.raises(ValueError, match="group_m must be >= 1"):
    Config(group_m=0)
  with pytest.raises(ValueError, match="num_stages and group_m must be >= 1"):
    Config(num_stages=0)
  # The smallest legal values: one stage, plain row-major order (no swizzle).
  assert Config(num_stages=1, group_m=1).group_m == 1
  with pytest.raises(ValueError, match="rows_per_program must be a positive multiple"):
    BackwardConfig(block_m=32, block_n=32, rows_per_program=48)


def test_gpu_defaults_are_tensor_core_tiles():
  cfg = config_lib.heuristic_config(4096, 4096, 4096, jnp.bfloat16, GPU,
                                    device_kind="NVIDIA A100-SXM4-80GB")
  assert (cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages) == (
      128, 128, 64, 8, 3)
  # Hopper: the same tile (128x256 spills, see the compile report), deeper pipeline.
  h200 = config_lib.heuristic_config(4096, 4096, 4096, jnp.bfloat16, GPU,
                                     device_kind="NVIDIA H200")
  assert (h200.block_m, h200.block_n, h200.num_warps, h200.num_stages) == (128, 128, 8, 4)
  # float32: TF32 tensor cores take the 128x128 tile; IEEE FMA a 64x128 one.
  tf32 = config_lib.heuristic_config(4096, 4096, 4096, jnp.float32, GPU, tf32=True,
                                     device_kind="NVIDIA H200")
  ieee = config_lib.heuristic_config(4096, 4096, 4096, jnp.float32, GPU,
                                     device_kind="NVIDIA H200")
  assert (tf32.block_m, tf32.block_n, tf32.block_k, tf32.num_warps) == (128, 128, 32, 8)
  assert (ieee.block_m, ieee.block_n, ieee.block_k, ieee.num_warps) == (64, 128, 32, 8)
  skinny = config_lib.heuristic_config(1, 4096, 4096, jnp.bfloat16, GPU)
  assert skinny.block_m == 16 and skinny.block_k == 128


def test_choose_config_defaults_to_highest_precision(monkeypatch):
  # With no precision named, float32 tiles feed the FMA units (HIGHEST), as
  # matmul's own default does; TF32's tile is for DEFAULT/HIGH only.
  monkeypatch.setattr(backend, "current_backend", lambda: GPU)
  monkeypatch.setattr(backend, "device_kind", lambda: "NVIDIA H200")
  ieee = config_lib.heuristic_config(4096, 4096, 4096, jnp.float32, GPU,
                                     device_kind="NVIDIA H200")
  tf32 = config_lib.heuristic_config(4096, 4096, 4096, jnp.float32, GPU, tf32=True,
                                     device_kind="NVIDIA H200")
  assert ieee != tf32
  assert config_lib.choose_config(4096, 4096, 4096, jnp.float32, False) == ieee
  assert config_lib.choose_config(4096, 4096, 4096, jnp.float32, False,
                                  precision="HIGHEST") == ieee
  assert config_lib.choose_config(4096, 4096, 4096, jnp.float32, False,
                                  precision="DEFAULT") == tf32


@pytest.mark.parametrize("w_dtype", ["int8", "int4"])
def test_integer_weight_cases_need_a_weight_scale(w_dtype):
  with pytest.raises(ValueError, match="integer weights need a w_scale"):
    arg_specs.build_case(arg_specs.CaseDef(m=4, k=8, n=6, w_dtype=w_dtype), seed=0)
  case = arg_specs.build_case(
      arg_specs.CaseDef(m=4, k=8, n=6, w_dtype=w_dtype, w_scale="channel"), seed=0)
  assert case.args[1].dtype == jnp.dtype(w_dtype)


@pytest.mark.parametrize("kind, shape", [("scalar", ()), ("channel", (6,)), ("group", (2, 6))])
def test_weight_scale_cases_pass_the_scale_as_w_scale(kind, shape):
  # A case's weight scale reaches the op as `w_scale`, shaped as its kind
  # says; only per-group scales come with `w_group_size`.
  d = arg_specs.CaseDef(m=4, k=8, n=6, w_dtype="float8_e4m3fn", w_scale=kind, group_size=4)
  kwargs = arg_specs.build_case(d, seed=0).kwargs
  assert tuple(kwargs["w_scale"].shape) == shape
  assert ("w_group_size" in kwargs) == (kind == "group")


@pytest.mark.parametrize("field, kind, key, shape", [
    ("x_scale", "scalar", "x_scale", ()), ("x_scale", "row", "x_scale", (4,)),
    ("scale", "scalar", "scale", ()), ("scale", "vector", "scale", (6,)),
])
def test_input_and_output_scale_cases_pass_each_under_its_own_name(field, kind, key, shape):
  # An output scale is the epilogue's `scale`, an input's `x_scale`: a case
  # that passed one as the other would validate an op it does not name.
  d = arg_specs.CaseDef(m=4, k=8, n=6, w_dtype="float8_e4m3fn", w_scale="scalar",
                        **{field: kind})
  kwargs = arg_specs.build_case(d, seed=0).kwargs
  assert tuple(kwargs[key].shape) == shape
  assert ({"x_scale", "scale"} - {key}).isdisjoint(kwargs)


@pytest.fixture
def gpu_available(monkeypatch):
  """Lets the guard apply its GPU rules on a machine without a GPU."""
  monkeypatch.setattr(gpu, "unavailable_reason", lambda interpret: None)


def _reason(x, w, cfg, **kw):
  kw.setdefault("out_dtype", jnp.bfloat16)
  return guard.unsupported_reason(x, w, backend=GPU, interpret=False, config=cfg, **kw)


def test_guard_applies_triton_limits(gpu_available):
  x, w = S((100, 256), jnp.bfloat16), S((256, 200), jnp.bfloat16)
  assert _reason(x, w, Config(128, 128, 64)) is None
  assert "tiles >= 16" in _reason(x, w, Config(8, 128, 64))
  assert "shared memory" in _reason(x, w, Config(256, 256, 256, num_stages=4))
  packed = _reason(x, S((256, 200), jnp.int4), Config(128, 128, 64))
  assert "int4 w is loaded packed along N" in packed
  assert _reason(x, S((256, 192), jnp.int4), Config(128, 64, 64)) is None
  assert "empty dimension" in _reason(S((0, 256), jnp.bfloat16), w, Config(16, 16, 16))
  assert "2**31-1" in _reason(S((2**16, 2**15 + 1), jnp.bfloat16),
                              S((2**15 + 1, 16), jnp.bfloat16), Config(16, 16, 16))
  assert "w dtype float64" in _reason(x, S((256, 200), jnp.float64), Config(16, 16, 16))


_DTYPES = st.sampled_from(["float32", "bfloat16", "float16"])


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(m=st.integers(1, 70_000), n=st.integers(1, 70_000), k=st.integers(1, 70_000),
                  dtype=_DTYPES, on_gpu=st.booleans(),
                  group=st.sampled_from([None, 16, 32, 64, 128, 256]),
                  quant=st.booleans(),
                  kind=st.sampled_from(["", "NVIDIA H200", "NVIDIA A100"]))
def test_heuristic_config_is_always_accepted_by_the_guard(m, n, k, dtype, on_gpu, group,
                                                          quant, kind):
  be = GPU if on_gpu else CPU
  if group is not None:
    k = max(group, k // group * group)
  cfg = config_lib.heuristic_config(m, n, k, dtype, be, group_size=group,
                                    fused_quantize=quant, device_kind=kind)
  if on_gpu:
    assert min(cfg.block_m, cfg.block_n, cfg.block_k) >= config_lib.GPU_MIN_BLOCK
  if group is not None:
    assert group % cfg.block_k == 0
  if quant and n <= config_lib.MAX_FUSED_QUANTIZE_N[be]:
    assert cfg.block_n >= n
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(gpu, "unavailable_reason", lambda interpret: None)
    mp.setattr(gpu, "shared_memory_bytes", lambda: gpu.shared_memory_bytes_of(kind))
    reason = guard.unsupported_reason(
        S((m, k), dtype), S((k, n), dtype), out_dtype=dtype, group_size=group,
        quantize="int8" if quant else None, backend=be, interpret=not on_gpu, config=cfg)
  assert reason is None or "2**31-1" in reason


def test_backward_heuristic_fills_the_gpu_and_covers_rows():
  cfg = config_lib.heuristic_backward_config(8192, 4096, GPU)
  programs = -(-8192 // cfg.rows_per_program) * -(-4096 // cfg.block_n)
  assert programs >= 132 and cfg.rows_per_program % cfg.block_m == 0
  cpu = config_lib.heuristic_backward_config(37, 41, CPU)
  assert cpu.rows_per_program >= 37  # One row chunk per column block.


# ---- epilogue math --------------------------------------------------------------


def test_kernel_erf_is_float32_accurate():
  v = jnp.linspace(-6.0, 6.0, 20001, dtype=jnp.float32)
  err = np.max(np.abs(np.asarray(kernel.erf(v)) - np.asarray(jax.scipy.special.erf(v))))
  assert err < 1e-6


@pytest.mark.parametrize("name", reference.ACTIVATIONS)
def test_kernel_activations_and_derivatives_match_jax(name):
  v = jnp.linspace(-8.0, 8.0, 4001, dtype=jnp.float32)
  np.testing.assert_allclose(kernel.activation_fn(name, v), reference.activate(name, v),
                             rtol=2e-6, atol=2e-6)
  want = jax.vmap(jax.grad(functools.partial(reference.activate, name)))(v)
  # atol: tanh's f32 rounding near +-1, amplified by up to ~60 in gelu_tanh'.
  np.testing.assert_allclose(kernel.activation_grad(name, v), want, rtol=1e-5, atol=2e-5)


def test_reference_follows_the_documented_order():
  x, w, extra = operands(4, 8, 6, "float32", bias=True, residual=True)
  s, xs, ws = scales((6,), 1.0), scales((4,), 1.0), scales((6,), 1.0)
  out = reference.reference(x, w, scale=s, x_scale=xs, w_scale=ws, activation="tanh",
                            clamp=(-0.5, 0.5), precision=jax.lax.Precision.HIGHEST, **extra)
  acc = (x * xs[:, None]) @ (w * ws) * s
  expected = jnp.clip(jnp.tanh(acc + extra["bias"]) + extra["residual"], -0.5, 0.5)
  assert_close(out, expected)


# ---- OpSpec ------------------------------------------------------------------------


def _case_def(prefix: str) -> arg_specs.CaseDef:
  [d] = [d for d in arg_specs.CASE_DEFS if d.name.startswith(prefix)]
  return d


@functools.lru_cache(maxsize=None)
def _case(prefix: str) -> Case:
  # Drawing arrays compiles jax.random per shape: build each case once.
  return arg_specs.build_case(_case_def(prefix), 0)


_QUANT_CASE = "x=bf16[17,64] w=bf16[64,50] bias+gelu+quantize:int8"


def test_spec_is_registered_with_well_formed_cases():
  assert isinstance(arg_specs.SPEC, OpSpec)
  assert registry.get_spec("matmul") is arg_specs.SPEC
  # Case definitions only: drawing every case's arrays costs a compile each.
  ci = [d for d in arg_specs.CASE_DEFS if "ci" in d.tags]
  assert len({d.name for d in ci}) == len(ci) >= 10
  dims = set()
  for d in ci:
    assert d.m * d.n * d.k * max(1, int(np.prod(d.batch + d.w_batch))) <= 64 * 96 * 80 * 6
    dims.update((d.m, d.n, d.k))
  assert 1 in dims and {7, 13, 37, 53, 97, 129} <= dims  # Ones, primes, non-multiples.
  assert len([d for d in ci if d.grad and "grad" in d.tags]) >= 4
  case = _case(_QUANT_CASE)
  assert case.grad_argnums == () and case.kwargs["quantize"] == "int8"
  for a in case.args:
    assert np.all(np.asarray(a).astype(np.float32) != 0)  # Random normal: no zeros.
    assert np.asarray(a).astype(np.float32).std() > 0.5
  # A float w's dequantization scales are about 1/sqrt(K) (1/8 here): the
  # scaled product's entries stay O(1), neither zero nor huge.
  scales = np.asarray(arg_specs.make_case(seed=0, m=16, k=64, n=32,
                                          w_scale="channel").kwargs["w_scale"])
  assert scales.shape == (32,) and 0.05 < scales.min() <= scales.max() < 0.25, scales
  assert case.kwargs["activation"] == "gelu" and case.args[2].shape == (50,)


def test_spec_formulas_and_bench_cases():
  c = _case(_QUANT_CASE)
  assert arg_specs.flops(c) == 2 * 17 * 50 * 64
  # M, K and N read through either transpose, or none named; batch counted.
  for kw in ({}, dict(transpose_x=True), dict(transpose_w=True)):
    t = arg_specs.make_case(seed=0, m=8, k=16, n=24, batch=2, **kw)
    assert arg_specs.flops(t) == 2 * 2 * 8 * 24 * 16, (kw, [a.shape for a in t.args])
  # x, w, bias (bf16), int8 values and f32 per-row scales of the result.
  assert arg_specs.bytes_moved(c) == 2 * (17 * 64 + 64 * 50 + 50) + 17 * 50 + 4 * 17
  assert _case_def("x=bf16[7,129]").grad and _case_def("x=bf16[7,129]").bias
  names = [d.name for d in arg_specs.CASE_DEFS if "bench" in d.tags]
  assert "x=bf16[4096,4096] w=bf16[4096,4096] bias+gelu+residual" in names
  assert "x=bf16[8192,8192] w=bf16[8192,8192]" in names
  int4 = Case(name="int4", args=(normal((2, 64), "bfloat16"), ints((64, 8), "int4")),
              kwargs={"w_scale": scales((8,), 0.1)})
  # Packed int4 counts half a byte; the f32 scales and the bf16 result count.
  assert arg_specs.bytes_moved(int4) == 2 * 2 * 64 + 64 * 8 // 2 + 4 * 8 + 2 * 2 * 8


def test_spec_fn_and_reference_agree_and_ignore_implementation_keywords():
  c = _case(_QUANT_CASE)
  values, s = jax.jit(lambda *a: arg_specs.SPEC.reference_f32(*a, config=None, **c.kwargs)
                      )(*c.args)
  kv, ks = jax.jit(lambda *a: arg_specs.SPEC.fn(*a, implementation="pallas", interpret=True,
                                                **c.kwargs))(*c.args)
  assert_close(kv, values)
  assert_close(ks, s)


# ---- Triton lowering (no GPU needed where JAX lowers without one) -----------------


def _lower(fn, *specs):
  # An abstract H200 lets every supported jaxlib lower Triton without a GPU
  # (see tests/pallas_kernels/lowering_test.py for the public ops).
  device = jax.sharding.AbstractDevice("NVIDIA H200", 132, "cuda")
  mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)
  with warnings.catch_warnings(), jax.sharding.use_abstract_mesh(mesh):
    warnings.simplefilter("ignore", DeprecationWarning)  # Pallas's Triton backend.
    jax.jit(fn).trace(*specs).lower(lowering_platforms=("cuda",))


@pytest.mark.parametrize("x_dtype,w_dtype,flags,extra", [
    ("bfloat16", "bfloat16", (False, False, False), "epilogue"),
    ("float32", "float32", (True, True, True), "epilogue"),
    ("bfloat16", "int8", (False, True, False), "channel"),
    ("bfloat16", "int4", (False, False, False), "group"),
    ("float16", "int4", (False, True, False), "group"),
    ("float8_e4m3fn", "float8_e5m2", (False, False, False), "channel"),
    ("bfloat16", "bfloat16", (False, False, True), "quantize"),
])
def test_forward_kernel_lowers_to_triton(x_dtype, w_dtype, flags, extra):
  tx, tw, to = flags
  m, k, n = 300, 320, 256  # Ragged rows; K not a power of two.
  cdt = reference.compute_dtype(x_dtype, w_dtype)
  cfg = config_lib.heuristic_config(m, n, k, cdt, GPU,
                                    group_size=64 if extra == "group" else None,
                                    fused_quantize=extra == "quantize",
                                    packed_n=w_dtype == "int4" and not tw)
  xs = S((k, m) if tx else (m, k), jnp.dtype(x_dtype))
  ws = S((n, k) if tw else (k, n), jnp.dtype(w_dtype))
  rs = S((n, m) if to else (m, n), jnp.bfloat16)

  def fn(x, w, r, v):
    kw = dict(cfg=cfg, interpret=False, compute_dtype=cdt, out_dtype=jnp.bfloat16,
              transpose_x=tx, transpose_w=tw, transpose_out=to)
    if extra == "epilogue":
      kw.update(activation="gelu", bias=v, residual=r, scale=v, clamp=(-3.0, 3.0),
                save_aux=True)
    elif extra == "channel":
      kw.update(w_col_scale=v, x_row_scale=jnp.ones((m,)), activation="silu")
    elif extra == "group":
      kw.update(w_group_scale=jnp.ones((k // 64, n)), group_size=64)
    else:
      kw.update(quantize="int8", activation="relu")
    return kernel.matmul_forward(x, w, **kw)

  _lower(fn, xs, ws, rs, S((n,), jnp.float32))


@pytest.mark.parametrize("transpose_out", [False, True])
def test_backward_kernel_lowers_to_triton(transpose_out):
  m, n = 300, 200
  cfg = config_lib.heuristic_backward_config(m, n, GPU, batch=2)
  shape = (2, n, m) if transpose_out else (2, m, n)

  def fn(dy, aux, r, v):
    return kernel.dact_bgrad(dy, aux, cfg=cfg, interpret=False, activation="gelu",
                             g_dtype=jnp.bfloat16, clamp=(-1.0, 1.0), residual=r, scale=v,
                             bias=v, col_mult=v, row_mult=jnp.ones((2, m)),
                             transpose_out=transpose_out, want_db=True, want_dscale=True)

  _lower(fn, S(shape, jnp.bfloat16), S((2, m, n), jnp.bfloat16), S(shape, jnp.bfloat16),
         S((n,), jnp.float32))


def test_the_forward_kernel_masks_both_ragged_edges_of_its_stores(monkeypatch):
  # Triton writes a whole block wherever it lies; the interpreter clips a
  # block at the array's edge, so values computed here cannot show a missing
  # mask: the stores' masks are read instead. M = 20 and N = 40 in 16 x 16
  # tiles: the output and the aux saved for the backward both need rows and
  # columns masked.
  seen = []
  real = tiles.store

  def store(view, value, mask):
    seen.append((tuple(view.shape), None if mask is None else tuple(mask.shape)))
    return real(view, value, mask)

  monkeypatch.setattr(tiles, "store", store)  # (the kernels' masked stores go through it)
  x, w, extra = operands(20, 32, 40, "float32", residual=True, tag="edges")
  cfg = Config(block_m=16, block_n=16, block_k=16, num_stages=1, group_m=1)
  loss = lambda x: pk.matmul(x, w, activation="gelu", implementation="pallas",  # noqa: E731
                             interpret=True, config=cfg, **extra).sum()
  jax.grad(loss)(x)
  assert seen[:2] == [((16, 16), (16, 16))] * 2, seen  # the aux, then the output


def test_shared_memory_is_held_to_its_bound(gpu_available, monkeypatch):
  # A config needing exactly the shared memory there is passes; one byte
  # less is refused.
  x, w = S((100, 256), jnp.bfloat16), S((256, 200), jnp.bfloat16)
  cfg = Config(64, 64, 64, num_stages=3)
  need = gpu.pipeline_smem_bytes(64, 64, 64, 2, 2, 3, compute_itemsize=2)
  monkeypatch.setattr(gpu, "shared_memory_bytes", lambda: need)
  assert _reason(x, w, cfg) is None
  monkeypatch.setattr(gpu, "shared_memory_bytes", lambda: need - 1)
  assert f"needs ~{need // 1024} KiB of shared memory" in _reason(x, w, cfg)


@pytest.mark.parametrize("cc, kib", [
    (90, 227), (89, 99),   # listed: Hopper, Ada
    (120, 99),             # listed: a consumer Blackwell's is not B200's
    (101, 227),            # not listed: its family's (100, Blackwell)
    (61, 48),              # no family listed: what every GPU gives a block
    (None, 163),           # no GPU at all: A100's
])
def test_shared_memory_per_program_by_compute_capability(monkeypatch, cc, kib):
  monkeypatch.setattr(gpu, "compute_capability", lambda: cc)
  assert gpu.shared_memory_bytes() == kib * 1024
