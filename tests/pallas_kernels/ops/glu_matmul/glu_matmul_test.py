"""glu_matmul: the Pallas kernels in interpret mode against the float32 ground truth.

Expected values come only from `reference.py` (float32 at Precision.HIGHEST),
tolerances only from `tolerances.py`. Every kernel test fails on any recorded
fallback (the backward's `pallas_kernels.matmul` calls included): a passing
number computed by XLA would say nothing about the kernels.
"""

from __future__ import annotations

import re
import types
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk
from pallas_kernels._src import backend
from pallas_kernels._src import inputs
from pallas_kernels._src.ops.glu_matmul import arg_specs
from pallas_kernels._src.ops.glu_matmul import config as config_lib
from pallas_kernels._src.ops.glu_matmul import guard
from pallas_kernels._src.ops.glu_matmul import reference
from pallas_kernels._src.ops.glu_matmul.api import glu_matmul
from pallas_kernels._src.ops.glu_matmul.config import Config
from pallas_kernels._src.spec import CallFacts
from pallas_kernels._src.tolerances import relative_error, tolerance

#: Ragged against every block: M=13 < 32, F=300 = 4 * 64 + 44, K=70 = 2 * 32 + 6.
RAGGED = (13, 70, 300)
SMALL = arg_specs.SMALL


def operands(m, k, f, dtype, *, batch=(), biases=True, tag=""):
  keys = inputs.Keys(0, f"glu{m},{k},{f}{dtype}{batch}{tag}")
  x = inputs.normal(keys.next(), batch + (m, k), dtype)
  wg, wu = ((inputs.normal(keys.next(), (k, f), jnp.float32) / np.sqrt(k)).astype(dtype)
            for _ in range(2))
  bg = inputs.normal(keys.next(), (f,), dtype) if biases else None
  bu = inputs.normal(keys.next(), (f,), dtype) if biases else None
  return x, wg, wu, bg, bu


def kernel(x, wg, wu, bg=None, bu=None, **kw):
  return glu_matmul(x, wg, wu, bias_gate=bg, bias_up=bu, implementation="pallas",
                    interpret=True, **kw)


def truth(x, wg, wu, bg=None, bu=None, activation="silu"):
  f32 = [None if a is None else a.astype(jnp.float32) for a in (x, wg, wu, bg, bu)]
  return reference.glu_matmul_f32(f32[0], f32[1], f32[2], bias_gate=f32[3],
                                  bias_up=f32[4], activation=activation)


def assert_close(out, expected, dtype, *, grad=False):
  assert out.shape == expected.shape, (out.shape, expected.shape)
  err, bound = relative_error(out, expected), tolerance(dtype, grad=grad)
  assert err <= bound, f"relative error {err:.3e} > {bound:.0e} ({jnp.dtype(dtype).name})"


def assert_no_fallback():
  assert not pk.fallbacks(), f"the kernels fell back to XLA: {pk.fallbacks()}"


# ----------------------------------------------------------- forward ----


@pytest.mark.parametrize("activation,dtype", [
    ("silu", "float32"), ("gelu", "float32"), ("gelu_tanh", "float32"),
    ("relu", "float32"), ("sigmoid", "float32"), ("silu", "bfloat16"),
    ("gelu", "float16")])
def test_forward_ragged_with_biases(clean_fallbacks, activation, dtype):
  x, wg, wu, bg, bu = operands(*RAGGED, dtype)
  out = kernel(x, wg, wu, bg, bu, activation=activation, config=SMALL)
  assert out.dtype == jnp.dtype(dtype)
  assert_close(out, truth(x, wg, wu, bg, bu, activation), dtype)
  assert np.all(np.isfinite(np.asarray(out, np.float32)))
  assert_no_fallback()


def test_forward_leading_dims_default_tiling_and_out_dtype(clean_fallbacks):
  x, wg, wu, _, _ = operands(5, 33, 17, "bfloat16", batch=(2, 3), biases=False)
  out = kernel(x, wg, wu, activation="gelu_tanh", out_dtype=jnp.float32)
  assert out.shape == (2, 3, 5, 17) and out.dtype == jnp.float32
  # f32 output of 16-bit products: held to bf16's bound (the inputs' precision).
  assert_close(out, truth(x, wg, wu, activation="gelu_tanh"), "bfloat16")
  assert_no_fallback()


@pytest.mark.parametrize("which", ["gate", "up"])
def test_one_bias(clean_fallbacks, which):
  x, wg, wu, bg, bu = operands(9, 40, 24, "float32")
  bg, bu = (bg, None) if which == "gate" else (None, bu)
  out = kernel(x, wg, wu, bg, bu, activation="sigmoid")
  assert_close(out, truth(x, wg, wu, bg, bu, "sigmoid"), "float32")
  assert_no_fallback()


