"""When the normalization kernels cannot run, and why (then XLA runs instead)."""

from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels._src import gpu
from pallas_kernels._src.ops import rows
from pallas_kernels._src.ops.normalization import kernel
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
      return f"dtype {jnp.dtype(dt).name} is not one of {sorted(SUPPORTED_DTYPES)}"
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
