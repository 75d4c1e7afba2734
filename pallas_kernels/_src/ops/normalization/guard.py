"""When the normalization kernels cannot run, and why (then XLA runs instead)."""

from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels._src import gpu
from pallas_kernels._src import tpu as tpu_lib
from pallas_kernels._src.ops import rows
from pallas_kernels._src.ops.normalization import kernel
from pallas_kernels._src.ops.normalization import tpu as norm_tpu
from pallas_kernels._src.ops.normalization.config import Config

#: Input dtypes the kernels are written and validated for.
SUPPORTED_DTYPES = frozenset({"float32", "bfloat16", "float16"})
#: Largest float32 dgamma/dbeta partial-sum buffer the backward may allocate
#: (rows wider than one chunk get one partial row per row block).
MAX_PARTIAL_BYTES = 256 * 2**20


def unsupported_reason(*, x_shape: tuple[int, ...], dtypes: tuple, quantize: str | None,
                       interpret: bool) -> str | None:
  """Why the forward kernel cannot run these arguments, or None if it can.

  Args:
    x_shape: shape of x (already validated by the API).
    dtypes: dtypes of every array argument (x, residual, gamma, beta).
    quantize: the requested quantizing epilogue, if any.
    interpret: whether the kernel would run in interpret mode.
  """
  reason = gpu.unavailable_reason(interpret)
  if reason:
    return reason
  for dt in dtypes:
    if jnp.dtype(dt).name not in SUPPORTED_DTYPES:
      return f"dtype {jnp.dtype(dt).name} {gpu.not_one_of(SUPPORTED_DTYPES)}"
  reason = rows.rows_reason(x_shape)
  if reason:
    return reason
  if quantize == "float8_e4m3fn":
    return gpu.float8_reason(interpret)
  return None


def backward_unsupported_reason(*, n_rows: int, n_cols: int, cfg: Config) -> str | None:
  """Why the backward kernel cannot run, or None if it can."""
  size = kernel.partial_sum_bytes(n_rows, n_cols, cfg)
  if size > MAX_PARTIAL_BYTES:
    return (f"backward partial sums would take {size / 2**20:.0f} MiB "
            f"(rows of {n_cols} > block_cols {cfg.block_cols} keep one partial row "
            "per row block)")
  return None


def tpu_unsupported_reason(*, x_shape: tuple[int, ...], dtypes: tuple, residual_dtype,
                           out_dtype, quantize: str | None,
                           requested_rows: int | None) -> str | None:
  """Why the TPU forward kernel cannot run these arguments, or None if it can.

  Args:
    x_shape: shape of x (already validated by the API).
    dtypes: dtypes of every array argument (x, residual, gamma, beta).
    residual_dtype: dtype of the residual, or None.
    out_dtype: dtype of the normalized output (resolved: h's by default).
    quantize: the requested quantizing epilogue, if any.
    requested_rows: `Config.block_rows` of the caller's config, or None.
  """
  if quantize is not None:
    return (f"quantize={quantize!r} has no TPU kernel (the TPU kernels fuse the "
            "residual add and the output cast only)")
  reason = tpu_lib.dtype_reason(dtypes + (out_dtype,))
  if reason:
    return reason
  reason = rows.rows_reason(x_shape)
  if reason:
    return reason
  n_rows, n_cols = rows_and_cols(x_shape)
  _, reason = norm_tpu.forward_block_rows(
      n_rows, n_cols, x_dtype=dtypes[0], residual_dtype=residual_dtype,
      out_dtype=out_dtype, requested=requested_rows)
  return reason


def tpu_backward_unsupported_reason(*, n_rows: int, n_cols: int, block_rows: int,
                                    fit_reason: str | None) -> str | None:
  """Why the TPU backward kernel cannot run, or None if it can.

  Args:
    n_rows, n_cols: of the flattened x.
    block_rows: the backward's row block.
    fit_reason: why that block does not fit VMEM (`tpu.backward_block_rows`).
  """
  if fit_reason:
    return fit_reason
  size = norm_tpu.partial_sum_bytes(n_rows, n_cols, block_rows)
  if size > MAX_PARTIAL_BYTES:
    return (f"backward partial sums would take {size / 2**20:.0f} MiB "
            f"(one partial row per block of {block_rows} rows)")
  return None


def rows_and_cols(x_shape: tuple[int, ...]) -> tuple[int, int]:
  """(rows, cols) of x flattened to 2-D."""
  n_rows = 1
  for d in x_shape[:-1]:
    n_rows *= d
  return n_rows, x_shape[-1]