def test_gate_and_up_are_not_interchangeable(clean_fallbacks):
  # The activation applies to x @ w_gate only: swapping the weights changes the result.
  x, wg, wu, _, _ = operands(8, 16, 16, "float32", biases=False)
  out = kernel(x, wg, wu)
  assert_close(out, truth(x, wg, wu), "float32")
  assert relative_error(out, truth(x, wu, wg)) > 0.1


def test_xla_implementation_is_the_reference():
  x, wg, wu, bg, bu = operands(*RAGGED, "float32")
  out = glu_matmul(x, wg, wu, bias_gate=bg, bias_up=bu, activation="gelu",
                   implementation="xla")
  assert_close(out, truth(x, wg, wu, bg, bu, "gelu"), "float32")


def test_one_token_without_a_batch_axis():
  # x [K] (a single decode step's token): the leading axes are optional.
  x, wg, wu, *_ = operands(*RAGGED, "float32")
  out = glu_matmul(x[0], wg, wu, activation="silu", implementation="xla")
  assert out.shape == (wg.shape[1],)
  assert_close(out, truth(x[:1], wg, wu, None, None, "silu")[0], "float32")


# --------------------------------------------------------- gradients ----


def _grads(fn, args, ct):
  _, pullback = jax.vjp(fn, *args)
  return pullback(ct)


@pytest.mark.parametrize("activation,dtype,shape,config", [
    ("silu", "float32", RAGGED, SMALL),
    ("gelu", "bfloat16", RAGGED, SMALL),
    ("gelu_tanh", "float32", (7, 40, 24), None),
    ("relu", "float32", (7, 40, 24), None),
    ("sigmoid", "float16", (7, 40, 24), None)])
def test_gradients(clean_fallbacks, activation, dtype, shape, config):
  args = operands(*shape, dtype)
  ct = inputs.normal(inputs.Keys(1, "ct").next(), (shape[0], shape[2]), dtype)

  def fn(*a):
    return kernel(*a, activation=activation, config=config)

  def ref(*a):
    return truth(*a, activation=activation)

  grads = jax.jit(lambda a, c: _grads(fn, a, c))(args, ct)
  args32 = [a.astype(jnp.float32) for a in args]
  want = jax.jit(lambda a, c: _grads(ref, a, c))(args32, ct.astype(jnp.float32))
  for name, g, w, a in zip(("x", "w_gate", "w_up", "bias_gate", "bias_up"), grads, want,
                           args):
    assert g.dtype == a.dtype and g.shape == a.shape, name
    err, bound = relative_error(g, w), tolerance(dtype, grad=True)
    assert err <= bound, f"d{name}: relative error {err:.3e} > {bound:.0e}"
  assert_no_fallback()


def test_gradient_without_biases_and_with_leading_dims(clean_fallbacks):
  x, wg, wu, _, _ = operands(3, 24, 20, "float32", batch=(2,), biases=False)
  ct = inputs.normal(inputs.Keys(2, "ct").next(), (2, 3, 20), jnp.float32)
  grads = jax.jit(lambda a, c: _grads(lambda *v: kernel(*v, activation="silu"), a, c))(
      (x, wg, wu), ct)
  want = _grads(lambda *v: truth(*v), (x, wg, wu), ct)
  for g, w in zip(grads, want):
    assert_close(g, w, "float32", grad=True)
  assert_no_fallback()


# ------------------------------------------------------------- guard ----


@pytest.mark.parametrize("dtype,word", [("int8", "int8"), ("float8_e4m3fn", "float8_e4m3fn")])
def test_unsupported_dtype_falls_back_and_names_it(clean_fallbacks, dtype, word):
  x, wg, wu, _, _ = operands(4, 8, 8, "float32", biases=False)
  x = (x * 4).astype(dtype)
  out = kernel(x, wg, wu, out_dtype=jnp.float32)
  (f,) = pk.fallbacks("glu_matmul")
  assert word in f.reason and "x" in f.reason, f.reason
  assert_close(out, truth(x, wg, wu), "float32")


def test_mismatched_dtypes_fall_back(clean_fallbacks):
  x, wg, wu, _, _ = operands(4, 8, 8, "bfloat16", biases=False)
  kernel(x, wg.astype(jnp.float32), wu)
  (f,) = pk.fallbacks("glu_matmul")
  assert "mismatched dtypes" in f.reason and "float32" in f.reason, f.reason


def _struct(shape, dtype):
  return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))


