"""matmul's `SPEC`: named cases for `validate`, `bench` and the tests, its cost
model, sweep parameters, and the audit findings it closes with the call it
suggests (the one description every consumer reads, `spec.py`).

Positional arguments of a case are a prefix of (x, w, bias, residual), the
differentiable arrays, or with `activation_grad` (which takes no bias) of
(x, w, preactivation, residual); everything else (activation, scale,
quantization scales, layout flags) is a keyword. Shapes include 1, primes and
sizes that are not multiples of any block; inputs are random normal, integer
weights are random integers with random positive scales.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp

from pallas_kernels._src import inputs
from pallas_kernels._src.ops.matmul import reference
from pallas_kernels._src.ops.matmul.api import matmul
from pallas_kernels._src.ops.matmul.config import MosaicConfig
from pallas_kernels._src.spec import Call, CallFacts, Case, Closes, OpSpec, SweepParam

_POSITIONAL = ("x", "w", "bias", "residual")
#: The positional arrays of a case with `activation_grad`.
_POSITIONAL_DACT = ("x", "w", "preactivation", "residual")
#: Keywords of `matmul` that only steer the implementation (not the math).
_IMPL_KEYWORDS = ("implementation", "interpret", "config", "backend")
#: Keywords the HIGHEST-precision ground truth ignores.
_REFERENCE_IGNORES = _IMPL_KEYWORDS + ("precision",)


@dataclasses.dataclass(frozen=True)
class CaseDef:
  """A case before its arrays exist: shapes, dtypes and options."""

  m: int
  k: int
  n: int
  dtype: str = "float32"
  w_dtype: str | None = None
  batch: tuple[int, ...] = ()
  w_batch: tuple[int, ...] = ()
  bias: bool = False
  residual: bool = False
  activation: str | None = None
  scale: str | None = None  # None | "scalar" | "vector"
  clamp: tuple[float | None, float | None] | None = None
  w_scale: str | None = None  # None | "scalar" | "channel" | "group"
  group_size: int | None = None
  x_scale: str | None = None  # None | "scalar" | "row"
  transpose_x: bool = False
  transpose_w: bool = False
  transpose_out: bool = False
  quantize: str | None = None
  out_dtype: str | None = None
  tags: frozenset[str] = frozenset({"ci"})
  grad: bool = False
  #: `precision=` of the call. float32 products that name none run at
  #: "highest" (IEEE, held to float32's bound); "default" is TF32 on a GPU,
  #: so such a case stores bf16 to be held to a bound TF32 meets.
  precision: str | None = None
  #: An explicit tiling (`config=`), e.g. a `MosaicConfig` whose steps do
  #: not divide K.
  config: Any = None
  #: Also return w's column sums (`w_column_sum=True`).
  w_column_sum: bool = False
  #: Multiply by this activation's derivative at a random preactivation
  #: (`activation_grad=`), the third positional array.
  activation_grad: str | None = None

  @property
  def name(self) -> str:
    wd = self.w_dtype or self.dtype
    xs = self.batch + ((self.k, self.m) if self.transpose_x else (self.m, self.k))
    ws = self.w_batch + ((self.n, self.k) if self.transpose_w else (self.k, self.n))
    parts = [inputs.describe("x", xs, self.dtype), inputs.describe("w", ws, wd)]
    extras = []
    if self.scale:
      extras.append(f"scale:{self.scale}")
    if self.bias:
      extras.append("bias")
    if self.activation:
      extras.append(self.activation)
    if self.activation_grad:
      extras.append(f"d{self.activation_grad}(z)")
    if self.residual:
      extras.append("residual")
    if self.clamp:
      extras.append(f"clamp{self.clamp}")
    if self.w_scale:
      group = f"/{self.group_size}" if self.group_size else ""
      extras.append(f"w_scale:{self.w_scale}{group}")
    if self.x_scale:
      extras.append(f"x_scale:{self.x_scale}")
    for flag in ("transpose_x", "transpose_w", "transpose_out"):
      if getattr(self, flag):
        extras.append(flag.replace("transpose_", "T"))
    if self.quantize:
      extras.append(f"quantize:{self.quantize}")
    if self.out_dtype:
      extras.append(f"out:{inputs.short_dtype(self.out_dtype)}")
    if self.precision:
      extras.append(f"precision:{self.precision}")
    if self.w_column_sum:
      extras.append("colsum")
    if self.config is not None:
      fields = ("tile_m", "tile_n", "tile_k", "stages")
      extras.append("config:" + "x".join(str(getattr(self.config, f)) for f in fields))
    return " ".join(parts + (["+".join(extras)] if extras else []))


def _random_weights(key, shape, dtype: str) -> jax.Array:
  if dtype in ("int8", "int4"):
    hi = 127 if dtype == "int8" else 7
    return jax.random.randint(key, shape, -hi, hi + 1, jnp.int32).astype(dtype)
  return inputs.normal(key, shape, dtype)


def _positive_scales(key, shape, magnitude: float) -> jax.Array:
  # Random, strictly positive, and about `magnitude` so outputs stay O(1).
  return magnitude * jax.random.uniform(key, shape, jnp.float32, 0.5, 1.5)


def build_case(d: CaseDef, seed: int) -> Case:
  """Materializes a `CaseDef` into a `Case` with deterministic random arrays."""
  keys = inputs.Keys(seed, d.name)
  wd = d.w_dtype or d.dtype
  xs = d.batch + ((d.k, d.m) if d.transpose_x else (d.m, d.k))
  ws = d.w_batch + ((d.n, d.k) if d.transpose_w else (d.k, d.n))
  x = _random_weights(keys.next(), xs, d.dtype)
  w = _random_weights(keys.next(), ws, wd)
  args: list[Any] = [x, w]
  kwargs: dict[str, Any] = {}
  # Keep the accumulator O(1): 1/sqrt(K) for normal weights, 1/(hi*sqrt(K)) for ints.
  w_mag = {"int8": 1 / 64, "int4": 1 / 4}.get(wd, 1.0) / math.sqrt(d.k)
  x_mag = 1 / 64 if d.dtype == "int8" else 1.0
  out_dtype = (jnp.dtype(d.out_dtype) if d.out_dtype
               else reference.default_out_dtype(d.dtype, wd))
  batch = tuple(jnp.broadcast_shapes(d.batch, d.w_batch))
  out_shape = batch + ((d.n, d.m) if d.transpose_out else (d.m, d.n))
  epi = out_dtype if jnp.dtype(out_dtype).itemsize >= 2 else jnp.bfloat16
  if d.activation_grad:
    if d.bias:
      raise ValueError(f"{d.name}: activation_grad takes no bias")
    args.append(inputs.normal(keys.next(), out_shape, epi))
  elif d.residual and not d.bias:
    raise ValueError(f"{d.name}: a residual without a bias is not expressible positionally")
  if d.bias:
    args.append(inputs.normal(keys.next(), (d.n,), epi))
  if d.residual:
    args.append(inputs.normal(keys.next(), out_shape, epi))
  if d.w_scale == "scalar":
    kwargs["w_scale"] = _positive_scales(keys.next(), (), w_mag)
  elif d.w_scale == "channel":
    kwargs["w_scale"] = _positive_scales(keys.next(), (d.n,), w_mag)
  elif d.w_scale == "group":
    kwargs["w_scale"] = _positive_scales(keys.next(), (-(-d.k // d.group_size), d.n), w_mag)
    kwargs["w_group_size"] = d.group_size
  elif wd in ("int8", "int4"):
    raise ValueError(f"{d.name}: integer weights need a w_scale")
  if d.x_scale == "scalar":
    kwargs["x_scale"] = _positive_scales(keys.next(), (), x_mag)
  elif d.x_scale == "row":
    kwargs["x_scale"] = _positive_scales(keys.next(), d.batch + (d.m,), x_mag)
  if d.scale == "scalar":
    kwargs["scale"] = _positive_scales(keys.next(), (), 1.0)
  elif d.scale == "vector":
    kwargs["scale"] = inputs.normal(keys.next(), (d.n,), jnp.float32)
  for key in ("activation", "clamp", "quantize", "out_dtype", "transpose_x",
              "transpose_w", "transpose_out", "w_column_sum", "activation_grad"):
    value = getattr(d, key)
    if value:
      kwargs[key] = value
  if d.config is not None:
    kwargs["config"] = d.config
  if d.precision:
    kwargs["precision"] = d.precision
  elif jnp.dtype(reference.compute_dtype(d.dtype, wd)) == jnp.float32:
    kwargs["precision"] = "highest"
  grad_argnums = ()
  if d.grad:
    grad_argnums = tuple(i for i, a in enumerate(args) if not reference.is_quantized(a.dtype))
  return Case(name=d.name, args=tuple(args), kwargs=kwargs, tags=d.tags,
              grad_argnums=grad_argnums)


_CI = frozenset({"ci"})
_CI_GRAD = frozenset({"ci", "grad"})
#: Column sums of w beside the product (`column_sum_test.py` selects them).
_COLSUM = frozenset({"ci", "column_sum"})
_COLSUM_GRAD = _COLSUM | {"grad"}
#: An activation's derivative at a preactivation (`activation_grad_test.py`).
_DACT = frozenset({"ci", "activation_grad"})
_DACT_GRAD = _DACT | {"grad"}
_BENCH = frozenset({"bench"})
#: Also in `scripts/device_check.sh`'s short table ("device" tag) and its
#: Mosaic GPU / Triton / XLA table ("backends", `scripts/bench_backends.py`).
_DEVICE = frozenset({"bench", "device", "backends"})

#: Every case definition, in display order.
CASE_DEFS: tuple[CaseDef, ...] = (
    # Plain products over awkward shapes and the three float dtypes.
    CaseDef(1, 1, 1),
    CaseDef(1, 64, 17, "bfloat16"),
    CaseDef(7, 129, 33, "bfloat16", bias=True, activation="gelu", tags=_CI_GRAD, grad=True),
    CaseDef(13, 31, 97, "float16", bias=True, residual=True, activation="silu",
            tags=_CI_GRAD, grad=True),
    CaseDef(37, 53, 41, "float32", bias=True, residual=True, activation="gelu_tanh",
            scale="vector", clamp=(-2.0, 2.0), tags=_CI_GRAD, grad=True),
    CaseDef(64, 96, 80, "bfloat16", bias=True, activation="relu", scale="scalar"),
    CaseDef(33, 72, 40, "float32", bias=True, activation="gelu", out_dtype="bfloat16",
            precision="default"),
    CaseDef(16, 40, 24, "float32", activation="sigmoid", batch=(2, 3), bias=True,
            tags=_CI_GRAD, grad=True),
    CaseDef(19, 40, 23, "bfloat16", activation="tanh", batch=(3,), w_batch=(3,),
            transpose_x=True, transpose_w=True, bias=True, residual=True,
            tags=_CI_GRAD, grad=True),
    CaseDef(11, 64, 48, "float32", transpose_out=True, bias=True, residual=True,
            activation="relu", tags=_CI_GRAD, grad=True),
    # Dequantizing prologues.
    CaseDef(9, 96, 40, "bfloat16", w_dtype="int8", w_scale="channel", bias=True,
            activation="gelu"),
    CaseDef(5, 128, 64, "bfloat16", w_dtype="int4", w_scale="group", group_size=32),
    CaseDef(8, 64, 48, "float16", w_dtype="int4", w_scale="channel", transpose_w=True),
    CaseDef(12, 48, 36, "bfloat16", w_dtype="float8_e4m3fn", w_scale="scalar"),
    CaseDef(10, 32, 24, "float8_e4m3fn", w_dtype="float8_e4m3fn", x_scale="row",
            w_scale="channel"),
    CaseDef(6, 80, 20, "int8", w_dtype="int8", x_scale="row", w_scale="channel",
            out_dtype="float32"),
    # Column sums of w: a weight and bias gradient x^T @ dy (ragged K and N
    # against every block), both layouts, a batched w and a fused epilogue.
    CaseDef(37, 83, 41, "float32", transpose_x=True, w_column_sum=True, tags=_COLSUM_GRAD,
            grad=True),
    CaseDef(29, 70, 45, "bfloat16", transpose_x=True, w_column_sum=True,
            tags=_COLSUM_GRAD, grad=True),
    CaseDef(19, 53, 33, "bfloat16", transpose_w=True, bias=True, activation="gelu",
            w_column_sum=True, tags=_COLSUM_GRAD, grad=True),
    CaseDef(13, 40, 23, "float32", batch=(2,), w_batch=(2,), transpose_x=True,
            transpose_w=True, w_column_sum=True, tags=_COLSUM_GRAD, grad=True),
    CaseDef(9, 72, 20, "float16", batch=(3,), bias=True, activation="relu",
            w_column_sum=True, tags=_COLSUM),
    # An activation's derivative at a preactivation z (cuBLASLt's DGELU): an
    # MLP backward's dz = (dy @ w2^T) * act'(z), ragged against every block.
    CaseDef(7, 129, 33, "bfloat16", batch=(2,), activation_grad="gelu", tags=_DACT_GRAD,
            grad=True),
    CaseDef(7, 129, 33, "float32", activation_grad="gelu_tanh", residual=True,
            tags=_DACT_GRAD, grad=True),
    CaseDef(13, 31, 97, "bfloat16", activation_grad="silu", transpose_w=True,
            scale="vector", clamp=(-1.0, 1.0), tags=_DACT_GRAD, grad=True),
    CaseDef(37, 53, 41, "float32", activation_grad="relu", transpose_out=True,
            residual=True, tags=_DACT_GRAD, grad=True),
    CaseDef(11, 40, 23, "bfloat16", activation_grad="tanh", batch=(2,), w_batch=(2,),
            transpose_x=True, out_dtype="float32", tags=_DACT_GRAD, grad=True),
    CaseDef(9, 64, 40, "float16", activation_grad="sigmoid", quantize="int8", tags=_DACT),
    # Quantizing epilogues.
    CaseDef(17, 64, 50, "bfloat16", bias=True, activation="gelu", quantize="int8"),
    CaseDef(9, 32, 40, "float32", residual=True, bias=True, quantize="float8_e4m3fn"),
    # Realistic sizes for benchmarks.
    CaseDef(4096, 4096, 4096, "bfloat16", bias=True, residual=True, activation="gelu",
            tags=_BENCH),
    CaseDef(8192, 8192, 8192, "bfloat16", tags=_BENCH),
    # JAX's hopper_matmul_mgpu benchmark shape.
    CaseDef(4096, 4096, 4096, "bfloat16", tags=frozenset({"backends"})),
    CaseDef(4096, 4096, 4096, "float16", tags=_BENCH),
    CaseDef(4096, 4096, 4096, "float32", tags=_BENCH),
    CaseDef(4096, 4096, 4096, "float32", precision="default", tags=_BENCH),
    # The docs' epilogue case (docs/ops.md): a wide, shallow product whose epilogue traffic
    # (bias, GELU, residual) is what fusing saves.
    CaseDef(8192, 512, 8192, "bfloat16", bias=True, residual=True, activation="gelu",
            tags=_DEVICE),
    CaseDef(16, 8192, 8192, "bfloat16", w_dtype="int8", w_scale="channel", tags=_DEVICE),
    CaseDef(16, 8192, 8192, "bfloat16", w_dtype="int4", w_scale="group", group_size=128,
            tags=_BENCH),
    CaseDef(4096, 4096, 4096, "bfloat16", w_dtype="float8_e4m3fn", w_scale="scalar",
            tags=_BENCH),
    CaseDef(4096, 4096, 11008, "bfloat16", transpose_w=True, activation="silu",
            tags=_BENCH),
    CaseDef(4096, 4096, 4096, "bfloat16", bias=True, residual=True, activation="gelu",
            tags=frozenset({"bench", "grad"}), grad=True),
)


#: Cases of the Mosaic GPU (Hopper) kernel: `validate(..., tags=("mosaic",),
#: target="h200", interpret=True)` runs them in Mosaic GPU's interpret mode.
#: Ragged against the tiles (M and N not multiples of a CTA tile, K of a step
#: in the `tile_k=128` case) but aligned to TMA's swizzle tiles: rows in
#: multiples of 8, columns of 64 16-bit (32 float32) values; what is not goes
#: to the Triton kernel (`guard.mosaic_unsupported_reason`).
_MOSAIC = frozenset({"mosaic"})
_MOSAIC_DEFS: tuple[CaseDef, ...] = (
    CaseDef(136, 192, 192, "bfloat16", bias=True, residual=True, activation="gelu",
            tags=_MOSAIC | {"backends_dry"}, grad=True),
    CaseDef(72, 128, 192, "float16", bias=True, activation="silu", scale="vector",
            clamp=(-2.0, 2.0), tags=_MOSAIC, grad=True),
    CaseDef(136, 128, 192, "float32", bias=True, residual=True, activation="gelu_tanh",
            out_dtype="bfloat16", precision="default", transpose_w=True, tags=_MOSAIC),
    CaseDef(40, 64, 64, "float32", bias=True, activation="relu", tags=_MOSAIC),
    CaseDef(192, 128, 192, "bfloat16", batch=(2,), w_batch=(2,), transpose_x=True,
            transpose_w=True, bias=True, residual=True, activation="tanh", tags=_MOSAIC,
            grad=True),
    CaseDef(24, 64, 128, "bfloat16", batch=(2, 3), bias=True, activation="sigmoid",
            scale="scalar", tags=_MOSAIC, grad=True),
    CaseDef(136, 192, 192, "bfloat16", bias=True, activation="gelu", tags=_MOSAIC,
            config=MosaicConfig(tile_k=128, stages=2)),
    CaseDef(40, 128, 192, "bfloat16", w_dtype="int8", w_scale="channel", bias=True,
            activation="gelu", tags=_MOSAIC),
    CaseDef(40, 128, 192, "float16", w_dtype="int8", w_scale="channel", transpose_w=True,
            tags=_MOSAIC),
    CaseDef(24, 256, 128, "bfloat16", w_dtype="int4", w_scale="group", group_size=64,
            residual=True, bias=True, tags=_MOSAIC),
    CaseDef(72, 128, 192, "bfloat16", w_dtype="float8_e4m3fn", w_scale="scalar",
            tags=_MOSAIC),
    # x converted to w's dtype beside the accumulator (its staging buffer).
    CaseDef(72, 128, 192, "float8_e4m3fn", w_dtype="bfloat16", x_scale="row", bias=True,
            activation="relu", tags=_MOSAIC),
    CaseDef(40, 256, 64, "int8", w_dtype="int8", x_scale="row", w_scale="channel",
            out_dtype="float32", transpose_w=True, tags=_MOSAIC),
    CaseDef(40, 128, 128, "float8_e4m3fn", w_dtype="float8_e4m3fn", x_scale="row",
            w_scale="channel", transpose_w=True, tags=_MOSAIC),
    CaseDef(72, 128, 192, "bfloat16", bias=True, activation="gelu", quantize="int8",
            tags=_MOSAIC),
    CaseDef(40, 64, 128, "float32", residual=True, bias=True, quantize="float8_e4m3fn",
            precision="default", transpose_w=True, tags=_MOSAIC),
)


def cases(tag: str, seed: int) -> Iterator[Case]:
  """Yields the cases carrying `tag`, arrays drawn deterministically from `seed`."""
  for d in CASE_DEFS + _MOSAIC_DEFS:
    if tag in d.tags:
      yield build_case(d, seed)


def _split(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
  names = _POSITIONAL_DACT if kwargs.get("activation_grad") else _POSITIONAL
  if len(args) > len(names):
    raise TypeError(f"matmul case takes at most {len(names)} positional arrays")
  return dict(zip(names, args))


def call(*args: Any, implementation: str | None = None, **kwargs: Any):
  """`OpSpec.fn`: `matmul` with positional (x, w, bias, residual), or (x, w,
  preactivation, residual) with activation_grad."""
  named = _split(args, kwargs)
  x, w = named.pop("x"), named.pop("w")
  return matmul(x, w, implementation=implementation, **named, **kwargs)


def reference_f32(*args: Any, **kwargs: Any):
  """`OpSpec.reference_f32`: the reference at Precision.HIGHEST."""
  named = _split(args, kwargs)
  x, w = named.pop("x"), named.pop("w")
  options = {k: v for k, v in kwargs.items() if k not in _REFERENCE_IGNORES}
  return reference.reference(x, w, precision=jax.lax.Precision.HIGHEST, **named,
                             **options)


def xla_baseline(*args: Any, **kwargs: Any):
  """`OpSpec.baseline`: the call as a user writes it in jnp (see reference)."""
  named = _split(args, kwargs)
  x, w = named.pop("x"), named.pop("w")
  options = {k: v for k, v in kwargs.items() if k not in _IMPL_KEYWORDS}
  return reference.xla_baseline(x, w, **named, **options)


def _bits(dtype) -> int:
  dt = jnp.dtype(dtype)
  return 4 if dt.name in ("int4", "uint4") else 8 * dt.itemsize


def _nbytes(a: Any) -> int:
  return -(-math.prod(a.shape) * _bits(a.dtype) // 8)


def bytes_moved(case: Case) -> int:
  """Bytes the op must read (every array argument) and write (its outputs)."""
  total = sum(_nbytes(a) for a in case.args if a is not None)
  total += sum(_nbytes(v) for v in case.kwargs.values() if hasattr(v, "shape"))
  out = jax.eval_shape(lambda *a: reference_f32(*a, **case.kwargs), *case.args)
  total += sum(_nbytes(o) for o in jax.tree_util.tree_leaves(out))
  return int(total)


def flops(case: Case) -> int:
  """2 * batch * M * N * K (the epilogue's O(M * N) is left out)."""
  x, w = case.args[0], case.args[1]
  tw = case.kwargs.get("transpose_w", False)
  n = w.shape[-2] if tw else w.shape[-1]
  batch = math.prod(jnp.broadcast_shapes(x.shape[:-2], w.shape[:-2]))
  # x holds M x K either way round (transpose_x only swaps which is which).
  return int(2 * batch * x.shape[-2] * x.shape[-1] * n)


# --------------------------------------------------------- sweeps ----


def make_case(*, seed: int, tags=(), grad: bool = False, m: int, k: int, n: int,
              batch: int | tuple[int, ...] | None = None, **options: Any) -> Case:
  """The case at one point: `CaseDef`'s fields (`batch` an int or a tuple)."""
  if isinstance(batch, int):
    batch = (batch,)
  d = CaseDef(m=m, k=k, n=n, batch=tuple(batch or ()), tags=frozenset(tags), grad=grad,
              **options)
  return build_case(d, seed)


SWEEP_PARAMS: tuple[SweepParam, ...] = (
    SweepParam("m", "int", 256), SweepParam("k", "int", 256), SweepParam("n", "int", 256),
    SweepParam("batch", "int", None, optional=True),
    SweepParam("dtype", "dtype", "float32"), SweepParam("grad", "bool", False),
    SweepParam("w_dtype", "dtype", None, optional=True),
    SweepParam("bias", "bool", False), SweepParam("residual", "bool", False),
    SweepParam("activation", "str", None, optional=True),
    SweepParam("scale", "str", None, optional=True),
    SweepParam("w_scale", "str", None, optional=True),
    SweepParam("group_size", "int", None, optional=True),
    SweepParam("x_scale", "str", None, optional=True),
    SweepParam("transpose_x", "bool", False), SweepParam("transpose_w", "bool", False),
    SweepParam("transpose_out", "bool", False),
    SweepParam("quantize", "str", None, optional=True),
    SweepParam("out_dtype", "dtype", None, optional=True),
    SweepParam("w_column_sum", "bool", False),
    SweepParam("activation_grad", "str", None, optional=True))


# ---------------------------------------------------- the audit's call ----

CLOSES = Closes(
    # A separate reduction anchored at a dot: the column sum of an operand the
    # dot also reads (a bias gradient beside its weight gradient).
    kinds=frozenset({"unfused-epilogue", "unfused-prologue", "layout-conflict",
                     "separate-reduction"}),
    anchors=frozenset({"dot"}),
    epilogues=frozenset({"bias", "scale", "activation", "residual", "clamp",
                         "cast", "quantize", "transpose", "column_sum",
                         "activation_grad"}),
    prologues=frozenset({"cast", "dequantize", "scale", "transpose"}),
    activations=frozenset({"relu", "gelu", "gelu_tanh", "silu", "sigmoid",
                           "tanh", "identity"}),
    keywords=(("bias", "bias"), ("activation", "activation"),
              ("residual", "residual"), ("cast", "out_dtype"),
              ("column_sum", "w_column_sum"), ("activation_grad", "activation_grad")),
    # Its custom VJP keeps aux = x @ w for the activation's derivative.
    stores_result=True)


def _dot_call(anchor) -> tuple[dict, list, tuple[int, ...]] | None:
  """x/w arrays, options and result dims of the matmul the audit read."""
  if anchor is None:
    return None
  lhs, rhs = anchor.lhs, anchor.rhs
  options = []
  if anchor.lhs_contracting is not None:  # a dot (a library call has none)
    nb = len(anchor.lhs_batch)
    if tuple(anchor.lhs_batch) != tuple(range(nb)) or \
        tuple(anchor.rhs_batch) != tuple(range(nb)):
      return None  # batch dimensions that are not leading: no call to write
    if anchor.lhs_contracting and anchor.lhs_contracting[0] == len(lhs.dims) - 2:
      options.append(("transpose_x", "True", True))
    if anchor.rhs_contracting and anchor.rhs_contracting[0] == len(rhs.dims) - 1:
      options.append(("transpose_w", "True", True))
  arrays = {"x": (lhs.dtype, tuple(lhs.dims)), "w": (rhs.dtype, tuple(rhs.dims))}
  return arrays, options, tuple(anchor.result)


def _column_sum_call(facts: CallFacts) -> Call | None:
  """`matmul(x, dy, transpose_x=True, w_column_sum=True)`: the weight
  gradient x^T @ dy and the bias gradient sum(dy, 0) in one pass over dy (the
  boundary), written over the tokens as a dense layer's backward sums them,
  however XLA batched or transposed its dot."""
  mm = facts.matmul
  if mm is None or mm.lhs_contracting is None:
    return None
  bdims = tuple(facts.boundary.dims)
  sides = ((mm.lhs, (*mm.lhs_contracting, *mm.lhs_batch)),
           (mm.rhs, (*mm.rhs_contracting, *mm.rhs_batch)))
  size = math.prod(bdims)
  for i, (spec, summed) in enumerate(sides):
    tokens = math.prod(spec.dims[a] for a in summed)
    if math.prod(spec.dims) != size or not tokens:
      continue
    other = sides[1 - i][0]
    k_in, n = math.prod(other.dims) // tokens, size // tokens
    arrays = (("x", other.dtype, (tokens, k_in), True),
              ("dy", facts.boundary.dtype, (tokens, n), True))
    options = (("transpose_x", "True", True), ("w_column_sum", "True", True))
    return Call("matmul", arrays, options,
                f"({facts.boundary.dtype}[{k_in},{n}], f32[{n}])")
  return None


def suggest(facts: CallFacts) -> Call | None:
  """`matmul` closing an epilogue (the work as keywords; an activation's
  derivative with its `preactivation`), a prologue (the operand in its source
  dtype, with its scale), or a column sum of an operand (`w_column_sum`)."""
  if "column_sum" in facts.ops:
    return _column_sum_call(facts)
  found = _dot_call(facts.matmul)
  if found is None:
    return None
  arrays, options, rdims = found
  bdt, bdims = facts.boundary.dtype, tuple(facts.boundary.dims)
  if facts.kind == "unfused-epilogue":
    rdims = rdims or bdims
    n = rdims[-1]
    out = [("x", *arrays["x"], True), ("w", *arrays["w"], True)]
    result_dt = bdt
    for item in facts.ops:
      base, _, arg = item.partition(":")
      if base == "bias":
        out.append(("bias", bdt, (n,), False))
      elif base == "scale":
        options.append(("scale", "scale", 1.0))
      elif base == "residual":
        out.append(("residual", bdt, rdims, False))
      elif base == "activation" and arg:
        options.append(("activation", repr(arg), arg))
      elif base == "activation_grad" and arg:
        # The derivative at the activation's saved input, of the result's shape.
        out.append(("preactivation", bdt, rdims, False))
        options.append(("activation_grad", repr(arg), arg))
      elif base == "clamp":
        options.append(("clamp", "(lo, hi)", (-1.0, 1.0)))
      elif base == "cast" and arg:
        name = facts.numpy_name(arg)
        options.append(("out_dtype", f"jnp.{name}", name))
        result_dt = arg
      elif base == "quantize" and arg:
        name = facts.numpy_name(arg)
        options.append(("quantize", repr(name), name))
    return Call("matmul", tuple(out), tuple(options),
                f"{result_dt}[{','.join(map(str, rdims))}]")
  if facts.kind == "unfused-prologue":
    src = [a for a in facts.sources if tuple(a.dims) == bdims]
    side = "w" if arrays["w"][1] == bdims and arrays["x"][1] != bdims else "x"
    if src:
      arrays[side] = (src[0].dtype, bdims)
    out = [("x", *arrays["x"], True), ("w", *arrays["w"], True)]
    if any(i.startswith("dequantize") for i in facts.ops):
      options.append((f"{side}_scale", f"{side}_scale", 1.0))
    return Call("matmul", tuple(out), tuple(options),
                f"{bdt if side == 'x' else arrays['x'][0]}[{','.join(map(str, rdims))}]")
  return None


SPEC = OpSpec(
    name="matmul",
    fn=call,
    reference_f32=reference_f32,
    cases=cases,
    bytes_moved=bytes_moved,
    flops=flops,
    baseline=xla_baseline,
    api=matmul,
    closes=CLOSES,
    sweep_params=SWEEP_PARAMS,
    make_case=make_case,
    suggest=suggest,
)
