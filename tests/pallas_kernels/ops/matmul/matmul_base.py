"""Shared test suite of matmul.

Subclasses choose where the kernel runs (`implementation`, `interpret`).
Expected values come only from `reference.py` (at Precision.HIGHEST),
tolerances only from `tolerances.py`. Shapes are small (interpret mode runs a
loop per grid step) and include 1, primes and non-multiples of every block;
a few tests force small blocks to get ragged multi-tile grids.
"""

from __future__ import annotations

import functools
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk
from pallas_kernels._src import backend
from pallas_kernels._src.ops.matmul import kernel
from pallas_kernels._src.ops.matmul import reference
from pallas_kernels._src.ops.matmul.config import Config
from pallas_kernels._src.tolerances import relative_error, tolerance

#: Small tiles: a 37x41 output becomes a ragged 3x3 grid, K=53 four K steps.
SMALL = Config(block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=2, group_m=2)
HIGHEST = jax.lax.Precision.HIGHEST
_NOT_MATH = ("implementation", "interpret", "config")


def _rng(tag: str) -> np.random.Generator:
  return np.random.default_rng(zlib.crc32(tag.encode()))


def _device(a: np.ndarray, dtype) -> jax.Array:
  # Cast on the host (ml_dtypes): no XLA compile per shape, unlike jax.random.
  return jnp.asarray(a.astype(jnp.dtype(dtype)))


def normal(shape, dtype, tag=""):
  """Random normal test data (never zeros), deterministic per shape/dtype/tag."""
  a = _rng(f"{shape}{dtype}{tag}").standard_normal(tuple(shape), dtype=np.float32)
  return _device(a, dtype)


def ints(shape, dtype, tag=""):
  """Random integers of int8 / int4 range (never all zero)."""
  hi = 127 if jnp.dtype(dtype).name == "int8" else 7
  return _device(_rng(f"{shape}{dtype}{tag}").integers(-hi, hi + 1, tuple(shape)), dtype)


def scales(shape, magnitude, tag=""):
  """Random strictly positive float32 scales around `magnitude`."""
  a = magnitude * _rng(f"scale{shape}{tag}").uniform(0.5, 1.5, tuple(shape))
  return _device(np.asarray(a, np.float32), jnp.float32)


def split_arrays(kw):
  """(array keywords, static keywords)."""
  arrays = {k: v for k, v in kw.items() if isinstance(v, jax.Array)}
  return arrays, {k: v for k, v in kw.items() if k not in arrays}


def ref(x, w, **kw):
  """The specification: reference.py at HIGHEST precision (one jitted program)."""
  arrays, static = split_arrays({k: v for k, v in kw.items() if k not in _NOT_MATH})
  fn = functools.partial(reference.reference, precision=HIGHEST, **static)
  return jax.jit(lambda x, w, a: fn(x, w, **a))(x, w, arrays)


def assert_close(out, expected, *, grad: bool = False):
  assert out.shape == expected.shape, (out.shape, expected.shape)
  assert out.dtype == expected.dtype, (out.dtype, expected.dtype)
  err = relative_error(out, expected)
  bound = tolerance(out.dtype, grad=grad)
  assert err <= bound, f"relative error {err:.3e} > {bound:.0e} ({out.dtype})"


def operands(m, k, n, dtype, *, batch=(), w_batch=(), transpose_x=False,
             transpose_w=False, transpose_out=False, bias=False, residual=False,
             w_dtype=None, tag=""):
  """(x, w, extra arrays) for a call, stored as the flags say."""
  xs = tuple(batch) + ((k, m) if transpose_x else (m, k))
  ws = tuple(w_batch) + ((n, k) if transpose_w else (k, n))
  x = normal(xs, dtype, "x" + tag)
  wd = w_dtype or dtype
  w = ints(ws, wd, "w" + tag) if wd in ("int8", "int4") else normal(ws, wd, "w" + tag)
  extra = {}
  if bias:
    extra["bias"] = normal((n,), dtype, "b" + tag)
  if residual:
    lead = tuple(jnp.broadcast_shapes(tuple(batch), tuple(w_batch)))
    extra["residual"] = normal(lead + ((n, m) if transpose_out else (m, n)), dtype, "r" + tag)
  return x, w, extra


