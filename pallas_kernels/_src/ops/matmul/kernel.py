"""Pallas matmul kernels: fused prologue/epilogue forward, fused dAct+dBias backward.

Forward (`matmul_forward`). The grid is one axis of `batch * Mb * Nb` programs
(Mb = cdiv(M, block_m), Nb = cdiv(N, block_n)), ordered in L2-friendly groups
of `group_m` row tiles. A program owns one [block_m, block_n] output tile; its
BlockSpecs hand it x's [block_m, Kp] row panel and w's [Kp, block_n] column
panel (Kp = K rounded up to block_k), which it walks in `block_k` steps with a
`fori_loop` and an f32 accumulator in registers. A grid axis over K with a
scratch accumulator is not used: Triton runs programs in parallel, so there is
no sequential grid axis to carry a scratch accumulator across (the Mosaic TPU
idiom), while the in-kernel loop works in interpret mode and Triton alike.

Per K step: load the x and w tiles (masked only where a dimension is ragged),
convert them to the compute dtype in registers (the dequantizing prologue;
int8/int4/fp8 values are exact in bf16/f16/f32), and accumulate
`dot(x, w, preferred_element_type=f32)`; a per-group weight scale multiplies
that step's f32 partial product (every K step lies inside one group). After the
loop, per-row x scales and per-column w scales multiply the accumulator (exact
in f32, and cheaper than scaling tiles). Transposed operands are read in place:
the tile is loaded in its stored orientation and the dot contracts the other
axis (Triton transposes in registers/shared memory, nothing is materialized).

The epilogue then runs on the accumulator in f32 in the documented order
(scale, bias, activation, residual, clamp) and the tile is stored once: cast
to out_dtype, or quantized per row when the tile spans the whole row, and
transposed in registers when the output is stored transposed. When asked
(for the backward pass) the tile also stores `aux`, the accumulator before the
epilogue. With `activation_grad` (cuBLASLt's DGELU) the activation step
multiplies by the derivative at the preactivation z instead: z's tile is
loaded like the residual's, in the output's stored orientation, and the same
`activation_grad` the backward kernel uses turns it into act'(z).

Column sums of w (`column_sum`, cuBLASLt's BGRADB): each K step also adds the
w tile it loaded, summed over K, into an f32 [block_n] row, so a weight
gradient x^T @ dy yields dy's bias gradient without a second read of dy. The
ragged K tail is already zero: the masked load fills it. Every program of a
column tile walks the whole of K over the same w panel, so all of them hold
the identical, complete sum: the programs of row tile 0 (and, for an
unbatched w, batch 0) store it, one writer per output block and no partial
sums to combine. The other programs' sums are dead work of one add per w
element per row tile (1/block_m of the dot's).

Backward (`dact_bgrad`): one program owns `block_n` columns and a chunk of
rows, recomputes pre = aux * scale + bias per sub-tile, forms
g = dy * [lo <= z <= hi] * act'(pre) (z = act(pre) + residual, the clamp's
input) and writes g times the per-column / per-row multipliers the matmul
gradients need, while it sums g and g * aux over its rows into f32 partial rows
of the bias and scale gradients (one pass over dy, like cuBLASLt's
DGELU_BGRAD). dx and dw are then this module's forward matmul with transpose
flags (see `vjp.py`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src import gpu as tiles
from pallas_kernels._src.ops import quantize as quant
from pallas_kernels._src.ops.matmul import config as config_lib
from pallas_kernels._src.ops.matmul import gpu
from pallas_kernels._src.ops.matmul.config import BackwardConfig, Config

_F32 = jnp.float32

# --------------------------------------------------------------------------
# Element-wise epilogue math (Triton-lowerable: no erf, no round primitives).
# --------------------------------------------------------------------------

# Rational approximation of erf on [-4, 4] (x * P(x^2) / Q(x^2)), the form
# XLA/Eigen use for float32: max abs error ~5e-7 against the exact erf.
_ERF_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
          -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
          -1.60960333262415e-02)
_ERF_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
          -7.37332916720468e-03, -1.42647390514189e-02)
_SQRT_HALF = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327
_SQRT_2_OVER_PI = 0.7978845608028654
_GELU_TANH_C = 0.044715


def erf(v: jax.Array) -> jax.Array:
  """float32 erf without `lax.erf` (which Pallas' Triton lowering lacks)."""
  v = jnp.clip(v, -4.0, 4.0)  # erf(+-4) == +-1 in float32.
  v2 = v * v
  # Horner's rule from the first product: no splat of a leading coefficient
  # (Mosaic GPU materializes one per element).
  p = v2 * _ERF_P[0] + _ERF_P[1]
  for c in _ERF_P[2:]:
    p = p * v2 + c
  q = v2 * _ERF_Q[0] + _ERF_Q[1]
  for c in _ERF_Q[2:]:
    q = q * v2 + c
  return v * p / q


def _sigmoid(v):
  return 1.0 / (1.0 + jnp.exp(-v))


def activation_fn(name: str, v: jax.Array) -> jax.Array:
  """Activation `name` on float32 v, written with Triton-lowerable ops."""
  if name == "identity":
    return v
  if name == "relu":
    return jnp.maximum(v, 0.0)
  if name == "gelu":
    return 0.5 * v * (1.0 + erf(v * _SQRT_HALF))
  if name == "gelu_tanh":
    return 0.5 * v * (1.0 + jnp.tanh(_SQRT_2_OVER_PI * (v + _GELU_TANH_C * v * v * v)))
  if name == "silu":
    return v * _sigmoid(v)
  if name == "sigmoid":
    return _sigmoid(v)
  if name == "tanh":
    return jnp.tanh(v)
  raise ValueError(f"unknown activation {name!r}")


def activation_grad(name: str, v: jax.Array) -> jax.Array:
  """d act(v) / dv on float32 v (relu: 0 at v == 0, as jax.nn.relu)."""
  if name == "identity":
    return jnp.ones_like(v)
  if name == "relu":
    return jnp.where(v > 0.0, 1.0, 0.0).astype(v.dtype)
  if name == "gelu":
    return 0.5 * (1.0 + erf(v * _SQRT_HALF)) + v * _INV_SQRT_2PI * jnp.exp(-0.5 * v * v)
  if name == "gelu_tanh":
    t = jnp.tanh(_SQRT_2_OVER_PI * (v + _GELU_TANH_C * v * v * v))
    du = _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_TANH_C * v * v)
    return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * du
  if name == "silu":
    s = _sigmoid(v)
    return s * (1.0 + v * (1.0 - s))
  if name == "sigmoid":
    s = _sigmoid(v)
    return s * (1.0 - s)
  if name == "tanh":
    t = jnp.tanh(v)
    return 1.0 - t * t
  raise ValueError(f"unknown activation {name!r}")


