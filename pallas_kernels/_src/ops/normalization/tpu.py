"""Mosaic TPU kernels for layer norm and RMS norm: forward and backward.

The same math as `kernel.py` (float32 throughout, term by term as
`reference.py`), laid out for a TPU: a grid step owns a block of whole rows
(`_src/tpu.py`), so a row is read once and never chunked; per-row statistics
travel as [rows, 1] float32 columns. Fused: the residual add (h returned) and
the output cast; the quantize epilogue has no TPU kernel (the guard says so).

Backward: dx as in `kernel.py`; each block writes its float32 partial sums of
dy * xhat (dgamma) and dy (dbeta) over its own rows, selected by row index
(a ragged last block holds padding rows), and XLA sums those partial rows.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels._src import backend
from pallas_kernels._src import tpu as tpu_lib
from pallas_kernels._src.ops.normalization.kernel import (ForwardOutputs, backward_refs,
                                                         forward_refs)

_F32 = jnp.float32
#: float32 [block, width] temporaries each body holds at once (h, centered, y;
#: backward: h, dy, xhat, g, dx, the partial-sum terms).
_FWD_TEMPS = 4
_BWD_TEMPS = 6


def _itemsizes(*dtypes) -> list[int]:
  return [jnp.dtype(d).itemsize for d in dtypes if d is not None]


def forward_block_rows(n_rows: int, n_cols: int, *, x_dtype, residual_dtype, out_dtype,
                       requested: int | None) -> tuple[int, str | None]:
  """(rows per forward block, why none fits VMEM or None)."""
  h_dtype = x_dtype if residual_dtype is None else jnp.promote_types(x_dtype, residual_dtype)
  io = [x_dtype, residual_dtype, out_dtype, None if residual_dtype is None else h_dtype]
  per_row = tpu_lib.row_bytes(n_cols, _itemsizes(*io), _FWD_TEMPS)
  return tpu_lib.block_rows(n_rows, n_cols, per_row,
                            tpu_lib.row_multiple([d for d in io if d is not None]),
                            requested)


def backward_block_rows(n_rows: int, n_cols: int, *, h_dtype, dy_dtype, has_dh: bool,
                        requested: int | None) -> tuple[int, str | None]:
  """(rows per backward block, why none fits VMEM or None)."""
  io = [h_dtype, dy_dtype, h_dtype] + ([h_dtype] if has_dh else [])  # h, dy, dx, dh
  per_row = tpu_lib.row_bytes(n_cols, _itemsizes(*io), _BWD_TEMPS)
  return tpu_lib.block_rows(n_rows, n_cols, per_row, tpu_lib.row_multiple(io), requested)


def _forward_kernel(*refs, kind: str, n_cols: int, eps: float, has_residual: bool,
                    has_beta: bool, h_dtype, save_stats: bool):
  x_ref, r_ref, g_ref, b_ref, y_ref, h_ref, _, mean_ref, rstd_ref = forward_refs(
      refs, kind=kind, has_residual=has_residual, has_beta=has_beta, quantize=False,
      save_stats=save_stats)

  h = x_ref[...].astype(_F32)
  if r_ref is not None:
    h = (h + r_ref[...].astype(_F32)).astype(h_dtype)  # Rounded as returned.
    h_ref[...] = h
    h = h.astype(_F32)
  if kind == "layer_norm":
    mean = jnp.sum(h, axis=1, keepdims=True) / n_cols
    centered = h - mean
  else:
    mean, centered = None, h
  var = jnp.sum(centered * centered, axis=1, keepdims=True) / n_cols
  rstd = jax.lax.rsqrt(var + jnp.float32(eps))
  y = centered * rstd * g_ref[...].astype(_F32)
  if b_ref is not None:
    y = y + b_ref[...].astype(_F32)
  y_ref[...] = y.astype(y_ref.dtype)
  if mean_ref is not None:
    mean_ref[...] = mean
  if rstd_ref is not None:
    rstd_ref[...] = rstd


def forward(x, residual, gamma, beta, *, kind: str, eps: float, out_dtype,
            save_stats: bool, block_rows: int, interpret: bool) -> ForwardOutputs:
  """The forward kernel on 2-D `x` [rows, cols]; see `kernel.forward` (no
  quantize). mean and rstd come back as [rows] float32."""
  n_rows, n_cols = x.shape
  bm = block_rows
  h_dtype = x.dtype if residual is None else jnp.promote_types(x.dtype, residual.dtype)
  tile = pl.BlockSpec((bm, n_cols), lambda i: (i, 0))
  vec = pl.BlockSpec((1, n_cols), lambda i: (0, 0))
  col = pl.BlockSpec((bm, 1), lambda i: (i, 0))

  inputs, in_specs = [x], [tile]
  if residual is not None:
    inputs.append(residual)
    in_specs.append(tile)
  inputs.append(gamma.reshape(1, n_cols))
  in_specs.append(vec)
  if beta is not None:
    inputs.append(beta.reshape(1, n_cols))
    in_specs.append(vec)

  out_shape = [jax.ShapeDtypeStruct((n_rows, n_cols), jnp.dtype(out_dtype))]
  out_specs = [tile]
  if residual is not None:
    out_shape.append(jax.ShapeDtypeStruct((n_rows, n_cols), h_dtype))
    out_specs.append(tile)
  stats = (["mean"] if save_stats and kind == "layer_norm" else []) + (
      ["rstd"] if save_stats else [])
  for _ in stats:
    out_shape.append(jax.ShapeDtypeStruct((n_rows, 1), _F32))
    out_specs.append(col)

  body = functools.partial(
      _forward_kernel, kind=kind, n_cols=n_cols, eps=float(eps),
      has_residual=residual is not None, has_beta=beta is not None,
      h_dtype=h_dtype, save_stats=save_stats)
  elems = n_rows * n_cols
  moved = tpu_lib.bytes_moved(inputs, out_shape)
  with backend.kernel_scope(kind):
    outs = pl.pallas_call(
        body,
        grid=(pl.cdiv(n_rows, bm),),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        interpret=tpu_lib.interpret_params(interpret),
        compiler_params=tpu_lib.compiler_params(1),
        cost_estimate=pl.CostEstimate(
            flops=(8 if kind == "layer_norm" else 6) * elems,
            transcendentals=n_rows, bytes_accessed=moved),
        name=f"{kind}_fwd_tpu",
    )(*inputs)
  outs = list(outs)
  y = outs.pop(0)
  h = outs.pop(0) if residual is not None else None
  named = {name: outs.pop(0).reshape(n_rows) for name in stats}
  return ForwardOutputs(y=y, h=h, scale=None, mean=named.get("mean"),
                        rstd=named.get("rstd"))


def _backward_kernel(*refs, kind: str, n_rows: int, n_cols: int, block_rows: int,
                     has_dh: bool):
  h_ref, g_ref, mean_ref, rstd_ref, dy_ref, dh_ref, dx_ref, dg_ref, db_ref = backward_refs(
      refs, kind=kind, has_dh=has_dh)

  h = h_ref[...].astype(_F32)
  dy = dy_ref[...].astype(_F32)
  rstd = rstd_ref[...]
  centered = h - mean_ref[...] if mean_ref is not None else h
  xhat = centered * rstd
  g = dy * g_ref[...].astype(_F32)
  c1 = jnp.sum(g * xhat, axis=1, keepdims=True) / n_cols
  inner = g - xhat * c1
  if mean_ref is not None:
    inner = inner - jnp.sum(g, axis=1, keepdims=True) / n_cols
  dx = rstd * inner
  if dh_ref is not None:
    dx = dx + dh_ref[...].astype(_F32)
  dx_ref[...] = dx.astype(dx_ref.dtype)

  # Rows past the end of a ragged last block hold padding (NaN in interpret
  # mode, anything on a TPU): select them away before summing over rows.
  rows = pl.program_id(0) * block_rows + jax.lax.broadcasted_iota(
      jnp.int32, (block_rows, 1), 0)
  live = rows < n_rows
  dg_ref[...] = jnp.sum(jnp.where(live, dy * xhat, 0.0), axis=0, keepdims=True)
  if db_ref is not None:
    db_ref[...] = jnp.sum(jnp.where(live, dy, 0.0), axis=0, keepdims=True)


def backward(h, gamma, mean, rstd, dy, dh, *, kind: str, dx_dtype, block_rows: int,
             interpret: bool) -> tuple[jax.Array, jax.Array, jax.Array | None]:
  """(dx, dgamma, dbeta) as `kernel.backward`; mean/rstd are [rows] float32."""
  n_rows, n_cols = h.shape
  bm = block_rows
  programs = pl.cdiv(n_rows, bm)
  tile = pl.BlockSpec((bm, n_cols), lambda i: (i, 0))
  vec = pl.BlockSpec((1, n_cols), lambda i: (0, 0))
  col = pl.BlockSpec((bm, 1), lambda i: (i, 0))
  partial = pl.BlockSpec((None, 1, n_cols), lambda i: (i, 0, 0))

  inputs, in_specs = [h, gamma.reshape(1, n_cols)], [tile, vec]
  if kind == "layer_norm":
    inputs.append(mean.reshape(n_rows, 1))
    in_specs.append(col)
  inputs += [rstd.reshape(n_rows, 1), dy]
  in_specs += [col, tile]
  if dh is not None:
    inputs.append(dh)
    in_specs.append(tile)

  out_shape = [jax.ShapeDtypeStruct((n_rows, n_cols), dx_dtype),
               jax.ShapeDtypeStruct((programs, 1, n_cols), _F32)]
  out_specs = [tile, partial]
  if kind == "layer_norm":
    out_shape.append(jax.ShapeDtypeStruct((programs, 1, n_cols), _F32))
    out_specs.append(partial)

  body = functools.partial(_backward_kernel, kind=kind, n_rows=n_rows, n_cols=n_cols,
                           block_rows=bm, has_dh=dh is not None)
  moved = tpu_lib.bytes_moved(inputs, out_shape)
  with backend.kernel_scope(kind):
    outs = pl.pallas_call(
        body,
        grid=(programs,),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        interpret=tpu_lib.interpret_params(interpret),
        compiler_params=tpu_lib.compiler_params(1),
        cost_estimate=pl.CostEstimate(
            flops=12 * n_rows * n_cols, transcendentals=0, bytes_accessed=moved),
        name=f"{kind}_bwd_tpu",
    )(*inputs)
  dx = outs[0]
  dgamma = jnp.sum(outs[1], axis=(0, 1))
  dbeta = jnp.sum(outs[2], axis=(0, 1)) if kind == "layer_norm" else None
  return dx, dgamma, dbeta


def partial_sum_bytes(n_rows: int, n_cols: int, block_rows: int) -> int:
  """Bytes of the float32 dgamma partial-sum buffer `backward` allocates."""
  return pl.cdiv(n_rows, block_rows) * n_cols * 4
