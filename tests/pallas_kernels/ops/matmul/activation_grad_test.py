"""matmul's `activation_grad`: the product times an activation's derivative at a
preactivation z (cuBLASLt's DGELU epilogue), as an MLP's backward computes
dz = (dy @ w2^T) * act'(z).

The kernel runs in interpret mode with `implementation="pallas"` and any
recorded fallback fails a test; expected values come from `reference.py` at
Precision.HIGHEST, whose derivative is JAX's of `activate` (the kernel writes
its own, `kernel.activation_grad`). Shapes are ragged against every block and
never square, so a z tile read transposed or from the wrong program shows.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import test_util as jtu

import pallas_kernels as pk
from pallas_kernels._src import backend
from pallas_kernels._src import compat
from pallas_kernels._src import guard as guard_lib
from pallas_kernels._src import tpu as tpu_lib
from pallas_kernels._src.audit import library
from pallas_kernels._src.ops.matmul import arg_specs
from pallas_kernels._src.ops.matmul import guard
from pallas_kernels._src.ops.matmul import reference
from pallas_kernels._src.ops.matmul.config import Config, MosaicConfig
from pallas_kernels._src.spec import CallFacts

from matmul_base import SMALL, assert_close, ints, normal, operands, ref, scales
from matmul_base import top_level_primitives

#: Activations whose derivative is not 1: ignoring z changes their result.
DERIVATIVES = tuple(a for a in reference.ACTIVATIONS if a != "identity")


def kernel(x, w, **kw):
  return pk.matmul(x, w, implementation="pallas", interpret=True, **kw)


def preactivation(shape, dtype="float32", tag="z"):
  # Spread over [-4, 4]: every derivative varies there (relu's sign, the
  # sigmoid family's tails).
  return (2.0 * normal(shape, "float32", tag)).astype(dtype)


@pytest.fixture(autouse=True)
def _no_fallback(clean_fallbacks):
  """Every call here must run the kernel: a fallback would hide it."""
  yield
  assert pk.fallbacks("matmul") == (), pk.fallbacks("matmul")


# ---- forward ------------------------------------------------------------------


@pytest.mark.parametrize("act", reference.ACTIVATIONS)
@pytest.mark.parametrize("m,k,n,dtype,cfg", [
    (37, 53, 41, "float32", SMALL),    # a ragged 3x3 grid of tiles, four K steps
    (7, 129, 33, "bfloat16", None),    # the heuristic's tiles, ragged against all
])
def test_each_derivative_matches_the_reference(act, m, k, n, dtype, cfg):
  x, w, _ = operands(m, k, n, dtype)
  z = preactivation((m, n), dtype)
  prec = dict(precision="highest") if dtype == "float32" else {}
  out = kernel(x, w, activation_grad=act, preactivation=z, config=cfg, **prec)
  assert out.dtype == jnp.dtype(dtype) and out.shape == (m, n)
  assert_close(out, ref(x, w, activation_grad=act, preactivation=z))


def test_the_reference_multiplies_by_the_derivative_not_the_activation():
  x, w, _ = operands(9, 20, 14, "float32")
  z = preactivation((9, 14))
  h = ref(x, w)
  for act in DERIVATIVES:
    want = h * jax.vmap(jax.vmap(jax.grad(lambda v: reference.activate(act, v))))(z)
    np.testing.assert_allclose(ref(x, w, activation_grad=act, preactivation=z), want,
                               rtol=1e-5, atol=1e-5, err_msg=act)
  # relu's derivative is 0 at 0, as jax.nn.relu's.
  zero = jnp.zeros((9, 14))
  assert (ref(x, w, activation_grad="relu", preactivation=zero) == 0).all()
  assert (kernel(x, w, activation_grad="relu", preactivation=zero,
                 precision="highest") == 0).all()


@pytest.mark.parametrize("dtype,z_dtype,batch,w_batch,flags,extra", [
    # The MLP backward's dh = dy @ w2^T, a float32 z beside bf16 operands.
    ("bfloat16", "float32", (), (), dict(transpose_w=True), {}),
    # x's batch folded into M (w unbatched): z is folded with it.
    ("float32", "float32", (2, 3), (), {}, dict(residual=True, scale="vector")),
    # Stored transposed: z is read in the output's [N, M] orientation.
    ("bfloat16", "bfloat16", (), (), dict(transpose_out=True), dict(residual=True)),
    ("float16", "float16", (2,), (2,), dict(transpose_x=True, transpose_w=True),
     dict(scale="scalar", clamp=(-0.5, 0.75))),
    ("bfloat16", "float16", (2,), (), dict(transpose_x=True), dict(out_dtype="float32")),
])
def test_layouts_batches_and_the_rest_of_the_epilogue(dtype, z_dtype, batch, w_batch,
                                                       flags, extra):
  m, k, n = 21, 45, 26
  extra = dict(extra)
  x, w, arrays = operands(m, k, n, dtype, batch=batch, w_batch=w_batch,
                          residual=extra.pop("residual", False), **flags)
  mode = extra.pop("scale", None)
  if mode == "vector":
    arrays["scale"] = normal((n,), "float32", "scale")
  elif mode == "scalar":
    arrays["scale"] = scales((), 0.7)
  lead = tuple(jnp.broadcast_shapes(batch, w_batch))
  z = preactivation(lead + ((n, m) if flags.get("transpose_out") else (m, n)), z_dtype)
  kw = dict(activation_grad="gelu", preactivation=z, **arrays, **flags, **extra)
  prec = dict(precision="highest") if dtype == "float32" else {}
  assert_close(kernel(x, w, config=SMALL, **kw, **prec), ref(x, w, **kw))


def test_the_product_is_the_kernels():
  # One pallas_call and no XLA dot: the gemm is not left to XLA.
  x, w, _ = operands(13, 40, 24, "bfloat16", transpose_w=True)
  z = preactivation((13, 24), "bfloat16")
  guard_lib.retrace_guards()
  names = top_level_primitives(
      lambda x, w, z: kernel(x, w, transpose_w=True, activation_grad="silu",
                             preactivation=z), x, w, z)
  assert "pallas_call" in names and "dot_general" not in names, names
  assert guard_lib.choices("matmul")[-1].backend == "triton"


def test_quantized_output_and_column_sums_compose():
  x, w, _ = operands(19, 53, 33, "bfloat16")
  z = preactivation((19, 33), "bfloat16")
  kw = dict(activation_grad="gelu_tanh", preactivation=z)
  (values, row_scales), colsum = kernel(x, w, quantize="int8", w_column_sum=True,
                                        config=SMALL, **kw)
  (want_v, want_s), want_c = ref(x, w, quantize="int8", w_column_sum=True, **kw)
  assert_close(values.astype(jnp.float32) * row_scales, want_v.astype(jnp.float32) * want_s)
  assert_close(colsum, want_c)


def test_on_a_tpu_the_mosaic_tpu_kernel_reads_z():
  # Transposed output: the TPU kernel swaps its operands and reads z as stored.
  m, k, n = 136, 300, 200
  x, w, arrays = operands(m, k, n, "float32", transpose_out=True, residual=True)
  z = preactivation((n, m))
  case = pk.Case(name="tpu dgelu", args=(x, w, z, arrays["residual"]),
                 kwargs=dict(activation_grad="gelu", transpose_out=True, precision="highest",
                             config=Config(block_m=128, block_n=128, block_k=128)),
                 grad_argnums=(0, 1, 2, 3))
  spec = dataclasses.replace(pk.get_spec("matmul"), cases=lambda tag, seed: iter((case,)))
  report = pk.validate(spec, target="tpu", interpret=True, require_kernel=True)
  assert report.passed, str(report)
  (row,) = report.rows
  assert row.backend == tpu_lib.KERNEL_BACKEND and row.grad_err is not None


# ---- gradients ----------------------------------------------------------------


def _vjp(fn, primals, ct):
  return jax.jit(lambda p, c: jax.vjp(fn, *p)[1](c))(primals, ct)


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "silu", "relu"])
@pytest.mark.parametrize("dtype,flags,extra", [
    ("float32", dict(transpose_w=True), dict(scale="vector", residual=True)),
    ("bfloat16", dict(transpose_out=True), dict(clamp=(-1.0, 1.0))),
])
def test_gradients_match_the_reference(act, dtype, flags, extra):
  # x, w and z (z's through act'', a second derivative), and the epilogue's.
  m, k, n = 21, 45, 26
  extra = dict(extra)
  x, w, arrays = operands(m, k, n, dtype, residual=extra.pop("residual", False), **flags)
  if extra.pop("scale", None):
    arrays["scale"] = normal((n,), "float32", "scale")
  arrays["preactivation"] = preactivation(
      (n, m) if flags.get("transpose_out") else (m, n), dtype)
  names = ["x", "w"] + list(arrays)
  prec = dict(precision="highest") if dtype == "float32" else {}

  def call(impl, *primals):
    a = dict(zip(names, primals))
    xx, ww = a.pop("x"), a.pop("w")
    kw = dict(activation_grad=act, **a, **flags, **extra)
    return ref(xx, ww, **kw) if impl == "ref" else kernel(xx, ww, config=SMALL, **kw, **prec)

  primals = [x, w, *arrays.values()]
  shape = jax.eval_shape(functools.partial(call, "ref"), *primals)
  ct = normal(shape.shape, shape.dtype, "ct")
  got = _vjp(functools.partial(call, "pallas"), primals, ct)
  want = _vjp(functools.partial(call, "ref"), primals, ct)
  for name, g, e, p in zip(names, got, want, primals):
    assert g.dtype == p.dtype and g.shape == p.shape, name
    if act == "relu" and name == "preactivation":
      assert (g == 0).all()  # relu'' = 0
    else:
      assert_close(g, e, grad=True)


@pytest.mark.parametrize("quantized", ["x", "w"])
def test_gradients_through_dequantization_scales(quantized):
  # The float operand's gradient carries the other's scales: dx = (g *
  # w_scale) @ w_q^T, dw = x_q^T @ (g * x_scale[:, None]).
  m, k, n = 19, 40, 22
  if quantized == "x":
    q, kw = ints((m, k), "int8", "xq"), dict(x_scale=scales((m,), 0.02, "xs"))
    other = normal((k, n), "bfloat16", "w")
    order = lambda q, f: (q, f)  # noqa: E731
  else:
    q, kw = ints((k, n), "int8", "wq"), dict(w_scale=scales((n,), 0.02, "ws"))
    other = normal((m, k), "bfloat16", "x")
    order = lambda q, f: (f, q)  # noqa: E731
  z = preactivation((m, n), "bfloat16")

  def call(impl, f, z):
    x, w = order(q, f)
    args = dict(activation_grad="silu", preactivation=z, **kw)
    return ref(x, w, **args) if impl == "ref" else kernel(x, w, config=SMALL, **args)

  ct = normal((m, n), "bfloat16", "ct")
  got = _vjp(functools.partial(call, "pallas"), (other, z), ct)
  want = _vjp(functools.partial(call, "ref"), (other, z), ct)
  for g, e in zip(got, want):
    assert_close(g, e, grad=True)


def test_gradients_are_the_derivatives_of_the_kernels_function():
  # Numerically, against the kernel's own values (no reference involved).
  x, w, _ = operands(7, 13, 10, "float32")
  z = preactivation((7, 10))
  f = functools.partial(kernel, activation_grad="gelu", precision="highest")
  jtu.check_grads(lambda x, w, z: f(x, w, preactivation=z), (x, w, z), order=1,
                  modes=["rev"], atol=2e-2, rtol=2e-2, eps=1e-2)


@pytest.mark.parametrize("act", ["gelu", "relu"])
def test_the_z_gradient_is_the_second_derivative(act):
  # d/dz sum(h * act'(z)) = h * act''(z): relu's is 0, gelu's is not.
  x, w, _ = operands(11, 17, 6, "float32")
  z = preactivation((11, 6))
  h = ref(x, w)

  def loss(z):
    return jnp.sum(kernel(x, w, activation_grad=act, preactivation=z, precision="highest"))

  d2 = jax.vmap(jax.vmap(jax.grad(jax.grad(functools.partial(reference.activate, act)))))(z)
  np.testing.assert_allclose(jax.grad(loss)(z), h * d2, rtol=1e-4, atol=1e-5)


# ---- invalid calls ------------------------------------------------------------


def test_invalid_calls_raise():
  x, w, _ = operands(7, 12, 33, "float32")
  z = preactivation((7, 33))
  with pytest.raises(ValueError, match="pass preactivation"):
    pk.matmul(x, w, activation_grad="gelu")
  with pytest.raises(ValueError, match="preactivation is read only with activation_grad"):
    pk.matmul(x, w, preactivation=z)
  with pytest.raises(ValueError, match="activation_grad takes no bias"):
    pk.matmul(x, w, bias=jnp.ones((33,)), activation_grad="gelu", preactivation=z)
  with pytest.raises(ValueError, match="replaces the activation step"):
    pk.matmul(x, w, activation="gelu", activation_grad="gelu", preactivation=z)
  with pytest.raises(ValueError, match="unknown activation 'softplus'"):
    pk.matmul(x, w, activation_grad="softplus", preactivation=z)
  with pytest.raises(ValueError, match=r"preactivation must have the result's shape "
                                       r"\[7, 33\], got \[33, 7\]"):
    pk.matmul(x, w, activation_grad="gelu", preactivation=z.T)
  with pytest.raises(ValueError, match=r"shape \[33, 7\], got \[7, 33\]"):
    pk.matmul(x, w, activation_grad="gelu", preactivation=z, transpose_out=True)
  with pytest.raises(ValueError, match="preactivation must be floating, got int32"):
    pk.matmul(x, w, activation_grad="gelu", preactivation=z.astype(jnp.int32))
  # activation=None / "identity" is no activation: accepted.
  assert pk.matmul(x, w, activation="identity", activation_grad="tanh", preactivation=z,
                   implementation="xla").shape == (7, 33)


# ---- other backends -----------------------------------------------------------


def test_the_mosaic_gpu_guard_names_it(monkeypatch):
  monkeypatch.setattr(compat, "mosaic_gpu_unavailable_reason", lambda: None)
  s = jax.ShapeDtypeStruct
  why = guard.mosaic_unsupported_reason(
      s((64, 128), jnp.bfloat16), s((128, 64), jnp.bfloat16), out_dtype=jnp.bfloat16,
      interpret=True, config=MosaicConfig(), activation_grad=True)
  assert why.startswith("activation_grad: the Mosaic GPU matmul's epilogue reads no "
                        "preactivation"), why


def test_a_z_dtype_no_kernel_takes_falls_back_with_the_reason():
  x, w, _ = operands(9, 32, 24, "bfloat16")
  z = preactivation((9, 24), "float8_e4m3fn")
  kw = dict(activation_grad="gelu", preactivation=z)
  assert_close(kernel(x, w, **kw), ref(x, w, **kw))
  (f,) = pk.fallbacks("matmul")
  assert f.reason.startswith("preactivation dtype float8_e4m3fn is not one of")
  pk.clear_fallbacks()  # Seen; the fixture asks for none.


@pytest.mark.skipif(compat.mosaic_gpu_unavailable_reason() is not None,
                    reason=str(compat.mosaic_gpu_unavailable_reason()))
def test_on_hopper_it_runs_on_triton_and_says_why():
  x, w, _ = operands(64, 128, 64, "bfloat16", transpose_w=True)
  z = preactivation((64, 64), "bfloat16")
  kw = dict(transpose_w=True, activation_grad="gelu", preactivation=z)
  with backend.targeting(backend.resolve_target("h200")):
    out = kernel(x, w, **kw)
  assert_close(out, ref(x, w, **kw))
  choice = guard_lib.choices("matmul")[-1]
  assert choice.backend == "triton" and "activation_grad" in choice.why, choice


# ---- the audit's call ---------------------------------------------------------


class _Array:
  def __init__(self, dtype, dims):
    self.dtype, self.dims = dtype, dims


class _Dot:
  def __init__(self, lhs, rhs, result, lc, rc):
    self.lhs, self.rhs, self.result = lhs, rhs, result
    self.lhs_contracting, self.rhs_contracting = lc, rc
    self.lhs_batch, self.rhs_batch = (), ()


def test_suggests_the_call_for_a_derivative_epilogue():
  closes = arg_specs.CLOSES
  assert "activation_grad" in closes.epilogues
  assert ("activation_grad", "activation_grad") in closes.keywords
  # dh = dy @ w2^T (w2 stored [H, D]), then dz = dh * gelu'(z): [tokens, H].
  dy, w2, dz = _Array("bf16", (512, 256)), _Array("bf16", (1024, 256)), _Array(
      "bf16", (512, 1024))
  facts = CallFacts(kind="unfused-epilogue", ops=("activation_grad:gelu",), boundary=dz,
                    shape="bf16[512,1024]", matmul=_Dot(dy, w2, (512, 1024), (1,), (1,)),
                    numpy_name=lambda n: {"bf16": "bfloat16"}.get(n, n))
  call = arg_specs.suggest(facts)
  assert call.text() == (
      "pallas_kernels.matmul(x, w, preactivation=preactivation, transpose_w=True, "
      "activation_grad='gelu')  # x: bf16[512,256], w: bf16[1024,256], "
      "preactivation: bf16[512,1024] -> bf16[512,1024]")
  # The call is valid, and the guard takes it.
  assert library._verdict(call).startswith("kernel runs"), library._verdict(call)
  arrays = {name: jax.ShapeDtypeStruct(dims, jnp.bfloat16)
            for name, _, dims, _ in call.arrays}
  opts = {k: v for k, _, v in call.options}
  out = jax.eval_shape(lambda a: pk.matmul(**a, **opts), arrays)
  assert out.shape == (512, 1024) and out.dtype == jnp.bfloat16


def test_validate_runs_the_derivative_cases_with_their_gradients():
  cases = list(arg_specs.cases("activation_grad", 0))
  assert {c.kwargs["activation_grad"] for c in cases} >= {"gelu", "gelu_tanh", "silu", "relu"}
  assert all("ci" in c.tags for c in cases)
  # (x, w, z[, residual]): z is positional, so its gradient is checked too.
  first = cases[0]
  assert len(first.args) == 3 and first.grad_argnums == (0, 1, 2)
  assert first.args[2].shape == (2, 7, 33)
  report = pk.validate("matmul", tags=("activation_grad",), require_kernel=True)
  assert report.passed, str(report)
  assert len(report.rows) == len(cases) >= 6
  assert sum(r.grad_err is not None for r in report.rows) >= 4


@pytest.mark.parametrize("x_dims, w_dims, boundary, want", [
    # The converted operand is x, or w; the call reads it in its source dtype.
    ((64, 128), (128, 32), (64, 128), "x: bf16[64,128], w: f32[128,32] -> f32[64,32]"),
    ((64, 128), (128, 32), (128, 32), "x: f32[64,128], w: bf16[128,32] -> f32[64,32]"),
    # Both operands of its dims: the tie goes to x.
    ((64, 64), (64, 64), (64, 64), "x: bf16[64,64], w: f32[64,64] -> f32[64,64]"),
    # The dot reads the boundary reshaped (dims of neither operand): it is x,
    # the side a prologue's tokens come from (the result as the dot wrote it).
    ((128, 128), (128, 32), (8, 16, 128),
     "x: bf16[8,16,128], w: f32[128,32] -> f32[128,32]"),
])
def test_a_prologues_call_reads_the_converted_operand_in_its_source_dtype(
    x_dims, w_dims, boundary, want):
  facts = CallFacts(kind="unfused-prologue", ops=("convert",),
                    boundary=_Array("f32", boundary), shape=f"f32{list(boundary)}",
                    matmul=_Dot(_Array("f32", x_dims), _Array("f32", w_dims),
                                (x_dims[0], w_dims[1]), (1,), (0,)),
                    sources=(_Array("bf16", boundary),),
                    numpy_name=lambda n: {"bf16": "bfloat16", "f32": "float32"}.get(n, n))
  assert arg_specs.suggest(facts).text().endswith(want)