def test_guard_reasons_name_the_shape_or_dtype():
  cfg = Config()
  x, w = _struct((0, 8), "float32"), _struct((8, 16), "float32")
  reason = guard.unsupported_reason(x, w, w, out_dtype=jnp.float32, interpret=True,
                                    config=cfg)
  assert "empty dimension" in reason and "M=0" in reason
  x = _struct((4, 8), "float32")
  reason = guard.unsupported_reason(x, w, w, bias_gate=_struct((16,), "int32"),
                                    out_dtype=jnp.float32, interpret=True, config=cfg)
  assert "bias_gate int32[16]" in reason
  reason = guard.unsupported_reason(x, w, w, out_dtype=jnp.int8, interpret=True,
                                    config=cfg)
  assert "out_dtype int8" in reason
  assert guard.unsupported_reason(x, w, w, out_dtype=jnp.float32, interpret=True,
                                  config=cfg) is None


def test_gpu_guard_checks_triton_tiles_and_shared_memory():
  x = _struct((8192, 4096), "bfloat16")
  w = _struct((4096, 14336), "bfloat16")
  with backend.targeting(backend.DEFAULT_GPU):
    cfg = config_lib.choose_config(8192, 14336, 4096, jnp.bfloat16, interpret=False)
    assert min(cfg.block_m, cfg.block_n, cfg.block_k) >= config_lib.GPU_MIN_BLOCK
    if guard.gpu.unavailable_reason(False) is None:
      assert guard.unsupported_reason(x, w, w, out_dtype=jnp.bfloat16, interpret=False,
                                      config=cfg) is None
      tiny = Config(block_m=8, block_n=64, block_k=64)
      assert "tiles >= 16" in guard.unsupported_reason(
          x, w, w, out_dtype=jnp.bfloat16, interpret=False, config=tiny)
      huge = Config(block_m=256, block_n=256, block_k=256, num_stages=4)
      assert "shared memory" in guard.unsupported_reason(
          x, w, w, out_dtype=jnp.bfloat16, interpret=False, config=huge)


@pytest.mark.parametrize("change,match", [
    (dict(x_shape=(4, 9)), "contraction mismatch"),
    (dict(up_shape=(8, 15)), "w_gate and w_up must both be"),
    (dict(activation="tanh"), "unknown activation"),
    (dict(bias_shape=(15,)), r"bias_gate must have shape \[F\]=\[16\]"),
    (dict(implementation="triton"), "implementation must be"),
    (dict(config=object()), "config must be"),
])
def test_invalid_calls_raise(change, match):
  x = jnp.ones(change.get("x_shape", (4, 8)))
  wg = jnp.ones((8, 16))
  wu = jnp.ones(change.get("up_shape", (8, 16)))
  bg = jnp.ones(change["bias_shape"]) if "bias_shape" in change else None
  with pytest.raises(ValueError, match=match):
    glu_matmul(x, wg, wu, bias_gate=bg, activation=change.get("activation", "silu"),
               implementation=change.get("implementation", "pallas"), interpret=True,
               config=change.get("config"))


@pytest.mark.parametrize("field, value", [("block_k", 48), ("block_m", 64.0)])
def test_config_rejects_non_powers_of_two(field, value):
  # A float equal to a power of two is no int block size either.
  with pytest.raises(ValueError, match=f"{field} must be a power of two, got {value!r}"):
    Config(**{field: value})


# --------------------------------------------------------- the spec ----


def test_validate_ci_with_kernels_required(clean_fallbacks):
  report = pk.validate("glu_matmul", tags=("ci",), interpret=True, require_kernel=True)
  assert report.passed, str(report)
  names = {r.case for r in report.rows}
  assert {c.activation for c in arg_specs.CASE_DEFS if "ci" in c.tags} == set(
      reference.ACTIVATIONS)
  assert sum(r.grad_err is not None for r in report.rows) >= 3, names


def test_cost_model_of_the_bench_case():
  d = next(c for c in arg_specs.CASE_DEFS if "bench" in c.tags)
  case = jax.eval_shape(lambda: arg_specs.build_case(d, 0).args)
  fake = types.SimpleNamespace(args=case, kwargs={})
  m, k, f = 8192, 4096, 14336
  assert arg_specs.flops(fake) == 4 * m * k * f
  assert arg_specs.bytes_moved(fake) == 2 * (m * k + 2 * k * f + m * f)


def _facts(ops, rhs_dims, lhs_dims=(64, 256), contracting=((1,), (0,)), boundary="bf16"):
  array = lambda dt, dims: types.SimpleNamespace(dtype=dt, dims=dims)
  anchor = types.SimpleNamespace(
      lhs=array("bf16", lhs_dims), rhs=array("bf16", rhs_dims),
      result=tuple(lhs_dims[:-1]) + (rhs_dims[-1],), lhs_contracting=contracting[0],
      rhs_contracting=contracting[1], lhs_batch=(), rhs_batch=())
  dims = tuple(lhs_dims[:-1]) + (rhs_dims[-1],)
  return CallFacts(kind="unfused-epilogue", ops=tuple(ops), boundary=array(boundary, dims),
                   shape=f"{boundary}[{','.join(map(str, dims))}]", matmul=anchor,
                   numpy_name={"bf16": "bfloat16", "f32": "float32"}.get)


