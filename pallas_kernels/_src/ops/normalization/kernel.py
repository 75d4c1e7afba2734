"""Pallas kernels for layer norm and RMS norm: forward and backward.

Both ops share one body, switched by `kind` at trace time. Inputs arrive
flattened to [rows, cols]; the grid runs over blocks of `block_rows` rows
(BlockSpecs over rows, full width rounded up to whole chunks) and a block
walks its columns in chunks of `block_cols` (see `ops/rows.py`). The arithmetic is float32 throughout and
follows `reference.py` term by term; where it differs in order of operations
(chunked statistics use Chan's parallel combination of per-chunk mean and M2)
the difference is rounding only.

Forward outputs: y (or quantized values), h (with a residual), per-row scales
(quantized), and when differentiating the per-row float32 mean (layer norm) and
rstd for the backward kernel, so it need not recompute them.

Backward: dx = rstd * (g - xhat * mean(g * xhat) - mean(g)) with g = dy * gamma
(RMS norm drops the mean(g) term), plus the cotangent of h when the op returned
h. Each program also writes float32 partial sums of dy * xhat (dgamma) and dy
(dbeta) over the rows it owns; XLA sums those few partial rows afterwards.
"""

from __future__ import annotations

import functools
from typing import NamedTuple
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels._src import backend
from pallas_kernels._src import gpu
from pallas_kernels._src.ops import quantize as quant
from pallas_kernels._src.ops import rows as rows_lib
from pallas_kernels._src.ops.normalization.config import Config

KINDS = ("layer_norm", "rms_norm")
_F32 = jnp.float32


class ForwardOutputs(NamedTuple):
  """What the forward kernel returns; fields it was not asked for are None.

  A NamedTuple (not a dataclass) so that it is a pytree and can leave `jit`.
  """

  y: jax.Array
  h: jax.Array | None
  scale: jax.Array | None
  mean: jax.Array | None
  rstd: jax.Array | None


def forward_refs(refs, *, kind: str, has_residual: bool, has_beta: bool, quantize: bool,
                 save_stats: bool) -> tuple:
  """(x, residual, gamma, beta, y, h, scale, mean, rstd) refs of a forward
  kernel, None for those the call has not: the order every backend's launch
  passes them in."""
  refs = list(refs)
  out = (refs.pop(0), refs.pop(0) if has_residual else None, refs.pop(0),
         refs.pop(0) if has_beta else None, refs.pop(0),
         refs.pop(0) if has_residual else None, refs.pop(0) if quantize else None,
         refs.pop(0) if save_stats and kind == "layer_norm" else None,
         refs.pop(0) if save_stats else None)
  assert not refs
  return out


def backward_refs(refs, *, kind: str, has_dh: bool) -> tuple:
  """(h, gamma, mean, rstd, dy, dh, dx, dgamma, dbeta) refs of a backward
  kernel, None for those the call has not (as `forward_refs`)."""
  refs = list(refs)
  layer = kind == "layer_norm"
  out = (refs.pop(0), refs.pop(0), refs.pop(0) if layer else None, refs.pop(0),
         refs.pop(0), refs.pop(0) if has_dh else None, refs.pop(0), refs.pop(0),
         refs.pop(0) if layer else None)
  assert not refs
  return out