def clamp_values(v, clamp):
  """`v` within `clamp`'s (lo, hi), a None side open (both backends' epilogue)."""
  lo, hi = clamp
  if lo is not None:
    v = jnp.maximum(v, lo)
  if hi is not None:
    v = jnp.minimum(v, hi)
  return v


def _in_clamp_range(z, clamp):
  lo, hi = clamp
  ok = None
  if lo is not None:
    ok = z >= lo
  if hi is not None:
    ok = (z <= hi) if ok is None else ok & (z <= hi)
  return ok


# --------------------------------------------------------------------------
# Masked tile access.
# --------------------------------------------------------------------------



# --------------------------------------------------------------------------
# Forward kernel.
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Forward:
  """Static description of one forward launch (3-D operands, batch first)."""

  m: int
  n: int
  k: int
  batch: int
  x_batched: bool
  w_batched: bool
  transpose_x: bool
  transpose_w: bool
  transpose_out: bool
  has_row_scale: bool
  has_col_scale: bool
  group_size: int | None
  has_scale: bool
  has_bias: bool
  has_residual: bool
  activation: str
  clamp: tuple[float | None, float | None] | None
  compute_dtype: str
  quantize: str | None
  save_aux: bool
  poison: bool
  interpret: bool
  cfg: Config
  #: `jax.lax.Precision` name of the dot ("DEFAULT" -> TF32 for f32 on GPU).
  precision: str = "HIGHEST"
  #: Also store the column sums of w (summed over K) per w batch.
  column_sum: bool = False
  #: Multiply by this activation's derivative at a preactivation tile instead
  #: of applying `activation` (None: the activation step as usual).
  activation_grad: str | None = None

  @property
  def mb(self) -> int:
    return pl.cdiv(self.m, self.cfg.block_m)

  @property
  def nb(self) -> int:
    return pl.cdiv(self.n, self.cfg.block_n)

  @property
  def kp(self) -> int:
    return pl.cdiv(self.k, self.cfg.block_k) * self.cfg.block_k


def tile_coords(pid, mb: int, nb: int, group_m: int, batch: int):
  """(batch, row tile, column tile) of program `pid`, with L2 swizzling.

  Programs run in groups of `group_m` row tiles: within a group, consecutive
  programs walk down the rows of one column tile, so the w panel they share
  stays in L2 (the ordering of Triton's matmul tutorial).
  """
  tiles = mb * nb
  if batch > 1:
    b, t = jax.lax.div(pid, tiles), jax.lax.rem(pid, tiles)
  else:
    b, t = 0, pid
  if group_m > 1 and mb > 1 and nb > 1:
    width = group_m * nb
    first = jax.lax.div(t, width) * group_m
    size = jnp.minimum(mb - first, group_m)
    local = jax.lax.rem(t, width)
    i = first + jax.lax.rem(local, size)
    j = jax.lax.div(local, size)
  else:
    i, j = jax.lax.div(t, nb), jax.lax.rem(t, nb)
  return b, i, j


