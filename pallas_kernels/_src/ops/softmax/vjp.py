"""custom_vjp wiring of the softmax kernels.

The forward saves its output y; the backward kernel computes
dx = y * (dy - sum(dy * y)) * scale. An additive mask gets the gradient of the
logits summed over the axes it broadcasts along (computed with jnp from y and
dy, so XLA drops it when nobody uses it); a boolean mask gets none.

When the backward kernel cannot serve a call (see
`guard.backward_unsupported_reason`) the forward saves x and the mask instead
and the backward is `jax.vjp` of the reference, recorded as a fallback when the
backward is traced.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels._src import guard as guard_lib
from pallas_kernels._src.ops.softmax import guard
from pallas_kernels._src.ops.softmax import kernel
from pallas_kernels._src.ops.softmax import reference
from pallas_kernels._src.ops.softmax import tpu as softmax_tpu
from pallas_kernels._src.ops.softmax.config import Config


@dataclasses.dataclass(frozen=True, slots=True)
class TpuPlan:
  """The Mosaic TPU kernels' layout and tiling of a call."""

  layout: softmax_tpu.Layout
  #: Query rows per forward block; rows per backward block.
  block_rows: int
  bwd_block_rows: int
  #: Why the backward block does not fit VMEM (then XLA's vjp runs), or None.
  bwd_reason: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class Static:
  """Everything about a call that is not an array (hashable for custom_vjp)."""

  scale: float | None
  causal: bool
  causal_alignment: str
  masking: kernel.Masking
  out_dtype: str
  cfg: Config
  bwd_cfg: Config
  interpret: bool
  #: Set: the TPU kernels (`tpu.py`) run the call, not the Triton ones.
  tpu: TpuPlan | None = None


def _reference(static: Static, x, mask):
  return reference.softmax(x, scale=static.scale, mask=mask, causal=static.causal,
                           causal_alignment=static.causal_alignment,
                           out_dtype=static.out_dtype)


def _forward(static: Static, x, mask):
  if static.tpu is not None:
    if mask is not None and mask.dtype == jnp.bool_:
      mask = mask.astype(jnp.int8)  # Loaded as bytes; nonzero keeps.
    return softmax_tpu.forward(
        x, mask, layout=static.tpu.layout, scale=static.scale,
        out_dtype=jnp.dtype(static.out_dtype), block_rows=static.tpu.block_rows,
        interpret=static.interpret)
  n = x.shape[-1]
  mask2 = None
  if mask is not None:
    layout = static.masking.layout
    if mask.dtype == jnp.bool_:
      mask = mask.astype(jnp.int8)  # Loaded as bytes; nonzero keeps.
    mask2 = mask.reshape(layout.rows, layout.cols)
  y = kernel.forward(x.reshape(-1, n), mask2, scale=static.scale,
                     masking=static.masking, out_dtype=jnp.dtype(static.out_dtype),
                     cfg=static.cfg, interpret=static.interpret)
  return y.reshape(x.shape)


def _backward_reason(static: Static, x) -> str | None:
  reason = guard.backward_unsupported_reason(x_dtype=x.dtype, out_dtype=static.out_dtype)
  if reason is None and static.tpu is not None:
    return static.tpu.bwd_reason
  return reason


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def softmax(x, mask, static: Static):
  """Softmax of x (any leading dims) through the Pallas kernels."""
  return _forward(static, x, mask)


def _softmax_fwd(x, mask, static: Static):
  y = _forward(static, x, mask)
  if _backward_reason(static, x):
    return y, (x, mask)
  # x itself is not needed, only its dtype, which a zero-size slice carries.
  return y, (y, mask, jnp.zeros((0,), x.dtype))


def _sum_to_shape(g, shape: tuple[int, ...]):
  """Sums g over the axes along which an array of `shape` broadcast to g."""
  padded = (1,) * (g.ndim - len(shape)) + tuple(shape)
  axes = tuple(i for i, (a, b) in enumerate(zip(padded, g.shape)) if a == 1 and b != 1)
  return jnp.sum(g, axis=axes, keepdims=True).reshape(shape)


def _mask_cotangent(mask, dlogits_fn):
  if mask is None:
    return None
  if mask.dtype == jnp.bool_:
    return np.zeros(mask.shape, dtype=jax.dtypes.float0)
  return _sum_to_shape(dlogits_fn(), mask.shape).astype(mask.dtype)


def _softmax_bwd(static: Static, saved, dy):
  if len(saved) == 2:
    x, mask = saved
    guard_lib.record_fallback(
        "softmax", "backward: " + _backward_reason(static, x),
        guard_lib.signature(x=x, mask=mask))
    _, pullback = jax.vjp(functools.partial(_reference, static), x, mask)
    dx, dmask = pullback(dy)
    if mask is not None and mask.dtype == jnp.bool_:
      dmask = np.zeros(mask.shape, dtype=jax.dtypes.float0)
    return dx, dmask
  y, mask, x_dtype_carrier = saved
  n = y.shape[-1]
  if static.tpu is not None:
    dx = softmax_tpu.backward(
        y.reshape(-1, n), dy.reshape(-1, n), scale=static.scale,
        dx_dtype=x_dtype_carrier.dtype, block_rows=static.tpu.bwd_block_rows,
        interpret=static.interpret).reshape(y.shape)
  else:
    dx = kernel.backward(y.reshape(-1, n), dy.reshape(-1, n), scale=static.scale,
                         dx_dtype=x_dtype_carrier.dtype, cfg=static.bwd_cfg,
                         interpret=static.interpret).reshape(y.shape)

  def dlogits():
    y32, dy32 = y.astype(jnp.float32), dy.astype(jnp.float32)
    return y32 * (dy32 - jnp.sum(y32 * dy32, axis=-1, keepdims=True))

  return dx, _mask_cotangent(mask, dlogits)


softmax.defvjp(_softmax_fwd, _softmax_bwd)