def _forward_kernel(*refs, kind: str, n_rows: int, n_cols: int, eps: float,
                    cfg: Config, has_residual: bool, has_beta: bool,
                    h_dtype: jnp.dtype, quantize: str | None, save_stats: bool):
  bm, bn = cfg.block_rows, cfg.block_cols
  x_ref, r_ref, g_ref, b_ref, y_ref, h_ref, s_ref, mean_ref, rstd_ref = forward_refs(
      refs, kind=kind, has_residual=has_residual, has_beta=has_beta,
      quantize=bool(quantize), save_stats=save_stats)

  rows = rows_lib.row_ids(pl.program_id(0), bm)
  row_ok = rows < n_rows
  n_chunks = rows_lib.num_chunks(n_cols, bn)
  single = n_chunks == 1

  def masks(c0):
    col_ok = rows_lib.col_ids(c0, bn) < n_cols
    return col_ok, row_ok[:, None] & col_ok[None, :]

  def load_h(c0, write_h: bool):
    """float32 h tile; masked-off entries are 0."""
    col_ok, m = masks(c0)
    x = rows_lib.load_tile(x_ref, 0, c0, bm, bn, m).astype(_F32)
    if r_ref is None:
      return x, col_ok, m
    r = rows_lib.load_tile(r_ref, 0, c0, bm, bn, m).astype(_F32)
    h = (x + r).astype(h_dtype)  # Rounded as returned: we normalize what we return.
    if write_h:
      rows_lib.store_tile(h_ref, 0, c0, bm, bn, h, m)
    return h.astype(_F32), col_ok, m

  # Statistics.
  if single:
    h_tile, col_ok0, m0 = load_h(0, write_h=True)
    if kind == "layer_norm":
      mean = jnp.sum(h_tile, axis=1) / n_cols
      d = jnp.where(m0, h_tile - mean[:, None], 0.0)
      var = jnp.sum(d * d, axis=1) / n_cols
    else:
      mean = None
      var = jnp.sum(h_tile * h_tile, axis=1) / n_cols
  elif kind == "layer_norm":
    def stats(c0, carry):
      count, mean, m2 = carry
      h, col_ok, m = load_h(c0, write_h=True)
      n_c = jnp.sum(col_ok.astype(_F32))
      mean_c = jnp.sum(h, axis=1) / n_c
      d = jnp.where(m, h - mean_c[:, None], 0.0)
      m2_c = jnp.sum(d * d, axis=1)
      total = count + n_c
      delta = mean_c - mean
      # Chan et al.: merge (count, mean, m2) with the chunk's (n_c, mean_c, m2_c).
      mean = mean + delta * (n_c / total)
      m2 = m2 + m2_c + delta * delta * (count * n_c / total)
      return total, mean, m2

    zeros = jnp.zeros((bm,), _F32)
    _, mean, m2 = rows_lib.over_chunks(n_chunks, bn, stats,
                                       (jnp.float32(0.0), zeros, zeros))
    var = m2 / n_cols
  else:
    def sumsq(c0, acc):
      h, _, _ = load_h(c0, write_h=True)
      return acc + jnp.sum(h * h, axis=1)

    mean = None
    var = rows_lib.over_chunks(n_chunks, bn, sumsq, jnp.zeros((bm,), _F32)) / n_cols
  rstd = jax.lax.rsqrt(var + jnp.float32(eps))

  if mean_ref is not None:
    rows_lib.store_vec(mean_ref, 0, bm, mean, row_ok)
  if rstd_ref is not None:
    rows_lib.store_vec(rstd_ref, 0, bm, rstd, row_ok)

  def y_tile(h, c0, col_ok):
    gamma = rows_lib.load_vec(g_ref, c0, bn, col_ok).astype(_F32)
    centered = h - mean[:, None] if mean is not None else h
    y = centered * rstd[:, None] * gamma[None, :]
    if b_ref is not None:
      y = y + rows_lib.load_vec(b_ref, c0, bn, col_ok).astype(_F32)[None, :]
    return y

  def chunk_y(c0):
    h, col_ok, m = load_h(c0, write_h=False)
    return y_tile(h, c0, col_ok), m

  if quantize is None:
    if single:
      rows_lib.store_tile(y_ref, 0, 0, bm, bn, y_tile(h_tile, 0, col_ok0), m0)
    else:
      def write(c0, carry):
        y, m = chunk_y(c0)
        rows_lib.store_tile(y_ref, 0, c0, bm, bn, y, m)
        return carry

      rows_lib.over_chunks(n_chunks, bn, write, 0)
    return

  # Quantizing epilogue: the scale needs the row's max |y| before any write.
  if single:
    y0 = y_tile(h_tile, 0, col_ok0)
    amax = jnp.max(jnp.where(m0, jnp.abs(y0), 0.0), axis=1)
  else:
    def row_amax(c0, acc):
      y, m = chunk_y(c0)
      return jnp.maximum(acc, jnp.max(jnp.where(m, jnp.abs(y), 0.0), axis=1))

    amax = rows_lib.over_chunks(n_chunks, bn, row_amax, jnp.zeros((bm,), _F32))
  scale = quant.scale_from_amax(amax, quantize)
  rows_lib.store_vec(s_ref, 0, bm, scale, row_ok)
  if single:
    rows_lib.store_tile(y_ref, 0, 0, bm, bn,
                        quant.quantize(y0, scale[:, None], quantize), m0)
  else:
    def write_q(c0, carry):
      y, m = chunk_y(c0)
      rows_lib.store_tile(y_ref, 0, c0, bm, bn,
                          quant.quantize(y, scale[:, None], quantize), m)
      return carry

    rows_lib.over_chunks(n_chunks, bn, write_q, 0)