def _forward_kernel(*refs, p: _Forward):
  cfg = p.cfg
  bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
  refs = list(refs)
  x_ref = refs.pop(0)
  w_ref = refs.pop(0)
  rs_ref = refs.pop(0) if p.has_row_scale else None
  cs_ref = refs.pop(0) if p.has_col_scale else None
  gs_ref = refs.pop(0) if p.group_size else None
  s_ref = refs.pop(0) if p.has_scale else None
  b_ref = refs.pop(0) if p.has_bias else None
  r_ref = refs.pop(0) if p.has_residual else None
  z_ref = refs.pop(0) if p.activation_grad else None
  if p.poison:
    refs.pop(0)  # The poisoned buffer aliased to `out`; never read.
  o_ref = refs.pop(0)
  qs_ref = refs.pop(0) if p.quantize else None
  aux_ref = refs.pop(0) if p.save_aux else None
  wsum_ref = refs.pop(0) if p.column_sum else None

  b, i, j = tile_coords(pl.program_id(0), p.mb, p.nb, cfg.group_m, p.batch)
  # Masks exist only for ragged dimensions; divisible shapes load unmasked.
  row_ok = (i * bm + jnp.arange(bm, dtype=jnp.int32) < p.m) if p.m % bm else None
  col_ok = (j * bn + jnp.arange(bn, dtype=jnp.int32) < p.n) if p.n % bn else None
  ragged_k = p.k % bk != 0
  cdt = jnp.dtype(p.compute_dtype)
  if p.interpret:
    # XLA:CPU cannot run some layouts of bf16 x bf16 -> f32 dots (e.g. when it
    # folds the transposed store into the dot). 16-bit products are exact in
    # f32, so widening the tiles first changes nothing but the summation order.
    cdt = jnp.dtype(_F32)
  precision = gpu.dot_precision(p.precision)

  def k_step(kk, carry):
    acc, wsum = carry
    k0 = pl.multiple_of(kk * bk, bk)
    k_ok = (k0 + jnp.arange(bk, dtype=jnp.int32) < p.k) if ragged_k else None
    if p.transpose_x:  # Stored [Kp, bm]: contract axis 0.
      xt = tiles.read_tile(x_ref.at[pl.ds(k0, bk), :], tiles.mask2(k_ok, row_ok))
      x_dims = (0,)
    else:
      xt = tiles.read_tile(x_ref.at[:, pl.ds(k0, bk)], tiles.mask2(row_ok, k_ok))
      x_dims = (1,)
    if p.transpose_w:  # Stored [bn, Kp]: contract axis 1.
      wt = tiles.read_tile(w_ref.at[:, pl.ds(k0, bk)], tiles.mask2(col_ok, k_ok))
      w_dims = (1,)
    else:
      wt = tiles.read_tile(w_ref.at[pl.ds(k0, bk), :], tiles.mask2(k_ok, col_ok))
      w_dims = (0,)
    part = jax.lax.dot_general(
        xt.astype(cdt), wt.astype(cdt), ((x_dims, w_dims), ((), ())),
        precision=precision, preferred_element_type=_F32)
    if p.group_size:
      # The whole K step lies in group k0 // G (block_k divides G).
      gs = tiles.read_tile(gs_ref.at[jax.lax.div(k0, p.group_size), :], col_ok)
      part = part * gs.astype(_F32)[None, :]
    if p.column_sum:
      # The tile as loaded: K-padding rows (and columns past N) are zeros.
      wsum = wsum + jnp.sum(wt.astype(_F32), axis=w_dims[0])
    return acc + part, wsum

  acc, wsum = jax.lax.fori_loop(0, p.kp // bk, k_step,
                                (jnp.zeros((bm, bn), _F32), jnp.zeros((bn,), _F32)))
  if wsum_ref is not None:
    first = i == 0
    if p.batch > 1 and not p.w_batched:
      first = first & (b == 0)  # One w shared by every batch: one writer.

    @pl.when(first)
    def _():
      tiles.write_tile(wsum_ref, wsum, col_ok)

  if rs_ref is not None:
    acc = acc * tiles.read_tile(rs_ref, row_ok).astype(_F32)[:, None]
  if cs_ref is not None:
    acc = acc * tiles.read_tile(cs_ref, col_ok).astype(_F32)[None, :]
  tile_mask = tiles.mask2(row_ok, col_ok)
  if aux_ref is not None:
    tiles.write_tile(aux_ref, acc, tile_mask)

  y = acc
  if s_ref is not None:
    y = y * tiles.read_tile(s_ref, col_ok).astype(_F32)[None, :]
  if b_ref is not None:
    y = y + tiles.read_tile(b_ref, col_ok).astype(_F32)[None, :]
  if z_ref is not None:
    if p.transpose_out:
      z = tiles.read_tile(z_ref, tiles.mask2(col_ok, row_ok)).astype(_F32).T
    else:
      z = tiles.read_tile(z_ref, tile_mask).astype(_F32)
    y = y * activation_grad(p.activation_grad, z)
  else:
    y = activation_fn(p.activation, y)
  if r_ref is not None:
    if p.transpose_out:
      y = y + tiles.read_tile(r_ref, tiles.mask2(col_ok, row_ok)).astype(_F32).T
    else:
      y = y + tiles.read_tile(r_ref, tile_mask).astype(_F32)
  if p.clamp is not None:
    y = clamp_values(y, p.clamp)

  if p.quantize:
    # The tile spans the whole row (block_n >= N): the row's amax is local.
    a = jnp.abs(y) if col_ok is None else jnp.where(col_ok[None, :], jnp.abs(y), 0.0)
    scales = quant.scale_from_amax(jnp.max(a, axis=1), p.quantize)
    y = quant.quantize(y, scales[:, None], p.quantize)
    tiles.write_tile(qs_ref, scales, row_ok)
  if p.transpose_out:
    tiles.write_tile(o_ref, y.T, tiles.mask2(col_ok, row_ok))
  else:
    tiles.write_tile(o_ref, y, tile_mask)


