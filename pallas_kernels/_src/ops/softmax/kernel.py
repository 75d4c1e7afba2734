"""Pallas softmax kernels (forward and backward) with fused scale and masks.

x arrives flattened to [rows, cols]. The grid runs over blocks of `block_rows`
rows (BlockSpecs over rows, full width rounded up to whole chunks); a row
longer than `block_cols` is walked in chunks with an online max/sum (one read
for statistics, one for the output). Everything is float32 inside.

Masks are never broadcast to x's shape in memory: the mask is passed whole,
flattened to [mask_rows, 1 or cols], and each row of x finds its mask row by
index arithmetic on its leading indices (`MaskLayout`), so a [q, k] mask for x
[batch, heads, q, k] is read from cache, not materialized batch*heads times.
Causal masking needs no input at all: row r is query r % q.

Backward: dx = y * (dy - sum(dy * y)) * scale from the saved output y.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels._src import backend
from pallas_kernels._src import gpu
from pallas_kernels._src.ops import rows as rows_lib
from pallas_kernels._src.ops.softmax.config import Config

_F32 = jnp.float32


@dataclasses.dataclass(frozen=True, slots=True)
class MaskLayout:
  """How row r of flattened x finds its row of the flattened mask.

  mask_row(r) = sum over `terms` of ((r // x_stride) % size) * mask_stride;
  leading dims along which the mask broadcasts contribute nothing.

  Attributes:
    terms: (x_stride, size, mask_stride) per run of non-broadcast leading dims.
    rows: rows of the flattened mask.
    cols: 1 (mask broadcasts over the last axis) or x's last dim.
  """

  terms: tuple[tuple[int, int, int], ...]
  rows: int
  cols: int

  @staticmethod
  def of(x_shape: tuple[int, ...], mask_shape: tuple[int, ...]) -> "MaskLayout":
    """Layout of a mask of `mask_shape` (broadcastable to `x_shape`)."""
    ndim = len(x_shape)
    padded = (1,) * (ndim - len(mask_shape)) + tuple(mask_shape)
    lead_x, lead_m = x_shape[:-1], padded[:-1]
    terms = []
    x_stride, m_stride = 1, 1
    run = None  # (x_stride, size, m_stride) of the current non-broadcast run.
    for d, m in zip(reversed(lead_x), reversed(lead_m)):
      if m == d and d > 1:
        run = (run[0], run[1] * d, run[2]) if run else (x_stride, d, m_stride)
      elif run:
        terms.append(run)
        run = None
      x_stride *= d
      m_stride *= m
    if run:
      terms.append(run)
    rows = 1
    for m in lead_m:
      rows *= m
    return MaskLayout(terms=tuple(terms), rows=rows, cols=padded[-1])

  def row_index(self, rows):
    """Mask row of each global x row in `rows` (int32 vector)."""
    out = jnp.zeros_like(rows)
    for x_stride, size, m_stride in self.terms:
      out = out + ((rows // x_stride) % size) * m_stride
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class Masking:
  """Static masking of one call."""

  #: None, "additive" (float mask added to logits) or "boolean" (nonzero keeps).
  mask_kind: str | None = None
  layout: MaskLayout | None = None
  causal: bool = False
  #: Length of the query axis (x.shape[-2]) for causal masking.
  q_len: int = 1
  #: Causal diagonal offset (see reference.causal_offset).
  offset: int = 0


def _forward_kernel(*refs, n_rows: int, n_cols: int, scale: float | None,
                    masking: Masking, cfg: Config):
  bm, bn = cfg.block_rows, cfg.block_cols
  if masking.mask_kind is not None:
    x_ref, m_ref, y_ref = refs
  else:
    (x_ref, y_ref), m_ref = refs, None
  rows = rows_lib.row_ids(pl.program_id(0), bm)
  row_ok = rows < n_rows
  n_chunks = rows_lib.num_chunks(n_cols, bn)
  if m_ref is not None:
    mask_rows = masking.layout.row_index(rows)
  if masking.causal:
    last_key = rows % masking.q_len + masking.offset

  def logits(c0):
    cols = rows_lib.col_ids(c0, bn)
    m = row_ok[:, None] & (cols < n_cols)[None, :]
    s = rows_lib.load_tile(x_ref, 0, c0, bm, bn, m).astype(_F32)
    if scale is not None:
      s = s * jnp.float32(scale)
    keep = m
    if m_ref is not None:
      mask_cols = cols if masking.layout.cols > 1 else jnp.zeros_like(cols)
      view = m_ref.at[mask_rows[:, None], mask_cols[None, :]]
      if masking.mask_kind == "additive":
        s = s + gpu.load(view, m, 0.0).astype(_F32)
      else:
        keep = keep & (gpu.load(view, m, 0) != 0)
    if masking.causal:
      keep = keep & (cols[None, :] <= last_key[:, None])
    return jnp.where(keep, s, -jnp.inf), m

  def safe(mx):
    # Fully masked rows (max -inf) shift by 0, so exp gives 0 rather than NaN.
    return jnp.where(mx == -jnp.inf, 0.0, mx)

  if n_chunks == 1:
    s, m = logits(0)
    shift = safe(jnp.max(s, axis=1))
    e = jnp.exp(s - shift[:, None])
    denom = jnp.sum(e, axis=1)
    y = e / jnp.where(denom == 0, 1.0, denom)[:, None]
    rows_lib.store_tile(y_ref, 0, 0, bm, bn, y, m)
    return

  def stats(c0, carry):
    mx, total = carry
    s, _ = logits(c0)
    new_mx = jnp.maximum(mx, jnp.max(s, axis=1))
    shift = safe(new_mx)
    total = total * jnp.exp(mx - shift) + jnp.sum(jnp.exp(s - shift[:, None]), axis=1)
    return new_mx, total

  init = (jnp.full((bm,), -jnp.inf, _F32), jnp.zeros((bm,), _F32))
  mx, total = rows_lib.over_chunks(n_chunks, bn, stats, init)
  shift = safe(mx)
  inv = 1.0 / jnp.where(total == 0, 1.0, total)

  def write(c0, carry):
    s, m = logits(c0)
    rows_lib.store_tile(y_ref, 0, c0, bm, bn,
                        jnp.exp(s - shift[:, None]) * inv[:, None], m)
    return carry

  rows_lib.over_chunks(n_chunks, bn, write, 0)


def _compiler_params(cfg: Config, interpret: bool):
  if interpret:
    return None
  return gpu.compiler_params(num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def forward(x, mask, *, scale: float | None, masking: Masking, out_dtype,
            cfg: Config, interpret: bool) -> jax.Array:
  """Softmax of 2-D x [rows, cols] into `out_dtype`.

  Args:
    x: [rows, cols] logits.
    mask: None, or the mask flattened to [layout.rows, layout.cols] (int8 for
      a boolean mask, floating for an additive one).
    scale: multiplies the logits first (static).
    masking: static description of mask and causal masking.
    out_dtype: dtype of the result.
    cfg: tiling (see `config.py`).
    interpret: run in Pallas interpret mode.
  """
  n_rows, n_cols = x.shape
  bm = cfg.block_rows
  width = rows_lib.padded_cols(n_cols, cfg.block_cols)  # whole chunks
  tile = pl.BlockSpec((bm, width), lambda i: (i, 0))
  inputs, in_specs = [x], [tile]
  if mask is not None:
    inputs.append(mask)
    # The whole (small, broadcast) mask; rows are gathered per x row.
    in_specs.append(pl.BlockSpec(mask.shape, lambda i: (0, 0)))
  body = functools.partial(_forward_kernel, n_rows=n_rows, n_cols=n_cols,
                           scale=scale, masking=masking, cfg=cfg)
  itemsize = jnp.dtype(x.dtype).itemsize
  with backend.kernel_scope("softmax"):
    return pl.pallas_call(
        body,
        grid=(pl.cdiv(n_rows, bm),),
        in_specs=in_specs,
        out_specs=tile,
        out_shape=jax.ShapeDtypeStruct((n_rows, n_cols), out_dtype),
        interpret=interpret,
        compiler_params=_compiler_params(cfg, interpret),
        cost_estimate=pl.CostEstimate(
            flops=5 * n_rows * n_cols, transcendentals=n_rows * n_cols,
            bytes_accessed=n_rows * n_cols * (itemsize
                                              + jnp.dtype(out_dtype).itemsize)),
        name="softmax_fwd",
    )(*inputs)


def _backward_kernel(y_ref, dy_ref, dx_ref, *, n_rows: int, n_cols: int,
                     scale: float | None, cfg: Config):
  bm, bn = cfg.block_rows, cfg.block_cols
  rows = rows_lib.row_ids(pl.program_id(0), bm)
  row_ok = rows < n_rows
  n_chunks = rows_lib.num_chunks(n_cols, bn)

  def tiles(c0):
    m = row_ok[:, None] & (rows_lib.col_ids(c0, bn) < n_cols)[None, :]
    y = rows_lib.load_tile(y_ref, 0, c0, bm, bn, m).astype(_F32)
    dy = rows_lib.load_tile(dy_ref, 0, c0, bm, bn, m).astype(_F32)
    return y, dy, m

  def dx_of(y, dy, inner):
    dx = y * (dy - inner[:, None])
    return dx * jnp.float32(scale) if scale is not None else dx

  if n_chunks == 1:
    y, dy, m = tiles(0)
    rows_lib.store_tile(dx_ref, 0, 0, bm, bn,
                        dx_of(y, dy, jnp.sum(y * dy, axis=1)), m)
    return

  def dot(c0, acc):
    y, dy, _ = tiles(c0)
    return acc + jnp.sum(y * dy, axis=1)

  inner = rows_lib.over_chunks(n_chunks, bn, dot, jnp.zeros((bm,), _F32))

  def write(c0, carry):
    y, dy, m = tiles(c0)
    rows_lib.store_tile(dx_ref, 0, c0, bm, bn, dx_of(y, dy, inner), m)
    return carry

  rows_lib.over_chunks(n_chunks, bn, write, 0)


def backward(y, dy, *, scale: float | None, dx_dtype, cfg: Config,
             interpret: bool) -> jax.Array:
  """dx [rows, cols] of softmax from its output y and cotangent dy."""
  n_rows, n_cols = y.shape
  bm = cfg.block_rows
  width = rows_lib.padded_cols(n_cols, cfg.block_cols)  # whole chunks
  tile = pl.BlockSpec((bm, width), lambda i: (i, 0))
  body = functools.partial(_backward_kernel, n_rows=n_rows, n_cols=n_cols,
                           scale=scale, cfg=cfg)
  with backend.kernel_scope("softmax"):
    return pl.pallas_call(
        body,
        grid=(pl.cdiv(n_rows, bm),),
        in_specs=[tile, tile],
        out_specs=tile,
        out_shape=jax.ShapeDtypeStruct((n_rows, n_cols), dx_dtype),
        interpret=interpret,
        compiler_params=_compiler_params(cfg, interpret),
        cost_estimate=pl.CostEstimate(
            flops=4 * n_rows * n_cols, transcendentals=0,
            bytes_accessed=n_rows * n_cols * (jnp.dtype(y.dtype).itemsize
                                              + jnp.dtype(dy.dtype).itemsize
                                              + jnp.dtype(dx_dtype).itemsize)),
        name="softmax_bwd",
    )(y, dy)
