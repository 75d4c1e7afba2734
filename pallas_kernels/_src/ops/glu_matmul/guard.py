"""When the GLU matmul kernels cannot run, and why (the XLA reference runs instead).

`api.py` asks `unsupported_reason` before every launch; on a reason it runs
the reference and records the fallback, so a user's program never breaks.
Invalid calls (mismatched shapes, an unknown activation) raise ValueError in
`api.py` instead.
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src import gpu
from pallas_kernels._src.ops.glu_matmul import config as config_lib
from pallas_kernels._src.ops.glu_matmul.config import Config
from pallas_kernels._src.ops.matmul import gpu as matmul_gpu

#: dtypes of x, the weights, the biases and the result the kernels are
#: written and validated for.
SUPPORTED_DTYPES = frozenset({"float32", "bfloat16", "float16"})




def unsupported_reason(x: Any, w_gate: Any, w_up: Any, *, bias_gate: Any = None,
                       bias_up: Any = None, out_dtype, interpret: bool,
                       config: Config) -> str | None:
  """Why the kernels cannot run this (validated) call, or None if they can.

  Args:
    x: [..., K] (an array or anything with .shape and .dtype).
    w_gate, w_up: [K, F].
    bias_gate, bias_up: [F] or None.
    out_dtype: the result dtype.
    interpret: whether Pallas would interpret the kernels.
    config: the tiling that would be used.

  Returns:
    A short reason naming the offending dtype or shape, or None.
  """
  arrays = (("x", x), ("w_gate", w_gate), ("w_up", w_up), ("bias_gate", bias_gate),
            ("bias_up", bias_up))
  reason = gpu.unavailable_reason(interpret) or gpu.dtype_reason(arrays, SUPPORTED_DTYPES)
  if reason:
    return reason
  for label, w in (("w_gate", w_gate), ("w_up", w_up)):
    if gpu.dtype_name(w.dtype) != gpu.dtype_name(x.dtype):
      # Both dot operands must share an element type (Triton's tt.dot).
      return (f"mismatched dtypes: {gpu.describe('x', x)} with {gpu.describe(label, w)}; "
              "cast them to one dtype")
  if gpu.dtype_name(out_dtype) not in SUPPORTED_DTYPES:
    return f"out_dtype {gpu.dtype_name(out_dtype)} {gpu.not_one_of(SUPPORTED_DTYPES)}"

  k, f = int(w_gate.shape[0]), int(w_gate.shape[1])
  m = math.prod(x.shape[:-1])
  if min(m, k, f) == 0:
    return f"empty dimension (M={m}, K={k}, F={f}) of {gpu.describe('x', x)}"
  for label, n in (("x", m * k), ("w_gate", k * f), ("the result", m * f)):
    if n > gpu.MAX_ELEMENTS:
      return f"{label} has {n} > 2**31-1 elements (int32 offsets)"

  if not interpret and backend_lib.current_backend() is backend_lib.Backend.GPU:
    lo = config_lib.GPU_MIN_BLOCK
    if min(config.block_m, config.block_n, config.block_k) < lo:
      return f"Triton dots need tiles >= {lo}, got {config}"
    smem = config_lib.smem_bytes(config, jnp.dtype(x.dtype).itemsize)
    limit = matmul_gpu.shared_memory_bytes()
    if smem > limit:
      return (f"{config} needs ~{smem // 1024} KiB of shared memory, more than the "
              f"{limit // 1024} KiB available")
  return None