class ForwardOutputs(NamedTuple):
  """Outputs of `matmul_forward`; fields that were not requested are None."""

  #: The result (or quantized values), shaped like the reference's result.
  out: jax.Array
  #: Per-row float32 quantization scales [..., M, 1] ([..., 1, M] if the
  #: output is transposed), broadcasting against `out` (quantize only).
  scales: jax.Array | None
  #: The f32 accumulator before the epilogue, logical [..., M, N] (save_aux).
  aux: jax.Array | None
  #: float32 column sums of the logical w over K, w's batch + [N] (column_sum).
  column_sum: jax.Array | None = None


def _to3(a: jax.Array, batch_shape: tuple[int, ...]) -> tuple[jax.Array, bool]:
  """[*b, r, c] -> ([B or 1, r, c], batched?) without copying when possible."""
  full = math.prod(batch_shape)
  own = a.shape[:-2]
  if math.prod(own) == 1:
    return a.reshape((1,) + a.shape[-2:]), False
  padded = (1,) * (len(batch_shape) - len(own)) + tuple(own)
  if padded != tuple(batch_shape):
    # Partial broadcasting (e.g. [2,1] against [2,3]) is materialized.
    a = jnp.broadcast_to(a, tuple(batch_shape) + a.shape[-2:])
  return a.reshape((full,) + a.shape[-2:]), full > 1