def _compiler_params(cfg: Config, interpret: bool):
  if interpret:
    return None
  return gpu.compiler_params(num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def forward(x, residual, gamma, beta, *, kind: str, eps: float, out_dtype,
            quantize: str | None, save_stats: bool, cfg: Config,
            interpret: bool) -> ForwardOutputs:
  """Runs the forward kernel on 2-D `x` [rows, cols].

  Args:
    x: [rows, cols] input.
    residual: None or [rows, cols], added to x first.
    gamma: [cols] scale.
    beta: None (RMS norm) or [cols] shift.
    kind: "layer_norm" or "rms_norm".
    eps: added to the variance.
    out_dtype: dtype of y when not quantizing.
    quantize: None, "int8" or "float8_e4m3fn".
    save_stats: also return float32 mean (layer norm) and rstd per row.
    cfg: tiling; see `config.py`.
    interpret: run the kernel in Pallas interpret mode.
  """
  n_rows, n_cols = x.shape
  bm = cfg.block_rows
  h_dtype = x.dtype if residual is None else jnp.promote_types(x.dtype, residual.dtype)
  width = rows_lib.padded_cols(n_cols, cfg.block_cols)  # whole chunks
  tile = pl.BlockSpec((bm, width), lambda i: (i, 0))
  vec = pl.BlockSpec((width,), lambda i: (0,))
  row_vec = pl.BlockSpec((bm,), lambda i: (i,))

  inputs, in_specs = [x], [tile]
  if residual is not None:
    inputs.append(residual)
    in_specs.append(tile)
  inputs.append(gamma)
  in_specs.append(vec)
  if beta is not None:
    inputs.append(beta)
    in_specs.append(vec)

  y_dtype = quant.dtype_of(quantize) if quantize else jnp.dtype(out_dtype)
  out_shape = [jax.ShapeDtypeStruct((n_rows, n_cols), y_dtype)]
  out_specs = [tile]
  names = ["y"]
  if residual is not None:
    out_shape.append(jax.ShapeDtypeStruct((n_rows, n_cols), h_dtype))
    out_specs.append(tile)
    names.append("h")
  stat_names = (["scale"] if quantize else []) + (
      ["mean"] if save_stats and kind == "layer_norm" else []) + (
          ["rstd"] if save_stats else [])
  for name in stat_names:
    out_shape.append(jax.ShapeDtypeStruct((n_rows,), _F32))
    out_specs.append(row_vec)
    names.append(name)

  body = functools.partial(
      _forward_kernel, kind=kind, n_rows=n_rows, n_cols=n_cols, eps=float(eps),
      cfg=cfg, has_residual=residual is not None, has_beta=beta is not None,
      h_dtype=h_dtype, quantize=quantize, save_stats=save_stats)
  itemsize = jnp.dtype(x.dtype).itemsize
  io_arrays = 2 + (2 if residual is not None else 0)
  with backend.kernel_scope(kind):
    outs = pl.pallas_call(
        body,
        grid=(pl.cdiv(n_rows, bm),),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        interpret=interpret,
        compiler_params=_compiler_params(cfg, interpret),
        cost_estimate=pl.CostEstimate(
            flops=8 * n_rows * n_cols, transcendentals=n_rows,
            bytes_accessed=io_arrays * n_rows * n_cols * itemsize),
        name=f"{kind}_fwd",
    )(*inputs)
  got = dict(zip(names, outs))
  return ForwardOutputs(y=got["y"], h=got.get("h"), scale=got.get("scale"),
                        mean=got.get("mean"), rstd=got.get("rstd"))


def _backward_kernel(*refs, kind: str, n_rows: int, n_cols: int, cfg: Config,
                     has_dh: bool):
  bm, bn, steps = cfg.block_rows, cfg.block_cols, cfg.row_steps
  h_ref, g_ref, mean_ref, rstd_ref, dy_ref, dh_ref, dx_ref, dg_ref, db_ref = backward_refs(
      refs, kind=kind, has_dh=has_dh)

  n_chunks = rows_lib.num_chunks(n_cols, bn)
  single = n_chunks == 1
  pid = pl.program_id(0)

  def row_block(step, acc):
    r0 = step * bm  # Local row offset inside this program's block.
    rows = rows_lib.row_ids(pid * steps + step, bm)
    row_ok = rows < n_rows
    rstd = rows_lib.load_vec(rstd_ref, r0, bm, row_ok)
    mean = (rows_lib.load_vec(mean_ref, r0, bm, row_ok)
            if mean_ref is not None else None)

    def terms(c0):
      col_ok = rows_lib.col_ids(c0, bn) < n_cols
      m = row_ok[:, None] & col_ok[None, :]
      h = rows_lib.load_tile(h_ref, r0, c0, bm, bn, m).astype(_F32)
      dy = rows_lib.load_tile(dy_ref, r0, c0, bm, bn, m).astype(_F32)
      gamma = rows_lib.load_vec(g_ref, c0, bn, col_ok).astype(_F32)
      centered = h - mean[:, None] if mean is not None else h
      xhat = jnp.where(m, centered * rstd[:, None], 0.0)
      return xhat, dy, dy * gamma[None, :], m

    def sums(c0, carry):
      s_gx, s_g = carry
      xhat, _, g, _ = terms(c0)
      return s_gx + jnp.sum(g * xhat, axis=1), s_g + jnp.sum(g, axis=1)

    zeros = jnp.zeros((bm,), _F32)
    s_gx, s_g = rows_lib.over_chunks(n_chunks, bn, sums, (zeros, zeros))
    c1 = s_gx / n_cols
    c2 = s_g / n_cols

    def dx_tile(c0):
      xhat, dy, g, m = terms(c0)
      inner = g - xhat * c1[:, None]
      if mean is not None:
        inner = inner - c2[:, None]
      dx = rstd[:, None] * inner
      if dh_ref is not None:
        dx = dx + rows_lib.load_tile(dh_ref, r0, c0, bm, bn, m).astype(_F32)
      rows_lib.store_tile(dx_ref, r0, c0, bm, bn, dx, m)
      return jnp.sum(dy * xhat, axis=0), jnp.sum(dy, axis=0)

    if single:
      dg, db = dx_tile(0)
      return acc[0] + dg, acc[1] + db

    # Chunked rows (row_steps == 1): partial sums go straight out per chunk.
    def write(c0, carry):
      dg, db = dx_tile(c0)
      col_ok = rows_lib.col_ids(c0, bn) < n_cols
      rows_lib.store_vec(dg_ref, c0, bn, dg, col_ok)
      if db_ref is not None:
        rows_lib.store_vec(db_ref, c0, bn, db, col_ok)
      return carry

    rows_lib.over_chunks(n_chunks, bn, write, 0)
    return acc

  zeros = jnp.zeros((bn,), _F32)
  if steps == 1:
    dg, db = row_block(0, (zeros, zeros))
  else:
    dg, db = jax.lax.fori_loop(0, steps, row_block, (zeros, zeros))
  if single:
    col_ok = rows_lib.col_ids(0, bn) < n_cols
    rows_lib.store_vec(dg_ref, 0, bn, dg, col_ok)
    if db_ref is not None:
      rows_lib.store_vec(db_ref, 0, bn, db, col_ok)


def backward(h, gamma, mean, rstd, dy, dh, *, kind: str, dx_dtype, cfg: Config,
             interpret: bool) -> tuple[jax.Array, jax.Array, jax.Array | None]:
  """Runs the backward kernel on 2-D h [rows, cols].

  Args:
    h: the normalized input (x, or x + residual as returned).
    gamma: [cols].
    mean: [rows] float32 (layer norm) or None (RMS norm).
    rstd: [rows] float32.
    dy: [rows, cols] cotangent of the normalized output.
    dh: None or [rows, cols] cotangent of the returned h (added to dx).
    kind: "layer_norm" or "rms_norm".
    dx_dtype: dtype of the returned dx.
    cfg: tiling with `row_steps`; `row_steps` must be 1 for chunked rows.
    interpret: run in Pallas interpret mode.

  Returns:
    (dx, dgamma, dbeta) with dgamma/dbeta float32 [cols] (dbeta None for RMS).
  """
  n_rows, n_cols = h.shape
  if cfg.block_cols < n_cols and cfg.row_steps != 1:
    raise ValueError(f"row_steps must be 1 when rows are chunked: {cfg}")
  rpp = cfg.rows_per_program
  programs = pl.cdiv(n_rows, rpp)
  width = rows_lib.padded_cols(n_cols, cfg.block_cols)  # whole chunks
  tile = pl.BlockSpec((rpp, width), lambda i: (i, 0))
  vec = pl.BlockSpec((width,), lambda i: (0,))
  row_vec = pl.BlockSpec((rpp,), lambda i: (i,))
  partial = pl.BlockSpec((None, width), lambda i: (i, 0))

  inputs, in_specs = [h, gamma], [tile, vec]
  if kind == "layer_norm":
    inputs.append(mean)
    in_specs.append(row_vec)
  inputs += [rstd, dy]
  in_specs += [row_vec, tile]
  if dh is not None:
    inputs.append(dh)
    in_specs.append(tile)

  out_shape = [jax.ShapeDtypeStruct((n_rows, n_cols), dx_dtype),
               jax.ShapeDtypeStruct((programs, n_cols), _F32)]
  out_specs = [tile, partial]
  if kind == "layer_norm":
    out_shape.append(jax.ShapeDtypeStruct((programs, n_cols), _F32))
    out_specs.append(partial)

  body = functools.partial(_backward_kernel, kind=kind, n_rows=n_rows,
                           n_cols=n_cols, cfg=cfg, has_dh=dh is not None)
  itemsize = jnp.dtype(h.dtype).itemsize
  with backend.kernel_scope(kind):
    outs = pl.pallas_call(
        body,
        grid=(programs,),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        interpret=interpret,
        compiler_params=_compiler_params(cfg, interpret),
        cost_estimate=pl.CostEstimate(
            flops=12 * n_rows * n_cols, transcendentals=0,
            bytes_accessed=(3 + (dh is not None)) * n_rows * n_cols * itemsize),
        name=f"{kind}_bwd",
    )(*inputs)
  dx, dg_partial = outs[0], outs[1]
  db_partial = outs[2] if kind == "layer_norm" else None
  dgamma = jnp.sum(dg_partial, axis=0)
  dbeta = jnp.sum(db_partial, axis=0) if db_partial is not None else None
  return dx, dgamma, dbeta


def partial_sum_bytes(n_rows: int, n_cols: int, cfg: Config) -> int:
  """Bytes of the float32 dgamma partial-sum buffer `backward` allocates."""
  return pl.cdiv(n_rows, cfg.rows_per_program) * n_cols * 4
