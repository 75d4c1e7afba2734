"""Mosaic TPU matmul: the forward kernel with its fused epilogue, for a TPU.

The canonical TPU pipeline (shared facts in `pallas_kernels._src.tpu`): a grid
(batch, M / bm, N / bn, K / bk) with K last and "arbitrary", the others
"parallel"; BlockSpecs bring an x [bm, bk] and a w [bk, bn] block into VMEM
(double-buffered by Pallas) and the MXU adds their product into a float32
[bm, bn] VMEM scratch accumulator, zeroed at k == 0. At the last k the
epilogue runs on the accumulator in float32, in the order of `api.matmul`
(scale, bias, activation, residual, clamp), and the tile is cast and stored
once; the output block's index ignores k, so it stays in VMEM across the K
steps and is written back once. With `activation_grad` the activation step
multiplies by the derivative at a preactivation block, brought in like the
residual's.

Prologue: transposed operands are read in place (the BlockSpec picks the
stored block, `dot_general` contracts its other axis); float32/bfloat16
operands of different dtypes are cast to the compute dtype in VMEM.
transpose_out computes (x w)^T = w^T x^T: operands swapped, bias and scale
applied per row, the residual and preactivation read as stored. Without w
batch dims, x's batch folds into M (one bigger matmul). The dequantizing
prologue, the quantizing epilogue and w's column sums have no TPU kernel
(`guard.tpu_unsupported_reason`).

Tiles: each of bm, bn, bk is the whole dimension when it fits a tile (a full
dimension needs no (8, 128) alignment), else a multiple of 128 lanes (which
is also a multiple of every dtype's sublane tile). Ragged M and N edges are
Pallas' padded edge blocks: their garbage rows and columns only reach output
elements that are never written back. K cannot be ragged: garbage would be
summed into every output, so K is zero-padded in the wrapper to a multiple of
bk (bk picked to divide K rounded to lanes where it can).

Every input allows input fusion (`tpu_lib.compiler_params`): XLA may read
the K padding, a layout copy of x or, in the backward, the elementwise dAct
that makes the gemms' g inside the kernel rather than materialize it first.
(Compiled for v5e, `hlo-audit example --swap`'s training step keeps XLA's
101 launches with it, and took 104 without.)

Nothing here claims a speed: validated in TPU interpret mode and compiled for
v5e and v6e, never run on a TPU.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels._src import backend
from pallas_kernels._src import tpu as tpu_lib
from pallas_kernels._src.ops.matmul import kernel

_F32 = jnp.float32
#: Largest tile edge the heuristic picks (a multiple of `tpu_lib.LANES`);
#: `plan` halves it where the blocks would miss the VMEM budget.
TILE = 512
#: float32 [bm, bn] values beside the accumulator that Mosaic may hold in
#: VMEM at once: the dot's product, y and the activation's intermediates.
#: Calibrated on v5e against the widest epilogue (scale, bias, gelu,
#: residual, clamp, aux): 512-cubed float32 tiles need 20.1 MiB, 512x512x256
#: with a transposed x 16.1 MiB; this count covers both.
_EPILOGUE_TEMPS = 7
#: Flops per output element of each activation as `kernel.activation_fn`
#: writes it (the erf of "gelu" is a degree-13 rational function), and
#: whether it takes one transcendental (exp or tanh) per element.
_ACTIVATION_FLOPS = {"identity": 0, "relu": 1, "gelu": 29, "gelu_tanh": 9, "silu": 4,
                     "sigmoid": 3, "tanh": 1}
_TRANSCENDENTAL = frozenset({"gelu_tanh", "silu", "sigmoid", "tanh"})
#: The derivatives as `kernel.activation_grad` writes them: gelu's adds an exp.
_GRAD_TRANSCENDENTAL = _TRANSCENDENTAL | {"gelu"}


@dataclasses.dataclass(frozen=True)
class Geometry:
  """The kernel's problem: out [batch, rows, cols] = lhs @ rhs over k."""

  batch: int
  rows: int
  cols: int
  k: int
  #: transpose_out: lhs is the logical w^T, rhs the logical x^T.
  swap: bool
  #: x's batch folded into rows (w has no batch dims).
  fold: bool