def matmul_forward(
    x: jax.Array, w: jax.Array, *, cfg: Config, interpret: bool,
    compute_dtype, out_dtype, activation: str = "identity",
    x_row_scale: jax.Array | None = None, w_col_scale: jax.Array | None = None,
    w_group_scale: jax.Array | None = None, group_size: int | None = None,
    scale: jax.Array | None = None, bias: jax.Array | None = None,
    residual: jax.Array | None = None,
    clamp: tuple[float | None, float | None] | None = None,
    transpose_x: bool = False, transpose_w: bool = False, transpose_out: bool = False,
    quantize: str | None = None, save_aux: bool = False, aux_dtype=_F32,
    poison: bool = False, precision: str = "HIGHEST",
    column_sum: bool = False, activation_grad: str | None = None,
    preactivation: jax.Array | None = None) -> ForwardOutputs:
  """Launches the forward kernel on canonical operands.

  The caller (`api.py`, `vjp.py`) has validated shapes and folded scalar
  scales into `w_col_scale`; `guard.py` has accepted `cfg`.

  Args:
    x: [..., M, K] (or [..., K, M] with transpose_x).
    w: [..., K, N] (or [..., N, K] with transpose_w); batch dims broadcast.
    cfg: tiling (`config.heuristic_config` or the caller's).
    interpret: run through Pallas' interpreter (CPU) instead of Triton.
    compute_dtype: dtype the tiles are converted to for the dot.
    out_dtype: dtype of the stored result (ignored when quantizing).
    activation: canonical activation name.
    x_row_scale: f32 per-row x scale, shape x's batch + [M].
    w_col_scale: f32 per-column scale [N] applied to the accumulator.
    w_group_scale: f32 per-group scale [K // G, N] (K % G == 0).
    group_size: G for w_group_scale.
    scale, bias: epilogue vectors [N].
    residual: the result's (stored) shape, with full batch dims.
    clamp: (lo, hi) with optional bounds.
    transpose_x, transpose_w, transpose_out: storage orientation.
    quantize: "int8" / "float8_e4m3fn" per-row quantization; needs
      cfg.block_n >= N (the caller otherwise quantizes from an f32 result).
    save_aux: also return the accumulator before the epilogue.
    aux_dtype: dtype of the saved accumulator.
    poison: test hook: the output buffer starts as NaN (or int8 -128) through
      `input_output_aliases`, so any element the kernel fails to write shows.
    precision: `jax.lax.Precision` name of the dot.
    column_sum: also return the f32 column sums of the logical w over K,
      shaped w's batch + [N] (w unscaled: the caller rejects w scales).
    activation_grad: canonical activation name whose derivative at
      `preactivation` multiplies the tile in place of `activation`.
    preactivation: the result's (stored) shape, with full batch dims.

  Returns:
    `ForwardOutputs(out, scales, aux, column_sum)`.
  """
  m = x.shape[-1] if transpose_x else x.shape[-2]
  k = x.shape[-2] if transpose_x else x.shape[-1]
  n = w.shape[-2] if transpose_w else w.shape[-1]
  batch_shape = jnp.broadcast_shapes(x.shape[:-2], w.shape[:-2])
  if quantize and cfg.block_n < n:
    raise ValueError(f"fused quantization needs block_n >= N, got {cfg.block_n} < {n}")
  if (activation_grad is None) != (preactivation is None):
    raise ValueError("activation_grad and preactivation come together")

  # Fold x's batch into M when w has no batch: one bigger matmul, better tiles.
  fold = (not transpose_x and not transpose_out and math.prod(w.shape[:-2]) == 1
          and len(x.shape) > 2)
  if fold:
    rows = math.prod(x.shape[:-1])
    x3 = x.reshape(1, rows, k)
    w3 = w.reshape((1,) + w.shape[-2:])
    x_batched = w_batched = False
    m_eff, batch = rows, 1
  else:
    x3, x_batched = _to3(x, batch_shape)
    w3, w_batched = _to3(w, batch_shape)
    m_eff, batch = m, math.prod(batch_shape)
  out_lead = tuple(batch_shape)

  p = _Forward(
      m=m_eff, n=n, k=k, batch=batch, x_batched=x_batched, w_batched=w_batched,
      transpose_x=transpose_x, transpose_w=transpose_w, transpose_out=transpose_out,
      has_row_scale=x_row_scale is not None, has_col_scale=w_col_scale is not None,
      group_size=group_size if w_group_scale is not None else None,
      has_scale=scale is not None, has_bias=bias is not None,
      has_residual=residual is not None, activation=activation, clamp=clamp,
      compute_dtype=jnp.dtype(compute_dtype).name, quantize=quantize,
      save_aux=save_aux, poison=poison, interpret=bool(interpret), cfg=cfg,
      precision=precision, column_sum=column_sum,
      activation_grad=activation_grad)
  bm, bn, kp = cfg.block_m, cfg.block_n, p.kp
  coords = functools.partial(tile_coords, mb=p.mb, nb=p.nb, group_m=cfg.group_m,
                             batch=batch)

  def bx(b):
    return b if x_batched else 0

  def bw(b):
    return b if w_batched else 0

  def x_map(pid):
    b, i, _ = coords(pid)
    return (bx(b), 0, i) if transpose_x else (bx(b), i, 0)

  def w_map(pid):
    b, _, j = coords(pid)
    return (bw(b), j, 0) if transpose_w else (bw(b), 0, j)

  def out_map(pid):
    b, i, j = coords(pid)
    return (b, j, i) if transpose_out else (b, i, j)

  def logical_map(pid):
    b, i, j = coords(pid)
    return (b, i, j)

  def row_map(pid):
    b, i, _ = coords(pid)
    return (b, i)

  def col_map(pid):
    return (coords(pid)[2],)

  out_block = (None, bn, bm) if transpose_out else (None, bm, bn)
  out_shape3 = (batch, n, m_eff) if transpose_out else (batch, m_eff, n)
  args, specs = [x3, w3], [
      pl.BlockSpec((None, kp, bm) if transpose_x else (None, bm, kp), x_map),
      pl.BlockSpec((None, bn, kp) if transpose_w else (None, kp, bn), w_map),
  ]
  if x_row_scale is not None:
    rs = jnp.broadcast_to(x_row_scale, x.shape[:-2] + (m,))
    if fold or not x_batched:
      rs = rs.reshape(1, m_eff)
    else:
      rs = jnp.broadcast_to(rs, tuple(batch_shape) + (m,)).reshape(batch, m)
    args.append(rs.astype(_F32))
    specs.append(pl.BlockSpec((None, bm), lambda pid: (bx(coords(pid)[0]), coords(pid)[1])))
  if w_col_scale is not None:
    args.append(w_col_scale.astype(_F32))
    specs.append(pl.BlockSpec((bn,), col_map))
  if p.group_size:
    args.append(w_group_scale.astype(_F32))
    specs.append(pl.BlockSpec((w_group_scale.shape[0], bn), lambda pid: (0, coords(pid)[2])))
  if scale is not None:
    args.append(scale.astype(_F32))
    specs.append(pl.BlockSpec((bn,), col_map))
  if bias is not None:
    args.append(bias)
    specs.append(pl.BlockSpec((bn,), col_map))
  if residual is not None:
    args.append(residual.reshape(out_shape3))
    specs.append(pl.BlockSpec(out_block, out_map))
  if p.activation_grad:
    args.append(preactivation.reshape(out_shape3))
    specs.append(pl.BlockSpec(out_block, out_map))

  odt = jnp.dtype(quant.dtype_of(quantize) if quantize else out_dtype)
  out_shapes = [jax.ShapeDtypeStruct(out_shape3, odt)]
  out_specs = [pl.BlockSpec(out_block, out_map)]
  aliases = {}
  if poison:
    fill = jnp.iinfo(odt).min if jnp.issubdtype(odt, jnp.integer) else jnp.nan
    aliases[len(args)] = 0
    args.append(jnp.full(out_shape3, fill, odt))
    specs.append(pl.BlockSpec(out_block, out_map))
  if quantize:
    out_shapes.append(jax.ShapeDtypeStruct((batch, m_eff), _F32))
    out_specs.append(pl.BlockSpec((None, bm), row_map))
  if save_aux:
    out_shapes.append(jax.ShapeDtypeStruct((batch, m_eff, n), aux_dtype))
    out_specs.append(pl.BlockSpec((None, bm, bn), logical_map))
  if column_sum:
    out_shapes.append(jax.ShapeDtypeStruct((w3.shape[0], n), _F32))
    out_specs.append(pl.BlockSpec((None, bn), lambda pid: (bw(coords(pid)[0]),
                                                           coords(pid)[2])))

  call = pl.pallas_call(
      functools.partial(_forward_kernel, p=p),
      out_shape=out_shapes,
      grid=(batch * p.mb * p.nb,),
      in_specs=specs,
      out_specs=out_specs,
      input_output_aliases=aliases,
      compiler_params=gpu.compiler_params(num_warps=cfg.num_warps,
                                          num_stages=cfg.num_stages,
                                          interpret=interpret),
      interpret=interpret,
      name="pallas_kernels_matmul",
  )
  with backend_lib.kernel_scope("matmul"):
    results = list(call(*args))
  out = results.pop(0)
  out = out.reshape(out_lead + ((n, m) if transpose_out else (m, n)))
  scales = None
  if quantize:
    scales = results.pop(0).reshape(out_lead + ((1, m) if transpose_out else (m, 1)))
  aux = results.pop(0).reshape(out_lead + (m, n)) if save_aux else None
  wsum = None
  if column_sum:
    wsum = _own_batch(results.pop(0), tuple(batch_shape), tuple(w.shape[:-2]))
  return ForwardOutputs(out, scales, aux, wsum)