def top_level_primitives(fn, *args) -> set[str]:
  """Primitive names of `fn`'s jaxpr outside any pallas_call kernel body."""
  names: set[str] = set()

  def subjaxprs(value):
    if hasattr(value, "eqns"):
      yield value
    elif hasattr(value, "jaxpr") and hasattr(value.jaxpr, "eqns"):
      yield value.jaxpr
    elif isinstance(value, (tuple, list)):
      for v in value:
        yield from subjaxprs(v)

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      names.add(eqn.primitive.name)
      if eqn.primitive.name == "pallas_call":
        continue  # The kernel body may transpose tiles in registers.
      for value in eqn.params.values():
        for sub in subjaxprs(value):
          walk(sub)

  walk(jax.make_jaxpr(fn)(*args).jaxpr)
  return names


class MatmulTestBase:
  """Every behaviour of `pallas_kernels.matmul`; see the module docstring."""

  __test__ = False
  implementation: str = "pallas"
  interpret: bool | None = True

  # ---- helpers -----------------------------------------------------------

  def op(self, x, w, **kw):
    """pk.matmul jitted, with array keywords passed as traced arguments."""
    arrays, static = split_arrays(kw)
    fn = functools.partial(pk.matmul, implementation=self.implementation,
                           interpret=self.interpret, **static)
    return jax.jit(lambda x, w, a: fn(x, w, **a))(x, w, arrays)

  def grads(self, fn, primals, ct):
    return jax.jit(lambda p, c: jax.vjp(fn, *p)[1](c))(primals, ct)

  def check_grads(self, x, w, argnames, **kw):
    """vjp cotangents of the kernel vs the reference for the named arrays."""
    arrays = {"x": x, "w": w, **{k: v for k, v in kw.items() if isinstance(v, jax.Array)}}
    static = {k: v for k, v in kw.items() if not isinstance(v, jax.Array)}
    fixed = {k: v for k, v in arrays.items() if k not in argnames}

    def call(impl, *primals):
      a = {**fixed, **dict(zip(argnames, primals))}
      xx, ww = a.pop("x"), a.pop("w")
      if impl == "ref":
        return ref(xx, ww, **a, **static)
      return pk.matmul(xx, ww, implementation=self.implementation,
                       interpret=self.interpret, **a, **static)

    primals = [arrays[k] for k in argnames]
    out = jax.eval_shape(functools.partial(call, "ref"), *primals)
    ct = normal(out.shape, out.dtype, "cotangent")
    got = self.grads(functools.partial(call, "kernel"), primals, ct)
    want = self.grads(functools.partial(call, "ref"), primals, ct)
    for name, g, e in zip(argnames, got, want):
      assert g.dtype == arrays[name].dtype, name
      assert_close(g, e, grad=True)

  # ---- forward: shapes x dtypes x epilogues -------------------------------

  @pytest.mark.parametrize("m,k,n,dtype,kw", [
      (1, 1, 1, "float32", {}),
      (1, 64, 17, "bfloat16", {}),
      (7, 129, 33, "bfloat16", dict(bias=True, activation="gelu")),
      (13, 31, 97, "float16", dict(bias=True, residual=True, activation="silu")),
      (37, 53, 41, "float32", dict(bias=True, residual=True, activation="gelu_tanh",
                                   scale="vector", clamp=(-2.0, 2.0))),
      (64, 96, 80, "bfloat16", dict(bias=True, activation="relu", scale="scalar")),
      (5, 17, 3, "float16", dict(activation="sigmoid", clamp=(0.1, None))),
      (3, 11, 7, "float32", dict(activation="tanh", clamp=(None, 0.5), residual=True,
                                 bias=True)),
      (23, 29, 31, "bfloat16", dict(activation="identity", out_dtype="float32")),
      (16, 32, 24, "float32", dict(bias=True, out_dtype="bfloat16")),
  ])
  def test_forward_matches_reference(self, m, k, n, dtype, kw):
    kw = dict(kw)
    x, w, extra = operands(m, k, n, dtype, bias=kw.pop("bias", False),
                           residual=kw.pop("residual", False))
    mode = kw.pop("scale", None)
    if mode == "vector":
      extra["scale"] = normal((n,), "float32", "scale")
    elif mode == "scalar":
      extra["scale"] = scales((), 0.7)
    out = self.op(x, w, **extra, **kw)
    assert out.dtype == jnp.dtype(kw.get("out_dtype", dtype))
    assert_close(out, ref(x, w, **extra, **kw))

  @pytest.mark.parametrize("dtype,flags", [
      ("float32", (False, False, False)),
      ("bfloat16", (True, True, True)),
  ])
  def test_ragged_multi_tile_grid(self, dtype, flags):
    tx, tw, to = flags
    x, w, extra = operands(37, 53, 41, dtype, transpose_x=tx, transpose_w=tw,
                           transpose_out=to, bias=True, residual=True)
    kw = dict(activation="gelu", transpose_x=tx, transpose_w=tw, transpose_out=to)
    out = self.op(x, w, config=SMALL, **extra, **kw)
    assert_close(out, ref(x, w, **extra, **kw))

  def test_output_is_fully_written(self):
    # The output buffer starts as NaN (aliased input); every tile must land.
    x, w, extra = operands(37, 53, 41, "float32", transpose_out=True, bias=True,
                           residual=True)
    interp = backend.resolve_interpret(self.interpret)
    out = jax.jit(lambda x, w, b, r: kernel.matmul_forward(
        x, w, cfg=SMALL, interpret=interp, compute_dtype="float32",
        out_dtype="float32", activation="relu", bias=b, residual=r,
        transpose_out=True, poison=True).out)(x, w, extra["bias"], extra["residual"])
    assert not np.isnan(np.asarray(out)).any()
    assert_close(out, ref(x, w, activation="relu", transpose_out=True, **extra))

  def test_quantized_output_is_fully_written(self):
    # int8 poison is -128, which the symmetric quantizer never produces.
    x, w, _ = operands(21, 40, 13, "float32")
    interp = backend.resolve_interpret(self.interpret)
    cfg = Config(block_m=16, block_n=16, block_k=16)
    res = jax.jit(lambda x, w: kernel.matmul_forward(
        x, w, cfg=cfg, interpret=interp, compute_dtype="float32", out_dtype="float32",
        quantize="int8", poison=True))(x, w)
    assert int(np.asarray(res.out).min()) > -128
    values, s = ref(x, w, quantize="int8")
    assert_close(res.out, values)
    assert_close(res.scales, s)

  # ---- prologues --------------------------------------------------------

  @pytest.mark.parametrize("name,m,k,n,x_dtype,w_dtype,kw", [
      ("int8 per channel", 9, 96, 40, "bfloat16", "int8", dict(w="channel", bias=True,
                                                                activation="gelu")),
      ("int4 per group", 5, 128, 64, "bfloat16", "int4", dict(w="group", group=32)),
      ("int4 per group, transposed w", 11, 64, 24, "float16", "int4",
       dict(w="group", group=16, transpose_w=True)),
      ("int4 per channel, transposed w", 8, 64, 48, "float16", "int4",
       dict(w="channel", transpose_w=True)),
      ("int8 groups across small K steps", 19, 96, 37, "float32", "int8",
       dict(w="group", group=32, config=SMALL)),
      ("fp8 e4m3 scalar scale", 12, 48, 36, "bfloat16", "float8_e4m3fn", dict(w="scalar")),
      ("fp8 e5m2 per channel, f32 x", 7, 40, 29, "float32", "float8_e5m2",
       dict(w="channel")),
      ("fp8 x and w", 10, 32, 24, "float8_e4m3fn", "float8_e4m3fn",
       dict(w="channel", x="row")),
      ("int8 x and w to f32", 6, 80, 20, "int8", "int8",
       dict(w="channel", x="row", out_dtype="float32")),
      ("fp8 x scalar scale, bf16 w", 9, 33, 17, "float8_e5m2", "bfloat16", dict(x="scalar")),
  ])
  def test_dequantizing_prologue(self, name, m, k, n, x_dtype, w_dtype, kw):
    kw = dict(kw)
    tw = kw.get("transpose_w", False)
    ws = (n, k) if tw else (k, n)
    x = ints((m, k), x_dtype, name) if x_dtype == "int8" else normal((m, k), x_dtype, name)
    w = ints(ws, w_dtype, name) if w_dtype in ("int8", "int4") else normal(ws, w_dtype, name)
    mag = {"int8": 1 / 64, "int4": 1 / 4}.get(w_dtype, 1.0) / np.sqrt(k)
    extra = {}
    mode = kw.pop("w", None)
    if mode == "channel":
      extra["w_scale"] = scales((n,), mag, name)
    elif mode == "scalar":
      extra["w_scale"] = scales((), mag, name)
    elif mode == "group":
      group = kw.pop("group")
      extra["w_scale"] = scales((k // group, n), mag, name)
      kw["w_group_size"] = group
    xmode = kw.pop("x", None)
    if xmode == "row":
      extra["x_scale"] = scales((m,), 1 / 64 if x_dtype == "int8" else 1.0, name + "x")
    elif xmode == "scalar":
      extra["x_scale"] = scales((), 1.0, name + "x")
    if kw.pop("bias", False):
      extra["bias"] = normal((n,), "bfloat16", name)
    out = self.op(x, w, **extra, **kw)
    assert_close(out, ref(x, w, **extra, **kw))

  # ---- layouts ----------------------------------------------------------

  @pytest.mark.parametrize("dtype,tx,tw,to", [
      ("float32", True, False, False),
      ("bfloat16", False, True, False),
      ("float16", False, False, True),
      ("float32", True, True, True),
  ])
  def test_transposed_operands_are_read_in_place(self, dtype, tx, tw, to):
    x, w, extra = operands(19, 45, 27, dtype, transpose_x=tx, transpose_w=tw,
                           transpose_out=to, bias=True, residual=True)
    kw = dict(activation="relu", transpose_x=tx, transpose_w=tw, transpose_out=to)
    out = self.op(x, w, **extra, **kw)
    assert out.shape == ((27, 19) if to else (19, 27))
    assert_close(out, ref(x, w, **extra, **kw))
    if self.implementation == "pallas":
      prims = top_level_primitives(functools.partial(
          pk.matmul, implementation="pallas", interpret=self.interpret, **kw), x, w)
      assert "pallas_call" in prims and "transpose" not in prims, prims

  # ---- quantizing epilogue ------------------------------------------------

  @pytest.mark.parametrize("kind,dtype,kw", [
      ("int8", "bfloat16", dict(bias=True, activation="gelu")),
      ("float8_e4m3fn", "float32", dict(bias=True, residual=True)),
      ("int8", "float32", dict(config=Config(block_m=16, block_n=16, block_k=32),
                               activation="silu")),  # Rows wider than a tile.
      ("int8", "float16", dict(transpose_out=True, bias=True)),
      ("float8_e4m3fn", "bfloat16", dict(config=SMALL, transpose_out=True, residual=True,
                                         bias=True)),
  ])
  def test_quantizing_epilogue(self, kind, dtype, kw):
    kw = dict(kw)
    to = kw.get("transpose_out", False)
    x, w, extra = operands(17, 64, 50, dtype, transpose_out=to,
                           bias=kw.pop("bias", False), residual=kw.pop("residual", False))
    values, s = self.op(x, w, quantize=kind, **extra, **kw)
    want_values, want_s = ref(x, w, quantize=kind, **extra, **kw)
    assert values.dtype == jnp.dtype(kind) and s.dtype == jnp.float32
    assert s.shape == ((1, 17) if to else (17, 1))
    assert_close(values, want_values)
    assert_close(s, want_s)
    # Dequantized values approximate the unquantized result.
    y = ref(x, w, out_dtype="float32", **extra, **kw)
    assert relative_error(values.astype(jnp.float32) * s, y) <= tolerance(kind)

  # ---- batch dims and vmap ------------------------------------------------

  @pytest.mark.parametrize("batch,w_batch,tx,to", [
      ((2, 3), (), False, False),   # x batch folded into M.
      ((2,), (2,), False, False),   # Both batched.
      ((2, 1), (3,), False, False),  # Broadcasting batch dims.
      ((), (2,), False, False),     # Only w batched.
      ((3,), (), True, False),      # Transposed x: a batch grid, w shared.
      ((2,), (), False, True),      # Transposed batched output with residual.
  ])
  def test_batch_dims_broadcast_like_jnp_matmul(self, batch, w_batch, tx, to):
    x, w, extra = operands(13, 24, 18, "float32", batch=batch, w_batch=w_batch,
                           transpose_x=tx, transpose_out=to, bias=True, residual=True)
    kw = dict(activation="silu", transpose_x=tx, transpose_out=to)
    out = self.op(x, w, **extra, **kw)
    assert_close(out, ref(x, w, **extra, **kw))

  def test_per_row_x_scale_with_batch(self):
    x = normal((2, 3, 9, 32), "float8_e4m3fn")
    w = normal((32, 20), "float8_e4m3fn")
    kw = dict(x_scale=scales((2, 3, 9), 1.0), w_scale=scales((20,), 0.2))
    assert_close(self.op(x, w, **kw), ref(x, w, **kw))

  def test_vmap_matches_reference(self):
    x, w, extra = operands(11, 24, 20, "float32", batch=(3,), bias=True)
    def fn(x):
      return pk.matmul(x, w, bias=extra["bias"], activation="gelu",
                       implementation=self.implementation, interpret=self.interpret)

    def expected(x):
      return ref(x, w, bias=extra["bias"], activation="gelu")

    out = jax.jit(jax.vmap(fn))(x)
    assert_close(out, ref(x, w, bias=extra["bias"], activation="gelu"))
    xs, ws, _ = operands(5, 16, 12, "bfloat16", batch=(2,), w_batch=(2,))
    out = jax.jit(jax.vmap(lambda a, b: pk.matmul(
        a, b, transpose_w=True, implementation=self.implementation,
        interpret=self.interpret)))(xs, jnp.swapaxes(ws, -1, -2))
    assert_close(out, ref(xs, ws))
    # Per-example gradients: vmap of the custom_vjp's backward kernels.
    def loss(f):
      return lambda x: f(x).astype(jnp.float32).sum() ** 2

    got = jax.jit(jax.vmap(jax.grad(loss(fn))))(x)
    want = jax.jit(jax.vmap(jax.grad(loss(expected))))(x)
    assert_close(got, want, grad=True)

  # ---- gradients ---------------------------------------------------------

  @pytest.mark.parametrize("dtype,kw", [
      ("float32", dict(activation="gelu", clamp=(-1.0, 1.5), scale="vector")),
      ("bfloat16", dict(activation="silu")),
      ("float16", dict(activation="relu", transpose_x=True, transpose_w=True,
                       transpose_out=True)),
      ("float32", dict(transpose_out=True)),  # Identity: no dAct kernel.
      ("float32", dict(activation="tanh", scale="scalar", config=SMALL)),
  ])
  def test_gradients_match_reference_vjp(self, dtype, kw):
    kw = dict(kw)
    flags = {f: kw.get(f, False) for f in ("transpose_x", "transpose_w", "transpose_out")}
    x, w, extra = operands(21, 35, 26, dtype, bias=True, residual=True, **flags)
    names = ["x", "w", "bias", "residual"]
    mode = kw.pop("scale", None)
    if mode:
      extra["scale"] = (normal((26,), "float32", "s") if mode == "vector"
                        else scales((), 0.8))
      names.append("scale")
    self.check_grads(x, w, names, **extra, **kw)

  def test_gradients_with_batch_folding_and_broadcasting(self):
    x, w, extra = operands(9, 16, 12, "float32", batch=(2, 3), bias=True)
    self.check_grads(x, w, ["x", "w", "bias"], activation="sigmoid", **extra)
    x, w, extra = operands(7, 16, 10, "float32", batch=(2, 1), w_batch=(3,),
                           residual=True, bias=True)
    self.check_grads(x, w, ["x", "w", "bias", "residual"], activation="relu", **extra)

  @pytest.mark.parametrize("w_dtype,mode", [("int8", "channel"), ("int4", "group")])
  def test_gradient_through_quantized_weights(self, w_dtype, mode):
    k, n = 64, 24
    x, w, extra = operands(10, k, n, "bfloat16", w_dtype=w_dtype, bias=True)
    mag = (1 / 64 if w_dtype == "int8" else 1 / 4) / 8
    if mode == "channel":
      extra["w_scale"] = scales((n,), mag)
      kw = {}
    else:
      extra["w_scale"] = scales((k // 16, n), mag)
      kw = dict(w_group_size=16)
    self.check_grads(x, w, ["x", "bias"], activation="gelu", **extra, **kw)

  def test_gradient_of_weights_with_quantized_activations(self):
    # dw = x_q^T @ (g * x_scale): the per-row scale is folded into g.
    x = normal((12, 32), "float8_e4m3fn")
    w, extra = normal((32, 20), "float32", "w"), dict(x_scale=scales((12,), 0.5))
    self.check_grads(x, w, ["w"], activation="silu", **extra)

  def test_quantized_output_differentiates_through_the_reference(self):
    x, w, _ = operands(8, 16, 12, "float32")
    def fn(x):
      return pk.matmul(x, w, quantize="int8", implementation=self.implementation,
                       interpret=self.interpret)[1].sum()

    g = jax.jit(jax.grad(fn))(x)
    want = jax.grad(lambda x: ref(x, w, quantize="int8")[1].sum())(x)
    assert_close(g, want, grad=True)

  # ---- guard fallbacks ----------------------------------------------------

  def test_group_size_not_dividing_k_falls_back(self, clean_fallbacks):
    x, w, _ = operands(6, 40, 16, "bfloat16", w_dtype="int4")
    kw = dict(w_scale=scales((3, 16), 0.05), w_group_size=16)
    out = self.op(x, w, **kw)
    assert_close(out, ref(x, w, **kw))
    reasons = [f.reason for f in pk.fallbacks("matmul")]
    if self.implementation == "pallas":
      assert any("does not divide K=40" in r for r in reasons), reasons

  def test_unsupported_dtypes_fall_back_and_stay_correct(self, clean_fallbacks):
    x, w, _ = operands(5, 16, 9, "float32")
    out = self.op(x.astype(jnp.int4), w)  # int4 activations: no kernel.
    assert_close(out, ref(x.astype(jnp.int4), w))
    out = self.op(x, w, out_dtype=jnp.int32)
    np.testing.assert_array_equal(out, ref(x, w, out_dtype=jnp.int32))
    if self.implementation == "pallas":
      reasons = " | ".join(f.reason for f in pk.fallbacks("matmul"))
      assert "x dtype int4" in reasons and "out_dtype int32" in reasons, reasons

  def test_block_k_not_dividing_group_falls_back(self, clean_fallbacks):
    x, w, _ = operands(6, 64, 16, "float32", w_dtype="int8")
    kw = dict(w_scale=scales((8, 16), 0.01), w_group_size=8,
              config=Config(block_m=16, block_n=16, block_k=16))
    assert_close(self.op(x, w, **kw), ref(x, w, **kw))
    if self.implementation == "pallas":
      assert any("block_k 16 does not divide" in f.reason for f in pk.fallbacks("matmul"))

  def test_no_fallback_on_supported_calls(self, clean_fallbacks):
    x, w, extra = operands(9, 16, 12, "bfloat16", bias=True)
    self.op(x, w, activation="gelu", **extra)
    assert pk.fallbacks("matmul") == ()
