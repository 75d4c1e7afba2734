"""When the Adam weight-gradient kernel cannot run, and why (the XLA
reference runs instead).

`api.py` asks `unsupported_reason` before every launch; on a reason it runs
the reference and records the fallback, so a training step never breaks.
Invalid calls (shapes that do not fit, a count that is not an integer
scalar) raise ValueError in `api.py` instead.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src import gpu
from pallas_kernels._src.ops import adam
from pallas_kernels._src.ops.adam_matmul import config as config_lib
from pallas_kernels._src.ops.adam_matmul.config import Config
from pallas_kernels._src.ops.matmul import gpu as matmul_gpu

#: dtypes of x and dy the kernel is written and validated for.
OPERAND_DTYPES = frozenset({"float32", "bfloat16", "float16"})




def unsupported_reason(x: Any, dy: Any, param: Any, mu: Any, nu: Any, *,
                       transpose_x: bool, interpret: bool, config: Config) -> str | None:
  """Why the kernel cannot run this (validated) call, or None if it can.

  Args:
    x: [M, K] (transpose_x) or [K, M] (an array or anything with .shape
      and .dtype).
    dy: [M, N].
    param, mu, nu: [K, N].
    transpose_x: x's storage orientation.
    interpret: whether Pallas would interpret the kernel.
    config: the tiling that would be used.

  Returns:
    A short reason naming the offending dtype or shape, or None.
  """
  arrays = (("x", x), ("dy", dy))
  reason = gpu.unavailable_reason(interpret) or gpu.dtype_reason(arrays, OPERAND_DTYPES)
  if reason:
    return reason
  if gpu.dtype_name(x.dtype) != gpu.dtype_name(dy.dtype):
    # Both dot operands must share an element type (Triton's tt.dot).
    return (f"mismatched dtypes: {gpu.describe('x', x)} with {gpu.describe('dy', dy)}; "
            "cast them to one dtype")
  reason = adam.state_reason(param, mu, nu)
  if reason:
    return reason

  m, k = (int(d) for d in (x.shape if transpose_x else x.shape[::-1]))
  n = int(dy.shape[1])
  if min(m, k, n) == 0:
    return f"empty dimension (M={m}, K={k}, N={n}) of {gpu.describe('x', x)}"
  for label, count in (("x", m * k), ("dy", m * n), ("param", k * n)):
    if count > gpu.MAX_ELEMENTS:
      return f"{label} has {count} > 2**31-1 elements (int32 offsets)"

  if not interpret and backend_lib.current_backend() is backend_lib.Backend.GPU:
    lo = config_lib.GPU_MIN_BLOCK
    if min(config.block_k, config.block_n, config.block_m) < lo:
      return f"Triton dots need tiles >= {lo}, got {config}"
    smem = config_lib.smem_bytes(config, jnp.dtype(x.dtype).itemsize)
    limit = matmul_gpu.shared_memory_bytes()
    if smem > limit:
      return (f"{config} needs ~{smem // 1024} KiB of shared memory, more than the "
              f"{limit // 1024} KiB available")
  return None