def _own_batch(sums: jax.Array, batch_shape: tuple[int, ...],
               w_batch: tuple[int, ...]) -> jax.Array:
  """Column sums [B or 1, N] per launched w batch -> w's own batch + [N].

  A partially broadcast w was materialized to the full batch (`_to3`): its
  copies' sums are equal, the first along each broadcast axis is kept.
  """
  n = sums.shape[-1]
  if sums.shape[0] == math.prod(w_batch):
    return sums.reshape(w_batch + (n,))
  full = sums.reshape(batch_shape + (n,))
  pad = len(batch_shape) - len(w_batch)
  index = tuple(0 if a < pad or w_batch[a - pad] == 1 else slice(None)
                for a in range(len(batch_shape)))
  return full[index].reshape(w_batch + (n,))


# --------------------------------------------------------------------------
# Backward: fused activation gradient + bias/scale gradient partial sums.
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Backward:
  m: int
  n: int
  nb: int
  batch: int
  chunks: int
  transpose_out: bool
  activation: str
  clamp: tuple[float | None, float | None] | None
  has_residual: bool
  has_scale: bool
  has_bias: bool
  has_col_mult: bool
  has_row_mult: bool
  row_mult_batched: bool
  want_db: bool
  want_dscale: bool
  want_dres: bool
  cfg: BackwardConfig


def _bwd_coords(pid, nb: int):
  """(row chunk over all batches, column block) of backward program `pid`."""
  return jax.lax.div(pid, nb), jax.lax.rem(pid, nb)