def test_suggest_splits_a_concatenated_weight():
  call = arg_specs.suggest(_facts(("activation:silu", "multiply:halves"), (256, 1024)))
  assert call.text() == (
      "pallas_kernels.glu_matmul(x, w_gate, w_up, activation='silu')  "
      "# x: bf16[64,256], w_gate: bf16[256,512], w_up: bf16[256,512] -> bf16[64,512]")


def test_suggest_with_separate_weights_bias_and_cast():
  call = arg_specs.suggest(_facts(("bias", "activation:gelu", "multiply", "cast:f32"),
                                  (256, 512)))
  assert call.text() == (
      "pallas_kernels.glu_matmul(x, w_gate, w_up, bias_gate=bias_gate, "
      "activation='gelu', out_dtype=jnp.float32)  # x: bf16[64,256], "
      "w_gate: bf16[256,512], w_up: bf16[256,512], bias_gate: bf16[512] -> f32[64,512]")


@pytest.mark.parametrize("ops,rhs,contracting", [
    (("activation:tanh", "multiply"), (256, 512), ((1,), (0,))),   # not a GLU activation
    (("activation:silu", "multiply"), (512, 256), ((1,), (1,))),   # w stored [F, K]
    (("activation:silu", "multiply:halves"), (256, 511), ((1,), (0,))),  # odd 2F
])
def test_suggest_declines(ops, rhs, contracting):
  assert arg_specs.suggest(_facts(ops, rhs, contracting=contracting)) is None


def test_suggested_call_passes_the_guard():
  call = arg_specs.suggest(_facts(("activation:silu", "multiply:halves"), (256, 1024)))
  check = pk.check_guard(call.op, *[_struct(dims, {"bf16": "bfloat16"}[dt])
                                    for _, dt, dims, _ in call.arrays],
                         interpret=True, **{k: v for k, _, v in call.options})
  assert check.runs, check


# ------------------------------------------------- GPU lowering (no GPU) ----

_TRITON_CALL = re.compile(r"stablehlo\.custom_call @(__gpu\$xla\.gpu\.triton|triton_kernel_call\w*)")


def test_lowers_for_a_gpu_with_nothing_left_to_xla(clean_fallbacks):
  # The route of tests/pallas_kernels/lowering_test.py: an abstract H200, lowered for CUDA.
  if guard.gpu.unavailable_reason(True):
    pytest.skip(guard.gpu.unavailable_reason(True))
  device = jax.sharding.AbstractDevice("NVIDIA H200", 132, "cuda")
  mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)
  x, w, b = (_struct(s, "bfloat16") for s in ((13, 70), (70, 300), (300,)))

  def fwd(*a):
    return glu_matmul(a[0], a[1], a[2], bias_gate=a[3], bias_up=a[4], activation="gelu")

  def grad(*a):
    return jax.grad(lambda *v: jnp.sum(fwd(*v).astype(jnp.float32)), argnums=(0, 1, 2, 3, 4))(*a)

  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    with jax.sharding.use_abstract_mesh(mesh):
      texts = [jax.jit(f).trace(x, w, w, b, b).lower(lowering_platforms=("cuda",)).as_text()
               for f in (fwd, grad)]
  assert len(_TRITON_CALL.findall(texts[0])) == 1
  assert _TRITON_CALL.findall(texts[1])  # The backward kernel (matmuls may be Mosaic GPU).
  for text in texts:
    assert "stablehlo.dot_general" not in text and "chlo.erf" not in text
  assert_no_fallback()


def test_on_a_gpu_the_guard_holds_tiles_and_shared_memory_to_their_bounds(monkeypatch):
  # Compiled for a GPU (faked here: no GPU runs this): tiles at Triton's
  # minimum pass and one below it is refused; shared memory likewise.
  monkeypatch.setattr(guard.gpu, "unavailable_reason", lambda interpret: None)
  monkeypatch.setattr(backend, "current_backend", lambda: backend.Backend.GPU)
  x, w = _struct((64, 64), "float32"), _struct((64, 64), "float32")
  lo = config_lib.GPU_MIN_BLOCK

  def reason(cfg, limit):
    monkeypatch.setattr(guard.matmul_gpu, "shared_memory_bytes", lambda: limit)
    return guard.unsupported_reason(x, w, w, out_dtype=jnp.float32, interpret=False,
                                    config=cfg)

  at = Config(block_m=2 * lo, block_n=2 * lo, block_k=lo)
  need = config_lib.smem_bytes(at, 4)
  assert reason(at, need) is None
  assert f"Triton dots need tiles >= {lo}" in reason(
      Config(block_m=2 * lo, block_n=2 * lo, block_k=lo // 2), need)
  assert f"needs ~{need // 1024} KiB of shared memory" in reason(at, need - 1)