def geometry(x_shape, w_shape, transpose_x: bool, transpose_w: bool,
             transpose_out: bool) -> Geometry:
  """How `matmul_forward` lays out a call with these stored shapes."""
  m = x_shape[-1] if transpose_x else x_shape[-2]
  k = x_shape[-2] if transpose_x else x_shape[-1]
  n = w_shape[-2] if transpose_w else w_shape[-1]
  lhs, rhs, lhs_t = (w_shape, x_shape, not transpose_w) if transpose_out else (
      x_shape, w_shape, transpose_x)
  rows, cols = (n, m) if transpose_out else (m, n)
  fold = math.prod(rhs[:-2]) == 1 and not lhs_t and len(lhs) > 2
  if fold:
    return Geometry(1, rows * math.prod(lhs[:-2]), cols, k, transpose_out, True)
  batch = math.prod(jnp.broadcast_shapes(tuple(x_shape[:-2]), tuple(w_shape[:-2])))
  return Geometry(batch, rows, cols, k, transpose_out, False)


@dataclasses.dataclass(frozen=True)
class Footprint:
  """What a launch holds in VMEM besides its tiles' shapes."""

  #: dtypes of the kernel's lhs and rhs (x and w; w and x for transpose_out).
  lhs_dtype: Any
  rhs_dtype: Any
  compute_dtype: Any
  out_dtype: Any
  residual_dtype: Any = None
  #: The pre-epilogue accumulator stored for the backward, if any.
  aux_dtype: Any = None
  #: [N] epilogue vectors (scale, bias).
  vectors: int = 0
  #: The lhs block is stored [bk, bm] (Mosaic transposes it for the MXU).
  lhs_t: bool = False
  #: The preactivation block `activation_grad` reads, if any.
  preactivation_dtype: Any = None


def footprint(x: Any, w: Any, geo: Geometry, *, transpose_x: bool, transpose_w: bool,
              out_dtype, residual_dtype=None, aux_dtype=None, vectors: int = 0,
              preactivation_dtype=None) -> Footprint:
  """The `Footprint` of a call on x and w (arrays or ShapeDtypeStructs)."""
  lhs, rhs = (w, x) if geo.swap else (x, w)
  return Footprint(lhs.dtype, rhs.dtype,
                   jnp.promote_types(x.dtype, w.dtype), out_dtype, residual_dtype,
                   aux_dtype, vectors, (not transpose_w) if geo.swap else transpose_x,
                   preactivation_dtype)


@dataclasses.dataclass(frozen=True)
class Plan:
  """Tiles of one launch."""

  bm: int
  bn: int
  bk: int
  #: K zero-padded to a multiple of bk.
  k_padded: int