def _backward_kernel(*refs, p: _Backward):
  cfg = p.cfg
  bm, bn, rpp = cfg.block_m, cfg.block_n, cfg.rows_per_program
  refs = list(refs)
  dy_ref = refs.pop(0)
  aux_ref = refs.pop(0)
  r_ref = refs.pop(0) if p.has_residual else None
  s_ref = refs.pop(0) if p.has_scale else None
  b_ref = refs.pop(0) if p.has_bias else None
  cm_ref = refs.pop(0) if p.has_col_mult else None
  rm_ref = refs.pop(0) if p.has_row_mult else None
  g_ref = refs.pop(0)
  db_ref = refs.pop(0) if p.want_db else None
  ds_ref = refs.pop(0) if p.want_dscale else None
  dr_ref = refs.pop(0) if p.want_dres else None

  c, j = _bwd_coords(pl.program_id(0), p.nb)
  chunk = jax.lax.rem(c, p.chunks)
  col_ok = (j * bn + jnp.arange(bn, dtype=jnp.int32) < p.n) if p.n % bn else None
  s = tiles.read_tile(s_ref, col_ok).astype(_F32) if s_ref is not None else None
  bias = tiles.read_tile(b_ref, col_ok).astype(_F32) if b_ref is not None else None
  cm = tiles.read_tile(cm_ref, col_ok).astype(_F32) if cm_ref is not None else None
  ragged_rows = p.m % rpp != 0  # The last chunk runs past M.

  def step(t, carry):
    db, ds = carry
    r0 = pl.multiple_of(t * bm, bm)
    rows = chunk * rpp + r0 + jnp.arange(bm, dtype=jnp.int32)
    row_ok = rows < p.m if ragged_rows else None
    mask = tiles.mask2(row_ok, col_ok)
    tmask = tiles.mask2(col_ok, row_ok)
    if p.transpose_out:
      dy = tiles.read_tile(dy_ref.at[:, pl.ds(r0, bm)], tmask).astype(_F32).T
    else:
      dy = tiles.read_tile(dy_ref.at[pl.ds(r0, bm), :], mask).astype(_F32)
    a = tiles.read_tile(aux_ref.at[pl.ds(r0, bm), :], mask).astype(_F32)
    pre = a if s is None else a * s[None, :]
    if bias is not None:
      pre = pre + bias[None, :]
    dz = dy
    if p.clamp is not None:
      z = activation_fn(p.activation, pre)
      if r_ref is not None:
        if p.transpose_out:
          z = z + tiles.read_tile(r_ref.at[:, pl.ds(r0, bm)], tmask).astype(_F32).T
        else:
          z = z + tiles.read_tile(r_ref.at[pl.ds(r0, bm), :], mask).astype(_F32)
      dz = jnp.where(_in_clamp_range(z, p.clamp), dy, 0.0)
      if dr_ref is not None:
        if p.transpose_out:
          tiles.write_tile(dr_ref.at[:, pl.ds(r0, bm)], dz.T, tmask)
        else:
          tiles.write_tile(dr_ref.at[pl.ds(r0, bm), :], dz, mask)
    g = dz * activation_grad(p.activation, pre)
    if row_ok is not None:
      g = jnp.where(row_ok[:, None], g, 0.0)  # Rows past M must not enter db.
    if p.want_db:
      db = db + jnp.sum(g, axis=0)
    if p.want_dscale:
      ds = ds + jnp.sum(g * a, axis=0)
    gout = g if s is None else g * s[None, :]
    if cm is not None:
      gout = gout * cm[None, :]
    if rm_ref is not None:
      rm = tiles.read_tile(rm_ref.at[pl.ds(r0, bm)], row_ok).astype(_F32)
      gout = gout * rm[:, None]
    tiles.write_tile(g_ref.at[pl.ds(r0, bm), :], gout, mask)
    return db, ds

  zeros = jnp.zeros((bn,), _F32)
  db, ds = jax.lax.fori_loop(0, rpp // bm, step, (zeros, zeros))
  if db_ref is not None:
    tiles.write_tile(db_ref, db, col_ok)
  if ds_ref is not None:
    tiles.write_tile(ds_ref, ds, col_ok)


class BackwardOutputs(NamedTuple):
  """Outputs of `dact_bgrad`; fields that were not requested are None."""

  #: dL/dacc times the column / row multipliers, logical [..., M, N].
  g: jax.Array
  #: Bias gradient [N] (float32).
  db: jax.Array | None
  #: Per-column gradient of the epilogue scale [N] (float32).
  dscale: jax.Array | None
  #: Residual gradient, stored like dy (only with a clamp; else it is dy).
  dres: jax.Array | None


def dact_bgrad(dy: jax.Array, aux: jax.Array, *, cfg: BackwardConfig | None, interpret: bool,
               activation: str, g_dtype, clamp=None, residual: jax.Array | None = None,
               scale: jax.Array | None = None, bias: jax.Array | None = None,
               col_mult: jax.Array | None = None, row_mult: jax.Array | None = None,
               transpose_out: bool = False, want_db: bool = False,
               want_dscale: bool = False, res_dtype=None) -> BackwardOutputs:
  """One pass over dy: g, bias gradient and scale gradient of the epilogue.

  With pre = aux * scale + bias and z = act(pre) + residual:
  dz = dy * [lo <= z <= hi], g = dz * act'(pre), db = sum_rows(g),
  dscale = sum_rows(g * aux), and the returned g is g * scale * col_mult *
  row_mult (the cotangent of the matmul accumulator, with the dequantization
  scales folded in so that dx = g @ w_q^T and dw = x_q^T @ g).

  Args:
    dy: cotangent of the result, stored layout ([..., N, M] if transpose_out).
    aux: saved accumulator, logical [..., M, N].
    cfg: tiling; None picks `config.heuristic_backward_config`.
    interpret: Pallas interpret mode.
    activation: canonical activation name.
    g_dtype: dtype of the returned g (the dx/dw matmul operand).
    clamp: (lo, hi) of the forward, or None.
    residual: the forward's residual (read only with a clamp).
    scale, bias: epilogue vectors [N] (or None).
    col_mult: f32 [N] multiplier folded into g (per-column w scales).
    row_mult: f32 per-row multiplier, aux's batch (or broadcastable) + [M].
    transpose_out: dy/residual are stored transposed.
    want_db, want_dscale: compute those partial sums.
    res_dtype: dtype of the residual gradient (returned only with a clamp).
  """
  lead = aux.shape[:-2]
  m_logical, n = aux.shape[-2:]
  if transpose_out:
    batch, m = math.prod(lead), m_logical
  else:
    # Logical layout: fold the batch into rows (fewer, fuller row chunks).
    batch, m = 1, math.prod(lead) * m_logical
  aux3 = aux.reshape(batch, m, n)
  store_shape = (batch, n, m) if transpose_out else (batch, m, n)
  dy3 = dy.reshape(store_shape)
  if cfg is None:
    cfg = config_lib.heuristic_backward_config(
        m, n, config_lib.tiling_backend(interpret), batch=batch)
  chunks = pl.cdiv(m, cfg.rows_per_program)
  bn, rpp = cfg.block_n, cfg.rows_per_program
  nb = pl.cdiv(n, bn)
  want_dres = clamp is not None and residual is not None
  rm3 = None
  if row_mult is not None:
    if math.prod(row_mult.shape[:-1]) == 1 and transpose_out:
      rm3 = row_mult.reshape(1, m)
    else:
      rm3 = jnp.broadcast_to(row_mult, lead + (m_logical,)).reshape(batch, m)
    rm3 = rm3.astype(_F32)
  p = _Backward(m=m, n=n, nb=nb, batch=batch, chunks=chunks, transpose_out=transpose_out,
                activation=activation, clamp=clamp,
                has_residual=residual is not None and clamp is not None,
                has_scale=scale is not None, has_bias=bias is not None,
                has_col_mult=col_mult is not None, has_row_mult=rm3 is not None,
                row_mult_batched=rm3 is not None and rm3.shape[0] > 1,
                want_db=want_db, want_dscale=want_dscale and scale is not None,
                want_dres=want_dres, cfg=cfg)
  batched_rm = p.row_mult_batched

  def stored_map(pid):
    c, j = _bwd_coords(pid, nb)
    b, ch = jax.lax.div(c, chunks), jax.lax.rem(c, chunks)
    return (b, j, ch) if transpose_out else (b, ch, j)

  def logical_map(pid):
    c, j = _bwd_coords(pid, nb)
    return (jax.lax.div(c, chunks), jax.lax.rem(c, chunks), j)

  def vec_map(pid):
    return (_bwd_coords(pid, nb)[1],)

  def partial_map(pid):
    return _bwd_coords(pid, nb)

  def row_mult_map(pid):
    c, _ = _bwd_coords(pid, nb)
    return (jax.lax.div(c, chunks) if batched_rm else 0, jax.lax.rem(c, chunks))

  stored_block = (None, bn, rpp) if transpose_out else (None, rpp, bn)
  args = [dy3, aux3]
  specs = [pl.BlockSpec(stored_block, stored_map), pl.BlockSpec((None, rpp, bn), logical_map)]
  if p.has_residual:
    args.append(residual.reshape(store_shape))
    specs.append(pl.BlockSpec(stored_block, stored_map))
  for vec in (scale, bias, col_mult):
    if vec is not None:
      args.append(vec)
      specs.append(pl.BlockSpec((bn,), vec_map))
  if rm3 is not None:
    args.append(rm3)
    specs.append(pl.BlockSpec((None, rpp), row_mult_map))
  out_shapes = [jax.ShapeDtypeStruct((batch, m, n), g_dtype)]
  out_specs = [pl.BlockSpec((None, rpp, bn), logical_map)]
  if p.want_db:
    out_shapes.append(jax.ShapeDtypeStruct((batch * chunks, n), _F32))
    out_specs.append(pl.BlockSpec((None, bn), partial_map))
  if p.want_dscale:
    out_shapes.append(jax.ShapeDtypeStruct((batch * chunks, n), _F32))
    out_specs.append(pl.BlockSpec((None, bn), partial_map))
  if want_dres:
    out_shapes.append(jax.ShapeDtypeStruct(store_shape, res_dtype or residual.dtype))
    out_specs.append(pl.BlockSpec(stored_block, stored_map))

  call = pl.pallas_call(
      functools.partial(_backward_kernel, p=p),
      out_shape=out_shapes,
      # One grid axis (like the forward) so that vmap's extra axes stay within
      # Triton's three.
      grid=(batch * chunks * nb,),
      in_specs=specs,
      out_specs=out_specs,
      compiler_params=gpu.compiler_params(num_warps=cfg.num_warps,
                                          num_stages=cfg.num_stages,
                                          interpret=interpret),
      interpret=interpret,
      name="pallas_kernels_matmul_dact_bgrad",
  )
  with backend_lib.kernel_scope("matmul"):
    results = list(call(*args))
  g = results.pop(0).reshape(lead + (m_logical, n))
  db = results.pop(0).sum(axis=0) if p.want_db else None
  dscale = results.pop(0).sum(axis=0) if p.want_dscale else None
  dres = results.pop(0).reshape(dy.shape) if want_dres else None
  return BackwardOutputs(g, db, dscale, dres)
