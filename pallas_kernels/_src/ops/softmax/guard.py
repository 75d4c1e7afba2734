"""When the softmax kernels cannot run, and why (then XLA runs instead)."""

from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels._src import gpu
from pallas_kernels._src import tpu as tpu_lib
from pallas_kernels._src.ops import rows
from pallas_kernels._src.ops.softmax import tpu as softmax_tpu

#: dtypes of x the kernels are written and validated for.
SUPPORTED_DTYPES = frozenset({"float32", "bfloat16", "float16"})


def unsupported_reason(*, x_shape: tuple[int, ...], x_dtype, mask_dtype,
                       interpret: bool) -> str | None:
  """Why the forward kernel cannot run these arguments, or None if it can.

  Args:
    x_shape: shape of x (already validated by the API).
    x_dtype: dtype of x.
    mask_dtype: dtype of the mask, or None.
    interpret: whether the kernel would run in interpret mode.
  """
  reason = gpu.unavailable_reason(interpret)
  if reason:
    return reason
  for name, dt in (("x", x_dtype), ("mask", mask_dtype)):
    if dt is None or jnp.dtype(dt) == jnp.bool_:
      continue
    if jnp.dtype(dt).name not in SUPPORTED_DTYPES:
      return f"{name} dtype {jnp.dtype(dt).name} {gpu.not_one_of(SUPPORTED_DTYPES)}"
  reason = rows.rows_reason(x_shape)
  if reason:
    return reason
  return None


def backward_unsupported_reason(*, x_dtype, out_dtype) -> str | None:
  """Why the backward kernel cannot serve this call, or None if it can.

  The backward kernel reads the saved output y; if y was stored in a dtype
  less precise than x, the gradient would carry y's rounding (e.g. 4e-3 for
  bfloat16) where x's dtype promises more, so the reference's vjp recomputes
  it in float32 instead.
  """
  x_bits = jnp.finfo(x_dtype).nmant
  out_bits = jnp.finfo(out_dtype).nmant
  if out_bits < x_bits:
    return (f"out_dtype {jnp.dtype(out_dtype).name} is less precise than x "
            f"({jnp.dtype(x_dtype).name}); the saved output would limit the gradient")
  return None


def tpu_unsupported_reason(*, x_shape: tuple[int, ...], x_dtype, mask_dtype, out_dtype,
                           layout: softmax_tpu.Layout,
                           requested_rows: int | None) -> str | None:
  """Why the TPU forward kernel cannot run these arguments, or None if it can.

  Args:
    x_shape: shape of x (already validated by the API).
    x_dtype, out_dtype: dtypes of x and of the result.
    mask_dtype: dtype of the mask (boolean is loaded as int8), or None.
    layout: how the kernel sees x and the mask.
    requested_rows: `Config.block_rows` of the caller's config, or None.
  """
  dtypes = [x_dtype, out_dtype]
  if mask_dtype is not None and jnp.dtype(mask_dtype) != jnp.bool_:
    dtypes.append(mask_dtype)
  reason = tpu_lib.dtype_reason(dtypes)
  if reason:
    return reason
  reason = rows.rows_reason(x_shape)
  if reason:
    return reason
  _, reason = softmax_tpu.forward_block_rows(
      layout, x_dtype=x_dtype, out_dtype=out_dtype, requested=requested_rows,
      mask_dtype=None if mask_dtype is None else (
          jnp.int8 if jnp.dtype(mask_dtype) == jnp.bool_ else mask_dtype))
  return reason