def _round_up(v: int, multiple: int) -> int:
  return -(-v // multiple) * multiple


def _tiles(geo: Geometry, cap_m: int, cap_n: int, cap_k: int) -> Plan:
  bm = geo.rows if geo.rows <= cap_m else cap_m
  bn = geo.cols if geo.cols <= cap_n else cap_n
  if geo.k <= cap_k:
    return Plan(bm, bn, geo.k, geo.k)
  kp = _round_up(geo.k, tpu_lib.LANES)
  bk = cap_k
  while kp % bk:  # The largest halving of the cap that divides K: no padding past lanes.
    bk //= 2
  if bk < tpu_lib.LANES:
    bk = cap_k
  return Plan(bm, bn, bk, _round_up(geo.k, bk))


def plan(geo: Geometry, fp: Footprint, requested: tuple[int, int, int] | None = None) -> Plan:
  """Tiles for `geo`; a dimension that fits its tile is one block.

  Args:
    geo: the launch's problem.
    fp: what its blocks hold.
    requested: a caller's (block_m, block_n, block_k), rounded up to whole
      lanes and taken as is (the guard says when it misses the budget).
      None: `TILE` each, the largest cap halved (K first) until the blocks
      fit the VMEM budget; 128-lane tiles always do.
  """
  if requested is not None:
    return _tiles(geo, *(_round_up(r, tpu_lib.LANES) for r in requested))
  caps = [TILE] * 3
  p = _tiles(geo, *caps)
  while vmem_bytes(p, fp) > tpu_lib.VMEM_BUDGET_BYTES and max(caps) > tpu_lib.LANES:
    i = max((2, 1, 0), key=lambda d: caps[d])  # Ties go to K, then N.
    caps[i] //= 2
    p = _tiles(geo, *caps)
  return p


def vmem_bytes(p: Plan, fp: Footprint) -> int:
  """VMEM a launch needs, erring high: its double-buffered blocks (lhs, rhs,
  out, residual, preactivation, aux, the vectors: [1, bn], or [bm, 1]
  lane-padded when swapped: counted as the larger), the loaded operand
  values, the float32 accumulator and epilogue values, Mosaic's transposed
  copy of a transposed lhs block, and a compute-dtype copy of an operand cast
  in VMEM."""
  tb = tpu_lib.tile_bytes
  blocks = (tb(p.bm, p.bk, fp.lhs_dtype) + tb(p.bk, p.bn, fp.rhs_dtype)
            + tb(p.bm, p.bn, fp.out_dtype))
  for dt in (fp.residual_dtype, fp.preactivation_dtype, fp.aux_dtype):
    if dt is not None:
      blocks += tb(p.bm, p.bn, dt)
  blocks += fp.vectors * max(tb(1, p.bn, _F32), tb(p.bm, 1, _F32))
  # The loaded lhs and rhs values, the accumulator and the epilogue's values.
  need = (tpu_lib.BUFFERS * blocks + tb(p.bm, p.bk, fp.lhs_dtype)
          + tb(p.bk, p.bn, fp.rhs_dtype) + (1 + _EPILOGUE_TEMPS) * tb(p.bm, p.bn, _F32))
  if fp.lhs_t:
    need += tb(p.bm, p.bk, fp.compute_dtype)
  for dt, shape in ((fp.lhs_dtype, (p.bm, p.bk)), (fp.rhs_dtype, (p.bk, p.bn))):
    if jnp.dtype(dt) != jnp.dtype(fp.compute_dtype):
      need += tb(*shape, fp.compute_dtype)
  return need


def vmem_reason(p: Plan, fp: Footprint) -> str | None:
  """Why `p`'s blocks do not fit the VMEM budget of a TPU kernel, or None."""
  need = vmem_bytes(p, fp)
  if need > tpu_lib.VMEM_BUDGET_BYTES:
    return (f"tiles bm={p.bm} bn={p.bn} bk={p.bk} need {need / 2**20:.1f} MiB of VMEM, "
            f"over the {tpu_lib.VMEM_BUDGET_BYTES // 2**20} MiB budget of a TPU kernel")
  return None


def dot_precision(name: str, compute_dtype) -> jax.lax.Precision:
  """The in-kernel dot's precision: Mosaic lowers DEFAULT and HIGHEST (fp32
  contract precision, float32 operands only) alone, so HIGH rounds up to
  HIGHEST and 16-bit operands (exact products either way) take DEFAULT."""
  if jnp.dtype(compute_dtype) != jnp.dtype(_F32):
    return jax.lax.Precision.DEFAULT
  return jax.lax.Precision.HIGHEST if name == "HIGH" else jax.lax.Precision[name]


def _kernel(*refs, lhs_t: bool, rhs_t: bool, n_k: int, compute_dtype, precision,
            activation: str, clamp, has_scale: bool, has_bias: bool, has_residual: bool,
            save_aux: bool, activation_grad: str | None = None):
  refs = list(refs)
  a_ref = refs.pop(0)
  b_ref = refs.pop(0)
  s_ref = refs.pop(0) if has_scale else None
  bias_ref = refs.pop(0) if has_bias else None
  r_ref = refs.pop(0) if has_residual else None
  z_ref = refs.pop(0) if activation_grad else None
  o_ref = refs.pop(0)
  aux_ref = refs.pop(0) if save_aux else None
  acc_ref = refs.pop(0)
  assert not refs
  k = pl.program_id(3)

  @pl.when(k == 0)
  def _():
    acc_ref[...] = jnp.zeros_like(acc_ref)

  acc_ref[...] += jax.lax.dot_general(
      a_ref[...].astype(compute_dtype), b_ref[...].astype(compute_dtype),
      (((0,) if lhs_t else (1,), (1,) if rhs_t else (0,)), ((), ())),
      precision=precision, preferred_element_type=_F32)

  @pl.when(k == n_k - 1)
  def _():
    acc = acc_ref[...]
    if aux_ref is not None:
      aux_ref[...] = acc.astype(aux_ref.dtype)
    y = acc
    # Vectors are [1, bn] (per column) or [bm, 1] (per row, transpose_out):
    # either broadcasts against the tile.
    if s_ref is not None:
      y = y * s_ref[...].astype(_F32)
    if bias_ref is not None:
      y = y + bias_ref[...].astype(_F32)
    if z_ref is not None:
      y = y * kernel.activation_grad(activation_grad, z_ref[...].astype(_F32))
    else:
      y = kernel.activation_fn(activation, y)
    if r_ref is not None:
      y = y + r_ref[...].astype(_F32)
    if clamp is not None:
      y = kernel.clamp_values(y, clamp)
    o_ref[...] = y.astype(o_ref.dtype)


def _to3(a: jax.Array, batch_shape: tuple[int, ...]) -> tuple[jax.Array, bool]:
  """[*b, r, c] -> ([B or 1, r, c], batched?): a partly broadcast batch is
  materialized (index maps pick batch b or 0, nothing in between)."""
  if math.prod(a.shape[:-2]) == 1:
    return a.reshape((1,) + a.shape[-2:]), False
  if tuple(a.shape[:-2]) != tuple(batch_shape):
    a = jnp.broadcast_to(a, tuple(batch_shape) + a.shape[-2:])
  return a.reshape((-1,) + a.shape[-2:]), True


def _pad_k(a: jax.Array, axis: int, kp: int) -> jax.Array:
  """Zeros appended along K: a ragged K block would sum garbage."""
  extra = kp - a.shape[axis]
  if not extra:
    return a
  pads = [(0, 0)] * a.ndim
  pads[axis] = (0, extra)
  return jnp.pad(a, pads)


def matmul_forward(x: jax.Array, w: jax.Array, *, interpret: bool, compute_dtype, out_dtype,
                   activation: str = "identity", scale: jax.Array | None = None,
                   bias: jax.Array | None = None, residual: jax.Array | None = None,
                   clamp: tuple[float | None, float | None] | None = None,
                   transpose_x: bool = False, transpose_w: bool = False,
                   transpose_out: bool = False, save_aux: bool = False, aux_dtype=_F32,
                   precision: str = "DEFAULT",
                   requested: tuple[int, int, int] | None = None,
                   activation_grad: str | None = None,
                   preactivation: jax.Array | None = None) -> kernel.ForwardOutputs:
  """The forward kernel on validated operands (`guard.tpu_unsupported_reason`
  accepted the call); arguments as `kernel.matmul_forward`'s, scale and bias
  [N], `requested` a caller's (block_m, block_n, block_k). aux comes back in
  the logical [..., M, N] orientation."""
  geo = geometry(x.shape, w.shape, transpose_x, transpose_w, transpose_out)
  p = plan(geo, footprint(
      x, w, geo, transpose_x=transpose_x, transpose_w=transpose_w, out_dtype=out_dtype,
      residual_dtype=None if residual is None else residual.dtype,
      aux_dtype=aux_dtype if save_aux else None,
      vectors=(scale is not None) + (bias is not None),
      preactivation_dtype=None if preactivation is None else preactivation.dtype), requested)
  if geo.swap:
    a, b, a_t, b_t = w, x, not transpose_w, not transpose_x
  else:
    a, b, a_t, b_t = x, w, transpose_x, transpose_w
  batch_shape = tuple(jnp.broadcast_shapes(tuple(x.shape[:-2]), tuple(w.shape[:-2])))
  if geo.fold:
    a3, a_batched = a.reshape(1, geo.rows, geo.k), False
    b3, b_batched = b.reshape((1,) + b.shape[-2:]), False
  else:
    a3, a_batched = _to3(a, batch_shape)
    b3, b_batched = _to3(b, batch_shape)
  a3 = _pad_k(a3, 1 if a_t else 2, p.k_padded)
  b3 = _pad_k(b3, 2 if b_t else 1, p.k_padded)

  def pick(batched: bool):
    return (lambda bb: bb) if batched else (lambda bb: 0)

  ab, bb_ = pick(a_batched), pick(b_batched)
  if a_t:
    a_spec = pl.BlockSpec((None, p.bk, p.bm), lambda bb, i, j, kk: (ab(bb), kk, i))
  else:
    a_spec = pl.BlockSpec((None, p.bm, p.bk), lambda bb, i, j, kk: (ab(bb), i, kk))
  if b_t:
    b_spec = pl.BlockSpec((None, p.bn, p.bk), lambda bb, i, j, kk: (bb_(bb), j, kk))
  else:
    b_spec = pl.BlockSpec((None, p.bk, p.bn), lambda bb, i, j, kk: (bb_(bb), kk, j))
  tile = pl.BlockSpec((None, p.bm, p.bn), lambda bb, i, j, kk: (bb, i, j))
  # [N] vectors run along the output's columns, or its rows when swapped.
  if geo.swap:
    vec_shape, vec_spec = (geo.rows, 1), pl.BlockSpec((p.bm, 1), lambda bb, i, j, kk: (i, 0))
  else:
    vec_shape, vec_spec = (1, geo.cols), pl.BlockSpec((1, p.bn), lambda bb, i, j, kk: (0, j))

  inputs, in_specs = [a3, b3], [a_spec, b_spec]
  for v in (scale, bias):
    if v is not None:
      inputs.append(v.reshape(vec_shape))
      in_specs.append(vec_spec)
  if residual is not None:
    inputs.append(residual.reshape(geo.batch, geo.rows, geo.cols))
    in_specs.append(tile)
  if activation_grad:
    inputs.append(preactivation.reshape(geo.batch, geo.rows, geo.cols))
    in_specs.append(tile)
  out_shape = [jax.ShapeDtypeStruct((geo.batch, geo.rows, geo.cols), jnp.dtype(out_dtype))]
  if save_aux:
    out_shape.append(jax.ShapeDtypeStruct((geo.batch, geo.rows, geo.cols),
                                          jnp.dtype(aux_dtype)))

  grid = (geo.batch, pl.cdiv(geo.rows, p.bm), pl.cdiv(geo.cols, p.bn), p.k_padded // p.bk)
  elems = geo.batch * geo.rows * geo.cols
  # A derivative is priced as its activation plus the multiply.
  act_flops = (_ACTIVATION_FLOPS[activation_grad] + 1 if activation_grad
               else _ACTIVATION_FLOPS[activation])
  transcendental = (activation_grad in _GRAD_TRANSCENDENTAL if activation_grad
                    else activation in _TRANSCENDENTAL)
  epilogue = (act_flops + (scale is not None) + (bias is not None)
              + (residual is not None) + (0 if clamp is None else
                                          sum(c is not None for c in clamp)))
  # Bytes as the tiled schedule moves them: each lhs block is read once per
  # column tile, each rhs block once per row tile.
  moved = (a3.size * a3.dtype.itemsize * grid[2] * (1 if a_batched else geo.batch)
           + b3.size * b3.dtype.itemsize * grid[1] * (1 if b_batched else geo.batch)
           + sum(v.size * v.dtype.itemsize for v in inputs[2:])
           + sum(math.prod(s.shape) * s.dtype.itemsize for s in out_shape))
  body = functools.partial(
      _kernel, lhs_t=a_t, rhs_t=b_t, n_k=grid[3], compute_dtype=jnp.dtype(compute_dtype),
      precision=dot_precision(precision, compute_dtype), activation=activation, clamp=clamp,
      has_scale=scale is not None, has_bias=bias is not None,
      has_residual=residual is not None, save_aux=save_aux, activation_grad=activation_grad)
  with backend.kernel_scope("matmul"):
    outs = pl.pallas_call(
        body,
        grid=grid,
        in_specs=in_specs,
        out_specs=[tile] * len(out_shape),
        out_shape=out_shape,
        scratch_shapes=[pltpu.VMEM((p.bm, p.bn), _F32)],
        interpret=tpu_lib.interpret_params(interpret),
        compiler_params=tpu_lib.compiler_params(4, sequential=1,
                                                fusible_inputs=len(inputs)),
        cost_estimate=pl.CostEstimate(
            flops=2 * elems * p.k_padded + epilogue * elems,
            transcendentals=elems if transcendental else 0,
            bytes_accessed=moved),
        name="matmul_tpu",
    )(*inputs)
  m = x.shape[-1] if transpose_x else x.shape[-2]
  n = w.shape[-2] if transpose_w else w.shape[-1]
  stored = batch_shape + ((n, m) if geo.swap else (m, n))
  out = outs[0].reshape(stored)
  aux = None
  if save_aux:
    aux = outs[1].reshape(stored)
    if geo.swap:
      aux = jnp.swapaxes(aux, -1, -2)
  return kernel.ForwardOutputs(out, None, aux, None)
