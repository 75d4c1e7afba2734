"""Mosaic TPU kernels for softmax: forward (scale, additive or boolean mask,
causal, output cast) and backward.

The same math as `kernel.py` and `reference.py` (float32 inside), laid out for
a TPU: a grid step owns a block of whole rows (`_src/tpu.py`). With a mask or
causal masking, x is seen as [batch, q, k] (batch = every axis before the
query axis) and the grid runs over (batch, query blocks): the mask, seen as
[mask batch, 1 or q, 1 or k], is never broadcast in memory; its BlockSpec
picks the mask batch of each x batch by index arithmetic (`MaskLayout`-like
strides) and its query block, or its one row when it broadcasts over
queries. Causal masking needs no input: a block's queries are its row ids.

Backward: dx = y * (dy - sum(dy * y)) * scale on [rows, k] blocks.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels._src import backend
from pallas_kernels._src import tpu as tpu_lib

_F32 = jnp.float32
#: float32 [block, k] temporaries each body holds at once (logits, keep,
#: exp; backward: y, dy, dx).
_FWD_TEMPS = 4
_BWD_TEMPS = 3


@dataclasses.dataclass(frozen=True, slots=True)
class Layout:
  """How x [..., q, k] and its mask are seen by the forward kernel.

  Attributes:
    batch, q, k: x as [batch, q, k] (no mask and not causal: [1, rows, k]).
    mask_kind: None, "additive" or "boolean".
    mask_batch: rows of the mask's [mask batch, mq, mk] view.
    mask_q, mask_k: 1 (broadcast) or q, k.
    batch_terms: (x stride, size, mask stride) per leading axis the mask
      does not broadcast along: mask batch of x batch b is
      sum(((b // x stride) % size) * mask stride).
    causal_offset: key j is kept for query i iff j <= i + offset; None: not
      causal.
  """

  batch: int
  q: int
  k: int
  mask_kind: str | None = None
  mask_batch: int = 1
  mask_q: int = 1
  mask_k: int = 1
  batch_terms: tuple[tuple[int, int, int], ...] = ()
  causal_offset: int | None = None

  @staticmethod
  def of(x_shape: tuple[int, ...], mask_shape: tuple[int, ...] | None,
         mask_kind: str | None, causal_offset: int | None) -> "Layout":
    """The layout of a call (mask_shape broadcasts to x_shape)."""
    k = x_shape[-1]
    if mask_shape is None and causal_offset is None:
      rows = 1
      for d in x_shape[:-1]:
        rows *= d
      return Layout(batch=1, q=rows, k=k)
    q = x_shape[-2] if len(x_shape) >= 2 else 1
    lead = tuple(x_shape[:-2])
    batch = 1
    for d in lead:
      batch *= d
    if mask_shape is None:
      return Layout(batch=batch, q=q, k=k, causal_offset=causal_offset)
    padded = (1,) * (len(x_shape) - len(mask_shape)) + tuple(mask_shape)
    mlead = padded[:len(lead)]
    mq = padded[-2] if len(x_shape) >= 2 else 1
    terms = []
    x_stride = m_stride = 1
    for d, m in zip(reversed(lead), reversed(mlead)):
      if m != 1:
        terms.append((x_stride, d, m_stride))
      x_stride *= d
      m_stride *= m
    mask_batch = 1
    for m in mlead:
      mask_batch *= m
    return Layout(batch=batch, q=q, k=k, mask_kind=mask_kind, mask_batch=mask_batch,
                  mask_q=mq, mask_k=padded[-1], batch_terms=tuple(terms),
                  causal_offset=causal_offset)

  def mask_batch_of(self, b):
    """The mask batch index of x batch `b` (traced int32 in an index map).

    lax.div/rem, not // and %: b >= 0, and Python's floor semantics lower
    through `sign`, whose Mosaic rule asks the process for a TPU generation.
    """
    out = b * 0
    for x_stride, size, m_stride in self.batch_terms:
      out = out + jax.lax.rem(jax.lax.div(b, x_stride), size) * m_stride
    return out


def forward_block_rows(layout: Layout, *, x_dtype, mask_dtype, out_dtype,
                       requested: int | None) -> tuple[int, str | None]:
  """(query rows per forward block, why none fits VMEM or None)."""
  io = [x_dtype, out_dtype]
  if mask_dtype is not None and layout.mask_q > 1:
    io.append(mask_dtype)
  sizes = [jnp.dtype(d).itemsize for d in io]
  per_row = tpu_lib.row_bytes(layout.k, sizes, _FWD_TEMPS)
  return tpu_lib.block_rows(layout.q, layout.k, per_row, tpu_lib.row_multiple(io),
                            requested)


def backward_block_rows(n_rows: int, n_cols: int, *, y_dtype, dy_dtype, dx_dtype,
                        requested: int | None) -> tuple[int, str | None]:
  """(rows per backward block, why none fits VMEM or None)."""
  io = [y_dtype, dy_dtype, dx_dtype]
  sizes = [jnp.dtype(d).itemsize for d in io]
  per_row = tpu_lib.row_bytes(n_cols, sizes, _BWD_TEMPS)
  return tpu_lib.block_rows(n_rows, n_cols, per_row, tpu_lib.row_multiple(io), requested)


def _forward_kernel(*refs, layout: Layout, scale: float | None, block_rows: int):
  if layout.mask_kind is not None:
    x_ref, m_ref, y_ref = refs
  else:
    (x_ref, y_ref), m_ref = refs, None
  s = x_ref[...].astype(_F32)
  if scale is not None:
    s = s * jnp.float32(scale)
  keep = None
  if m_ref is not None:
    m = m_ref[...]
    if layout.mask_kind == "additive":
      s = s + m.astype(_F32)
    else:
      keep = jnp.broadcast_to(m.astype(jnp.int32) != 0, s.shape)
  if layout.causal_offset is not None:
    query = pl.program_id(1) * block_rows + jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
    key = jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
    tri = key <= query + layout.causal_offset
    keep = tri if keep is None else keep & tri
  if keep is not None:
    s = jnp.where(keep, s, -jnp.inf)
  mx = jnp.max(s, axis=1, keepdims=True)
  # A fully masked row (max -inf) shifts by 0, so exp gives 0 rather than NaN.
  mx = jnp.where(mx == -jnp.inf, 0.0, mx)
  e = jnp.exp(s - mx)
  denom = jnp.sum(e, axis=1, keepdims=True)
  y_ref[...] = (e / jnp.where(denom == 0, 1.0, denom)).astype(y_ref.dtype)


def forward(x, mask, *, layout: Layout, scale: float | None, out_dtype, block_rows: int,
            interpret: bool) -> jax.Array:
  """Softmax of x (any shape whose layout is `layout`) into `out_dtype`.

  Args:
    x: the logits.
    mask: None, or the mask in its own shape (int8 for a boolean mask,
      floating for an additive one).
    layout: `Layout.of` x and the mask.
    scale: multiplies the logits first (static).
    out_dtype: dtype of the result.
    block_rows: query rows per block (`forward_block_rows`).
    interpret: TPU interpret mode.
  """
  bq = block_rows
  x3 = x.reshape(layout.batch, layout.q, layout.k)
  tile = pl.BlockSpec((None, bq, layout.k), lambda b, i: (b, i, 0))
  inputs, in_specs = [x3], [tile]
  if mask is not None:
    inputs.append(mask.reshape(layout.mask_batch, layout.mask_q, layout.mask_k))
    per_query = layout.mask_q > 1
    in_specs.append(pl.BlockSpec(
        (None, bq if per_query else 1, layout.mask_k),
        lambda b, i: (layout.mask_batch_of(b), i if per_query else 0, 0)))
  body = functools.partial(_forward_kernel, layout=layout, scale=scale, block_rows=bq)
  elems = layout.batch * layout.q * layout.k
  moved = elems * (x.dtype.itemsize + jnp.dtype(out_dtype).itemsize) + (
      0 if mask is None else mask.size * mask.dtype.itemsize)
  with backend.kernel_scope("softmax"):
    y = pl.pallas_call(
        body,
        grid=(layout.batch, pl.cdiv(layout.q, bq)),
        in_specs=in_specs,
        out_specs=tile,
        out_shape=jax.ShapeDtypeStruct(x3.shape, out_dtype),
        interpret=tpu_lib.interpret_params(interpret),
        compiler_params=tpu_lib.compiler_params(2),
        cost_estimate=pl.CostEstimate(flops=5 * elems, transcendentals=elems,
                                      bytes_accessed=moved),
        name="softmax_fwd_tpu",
    )(*inputs)
  return y.reshape(x.shape)


def _backward_kernel(y_ref, dy_ref, dx_ref, *, scale: float | None):
  y = y_ref[...].astype(_F32)
  dy = dy_ref[...].astype(_F32)
  dx = y * (dy - jnp.sum(y * dy, axis=1, keepdims=True))
  if scale is not None:
    dx = dx * jnp.float32(scale)
  dx_ref[...] = dx.astype(dx_ref.dtype)


def backward(y, dy, *, scale: float | None, dx_dtype, block_rows: int,
             interpret: bool) -> jax.Array:
  """dx [rows, cols] of softmax from its output y and cotangent dy."""
  n_rows, n_cols = y.shape
  bm = block_rows
  tile = pl.BlockSpec((bm, n_cols), lambda i: (i, 0))
  elems = n_rows * n_cols
  with backend.kernel_scope("softmax"):
    return pl.pallas_call(
        functools.partial(_backward_kernel, scale=scale),
        grid=(pl.cdiv(n_rows, bm),),
        in_specs=[tile, tile],
        out_specs=tile,
        out_shape=jax.ShapeDtypeStruct((n_rows, n_cols), dx_dtype),
        interpret=tpu_lib.interpret_params(interpret),
        compiler_params=tpu_lib.compiler_params(1),
        cost_estimate=pl.CostEstimate(
            flops=4 * elems, transcendentals=0,
            bytes_accessed=elems * (y.dtype.itemsize + dy.dtype.itemsize
                                    + jnp.dtype(dx_dtype).itemsize)),
        name="softmax_bwd_tpu",
    )(y, dy)
